"""`--trainer llamafactory`: LLaMA-Factory's own DPO preprocessing (llamafactory.py, in its own venv), prefdata's
checks on what it trains on (llamafactory_checks.py), as a TrainerRun for the report."""

from __future__ import annotations

from typing import Any

from prefdata.trainers.common import TrainerRun
from prefdata.trainers.llamafactory import (
    TESTED_VERSION,
    LlamaFactorySettings,
    dataset_entry,
    parse_llamafactory_args,
    run_llamafactory,
)
from prefdata.trainers.llamafactory_checks import llamafactory_findings


def parse_args(items: list[str] | None) -> LlamaFactorySettings:
    return parse_llamafactory_args(items)


def run(rows: list[dict[str, Any]], tokenizer_path: str, trust_remote_code: bool,
        settings: LlamaFactorySettings, python: str | None = None) -> TrainerRun:
    from transformers import AutoTokenizer

    entry = dataset_entry(settings, rows)
    outcome = run_llamafactory(rows, tokenizer_path, trust_remote_code, settings, python, entry)
    # decodes LLaMA-Factory's ids for the report (its load_tokenizer reads the same files)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust_remote_code)
    columns = ", ".join(f"{k}={v}" for k, v in entry.get("columns", {}).items())
    notes = [f"rows read as dataset_info entry: formatting {entry.get('formatting', 'alpaca')}, ranking true, "
             f"columns {columns}" + (f", tags {entry['tags']}" if entry.get("tags") else "")]
    if outcome.version != TESTED_VERSION:
        notes.append(f"LLaMA-Factory {outcome.version} ran; prefdata is tested with {TESTED_VERSION}")
    return TrainerRun(
        trainer="llamafactory", version=outcome.version, tested_version=TESTED_VERSION, settings=settings.given(),
        rows=len(rows), pairs=outcome.pairs, dropped=len(outcome.dropped),
        findings=llamafactory_findings(outcome, settings, tokenizer), tokenizer=tokenizer,
        length_fix="cutoff_len: {}", notes=notes)
