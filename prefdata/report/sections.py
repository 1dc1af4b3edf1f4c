"""The dataset health report, laid out: report.json's sections from a ReportBuilder's collected state.

The layout is documented in docs/report-schema.md; bump SCHEMA_VERSION on any breaking change.
"""

from __future__ import annotations

import time
from array import array
from typing import Any, Mapping

from prefdata import __version__
from prefdata.checks.similarity import BOUNDED_METHOD, EXACT_LIMIT
from prefdata.report.builder import LINES_PER_GROUP, TOP_GROUPS, ReportBuilder
from prefdata.report.hints import chat_template_hint, dropped_share_hint, template_hint
from prefdata.report.length_bias import bias_dict
from prefdata.report.sources import sources_section

SCHEMA_VERSION = 1
# A record that cannot be read fails `validate` (a PR must not bring one in); `prepare` sets it aside
# in quarantine.jsonl and goes on, so there it is a warning.
QUARANTINE_SEVERITY = {"validate": "error", "prepare": "warn"}


def build_report(
    builder: ReportBuilder, accounting: Mapping[str, int] | None = None, meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """report.json as a dict, from everything `builder` collected; `accounting` and `meta` (command,
    input, tokenizer, ...) come from the caller."""
    builder.flush_lengths()
    meta = dict(meta or {})
    policy = builder.policy
    q_severity = builder.quarantine_severity or QUARANTINE_SEVERITY.get(meta.get("command") or "", "error")
    flagged_rows = _flagged_rows(builder, q_severity)
    pairs = len(builder.pair_row)
    accounting = {**_accounting(builder), **(accounting or {})}

    tokens = builder.tokenized_rows > 0
    images = builder.images.to_dict(pairs)  # None for text-only data: no section
    unit = "tokens" if tokens else "characters"
    lengths_src = builder.tokens if tokens else builder.chars
    length_bias = _length_bias(builder, tokens, pairs)
    flags = _flags(builder, policy)
    findings = _findings(builder, flags, pairs, length_bias, q_severity)
    hints = _hints(builder, flags, pairs, findings, meta)
    # Rows, each counted once at its worst severity: `errors` = rows with an error-severity flag
    # (quarantined records too where quarantine is an error), `drops` = rows whose worst flag drops them,
    # `warnings` = rows whose worst is a warning (quarantined records in prepare). So errors + drops are
    # the pairs prepare drops by policy. Exceeded dataset limits are no rows: `limits_exceeded`. Every
    # renderer prints these numbers with their denominator, the rows in (render_common.counts_phrase).
    quarantined = builder.outcomes["quarantined"]
    errors = builder.rows_with["error"] + (quarantined if q_severity == "error" else 0)
    warnings = builder.rows_with["warn"] + (quarantined if q_severity == "warn" else 0)
    drops = builder.rows_with["drop"]
    limits_exceeded = sum(1 for f in findings if f["kind"] == "threshold" and f["exceeded"])
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "prefdata_version": __version__,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": meta.pop("command", None),
        "input": meta.pop("input", None),
        "tokenizer": meta.pop("tokenizer", None),
        "policy": _policy_section(policy),
        "status": "fail" if errors or limits_exceeded else ("warn" if (warnings or drops) else "pass"),
        "errors": errors,
        "warnings": warnings,
        "drops": drops,
        "limits_exceeded": limits_exceeded,
        "accounting": accounting,
        "outcomes": dict(builder.outcomes),
        "rows_checked": pairs,
        "rows_flagged": builder.flagged_rows_any,
        "findings": findings,
        "hints": hints,
        "flags": flags,
        "quarantine": _quarantine_section(builder, q_severity),
        "dataset": _dataset_section(builder),
        "lengths": {
            "unit": unit,
            "measured": ("before truncation" if builder.truncation_known else "as stored")
            if tokens
            else "normalized text",
            **{name: dist.to_dict() for name, dist in lengths_src.items()},
        },
        "truncation": _truncation_section(builder),
        "length_bias": {**length_bias, "limit": getattr(policy, "length_bias_limit", None)},
        "similarity": _similarity_section(builder, getattr(policy, "near_duplicate_threshold", None)),
        "scored": builder.scored.to_dict(),
        **({"length_balance": builder.length_balance} if builder.length_balance is not None else {}),
        **({"images": images} if images is not None else {}),
        **({"sources": sources_section(builder.by_source, list(builder.source_plans), accounting["rows_in"],
                                       accounting["rows_out"], builder.source_plans)}
           if builder.file_sources is not None else {}),
        "flagged_rows": flagged_rows,
        "flagged_rows_total": builder.flagged_total,
        "flagged_rows_complete": builder.flagged_total == len(builder.flagged),
    }
    if builder.benchmarks is not None:
        report["decontamination"] = _decontamination_section(builder)
    if meta:
        report["meta"] = meta
    return report


def _length_bias(builder: ReportBuilder, tokens: bool, pairs: int) -> dict[str, Any]:
    """Which half is longer, in the run's unit (tokens when rows were tokenized), both units, and
    over the kept pairs (what training sees)."""
    unit = "tokens" if tokens else "characters"
    bias = builder.bias["tokens" if tokens else "chars"]
    bias_total = sum(bias.values())
    return {
        "unit": unit,
        "pairs": bias_total,
        "chosen_longer": _share(bias["chosen"], bias_total),
        "rejected_longer": _share(bias["rejected"], bias_total),
        "equal": _share(bias["equal"], bias_total),
        # Both units, over every checked pair and over the kept ones (what training sees).
        "tokens": bias_dict(builder.bias["tokens"]) if tokens else None,
        "characters": bias_dict(builder.bias["chars"]),
        "kept": {
            # Only when every pair is tokenized: a run of rows checked in bulk cannot tell which
            # of its pairs a partial set of token rows belongs to.
            "tokens": bias_dict(builder.bias_kept["tokens"]) if tokens and builder.tokenized_rows == pairs else None,
            "characters": bias_dict(builder.bias_kept["chars"]),
        },
    }


def _flags(builder: ReportBuilder, policy: Any) -> dict[str, Any]:
    """Each flag raised, most frequent first: its count, its severity under the policy, examples."""
    return {
        flag: {
            "count": count,
            "severity": _severity(policy, flag),
            "examples": builder.flag_examples.get(flag, []),
        }
        for flag, count in sorted(builder.flag_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    }


def _accounting(builder: "ReportBuilder") -> dict[str, int]:
    """Row accounting from the report's own counts (validate; prepare passes its ledger's, the same
    numbers): rows, records, pairs and completions, as io.ledger.Ledger.accounting lays them out."""
    outcomes, scored = builder.outcomes, builder.scored
    kept, dropped, quarantined, unpaired = (outcomes[o] for o in ("kept", "dropped", "quarantined", "unpaired"))
    pairs_made = kept + dropped
    # A record of scored completions counts once however many pairs it made.
    records_paired = pairs_made - scored.pairs + scored.records_paired
    return {
        "rows_in": builder.rows,
        "rows_out": kept,
        "rows_dropped": dropped + unpaired,
        "rows_quarantined": quarantined,
        "records_in": records_paired + unpaired + quarantined,
        "records_paired": records_paired,
        "records_unpaired": unpaired,
        "records_quarantined": quarantined,
        "pairs_made": pairs_made,
        "pairs_kept": kept,
        "pairs_dropped": dropped,
        "scored_records": scored.records,
        "completions_in": scored.completions_in,
        "completions_paired": scored.completions_paired,
        "completions_unpaired": scored.completions_in - scored.completions_paired,
    }


def _findings(
    builder: "ReportBuilder", flags: dict[str, Any], pairs: int, length_bias: dict[str, Any], q_severity: str
) -> list[dict[str, Any]]:
    """Everything that can fail a check: flags at error severity, quarantine, exceeded thresholds."""
    findings: list[dict[str, Any]] = []
    for flag, info in flags.items():
        if info["severity"] in ("error", "warn", "drop"):
            findings.append({"kind": "flag", "name": flag, "severity": info["severity"], "count": info["count"]})
    quarantined = builder.outcomes["quarantined"]
    if quarantined:
        findings.append(
            {"kind": "quarantine", "name": "quarantined", "severity": q_severity, "count": quarantined}
        )
    # Same meaning as policy.dataset_limit_findings: flagged = any warn-or-worse flag (ignored flags
    # are already removed), length bias = share of pairs whose chosen half is longer.
    policy = builder.policy
    max_share = getattr(policy, "max_flagged_share", None)
    if max_share is not None and pairs:
        share = builder.flagged_rows_any / pairs
        findings.append(_threshold("max_flagged_share", share, max_share, share > max_share))
    bias_limit = getattr(policy, "length_bias_limit", None)
    if bias_limit is not None and length_bias["pairs"]:
        share = length_bias["chosen_longer"]
        findings.append(_threshold("length_bias", share, bias_limit, share > bias_limit))
    dropped_limit = getattr(policy, "max_dropped_share", None)
    if dropped_limit is not None and pairs:
        share = _policy_dropped(builder) / pairs
        findings.append(_threshold("max_dropped_share", share, dropped_limit, share > dropped_limit))
    order = {"error": 0, "drop": 1, "warn": 2, None: 3}
    findings.sort(key=lambda f: (order.get(f["severity"], 3), -f.get("count", 0), f["name"]))
    return findings


def _hints(
    builder: "ReportBuilder", flags: dict[str, Any], pairs: int, findings: list[dict[str, Any]], meta: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """report.hints: the main cause of an exceeded max_dropped_share, a template that drops what rows
    carry, and a missing --chat-template."""
    hints: list[dict[str, Any]] = []
    settings = meta.get("settings") or {}
    fitting = meta.get("bundled_templates") or ()  # made for the tokenizer's own template
    for finding in findings:
        if finding["name"] == "max_dropped_share" and finding["exceeded"]:
            balanced = {k: v for k, v in flags.items() if k != "length_balance"}  # asked for, not a cause
            hints.append(dropped_share_hint(balanced, _policy_dropped(builder), pairs, finding["limit"], settings, fitting))
    template = template_hint(flags, settings, fitting)
    if template is not None and not any(h.get("flag") == "reasoning_lost" for h in hints):  # said once
        hints.append(template)
    chat = chat_template_hint(builder.string_boundary_mismatches, pairs, meta)
    if chat is not None:
        hints.append(chat)
    return hints


def _policy_dropped(builder: "ReportBuilder") -> int:
    """Pairs the policy dropped: `--balance-length`'s subsample is not a sign of bad data or settings."""
    return builder.outcomes["dropped"] - builder.balance_dropped


def _flagged_rows(builder: "ReportBuilder", q_severity: str) -> list[dict[str, Any]]:
    files = builder.file_names()
    rows = []
    for digest, file_id, line, flags, severity, outcome, detail in builder.flagged:
        quarantined = outcome == "quarantined"
        detail_key = "error" if quarantined else "excerpt"
        rows.append(_FlaggedRow(digest, files[file_id], line, list(flags), q_severity if quarantined else severity,
                                outcome, detail_key, detail).__dict__)
    return rows


class _FlaggedRow:
    """Builds one flagged row's dict as an instance's `__dict__`: CPython lets such dicts share one
    key table, 248 bytes a row with its flags list against 384 for a dict literal (tracemalloc). A
    200k-pair prepare listing 68,800 flagged rows: 30 MiB instead of 36-39; the dicts stay plain
    dicts, JSON-able and in this key order."""

    def __init__(self, digest: str, source_file: str, line: int, flags: list[str], severity: str, outcome: str,
                 detail_key: str, detail: str | None) -> None:
        self.hash = digest
        self.source_file = source_file
        self.source_line = line
        self.flags = flags
        self.severity = severity
        self.outcome = outcome
        setattr(self, detail_key, detail)


def _quarantine_section(builder: "ReportBuilder", q_severity: str) -> dict[str, Any]:
    reasons = sorted(builder.quarantine_reasons.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return {
        "count": builder.outcomes["quarantined"],
        "severity": q_severity,
        "reasons": [{"reason": reason, "count": count, "rows": rows} for reason, (count, rows) in reasons],
        "other_reasons_count": builder.quarantine_other,
    }


def duplicate_groups(builder: "ReportBuilder", keys: array) -> dict[str, Any]:
    """Exact duplicate groups among 64-bit keys: rows involved, groups, and the largest groups."""
    import numpy as np

    if not len(keys):
        return {"groups": 0, "rows": 0, "extra_copies": 0, "top": []}
    values = np.frombuffer(keys, dtype=np.uint64)
    # Only keys that occur more than once matter: one plain sort finds them, and only their rows
    # get the (slower) stable sort that keeps the first occurrence first within a group.
    sorted_all = np.sort(values)
    repeated = np.unique(sorted_all[1:][sorted_all[1:] == sorted_all[:-1]])
    del sorted_all
    at = np.minimum(np.searchsorted(repeated, values), max(repeated.size - 1, 0))
    members = np.flatnonzero(repeated[at] == values) if repeated.size else np.zeros(0, dtype=np.int64)
    order = members[np.argsort(values[members], kind="stable")]
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]]) if order.size else order
    sizes = np.diff(np.r_[starts, len(order)])
    dup = np.flatnonzero(sizes > 1)
    rows_in_groups = int(sizes[dup].sum()) if len(dup) else 0
    # Largest first; ties by first appearance in the input.
    firsts = order[starts[dup]]
    ranked = sorted(zip((-sizes[dup]).tolist(), firsts.tolist(), starts[dup].tolist()))[:TOP_GROUPS]
    top = []
    for neg_size, _, start in ranked:
        members = sorted(order[start : start - neg_size].tolist())[:LINES_PER_GROUP]
        ordinals = [builder.pair_row[m] for m in members]
        top.append(
            {
                "count": -neg_size,
                "excerpt": builder.prompt_excerpts[ordinals[0]] if ordinals[0] < len(builder.prompt_excerpts) else None,
                "rows": [
                    {"source_file": loc["source_file"], "source_line": loc["source_line"]}
                    for loc in map(builder.location, ordinals)
                ],
            }
        )
    return {"groups": len(dup), "rows": rows_in_groups, "extra_copies": rows_in_groups - len(dup), "top": top}


def _dataset_section(builder: "ReportBuilder") -> dict[str, Any]:
    conflicting = builder.flag_counts.get("conflicting_pair", 0)
    return {
        "duplicate_prompts": duplicate_groups(builder, builder.prompt_key),
        "duplicate_pairs": duplicate_groups(builder, builder.pair_key),
        "conflicting_pairs": {
            "count": conflicting,
            "examples": builder.flag_examples.get("conflicting_pair", []),
            "note": "counted from the conflicting_pair flag (absent when the policy ignores it)",
        },
        "near_duplicate_prompts": {
            "method": "minhash",
            "computed": builder.near_duplicates_run,
            "threshold": getattr(builder.policy, "near_duplicate_prompt_threshold", None),
            "clusters": builder.near_duplicate_clusters,
            "rows": builder.near_duplicate_rows,
            "top": builder.near_duplicates,
        },
    }


def _truncation_section(builder: "ReportBuilder") -> dict[str, Any]:
    n = builder.tokenized_rows
    if not builder.truncation_known:
        return {"available": False, "rows": n, "reason": "stored ids are already truncated"}
    if not n:
        return {"available": False, "rows": 0, "reason": "no tokenizer"}
    return {
        "available": True,
        "rows": n,
        **{f"{name}_rate": _share(builder.truncated[name], n) for name in ("prompt", "chosen", "rejected", "any")},
        **{f"{name}_count": builder.truncated[name] for name in ("prompt", "chosen", "rejected", "any")},
    }


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def _threshold(name: str, value: float, limit: float, exceeded: bool) -> dict[str, Any]:
    return {
        "kind": "threshold",
        "name": name,
        "value": round(value, 6),
        "limit": limit,
        "exceeded": exceeded,
        "severity": "error" if exceeded else None,
        "count": 1 if exceeded else 0,
    }


def _severity(policy: Any, flag: str) -> str | None:
    if policy is None:
        return None
    try:
        return policy.severity(flag)
    except Exception:  # a flag the policy does not know (e.g. from an older OUT/)
        return None


def _policy_section(policy: Any) -> dict[str, Any] | None:
    if policy is None:
        return None
    source = getattr(policy, "source", None)
    settings = policy.to_dict() if hasattr(policy, "to_dict") else {}
    return {"source": str(source) if source is not None else None, "settings": settings}


def _similarity_section(builder: "ReportBuilder", threshold: float | None) -> dict[str, Any]:
    """The similarity sample, plus the pairs too long for the exact measure (checks.similarity)."""
    section = builder.similarity.to_dict(threshold)
    section["exact_limit"] = EXACT_LIMIT
    section["bounded"] = {"method": BOUNDED_METHOD, "rows": builder.bounded_rows, "examples": builder.bounded_examples}
    return section


def _decontamination_section(builder: "ReportBuilder") -> dict[str, Any]:
    """--decontaminate-against: the benchmarks, the run table's size, and for each flagged pair the
    benchmark item it overlaps (file, line, excerpt) and the overlapping words."""
    catalog = builder.benchmarks
    files = builder.file_names()
    matches = [
        {
            "source_file": files[file_id], "source_line": line, "outcome": outcome, **match.record(),
            "item_excerpt": catalog.excerpt(match.item),
        }
        for file_id, line, outcome, match in builder.benchmark_matches
    ]
    total = sum(builder.benchmark_pairs.values())
    return {
        **catalog.settings(),
        "normalization": "lowercase, punctuation deleted (ASCII and Unicode), split on whitespace (lm-eval-harness)",
        "benchmarks": [{**b, "pairs_flagged": builder.benchmark_pairs.get(b["path"], 0)} for b in catalog.benchmarks],
        "index": {
            "runs": catalog.runs,
            "bytes": catalog.index_bytes,
            "bytes_per_million_runs": round(catalog.index_bytes / catalog.runs * 1e6) if catalog.runs else 0,
        },
        "pairs_flagged": total,
        "matches": matches,
        "matches_complete": len(matches) == total,
    }
