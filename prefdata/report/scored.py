"""The report's scored-completions section: what pairing made of each record (prefdata.sets.pairing).

Per prompt: completions, pairs made, ties (unordered pairs of completions with equal scores), as
distributions; the records that made no pair, by reason, with example lines; the records capped at
the policy's max_pairs_per_record (pairs kept, pairs not made, example lines); and the distribution
of score margins (chosen - rejected) of the pairs made, apart for scores and for ranks (rank steps).
A margin that overflows a float (1e308 - -1e308) is counted as `non_finite`, outside the
distribution. Memory: small counters, plus 8 bytes per pair for exact margin quantiles.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections import Counter
from typing import Any

from prefdata.core.records import ScoredSummary
from prefdata.report.distributions import QUANTILES, IntDistribution, nice_width

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
        self.records_capped = 0  # records above max_pairs_per_record that made pairs up to it
        self.pairs_not_made = 0  # the pairs those records would have made beyond it
        self.capped_examples: list[dict[str, Any]] = []

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
        if summary.pairs and summary.possible > summary.pairs:
            self.records_capped += 1
            self.pairs_not_made += summary.possible - summary.pairs
            if len(self.capped_examples) < EXAMPLES_PER_REASON:
                self.capped_examples.append({"source_file": source_file, "source_line": source_line,
                                             "group_id": summary.group_id, "pairs": summary.pairs,
                                             "possible": summary.possible})

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
            "capped": {"records": self.records_capped, "pairs_not_made": self.pairs_not_made,
                       "rows": self.capped_examples},
            "margins": {scale: margin_distribution(values) for scale, values in sorted(self.margins.items())},
        }


def margin_distribution(values: array | list[float], bins: int = MARGIN_BINS) -> dict[str, Any]:
    """count, min, max, mean, nearest-rank quantiles and a histogram of equal-width bins from 0.
    Margins that overflowed a float (scores of +-1e308) are left out and counted as `non_finite`:
    no bin, quantile or mean can hold them."""
    ordered = sorted(v for v in values if math.isfinite(v))
    n = len(ordered)
    non_finite = len(values) - n
    if not n:
        return {"count": 0, "non_finite": non_finite} if non_finite else {"count": 0}
    lo, hi = ordered[0], ordered[-1]
    width = nice_width(hi, bins) if hi > 0 else 1.0
    nbins = max(1, math.ceil(hi / width - 1e-9))  # the largest margin falls in the last bin, edge included
    edges = [i * width for i in range(nbins + 1)]
    if edges[-1] > sys.float_info.max:  # margins near 1.8e308: a round width would end past any float
        width, nbins = hi / bins, bins
        edges = [i * width for i in range(nbins)] + [hi]
    counts = [0] * nbins
    for value in ordered:
        counts[min(nbins - 1, int(value / width))] += 1
    out = {
        "count": n,
        "min": _round(lo),
        "max": _round(hi),
        "mean": _round(_mean(ordered)),
        "quantiles": {f"p{round(q * 100)}": _round(ordered[max(1, math.ceil(q * n)) - 1]) for q in QUANTILES},
        "histogram": {"edges": [_round(edge) for edge in edges], "counts": counts},
    }
    if non_finite:
        out["non_finite"] = non_finite
    return out


def _mean(values: list[float]) -> float:
    """fsum's exact mean; finite margins near 1.8e308 overflow the sum itself, so then average the
    values scaled down first (each at most the largest, so no overflow)."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)


def _round(value: float) -> float:
    return round(value, 6)
