"""The report's chosen/rejected similarity: a bottom-k sample by content hash, measured lazily."""

from __future__ import annotations

import heapq
import math
from typing import Any, Sequence

from prefdata.checks.pair import similarity
from prefdata.report.distributions import QUANTILES

SIMILARITY_SAMPLE = 5_000  # bottom-k sample by content hash: uniform, order-independent, bounded cost
SIMILARITY_BINS = 20


class LazySimilarity:
    """similarity(chosen, rejected), computed when first needed.

    Most rows that enter the bottom-k sample are pushed out again by a smaller hash later; only
    the survivors (and the rare tie on equal hashes, where the heap compares similarities) are
    measured. Halves longer than DEFER_CHARS are measured at once, so the sample never holds much text.
    """

    __slots__ = ("halves", "_value")
    DEFER_CHARS = 8192  # halves longer than this together are measured at once

    def __init__(self, chosen: str | Sequence[int], rejected: str | Sequence[int]) -> None:
        if len(chosen) + len(rejected) > self.DEFER_CHARS:
            self.halves, self._value = None, similarity(chosen, rejected)
        else:
            self.halves, self._value = (chosen, rejected), None

    def value(self) -> float:
        if self.halves is not None:
            self._value = similarity(*self.halves)
            self.halves = None
        return self._value  # type: ignore[return-value]

    def measured(self, value: float) -> None:
        """Take `value` = similarity(*self.halves), computed elsewhere (e.g. in another process)."""
        self._value, self.halves = value, None

    # Only compared when two sampled rows have the same hash: the same order as plain floats.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazySimilarity) and self.value() == other.value()

    def __lt__(self, other: "LazySimilarity") -> bool:
        return self.value() < other.value()

    __hash__ = None  # type: ignore[assignment]


class SimilaritySample:
    """Chosen/rejected similarity on a bottom-k sample by content hash.

    The k distinct pairs with the smallest hashes are a uniform sample that does not depend on batch
    size (copies of a pair count once, as first seen); a row is only measured when its hash could
    enter the sample, so the cost is about k * (1 + ln(n / k)) similarity computations instead of n."""

    def __init__(self, k: int = SIMILARITY_SAMPLE) -> None:
        self.k = k
        self.heap: list[tuple[int, LazySimilarity]] = []  # (-hash, similarity): a max-heap on hash
        # Each distinct pair enters once: its copies are duplicate_pair's business, and equal hashes
        # would make the heap compare (so measure) the similarities of every copy it holds.
        self.keys: set[int] = set()
        self.seen = 0

    def offer(self, key: int, chosen: str | Sequence[int], rejected: str | Sequence[int]) -> None:
        self.seen += 1
        if self.wants(key):
            self.put(key, chosen, rejected)

    def unmeasured(self) -> list[LazySimilarity]:
        """The sampled rows whose similarity is not computed yet (their `halves` say what to compare)."""
        return [item for _, item in self.heap if item.halves is not None]

    def cutoff(self) -> int:
        """Every key that enters the sample from now on is below this (it only ever decreases)."""
        return -self.heap[0][0] if len(self.heap) >= self.k else 1 << 64

    def wants(self, key: int) -> bool:
        """Whether a row with this hash enters the sample (checked before computing anything)."""
        return (len(self.heap) < self.k or -self.heap[0][0] > key) and key not in self.keys

    def put(self, key: int, chosen: str | Sequence[int], rejected: str | Sequence[int]) -> None:
        self._push(key, LazySimilarity(chosen, rejected))

    def put_measured(self, key: int, value: float) -> None:
        """`put` for a row whose similarity was computed already (its halves are long)."""
        item = LazySimilarity.__new__(LazySimilarity)
        item.halves, item._value = None, value
        self._push(key, item)

    def _push(self, key: int, similarity_: "LazySimilarity") -> None:
        if key in self.keys:
            return
        self.keys.add(key)
        item = (-key, similarity_)
        if len(self.heap) < self.k:
            heapq.heappush(self.heap, item)
        else:
            self.keys.discard(-heapq.heapreplace(self.heap, item)[0])

    def to_dict(self, threshold: float | None) -> dict[str, Any]:
        values = sorted(v.value() for _, v in self.heap)
        if not values:
            return {"method": "text edit-distance ratio (checks.similarity)", "rows_measured": 0, "rows_total": 0}
        counts = [0] * SIMILARITY_BINS
        for value in values:
            counts[min(SIMILARITY_BINS - 1, int(value * SIMILARITY_BINS))] += 1

        def q(p: float) -> float:
            return round(values[max(0, math.ceil(p * len(values)) - 1)], 4)

        result: dict[str, Any] = {
            "method": "text edit-distance ratio (checks.similarity)",
            "rows_measured": len(values),
            "rows_total": self.seen,
            "sampled": len(values) < self.seen,
            "mean": round(sum(values) / len(values), 4),
            "quantiles": {f"p{round(p * 100)}": q(p) for p in QUANTILES},
            "histogram": {
                "edges": [round(i / SIMILARITY_BINS, 4) for i in range(SIMILARITY_BINS + 1)],
                "counts": counts,
                "overflow": 0,
            },
        }
        if threshold is not None:
            result["threshold"] = threshold
            result["share_at_or_above_threshold"] = round(sum(v >= threshold for v in values) / len(values), 6)
        return result
