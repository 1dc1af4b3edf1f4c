"""`--trainer axolotl`: axolotl's own preprocessing (axolotl.py, in axolotl's venv) on the rows, prefdata's
checks on what it trains on (axolotl_checks.py), as a TrainerRun for the report."""

from __future__ import annotations

from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.trainers.axolotl import TESTED_VERSION, INSTALL, AxolotlSettings, parse_axolotl_args, run_axolotl
from prefdata.trainers.axolotl_checks import axolotl_findings, double_bos_rows
from prefdata.trainers.common import TrainerRun


def parse_args(items: list[str] | None) -> AxolotlSettings:
    return parse_axolotl_args(items)


def run(rows: list[dict[str, Any]], tokenizer_path: str, trust_remote_code: bool,
        settings: AxolotlSettings, python: str | None = None) -> TrainerRun:
    from transformers import AutoTokenizer

    from prefdata.trainers.worker_process import trainer_python

    interpreter = trainer_python(python, "axolotl", "axolotl", INSTALL)
    try:
        runs = run_axolotl(rows, tokenizer_path, trust_remote_code, settings, interpreter)
    except PrefdataError as error:
        if not str(error).startswith("axolotl: "):
            raise
        # axolotl's own code stopped on the rows: `axolotl train` would stop there too
        hint = (" (a row with an empty prompt, chosen or rejected, which prefdata's empty_* flags name, or a "
                "response a trimming chat template made empty)"
                if "keys are required" in str(error) else "")
        raise PrefdataError(f"under axolotl: axolotl's preprocessing stops on this input with "
                            f"{str(error).removeprefix('axolotl: ')}{hint} (settings: {' '.join(settings.given())})") from None
    # Decodes axolotl's ids for the report (the same tokenizer files axolotl loaded).
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust_remote_code)
    notes = [f"TRL {runs.trl_version} under axolotl {runs.version} (prefdata tests axolotl {TESTED_VERSION})"]
    lost = [r for r in runs.main.dropped if r not in runs.full.pairs]
    if lost:
        notes.append(f"{len(lost)} rows axolotl leaves out whatever the length (e.g. row {lost[0] + 1})")
    doubled = double_bos_rows(runs, tokenizer.bos_token_id)
    if doubled:
        notes.append(f"{len(doubled)} pairs start with two BOS tokens (e.g. row {doubled[0] + 1}): the chat template "
                     "writes one and TRL's tokenizer call adds another; AxolotlDPOTrainer._tokenize, which removes it, "
                     "is not called by TRL 1.9's tokenize step; no axolotl setting avoids it")
    if settings.config.get("dataset_exact_deduplication"):
        notes.append("dataset_exact_deduplication: not run here (prefdata's duplicate_pair check reports duplicates)")
    return TrainerRun(
        trainer="axolotl", version=runs.version, tested_version=TESTED_VERSION, settings=settings.given(),
        rows=len(rows), pairs=runs.main.pairs, dropped=len(runs.main.dropped),
        findings=axolotl_findings(runs, settings, tokenizer, rows), tokenizer=tokenizer,
        length_fix="sequence_len: {}", notes=notes)
