"""`validate --trainer openrlhf`: the rows through OpenRLHF's own preprocessing, prefdata's pair checks
on what comes out, and its ids beside prefdata's, as the report's `trainer` section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefdata.checks.policy import SEVERITY_RANK, Policy
from prefdata.core.errors import PrefdataError, RecordError
from prefdata.core.records import TokenizedPair
from prefdata.trainers import TRAINERS
from prefdata.trainers.checks import TrainerFinding, needs_untruncated, openrlhf_findings
from prefdata.trainers.compare import compare_ids
from prefdata.trainers.openrlhf import (
    TESTED_VERSION,
    UNLIMITED,
    OpenRLHFOutcome,
    OpenRLHFSettings,
    openrlhf_version,
    parse_openrlhf_args,
    run_openrlhf,
)

EXAMPLES = 5


def check_trainer_arguments(trainer: str | None, trainer_args: list[str] | None, tokenizer: str | None,
                            prepared: bool, plain_file: bool) -> OpenRLHFSettings | None:
    """The trainer's settings, checked before any work; None without --trainer."""
    if trainer is None:
        if trainer_args:
            raise PrefdataError("--trainer-arg needs --trainer (which trainer reads these settings)")
        return None
    if trainer not in TRAINERS:
        raise PrefdataError(f"--trainer must be one of {', '.join(TRAINERS)}, got {trainer!r}")
    if not tokenizer:
        raise PrefdataError(f"--trainer {trainer} needs --tokenizer (the tokenizer {trainer} trains with)")
    if prepared or not plain_file:
        raise PrefdataError(f"--trainer {trainer} reads raw rows from files, as {trainer} does "
                            "(not a prepared OUT/, a Hub id or a mix file)")
    return parse_openrlhf_args(trainer_args)


def openrlhf_tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The tokenizer as OpenRLHF's train_dpo.py gets it (get_tokenizer(..., "right")): right padding and
    EOS as PAD when there is none. Loaded here with prefdata's trust setting, not get_tokenizer's
    trust_remote_code=True; the padding only fills positions both masks leave out."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, use_fast=True)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def trainer_section(input_path: Path, settings: OpenRLHFSettings, tokenizer_path: str, trust_remote_code: bool,
                    pair_tokenizer: Any, policy: Policy) -> dict[str, Any]:
    """The report's `trainer` section for OpenRLHF: settings, findings by flag (severity from `policy`),
    rows at error severity, and the ids comparison with prefdata's."""
    from prefdata.io.formats import normalize_record
    from prefdata.io.readers import iter_raw_records

    records = [r for r in iter_raw_records(input_path) if r.error is None and type(r.value) is dict]
    where = {i: {"source_file": r.source_file, "source_line": r.source_line} for i, r in enumerate(records)}
    tokenizer = openrlhf_tokenizer(tokenizer_path, trust_remote_code)
    rows = [r.value for r in records]
    outcome = run_openrlhf(rows, tokenizer, settings)
    again = sorted([*outcome.dropped, *(i for i, pair in outcome.pairs.items() if needs_untruncated(pair, settings))])
    full = OpenRLHFOutcome()
    if again:  # OpenRLHF once more with no limit, on the rows it dropped or may have cut: what the limit took
        from dataclasses import replace

        unlimited = run_openrlhf([rows[i] for i in again], tokenizer, replace(settings, max_len=UNLIMITED))
        full.pairs = {again[k]: pair for k, pair in unlimited.pairs.items()}
    findings = openrlhf_findings(outcome, full, settings, tokenizer, rows)
    ours = _prefdata_ids(records, pair_tokenizer, normalize_record)
    return {
        "trainer": "openrlhf",
        "version": openrlhf_version(),
        "tested_version": TESTED_VERSION,
        "settings": settings.given(),
        "rows": len(rows),
        "trained_pairs": len(outcome.pairs),
        "dropped_rows": len(outcome.dropped),
        **_by_flag(findings, policy, where),
        "comparison": compare_ids(ours, outcome.pairs, tokenizer, where),
    }


def _prefdata_ids(records: list[Any], pair_tokenizer: Any, normalize: Any) -> dict[int, TokenizedPair]:
    """prefdata's final ids for each row that makes one pair (as validate/prepare tokenize it)."""
    pairs, rows = [], []
    for index, record in enumerate(records):
        try:
            pairs.append(normalize(record))
        except RecordError:
            continue
        rows.append(index)
    out: dict[int, TokenizedPair] = {}
    for row, tokenized in zip(rows, pair_tokenizer.tokenize_pairs_or_errors(pairs)):
        if isinstance(tokenized, TokenizedPair):
            out[row] = tokenized
    return out


def _by_flag(findings: list[TrainerFinding], policy: Policy, where: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Findings grouped by flag at the policy's severity (ignored flags left out), with the one setting
    that avoids them all; `errors`: rows with an error-severity finding (they fail validate)."""
    groups: dict[str, list[TrainerFinding]] = {}
    for finding in findings:
        if policy.severity(finding.flag) != "ignore":
            groups.setdefault(finding.flag, []).append(finding)
    out = []
    for flag, items in groups.items():
        lengths = [f.fix for f in items if isinstance(f.fix, int)]
        words = sorted({f.fix for f in items if isinstance(f.fix, str)})
        fix = ([f"--data.max_len {max(lengths)}"] if lengths else []) + words
        out.append({
            "flag": flag, "severity": policy.severity(flag), "rows": len({f.row for f in items}),
            "cause": sorted({f.cause for f in items}), "fix": fix,
            "examples": [{**where[f.row], "detail": f.detail} for f in items[:EXAMPLES]],
        })
    out.sort(key=lambda g: (-SEVERITY_RANK[g["severity"]], -g["rows"], g["flag"]))
    errors = {f.row for f in findings if policy.severity(f.flag) == "error"}
    return {"findings": out, "errors": len(errors)}
