"""The report's image statistics: what the images of image pairs are like (report.json `images`).

Per checked pair with images, each image's facts: width, height, encoded bytes, the tokens the model
sees for it (when a processor counted them: prefdata.tokenize.vision) and its content digest
(prefdata.io.images.LoadedImage.digest). They are known where the images were decoded, in the
workers; there `ImageFactsCollector` gathers a run of pairs' facts into `ImageFacts` arrays, which
travel to the main process with the run's other compact rows (report.compact.CompactRows.images).
Rows that reach the main process whole are added one by one (`ImageStats.add`), into the same arrays.

A text-only run collects nothing and its report has no `images` section. Memory: the distributions
are bounded; counting unique images keeps each image's 8-byte digest and its size (16 bytes an image),
like the per-row hashes of the exact-duplicate sections.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from prefdata.report.distributions import IntDistribution

if TYPE_CHECKING:
    import numpy as np

NOT_COUNTED = -1  # tokens of an image no processor counted (no --processor, or image_mismatch)
FLUSH_IMAGES = 8192  # images added one by one that are counted together (numpy, not per image)


@dataclass
class ImageFacts:
    """The images of a run of pairs, as arrays: only pairs that have images appear."""

    counts: "np.ndarray"  # (k,) int64: images of each pair with images, in order
    table: "np.ndarray"  # (m, 4) int64 per image, in order: width, height, bytes, tokens (NOT_COUNTED)
    digests: "np.ndarray"  # (m,) uint64 content digests


class ImageFactsCollector:
    """Gathers the facts of pairs with images (`add`) into ImageFacts (`facts`), where they are checked."""

    def __init__(self) -> None:
        self.counts = array("q")
        self.table = array("q")
        self.digests = array("Q")

    def add(self, images: Sequence[Any], tokens: Sequence[int] | None) -> None:
        """One pair's decoded images (io.images.LoadedImage) and, if counted, each one's tokens."""
        self.counts.append(len(images))
        for i, image in enumerate(images):
            self.table.extend((image.width, image.height, len(image.data),
                               tokens[i] if tokens is not None else NOT_COUNTED))
            self.digests.append(image.digest)

    def __len__(self) -> int:
        return len(self.digests)

    def facts(self) -> ImageFacts | None:
        """The arrays, or None when no pair had images (text-only runs carry nothing)."""
        import numpy as np

        if not self.counts:
            return None
        return ImageFacts(np.frombuffer(self.counts, dtype=np.int64).copy(),
                          np.frombuffer(self.table, dtype=np.int64).reshape(-1, 4).copy(),
                          np.frombuffer(self.digests, dtype=np.uint64).copy())


class ImageStats:
    """The report's image statistics over every checked pair (kept and dropped, as the lengths)."""

    def __init__(self) -> None:
        self.rows = 0  # pairs with at least one image
        self.by_count: Counter[int] = Counter()  # pairs by how many images they have (1, 2, ...)
        self.width = IntDistribution()
        self.height = IntDistribution()
        self.tokens = IntDistribution()
        self.bytes = 0
        self.digests = array("Q")  # every image's digest and byte size: unique images, unique bytes
        self.sizes = array("q")
        self._pending = ImageFactsCollector()  # pairs added one by one, not yet counted

    def add(self, images: Sequence[Any], tokens: Sequence[int] | None) -> None:
        """One pair with images (a row that reached this process whole)."""
        self._pending.add(images, tokens)
        if len(self._pending) >= FLUSH_IMAGES:
            self._flush()

    def add_facts(self, facts: ImageFacts) -> None:
        """A run of pairs' facts, gathered where they were checked."""
        import numpy as np

        self.rows += len(facts.counts)
        for images, pairs in enumerate(np.bincount(facts.counts).tolist()):
            if pairs:
                self.by_count[images] += pairs
        table = facts.table
        self.width.add_many(table[:, 0])
        self.height.add_many(table[:, 1])
        self.tokens.add_many(table[table[:, 3] != NOT_COUNTED, 3])
        self.bytes += int(table[:, 2].sum())
        self.digests.frombytes(np.ascontiguousarray(facts.digests, dtype=np.uint64).tobytes())
        self.sizes.frombytes(np.ascontiguousarray(table[:, 2], dtype=np.int64).tobytes())

    def _flush(self) -> None:
        facts = self._pending.facts()
        self._pending = ImageFactsCollector()
        if facts is not None:
            self.add_facts(facts)

    def to_dict(self, pairs: int) -> dict[str, Any] | None:
        """report.json `images` (docs/report-schema.md), or None when no checked pair has an image.
        `pairs`: the checked pairs, those without images included."""
        import numpy as np

        self._flush()
        if not self.rows:
            return None
        digests = np.frombuffer(self.digests, dtype=np.uint64)
        _, first = np.unique(digests, return_index=True)
        by_count = {0: pairs - self.rows, **self.by_count} if pairs > self.rows else dict(self.by_count)
        return {
            "rows": self.rows,
            "images": self.width.n,
            "unique_images": len(first),
            "bytes": self.bytes,
            "unique_bytes": int(np.frombuffer(self.sizes, dtype=np.int64)[first].sum()),
            "rows_by_image_count": {str(k): by_count[k] for k in sorted(by_count)},
            "width": _spread(self.width),
            "height": _spread(self.height),
            "tokens_per_image": _spread(self.tokens) if self.tokens.n else None,
        }


def _spread(dist: IntDistribution) -> dict[str, Any]:
    """count, min, median, max and mean of a distribution with values."""
    return {"count": dist.n, "min": min(dist.counts), "median": dist.quantile(0.5), "max": dist.max,
            "mean": round(dist.total / dist.n, 3)}
