"""The report dict as Markdown: tables a pull request comment or a GitHub step summary can show."""

from __future__ import annotations

from typing import Any, Mapping

from prefdata.report.render_trainer import trainer_markdown
from prefdata.report.render_images import images_markdown
from prefdata.report.render_scored import scored_markdown
from prefdata.report.render_common import (
    bounded_line,
    counts_phrase,
    FLAG_MEANINGS,
    Report,
    flag_share,
    flags_by_severity,
    headline,
    hint_lines,
    loc,
    locs,
    num,
    pct,
    status_word,
    threshold_findings,
    threshold_value,
)
from prefdata.report.render_common import balance_line, length_bias_units_line, source_cells


def _md_escape(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _spark(counts: list[int]) -> str:
    """A histogram as one line of block characters (Markdown has no plots)."""
    blocks = " ▁▂▃▄▅▆▇█"
    peak = max(counts) if counts else 0
    if not peak:
        return ""
    return "".join(blocks[0 if c == 0 else max(1, round(c / peak * 8))] for c in counts)


def render_markdown(report: Report, *, max_flagged_examples: int = 5) -> str:
    out = _md_summary(report)
    out += _md_limits(report)
    out += _md_hints(report)
    out += _md_baseline(report.get("baseline"))
    out += _md_flags(report, max_flagged_examples)
    out += trainer_markdown(report)  # validate --trainer: what that trainer trains on
    out += _md_quarantine(report.get("quarantine", {}))
    out += scored_markdown(report, _spark)
    out += _md_decontamination(report.get("decontamination"))
    out += _md_dataset(report.get("dataset", {}))
    out += _md_lengths(report.get("lengths", {}))
    out += images_markdown(report)
    out += _md_truncation_bias_similarity(report)
    out += _md_sources(report.get("sources"))
    out += ["", f"<sub>prefdata {report.get('prefdata_version')} · report schema {report.get('schema_version')} · {report.get('generated_at')}</sub>", ""]
    return "\n".join(out)


def _md_summary(report: Report) -> list[str]:
    status = report.get("status", "pass")
    icon = {"pass": "✅", "warn": "⚠️", "fail": "❌"}.get(status, "")
    return [
        f"## {icon} prefdata {report.get('command') or 'report'}: {status_word(report)}",
        "",
        f"`{_md_escape(report.get('input'))}` — {headline(report)}. "
        f"**{counts_phrase(report)}**. "
        f"Policy: `{_md_escape((report.get('policy') or {}).get('source'))}`.",
        "",
    ]


def _md_limits(report: Report) -> list[str]:
    limits = threshold_findings(report)
    if not limits:
        return []
    out = ["| limit | value | max | |", "| --- | ---: | ---: | --- |"]
    for f in limits:
        mark = "❌ exceeded" if f.get("exceeded") else "ok"
        out.append(f"| `{f['name']}` | {threshold_value(f, report)} | {pct(f['limit'])} | {mark} |")
    out.append("")
    return out


def _md_hints(report: Report) -> list[str]:
    return [line for hint in hint_lines(report) for line in (f"**Hint:** {_md_escape(hint)}", "")]


def _md_baseline(baseline: Mapping[str, Any] | None) -> list[str]:
    if not baseline:
        return []
    out = [
        "### Changes against the baseline",
        "",
        f"{baseline['new_flagged_rows']:,} new flagged rows ({baseline['new_error_rows']:,} at error severity), "
        f"{baseline['resolved_rows']:,} resolved; **{baseline['regressions']:,} regressions**"
        + (f"; limits newly exceeded: {', '.join(baseline['new_thresholds_exceeded'])}" if baseline["new_thresholds_exceeded"] else "")
        + ".",
        "",
    ]
    changed = {k: v for k, v in baseline.get("flag_deltas", {}).items() if v["delta"]}
    if changed:
        out += ["| flag | before | after | change |", "| --- | ---: | ---: | ---: |"]
        for name, d in changed.items():
            out.append(f"| `{name}` | {d['before']:,} | {d['after']:,} | {d['delta']:+,} |")
        out.append("")
    if baseline.get("new_rows"):
        out += ["| new finding | where | severity |", "| --- | --- | --- |"]
        for row in baseline["new_rows"][:20]:
            out.append(f"| {', '.join(f'`{f}`' for f in row['new_flags'])} | `{_md_escape(loc(row))}` | {row.get('severity') or '-'} |")
        if len(baseline["new_rows"]) > 20:
            out.append(f"| … {len(baseline['new_rows']) - 20:,} more | | |")
        out.append("")
    return out


def _md_flags(report: Report, max_flagged_examples: int) -> list[str]:
    entries = flags_by_severity(report)  # quarantined records included, as the headline counts them
    out = ["### Flags", ""]
    if entries:
        out += ["| flag | severity | rows | share | meaning | examples |", "| --- | --- | ---: | ---: | --- | --- |"]
        for name, info in entries:
            examples = "<br>".join(
                f"`{_md_escape(loc(e))}` {_md_escape(e.get('prompt', ''))[:60]}" for e in info.get("examples", [])[:max_flagged_examples]
            )
            out.append(
                f"| `{name}` | {info.get('severity') or '-'} | {info['count']:,} | {flag_share(report, name, info['count'])} "
                f"| {FLAG_MEANINGS.get(name, '')} | {examples} |"
            )
    else:
        out.append("No flagged rows.")
    out.append("")
    return out


def _md_decontamination(section: Mapping[str, Any] | None, limit: int = 50) -> list[str]:
    """Per benchmark its items and flagged pairs, then each flagged pair with the item it overlaps."""
    if not section:
        return []
    index = section.get("index", {})
    out = [
        "### Decontamination",
        "",
        f"{section['pairs_flagged']:,} pairs share a {section['ngram']}-word run with a benchmark item "
        f"({'prompt and completions' if section.get('completions') else 'prompt'} checked; "
        f"{index.get('runs', 0):,} benchmark runs, {index.get('bytes', 0) / 2**20:.1f} MiB).",
        "",
        "| benchmark | items | too short | without text | pairs flagged |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for b in section.get("benchmarks", []):
        out.append(f"| `{_md_escape(b['path'])}` | {b['items']:,} | {b['items_short']:,} | {b['items_without_text']:,} | {b['pairs_flagged']:,} |")
    matches = section.get("matches", [])
    if matches:
        out += ["", "| pair | half | benchmark item | item excerpt | overlap |", "| --- | --- | --- | --- | --- |"]
        for m in matches[:limit]:
            out.append(
                f"| `{_md_escape(loc(m))}` | {m['half']} | `{_md_escape(m['item_file'])}:{m['item_line']}` "
                f"| {_md_escape(m['item_excerpt'])[:80]} | {_md_escape(m['overlap'])[:80]} |"
            )
        if len(matches) > limit or not section.get("matches_complete", True):
            out.append(f"| … {section['pairs_flagged'] - min(limit, len(matches)):,} more (report.json lists them) | | | | |")
    out.append("")
    return out


def _md_quarantine(quarantine: Mapping[str, Any]) -> list[str]:
    if not quarantine.get("count"):
        return []
    out = ["### Quarantined records", "", "| reason | rows | lines |", "| --- | ---: | --- |"]
    for reason in quarantine.get("reasons", []):
        out.append(f"| {_md_escape(reason['reason'])} | {reason['count']:,} | `{_md_escape(locs(reason['rows']))}` |")
    if quarantine.get("other_reasons_count"):
        out.append(f"| other reasons | {quarantine['other_reasons_count']:,} | |")
    out.append("")
    return out


def _md_dataset(dataset: Mapping[str, Any]) -> list[str]:
    if not dataset:
        return []
    dp, dpair = dataset.get("duplicate_prompts", {}), dataset.get("duplicate_pairs", {})
    conf, near = dataset.get("conflicting_pairs", {}), dataset.get("near_duplicate_prompts", {})
    return [
        "### Dataset-wide",
        "",
        "| check | groups | rows | largest groups (lines) |",
        "| --- | ---: | ---: | --- |",
        f"| exact duplicate prompts | {dp.get('groups', 0):,} | {dp.get('rows', 0):,} | {_groups_md(dp.get('top', []))} |",
        f"| exact duplicate pairs | {dpair.get('groups', 0):,} | {dpair.get('rows', 0):,} | {_groups_md(dpair.get('top', []))} |",
        f"| conflicting pairs (swapped) | – | {conf.get('count', 0):,} | {_md_escape(locs(conf.get('examples', [])))} |",
        f"| near-duplicate prompts (MinHash ≥ {near.get('threshold')}) | {near.get('clusters', 0):,} | {near.get('rows', 0):,} | "
        + "; ".join(_md_escape(locs(c["rows"], 3)) + f" ({c['size']})" for c in near.get("top", [])[:3])
        + " |",
        "",
    ]


def _groups_md(top: list[Mapping[str, Any]]) -> str:
    return "; ".join(
        f"{g['count']}× `{_md_escape(locs(g['rows'], 3))}`" + (f" “{_md_escape(g['excerpt'][:40])}”" if g.get("excerpt") else "")
        for g in top[:3]
    )


def _md_lengths(lengths: Mapping[str, Any]) -> list[str]:
    if not lengths:
        return []
    out = [
        f"### Lengths ({lengths.get('unit')}, {lengths.get('measured')})",
        "",
        "| | mean | p5 | p50 | p95 | p99 | max | histogram |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in ("prompt", "chosen", "rejected"):
        d = lengths.get(name, {})
        if not d.get("count"):
            continue
        q = d["quantiles"]
        out.append(
            f"| {name} | {num(d['mean'])} | {q['p5']:,} | {q['p50']:,} | {q['p95']:,} | {q['p99']:,} | {d['max']:,} | `{_spark(d['histogram']['counts'])}` |"
        )
    out.append("")
    return out


def _md_truncation_bias_similarity(report: Report) -> list[str]:
    trunc = report.get("truncation", {})
    bias = report.get("length_bias", {})
    sim = report.get("similarity", {})
    out = ["### Truncation, length bias, similarity", ""]
    if trunc.get("available"):
        out.append(
            f"- Truncated: prompt {pct(trunc['prompt_rate'])}, chosen {pct(trunc['chosen_rate'])}, "
            f"rejected {pct(trunc['rejected_rate'])} (any: {pct(trunc['any_rate'])} of {trunc['rows']:,} tokenized pairs)."
        )
    else:
        out.append(f"- Truncation: not measured ({trunc.get('reason', 'no tokenizer')}).")
    if bias.get("pairs"):
        out.append(
            f"- Length bias ({bias['unit']}): chosen longer in {pct(bias['chosen_longer'])}, rejected longer in "
            f"{pct(bias['rejected_longer'])}, equal in {pct(bias['equal'])} of {bias['pairs']:,} pairs"
            + (f" (limit {pct(bias['limit'])})." if bias.get("limit") is not None else ".")
        )
    units = length_bias_units_line(bias)
    if units:
        out.append(f"- Chosen longer {units}.")
    if report.get("length_balance"):
        out.append(f"- {_md_escape(balance_line(report['length_balance']))}.")
    if sim.get("rows_measured"):
        sampled = f" (sample of {sim['rows_measured']:,} of {sim['rows_total']:,})" if sim.get("sampled") else ""
        out.append(
            f"- Chosen/rejected similarity{sampled}: mean {sim['mean']:.3f}, median {sim['quantiles']['p50']:.3f}, "
            f"p95 {sim['quantiles']['p95']:.3f}; `{_spark(sim['histogram']['counts'])}` over 0…1"
            + (f"; {pct(sim['share_at_or_above_threshold'])} at or above {sim['threshold']}" if "threshold" in sim else "")
            + "."
        )
    if bounded_line(report):
        line = _md_escape(bounded_line(report))
        out.append(f"- {line[:1].upper()}{line[1:]}.")
    return out


def _md_sources(sources: list[Mapping[str, Any]] | None) -> list[str]:
    """A mixture's per-source table (report.json `sources`)."""
    if not sources:
        return []
    out = [
        "",
        "### Sources",
        "",
        "| source | asked | rows in | kept | dropped | quarantined | share of kept | chosen longer (tokens) | "
        "chosen longer (characters) | tokens p50 prompt / chosen / rejected | flags |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for row in sources:
        out.append(
            "| " + " | ".join(_md_escape(cell) for cell in source_cells(row)[:10])
            + " | " + (", ".join(f"`{name}` {n:,}" for name, n in list(row["flags"].items())[:4]) or "–") + " |"
        )
    out.append("")
    return out
