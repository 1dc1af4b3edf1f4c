"""Numbers from strangers' records: a score or reward is a finite float or nothing."""

from __future__ import annotations

import math
from typing import Any


def finite_float(value: Any) -> float | None:
    """`value` as a finite float when it is an int or a float (bool is neither), else None: NaN,
    Infinity and integers beyond any float (a 400-digit score; `math.isfinite` raises on them)
    are no number at all, as the pairing and the reward checks have nothing to compare them with."""
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return None
    if type(value) is float and math.isfinite(value):
        return value
    return None


# What float32 training can hold of the per-pair loss inputs (docs/select.md, "Bounds"). A weight is 0
# (the pair adds nothing) or within [WEIGHT_MIN, WEIGHT_MAX]: that keeps every w·loss, the step's Σ w
# and each w / Σ w far inside float32's normal range (1.2e-38 to 3.4e38), where 1e39 overflows to inf
# and 1e-45 is a subnormal that loses its digits; 1e-9 leaves room for `select --weight-by`'s
# percentiles (the lowest is 0.5 / pairs). |offset| <= OFFSET_MAX: float32 spaces numbers near 1e4 about
# 0.001 apart, so the logit β·Δ - δ still moves with the policy's margin; beyond it the loss ignores
# the policy, and past 3.4e38 it is inf.
WEIGHT_MIN, WEIGHT_MAX = 1e-9, 1e9
OFFSET_MAX = 1e4


def loss_input_problem(name: str, value: Any) -> str | None:
    """Why `value` cannot be the pair's `weight` or `offset` (one line), or None when it can."""
    number = finite_float(value)
    if number is None:
        return f"{name} {value!r:.40} is not a finite number"
    if name == "weight" and number != 0 and not WEIGHT_MIN <= number <= WEIGHT_MAX:
        return f"weight {number:g} is outside 0 or [{WEIGHT_MIN:g}, {WEIGHT_MAX:g}] (what float32 training holds)"
    if name == "offset" and abs(number) > OFFSET_MAX:
        return f"offset {number:g} is outside [-{OFFSET_MAX:g}, {OFFSET_MAX:g}] (what float32 training holds)"
    return None
