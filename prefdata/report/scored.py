"""The report's scored-completions section: what pairing made of each record (prefdata.pairing).

Per prompt: completions, pairs made, ties (unordered pairs of completions with equal scores), as
distributions; the records that made no pair, by reason, with example lines; and the distribution
of score margins (chosen - rejected) of the pairs made, apart for scores and for ranks (rank steps).
Memory: small counters, plus 8 bytes per pair for exact margin quantiles.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from typing import Any

from prefdata.records import ScoredSummary
from prefdata.report.distributions import QUANTILES, IntDistribution, _nice_width

MARGIN_BINS = 12
EXAMPLES_PER_REASON = 10


class ScoredStats:
    """Accumulates ScoredSummary objects, one per record of scored completions, in input order."""

    def __init__(self) -> None:
        self.records = 0
        self.records_paired = 0
        self.records_with_ties = 0
        self.pairs = 0
        self.completions_in = 0
        self.completions_paired = 0
        self.per_prompt = {name: IntDistribution() for name in ("completions", "pairs", "ties")}
        self.unpaired: Counter[str] = Counter()
        self.unpaired_examples: dict[str, list[dict[str, Any]]] = {}
        self.margins: dict[str, array] = {}  # scale -> chosen - rejected of every pair made

    def add(self, summary: ScoredSummary, source_file: str, source_line: int) -> None:
        self.records += 1
        self.pairs += summary.pairs
        self.records_paired += summary.pairs > 0
        self.records_with_ties += summary.ties > 0
        self.completions_in += summary.completions
        self.completions_paired += summary.used
        self.per_prompt["completions"].add(summary.completions)
        self.per_prompt["pairs"].add(summary.pairs)
        self.per_prompt["ties"].add(summary.ties)
        if summary.reason is not None:
            self.unpaired[summary.reason] += 1
            examples = self.unpaired_examples.setdefault(summary.reason, [])
            if len(examples) < EXAMPLES_PER_REASON:
                examples.append({"source_file": source_file, "source_line": source_line, "group_id": summary.group_id})
        if summary.margins:
            self.margins.setdefault(summary.scale, array("d")).extend(summary.margins)

    def to_dict(self) -> dict[str, Any] | None:
        """report.json's `scored` section; None when the input had no scored completions."""
        if not self.records:
            return None
        return {
            "records": self.records,
            "records_paired": self.records_paired,
            "records_unpaired": sum(self.unpaired.values()),
            "records_with_ties": self.records_with_ties,
            "pairs_made": self.pairs,
            "completions_in": self.completions_in,
            "completions_paired": self.completions_paired,
            "per_prompt": {name: dist.to_dict() for name, dist in self.per_prompt.items()},
            "unpaired": [
                {"reason": reason, "count": count, "rows": self.unpaired_examples.get(reason, [])}
                for reason, count in sorted(self.unpaired.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            "margins": {scale: margin_distribution(values) for scale, values in sorted(self.margins.items())},
        }


def margin_distribution(values: array | list[float], bins: int = MARGIN_BINS) -> dict[str, Any]:
    """count, min, max, mean, nearest-rank quantiles and a histogram of equal-width bins from 0."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return {"count": 0}
    lo, hi = ordered[0], ordered[-1]
    width = _nice_width(hi, bins) if hi > 0 else 1.0
    nbins = max(1, math.ceil(hi / width - 1e-9))  # the largest margin falls in the last bin, edge included
    counts = [0] * nbins
    for value in ordered:
        counts[min(nbins - 1, int(value / width))] += 1
    return {
        "count": n,
        "min": _round(lo),
        "max": _round(hi),
        "mean": _round(math.fsum(ordered) / n),
        "quantiles": {f"p{round(q * 100)}": _round(ordered[max(1, math.ceil(q * n)) - 1]) for q in QUANTILES},
        "histogram": {"edges": [_round(i * width) for i in range(nbins + 1)], "counts": counts},
    }


def _round(value: float) -> float:
    return round(value, 6)
