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
