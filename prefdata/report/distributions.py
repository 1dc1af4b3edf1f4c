"""Length distributions: exact counts of integer values in bounded memory, quantiles and a histogram."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

LENGTH_HISTOGRAM_BINS = 24
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def _bucket(value: int) -> int:
    """Exact below 4096; beyond, round down keeping 12 significant bits (< 0.05% error).

    Keeps the number of distinct keys, and so memory, bounded whatever the lengths are."""
    if value < 4096:
        return value
    shift = value.bit_length() - 12
    return (value >> shift) << shift


def nice_width(span: float, bins: int) -> float:
    raw = max(span / bins, 1e-12)
    exponent = math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        width = factor * 10**exponent
        if width >= raw:
            return width
    return 10 ** (exponent + 1)


class IntDistribution:
    """Counts of integer values (lengths). Exact quantiles from the counts; bounded memory."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.n = 0
        self.total = 0
        self.max = 0  # exact, although large values are bucketed

    def add(self, value: int) -> None:
        self.counts[value if value < 4096 else _bucket(value)] += 1
        self.n += 1
        self.total += value
        if value > self.max:
            self.max = value

    def add_many(self, values: Any) -> None:
        """`add` for every value of an int64 numpy array (the same counts, in bulk)."""
        import numpy as np

        if not len(values):
            return
        distinct, counts = np.unique(values, return_counts=True)
        for value, count in zip(distinct.tolist(), counts.tolist()):
            self.counts[value if value < 4096 else _bucket(value)] += count
        self.n += len(values)
        self.total += int(values.sum())
        self.max = max(self.max, int(distinct[-1]))

    def quantile(self, q: float) -> int:
        """Nearest-rank quantile."""
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for value in sorted(self.counts):
            seen += self.counts[value]
            if seen >= rank:
                return value
        return max(self.counts)

    def summary(self) -> dict[str, Any]:
        """count, mean, quantiles and max, without the histogram (the report's per-source lengths)."""
        if self.n == 0:
            return {"count": 0}
        return {
            "count": self.n,
            "mean": round(self.total / self.n, 3),
            "quantiles": {f"p{round(q * 100)}": self.quantile(q) for q in QUANTILES},
            "max": self.max,
        }

    def to_dict(self, bins: int = LENGTH_HISTOGRAM_BINS) -> dict[str, Any]:
        if self.n == 0:
            return {"count": 0}
        values = sorted(self.counts)
        lo, hi = values[0], self.max
        p99 = self.quantile(0.99)
        # A few huge outliers would squash every other bar into one: cap the range at p99 then,
        # and count what lies beyond in `overflow`.
        upper = hi if hi <= 2 * max(p99, 1) else p99
        width = max(1.0, nice_width(upper + 1, bins))
        width = float(math.ceil(width))
        nbins = max(1, math.ceil((upper + 1) / width))
        counts = [0] * nbins
        overflow = 0
        for value in values:
            index = int(value // width)
            if index >= nbins:
                overflow += self.counts[value]
            else:
                counts[index] += self.counts[value]
        return {
            "count": self.n,
            "min": lo,
            "max": hi,
            "mean": round(self.total / self.n, 3),
            "quantiles": {f"p{round(q * 100)}": self.quantile(q) for q in QUANTILES},
            "histogram": {"edges": [round(i * width) for i in range(nbins + 1)], "counts": counts, "overflow": overflow},
        }
