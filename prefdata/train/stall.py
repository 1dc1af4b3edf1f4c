"""Stall detector: notice when DPO is not learning and say why it probably isn't.

A DPO run whose loss sits at its zero-margin value (ln 2 for sigmoid/robust) with near-zero reward
margins, or whose gradient is exactly zero, is training on nothing: identical pairs forced through,
pairs that became identical after truncation, loss masks that cover nothing, a learning rate of 0.
Other stacks keep printing 0.6931 for hours; this turns it into one warning plus a
`{"event": "stall", ...}` line in metrics.jsonl, with the flag counts that point at the cause.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError

LN2 = math.log(2.0)

# Flags whose pairs carry no (or a misleading) preference signal when forced through a policy.
SIGNAL_FREE_FLAGS: tuple[str, ...] = (
    F.IDENTICAL,
    F.WHITESPACE_ONLY,
    F.IDENTICAL_AFTER_TRUNCATION,
    F.NO_COMPLETION_TOKENS,
    F.EMPTY_CHOSEN,
    F.EMPTY_REJECTED,
    F.CONFLICTING_PAIR,
    F.NEAR_DUPLICATE,
    F.DUPLICATE_PAIR,
)


class TrainingStalled(PrefdataError):
    """Raised with --fail-on-stall. Exit code 1: a finding, not a usage error."""

    exit_code = 1


class TrainingDiverged(PrefdataError):
    """A step's loss or gradient norm is not finite (or the parameters are not): the run stops before
    the optimizer or a save sees it. Exit code 1: a finding about the run, not a usage error."""

    exit_code = 1


_ADVICE = "nothing of this step is saved: lower --lr, or check OUT's weight/offset and ref columns"


def require_finite_step(step: int, loss: float, grad_norm: float, data: Any, rows: list[int]) -> None:
    """TrainingDiverged (one line naming the step, and the pairs whose loss is not finite) unless the
    step's summed loss and its gradient norm are finite."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    where = ""
    if rows:
        shown = data.sources_of(rows[:3]) if hasattr(data, "sources_of") else [f"row {row}" for row in rows[:3]]
        where = f" on {len(rows)} pair(s), first at {', '.join(shown)}"
    raise TrainingDiverged(f"training stopped at step {step}: the loss is {loss:g} and the gradient norm "
                           f"{grad_norm:g}{where}; {_ADVICE}")


def require_finite_parameters(params: list[Any], step: int) -> None:
    """TrainingDiverged unless every parameter is finite (checked before the model is saved)."""
    import torch

    with torch.no_grad():
        if all(bool(torch.isfinite(p).all()) for p in params):
            return
    raise TrainingDiverged(f"training stopped after step {step}: the parameters are no longer finite; {_ADVICE}")


@dataclass
class StallDetector:
    """Counts consecutive stalled optimizer steps; fires once per stall after `steps` of them.

    A step is stalled when the loss is within `loss_tol` of `zero_margin_loss` (what the loss is when
    chosen and rejected score alike) and the mean |reward margin| is below `margin_tol`, or when the
    gradient norm is (numerically) zero. With ODPO offsets each pair's zero-margin loss is its own
    (-logσ(-δ) for sigmoid): `zero_margin_by_row` holds them by OUT row, and a step compares its loss
    with the mean over its pairs.
    """

    steps: int = 20
    zero_margin_loss: float = LN2
    loss_tol: float = 1e-3
    margin_tol: float = 1e-3
    grad_tol: float = 1e-12
    flag_counts: dict[str, int] = field(default_factory=dict)
    identical_pairs: int | None = None  # rows whose chosen_ids == rejected_ids in the training data
    num_pairs: int | None = None
    lr: float | None = None
    zero_margin_by_row: Any = None  # numpy array by OUT row when pairs carry offsets, else None
    _run: int = 0
    _fired: bool = False
    _window: deque = field(default_factory=lambda: deque(maxlen=1))

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"stall steps must be >= 1, got {self.steps}")
        self._window = deque(maxlen=self.steps)

    def zero_margin_for(self, rows: list[int] | None) -> float:
        """The zero-margin loss of a step over `rows` (OUT row indices): the mean of the pairs' own
        values with offsets, else the loss's one value."""
        if self.zero_margin_by_row is None or not rows:
            return self.zero_margin_loss
        return float(self.zero_margin_by_row[rows].mean())

    def is_stalled_step(self, loss: float, mean_abs_margin: float, grad_norm: float,
                        zero_margin_loss: float | None = None) -> bool:
        zero = self.zero_margin_loss if zero_margin_loss is None else zero_margin_loss
        flat_loss = abs(loss - zero) <= self.loss_tol and mean_abs_margin <= self.margin_tol
        no_gradient = math.isfinite(grad_norm) and grad_norm <= self.grad_tol
        return flat_loss or no_gradient

    def update(self, step: int, loss: float, mean_abs_margin: float, grad_norm: float, lr: float,
               rows: list[int] | None = None) -> dict[str, Any] | None:
        """Feed one optimizer step (over the OUT rows `rows`); returns the stall event the first time
        the run reaches `steps`."""
        zero = self.zero_margin_for(rows)
        if not self.is_stalled_step(loss, mean_abs_margin, grad_norm, zero):
            self._run = 0
            self._fired = False  # a later, separate stall is reported again
            self._window.clear()
            return None
        self._run += 1
        self._window.append((loss, mean_abs_margin, grad_norm, lr, zero))
        if self._run < self.steps or self._fired:
            return None
        self._fired = True
        return self._event(step)

    def finish(self, step: int, steps_run: int) -> dict[str, Any] | None:
        """At the end of a run: a run shorter than `steps` whose every step stalled never reached the
        threshold, yet learned nothing (a few steps at a small learning rate end at 0.6931): its
        stall event, once, or None."""
        # One step proves nothing: its loss is measured before its update, at ln 2 in every run.
        if self._fired or steps_run < 2 or self._run < steps_run or self._run >= self.steps:
            return None
        self._fired = True
        return self._event(step, short_run=True)

    def _event(self, step: int, short_run: bool = False) -> dict[str, Any]:
        n = len(self._window)
        mean_loss = sum(w[0] for w in self._window) / n
        mean_margin = sum(w[1] for w in self._window) / n
        max_grad = max(w[2] for w in self._window)
        max_lr = max(w[3] for w in self._window)
        causes = self.likely_causes(max_grad, max_lr)
        if short_run and max_lr > 0.0:
            causes.insert(0, (
                f"the run is short: {self._run} optimizer {'step' if self._run == 1 else 'steps'} at a learning rate "
                f"of at most {max_lr:.2g} cannot move the policy off the reference; raise --lr, or train more steps "
                "(more --epochs, a smaller --batch-pairs or --grad-accum)"
            ))
        counts = {name: int(self.flag_counts.get(name, 0)) for name in SIGNAL_FREE_FLAGS if self.flag_counts.get(name)}
        event: dict[str, Any] = {
            "event": "stall",
            "step": step,
            "stalled_steps": self._run,
            "loss": mean_loss,
            "zero_margin_loss": sum(w[4] for w in self._window) / n,
            "mean_abs_margin": mean_margin,
            "max_grad_norm": max_grad,
            "max_lr": max_lr,
            "likely_causes": causes,
            "short_run": short_run,
            "flag_counts": dict(self.flag_counts),
            "signal_free_flag_counts": counts,
        }
        if self.identical_pairs is not None:
            event["identical_pairs"] = self.identical_pairs
            event["num_pairs"] = self.num_pairs
        event["message"] = format_stall_message(event)
        return event

    def likely_causes(self, max_grad: float, max_lr: float) -> list[str]:
        causes: list[str] = []
        if self.identical_pairs:
            causes.append(
                f"{self.identical_pairs} of {self.num_pairs} training pairs have identical chosen and rejected "
                "token ids: they carry no preference signal (identical / whitespace_only / "
                "identical_after_truncation pairs forced through by the policy)"
            )
        forced = [name for name in (F.IDENTICAL, F.WHITESPACE_ONLY, F.IDENTICAL_AFTER_TRUNCATION) if self.flag_counts.get(name)]
        if forced:
            causes.append("the manifest counts " + ", ".join(f"{self.flag_counts[n]} {n}" for n in forced) + " pairs")
        if self.flag_counts.get(F.NO_COMPLETION_TOKENS):
            causes.append(f"{self.flag_counts[F.NO_COMPLETION_TOKENS]} pairs have a half with no completion tokens")
        if max_lr <= 0.0:
            causes.append("the learning rate is 0: the policy never moves away from the reference")
        if max_grad <= self.grad_tol:
            causes.append(
                "the gradient is zero: loss masks cover no tokens, parameters are frozen (requires_grad False, "
                "a LoRA adapter on no modules), or the loss does not reach the model"
            )
        causes.append(
            "the policy still equals the reference (stored ref log-probs from this same model and a learning "
            "rate, beta or step count too small to move it)"
        )
        causes.append("loss masks that select the prompt or padding instead of the completion, in one half or both")
        return causes


def format_stall_message(event: dict[str, Any]) -> str:
    if event.get("short_run"):
        head = (f"training learned nothing: in all {event['stalled_steps']} steps of the run (up to step {event['step']}) "
                "the loss stayed at ")
    else:
        head = f"training stalled: for {event['stalled_steps']} steps (up to step {event['step']}) the loss stayed at "
    lines = [
        head +
        f"{event['loss']:.4f} (zero-margin value {event['zero_margin_loss']:.4f}) with mean |margin| "
        f"{event['mean_abs_margin']:.2e} and grad norm <= {event['max_grad_norm']:.2e}.",
        "Likely causes:",
    ]
    lines += [f"  - {cause}" for cause in event["likely_causes"]]
    counts = event.get("flag_counts") or {}
    if counts:
        lines.append("Flag counts from the manifest: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    else:
        lines.append("Flag counts from the manifest: none recorded")
    return "\n".join(lines)
