"""`--trainer openrlhf`: OpenRLHF's own preprocessing (openrlhf.py) on the rows, prefdata's checks on
what it trains on (checks.py), as a TrainerRun for the report."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.trainers.checks import needs_untruncated, openrlhf_findings
from prefdata.trainers.common import TrainerRun
from prefdata.trainers.openrlhf import (
    TESTED_VERSION,
    UNLIMITED,
    OpenRLHFOutcome,
    OpenRLHFSettings,
    openrlhf_version,
    parse_openrlhf_args,
    run_openrlhf,
)


def parse_args(items: list[str] | None) -> OpenRLHFSettings:
    return parse_openrlhf_args(items)


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


def run(rows: list[dict[str, Any]], tokenizer_path: str, trust_remote_code: bool,
        settings: OpenRLHFSettings, python: str | None = None) -> TrainerRun:
    if python is not None:
        raise PrefdataError("--trainer-python is for trainers that run in their own environment (llamafactory, "
                            "axolotl); OpenRLHF's preprocessing runs in prefdata's (pip install --no-deps openrlhf)")
    tokenizer = openrlhf_tokenizer(tokenizer_path, trust_remote_code)
    outcome = run_openrlhf(rows, tokenizer, settings)
    again = sorted([*outcome.dropped, *(i for i, pair in outcome.pairs.items() if needs_untruncated(pair, settings))])
    full = OpenRLHFOutcome()
    if again:  # OpenRLHF once more with no limit, on the rows it dropped or may have cut: what the limit took
        unlimited = run_openrlhf([rows[i] for i in again], tokenizer, replace(settings, max_len=UNLIMITED))
        full.pairs = {again[k]: pair for k, pair in unlimited.pairs.items()}
    return TrainerRun(
        trainer="openrlhf", version=openrlhf_version(), tested_version=TESTED_VERSION, settings=settings.given(),
        rows=len(rows), pairs=outcome.pairs, dropped=len(outcome.dropped),
        findings=openrlhf_findings(outcome, full, settings, tokenizer, rows), tokenizer=tokenizer,
        length_fix="--data.max_len {}")
