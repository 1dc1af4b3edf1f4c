"""`validate|prepare --trainer NAME`: the rows through that trainer's own preprocessing (its adapter,
prefdata.core.trainer_names), prefdata's pair checks on what comes out, and its ids beside prefdata's,
as the report's `trainer` section."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from prefdata.checks.policy import SEVERITY_RANK, Policy
from prefdata.core.errors import PrefdataError, RecordError
from prefdata.core.records import TokenizedPair
from prefdata.core.trainer_names import TRAINER_ADAPTERS, TRAINERS
from prefdata.trainers.common import TrainerFinding, TrainerRun
from prefdata.trainers.compare import compare_ids

EXAMPLES = 5


@dataclass(frozen=True)
class TrainerChoice:
    """--trainer and its --trainer-arg settings, parsed by the trainer's adapter."""

    name: str
    settings: Any
    python: str | None = None  # --trainer-python: the trainer's own environment (adapters that run in a child process)


def adapter(name: str) -> ModuleType:
    return importlib.import_module(TRAINER_ADAPTERS[name])


def check_trainer_arguments(trainer: str | None, trainer_args: list[str] | None, trainer_python: str | None,
                            tokenizer: str | None, prepared: bool, plain_file: bool) -> TrainerChoice | None:
    """The trainer's settings, checked before any work; None without --trainer."""
    if trainer is None:
        if trainer_args or trainer_python:
            raise PrefdataError(f"{'--trainer-arg' if trainer_args else '--trainer-python'} needs --trainer "
                                "(which trainer it is for)")
        return None
    if trainer not in TRAINERS:
        raise PrefdataError(f"--trainer must be one of {', '.join(TRAINERS)}, got {trainer!r}")
    if not tokenizer:
        raise PrefdataError(f"--trainer {trainer} needs --tokenizer (the tokenizer {trainer} trains with)")
    if prepared or not plain_file:
        raise PrefdataError(f"--trainer {trainer} reads raw rows from files, as {trainer} does "
                            "(not a prepared OUT/, a Hub id or a mix file)")
    return TrainerChoice(trainer, adapter(trainer).parse_args(trainer_args), trainer_python)


def trainer_section(input_path: Path, choice: TrainerChoice, tokenizer_path: str, trust_remote_code: bool,
                    pair_tokenizer: Any, policy: Policy) -> dict[str, Any]:
    """The report's `trainer` section: settings, findings by flag (severity from `policy`), rows at error
    severity, and the ids comparison with prefdata's."""
    from prefdata.io.formats import normalize_record
    from prefdata.io.readers import iter_raw_records

    records = [r for r in iter_raw_records(input_path) if r.error is None and type(r.value) is dict]
    where = {i: {"source_file": r.source_file, "source_line": r.source_line} for i, r in enumerate(records)}
    rows = [r.value for r in records]
    result: TrainerRun = adapter(choice.name).run(rows, tokenizer_path, trust_remote_code, choice.settings,
                                                  python=choice.python)
    ours = _prefdata_ids(records, pair_tokenizer, normalize_record)
    return {
        "trainer": result.trainer,
        "version": result.version,
        "tested_version": result.tested_version,
        "settings": result.settings,
        "rows": result.rows,
        "trained_pairs": len(result.pairs),
        "dropped_rows": result.dropped,
        "notes": result.notes,
        **_by_flag(result.findings, policy, where, result.length_fix),
        "comparison": compare_ids(ours, result.pairs, result.tokenizer, where),
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


def _by_flag(findings: list[TrainerFinding], policy: Policy, where: dict[int, dict[str, Any]],
             length_fix: str) -> dict[str, Any]:
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
        fix = ([length_fix.format(max(lengths))] if lengths else []) + words
        out.append({
            "flag": flag, "severity": policy.severity(flag), "rows": len({f.row for f in items}),
            "cause": sorted({f.cause for f in items}), "fix": fix,
            "examples": [{**where[f.row], "detail": f.detail} for f in items[:EXAMPLES]],
        })
    out.sort(key=lambda g: (-SEVERITY_RANK[g["severity"]], -g["rows"], g["flag"]))
    errors = {f.row for f in findings if policy.severity(f.flag) == "error"}
    return {"findings": out, "errors": len(errors)}
