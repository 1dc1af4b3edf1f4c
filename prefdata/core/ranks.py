"""Which torchrun process this is. Under torchrun every rank runs the same command; only rank 0
talks to the user (summaries, progress bars, warnings, hints) and writes OUT's and --output's files,
so a run on N GPUs reads like a run on one."""

from __future__ import annotations

import os


def process_rank() -> int:
    """This process's global rank from torchrun's environment (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0") or 0)


def is_main_process() -> bool:
    return process_rank() == 0
