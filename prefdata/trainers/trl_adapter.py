"""`--trainer trl`: TRL's own DPO data preparation (trl_run.py) on the rows, in prefdata's process, with the
DPOConfig settings given (trl_settings.py), prefdata's checks on what it trains on (trl_checks.py), as a
TrainerRun for the report.

This is for raw rows given to TRL's own `trl.DPOTrainer`, which tokenizes them itself. An OUT handed over
with `prefdata.trl.DPOTrainer` is not tokenized again: TRL trains on OUT's ids (docs/trainers.md).
"""

from __future__ import annotations

from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.trainers.common import TrainerRun
from prefdata.trainers.trl_checks import trl_findings
from prefdata.trainers.trl_run import run_trl, trl_tokenizer
from prefdata.trainers.trl_settings import TESTED_VERSION, TRLSettings, parse_trl_args, trl_version


def parse_args(items: list[str] | None) -> TRLSettings:
    return parse_trl_args(items)


def run(rows: list[dict[str, Any]], tokenizer_path: str, trust_remote_code: bool,
        settings: TRLSettings, python: str | None = None) -> TrainerRun:
    if python is not None:
        raise PrefdataError("--trainer-python is for trainers that run in their own environment (llamafactory, "
                            "axolotl); TRL's data preparation runs in prefdata's (pip install \"prefdata[trl]\")")
    tokenizer = trl_tokenizer(tokenizer_path, trust_remote_code)
    outcome = run_trl(rows, tokenizer, settings)
    return TrainerRun(
        trainer="trl", version=trl_version(), tested_version=TESTED_VERSION, settings=settings.given(),
        rows=len(rows), pairs=outcome.pairs, dropped=len(outcome.dropped),
        findings=trl_findings(outcome, settings, tokenizer), tokenizer=tokenizer,
        length_fix="max_length={}", notes=outcome.notes)
