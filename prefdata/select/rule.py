"""Which pairs a selection keeps: thresholds, then a budget over the signal's order, ties by row.

A pair is eligible when its signal is finite and within [--min, --max]. The budget (--keep) is a
share of OUT's pairs (0.3: 30% of them, rounded) or a count; the eligible pairs are ordered by the
signal (highest first, or lowest with --lowest), ties broken by OUT's row order (stable, so the same
OUT and settings always keep the same pairs), and the first ones up to the budget are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from prefdata.core.errors import PrefdataError
from prefdata.core.numbers import OFFSET_MAX

# Why a pair was not kept (dropped.jsonl's `why`), in the order the rule decides them.
NON_FINITE, BELOW_MIN, ABOVE_MAX, BEYOND_BUDGET = "non_finite", "below_min", "above_max", "beyond_budget"
REASONS = (NON_FINITE, BELOW_MIN, ABOVE_MAX, BEYOND_BUDGET)


@dataclass
class Selection:
    kept: np.ndarray  # row positions kept, ascending (OUT's order)
    reason: np.ndarray  # per row: "" when kept, else one of REASONS
    budget: int | None  # pairs the --keep budget allows (None: no budget)
    cut: float | None  # the signal of the last pair the budget kept (None when the budget cut nothing)

    def counts(self) -> dict[str, int]:
        return {why: int((self.reason == why).sum()) for why in REASONS}


def parse_keep(value: str | float | int | None) -> float | int | None:
    """--keep: `0.3` or `30%` is a share of OUT's pairs; `300` a count. Floats are shares, ints counts."""
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        keep = value
    else:
        text = str(value).strip()
        try:
            if text.endswith("%"):
                keep = float(text[:-1]) / 100.0
            elif any(ch in text for ch in ".eE"):
                keep = float(text)
            else:
                keep = int(text)
        except ValueError:
            raise PrefdataError(
                f"--keep must be a share (0.3, 30%) or a number of pairs (300), got {value!r}") from None
    if isinstance(keep, float) and not 0.0 < keep <= 1.0:
        raise PrefdataError(f"--keep as a share must be in (0, 1], got {keep}")
    if isinstance(keep, int) and keep < 1:
        raise PrefdataError(f"--keep as a number of pairs must be >= 1, got {keep}")
    return keep


def budget_of(keep: float | int | None, pairs: int) -> int | None:
    if keep is None:
        return None
    return int(round(keep * pairs)) if isinstance(keep, float) else int(keep)


def choose(values: np.ndarray, *, keep: float | int | None, min_value: float | None = None,
           max_value: float | None = None, lowest: bool = False, usable: np.ndarray | None = None) -> Selection:
    """The pairs to keep by `values` (one per row, NaN for non-finite). `usable`: rows whose other
    signals (--weight-by, --offset-by) are finite too; the others count as non-finite before the budget."""
    n = len(values)
    reason = np.full(n, "", dtype=object)
    finite = np.isfinite(values) if usable is None else np.isfinite(values) & usable
    reason[~finite] = NON_FINITE
    if min_value is not None:
        reason[finite & (values < min_value)] = BELOW_MIN
    if max_value is not None:
        reason[finite & (reason == "") & (values > max_value)] = ABOVE_MAX
    eligible = np.flatnonzero(reason == "")
    budget = budget_of(keep, n)
    cut = None
    if budget is not None and budget < len(eligible):
        signal = values[eligible]
        order = np.lexsort((eligible, signal if lowest else -signal))  # by signal, then by row: stable
        ranked = eligible[order]
        reason[ranked[budget:]] = BEYOND_BUDGET
        cut = float(values[ranked[budget - 1]]) if budget > 0 else None
    return Selection(kept=np.flatnonzero(reason == ""), reason=reason, budget=budget, cut=cut)


def weights_from(values: np.ndarray) -> np.ndarray:
    """--weight-by: each kept pair's weight is its signal's mid-rank percentile among the kept pairs,
    in (0, 1): scale-free, so any signal makes a weight, and the highest signal weighs most."""
    from prefdata.select.signals import percentile

    return percentile(values)


def check_offsets(offsets: np.ndarray, rows: np.ndarray, where: Callable[[int], str], scale: float,
                  signal: str) -> None:
    """`--offset-scale A x --offset-by SIGNAL` must give offsets float32 training holds (|offset| <=
    OFFSET_MAX, docs/select.md "Bounds"): else one line naming the first kept pair beyond it."""
    beyond = np.flatnonzero(np.abs(offsets) > OFFSET_MAX)
    if len(beyond):
        first = int(beyond[0])
        raise PrefdataError(
            f"--offset-scale {scale:g} x {signal} gives an offset of {offsets[first]:g} at {where(int(rows[first]))} "
            f"({len(beyond)} kept pair(s) beyond |offset| <= {OFFSET_MAX:g}, what float32 training holds): "
            f"use a smaller --offset-scale")
