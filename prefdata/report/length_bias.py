"""Length bias: which half of a pair is longer, counted in bulk, and its report.json form.

A preference set whose chosen half is mostly the longer one teaches length, not quality (the share
of pairs where chosen is longer, in tokens and in characters, overall and per source; prepare's
`--balance-length` subsamples to a target share: prefdata.sets.balance).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

KEYS = ("chosen", "rejected", "equal")


def compare(chosen: int, rejected: int) -> str:
    """Which half is longer: "chosen", "rejected" or "equal"."""
    return "chosen" if chosen > rejected else ("rejected" if rejected > chosen else "equal")


def count_bias(bias: Counter[str], chosen: "np.ndarray", rejected: "np.ndarray") -> None:
    """`bias[compare(c, r)] += 1` for every pair of lengths, in bulk (only the keys that occur)."""
    for key, count in (
        ("chosen", int((chosen > rejected).sum())),
        ("rejected", int((rejected > chosen).sum())),
        ("equal", int((chosen == rejected).sum())),
    ):
        if count:
            bias[key] += count


def share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def bias_dict(bias: Counter[str]) -> dict[str, Any]:
    """{pairs, chosen_longer, rejected_longer, equal (shares), chosen_longer_count} of a bias count."""
    pairs = sum(bias[key] for key in KEYS)
    return {
        "pairs": pairs,
        "chosen_longer": share(bias["chosen"], pairs),
        "rejected_longer": share(bias["rejected"], pairs),
        "equal": share(bias["equal"], pairs),
        "chosen_longer_count": bias["chosen"],
    }
