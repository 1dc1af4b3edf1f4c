"""Learning-rate schedules: linear warmup, then cosine or linear decay to zero, or constant.

`total_steps` is the length the schedule spans. A plain `train` run spans its own steps; an online
run spans all its rounds (each round's `train` continues the run's optimizer and schedule), as TRL's
OnlineDPOTrainer keeps one schedule for the whole run. Past `total_steps` the rate stays at its end
value instead of turning back up (a cosine would).
"""

from __future__ import annotations

import math
from functools import partial

import torch

LR_SCHEDULES = ("cosine", "linear", "constant")


def lr_factor(step: int, *, kind: str, warmup_steps: int, total_steps: int) -> float:
    """The multiplier of the base learning rate before optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if kind == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine, as transformers' with num_cycles=0.5


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int,
                   total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over `lr_factor`; a partial (not a lambda) so its state_dict round-trips."""
    if kind not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {kind!r} ({', '.join(LR_SCHEDULES)})")
    factor = partial(lr_factor, kind=kind, warmup_steps=warmup_steps, total_steps=total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
