"""The dataset health report: a streaming accumulator over checked rows, and the report.json schema.

`ReportBuilder.add(row)` is called once per input record (kept, dropped or quarantined). Memory stays
flat apart from compact per-row hash arrays (8-byte prompt and pair hashes plus a location, for the
exact-duplicate sections) and small bounded samples. `build()` returns a plain JSON-able dict whose
layout is documented in docs/report-schema.md (bump SCHEMA_VERSION on any breaking change).

The report is deterministic: the same input gives the same dict apart from `generated_at`.
"""

from __future__ import annotations

import heapq
import math
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import xxhash

from prefdata import __version__
from prefdata.checks.pair import completion_content, ids_mode
from prefdata.checks.similarity import BOUNDED_METHOD, EXACT_LIMIT, similarity
from prefdata.checks.dataset import pair_digests_and_key
from prefdata.records import Pair

if TYPE_CHECKING:
    import numpy as np

    from prefdata.records import CheckedRow

SCHEMA_VERSION = 1
EXAMPLES_PER_FLAG = 5
EXCERPT_CHARS = 100
TOP_GROUPS = 10  # duplicate-prompt / duplicate-pair / near-duplicate groups listed in the report
LINES_PER_GROUP = 5
MAX_QUARANTINE_REASONS = 50  # distinct quarantine reasons kept; the rest are counted as "other reasons"
LINES_PER_REASON = 10
EXCERPT_ROWS = 20_000  # prompt excerpts kept for the first rows only (bounded memory)
SIMILARITY_SAMPLE = 5_000  # bottom-k sample by content hash: uniform, order-independent, bounded cost
MAX_FLAGGED_ROWS = 200_000  # content hashes of flagged rows kept for baseline comparison
LENGTH_HISTOGRAM_BINS = 24
LENGTH_FLUSH_ROWS = 8192  # rows whose character lengths are counted together (numpy, not per row)
SIMILARITY_BINS = 20
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
# A record that cannot be read fails `validate` (a PR must not bring one in); `prepare` sets it aside
# in quarantine.jsonl and goes on, so there it is a warning.
QUARANTINE_SEVERITY = {"validate": "error", "prepare": "warn"}


# ----------------------------------------------------------------------------- hashing / excerpts


def _pair_keys(pair: Pair) -> tuple[int, int]:
    """(prompt key, pair key): the same whitespace-normalized digests the dataset-wide checks use,
    so "duplicate" means the same thing in the report as in the `duplicate_pair` flag."""
    keys = pair_digests_and_key(pair)
    return keys[0], keys[3]


def content_hash(pair: Pair) -> str:
    """Stable 16-hex-digit hash of a pair's content (whitespace-normalized prompt, chosen, rejected).

    It identifies a row independently of its position, so a baseline can tell new findings from old."""
    return f"{_pair_keys(pair)[1]:016x}"


def excerpt(text: str | None, limit: int = EXCERPT_CHARS) -> str:
    """One line, at most `limit` characters, for tables and annotations."""
    if not text:
        return ""
    flat = " ".join(text[: limit * 4].split())  # cut first: excerpts of long texts stay cheap
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def row_hash(row: "CheckedRow") -> str:
    if row.pair is not None:
        return content_hash(row.pair)
    # Quarantined: hash what was read (the same broken line gets the same hash wherever it moves).
    raw = row.raw.raw_text if row.raw.raw_text is not None else repr(row.raw.value)
    digest = xxhash.xxh3_64_intdigest((raw + "\x00" + str(row.error)).encode("utf-8", "surrogatepass"))
    return f"{digest:016x}"


# ----------------------------------------------------------------------------- distributions


def _bucket(value: int) -> int:
    """Exact below 4096; beyond, round down keeping 12 significant bits (< 0.05% error).

    Keeps the number of distinct keys, and so memory, bounded whatever the lengths are."""
    if value < 4096:
        return value
    shift = value.bit_length() - 12
    return (value >> shift) << shift


def _nice_width(span: float, bins: int) -> float:
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

    def to_dict(self, bins: int = LENGTH_HISTOGRAM_BINS) -> dict[str, Any]:
        if self.n == 0:
            return {"count": 0}
        values = sorted(self.counts)
        lo, hi = values[0], self.max
        p99 = self.quantile(0.99)
        # A few huge outliers would squash every other bar into one: cap the range at p99 then,
        # and count what lies beyond in `overflow`.
        upper = hi if hi <= 2 * max(p99, 1) else p99
        width = max(1.0, _nice_width(upper + 1, bins))
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


class _Similarity:
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
        return isinstance(other, _Similarity) and self.value() == other.value()

    def __lt__(self, other: "_Similarity") -> bool:
        return self.value() < other.value()

    __hash__ = None  # type: ignore[assignment]


class SimilaritySample:
    """Chosen/rejected similarity on a bottom-k sample by content hash.

    The k distinct pairs with the smallest hashes are a uniform sample that does not depend on batch
    size (copies of a pair count once, as first seen); a row is only measured when its hash could
    enter the sample, so the cost is about k * (1 + ln(n / k)) similarity computations instead of n."""

    def __init__(self, k: int = SIMILARITY_SAMPLE) -> None:
        self.k = k
        self.heap: list[tuple[int, _Similarity]] = []  # (-hash, similarity): a max-heap on hash
        # Each distinct pair enters once: its copies are duplicate_pair's business, and equal hashes
        # would make the heap compare (so measure) the similarities of every copy it holds.
        self.keys: set[int] = set()
        self.seen = 0

    def offer(self, key: int, chosen: str | Sequence[int], rejected: str | Sequence[int]) -> None:
        self.seen += 1
        if self.wants(key):
            self.put(key, chosen, rejected)

    def unmeasured(self) -> list[_Similarity]:
        """The sampled rows whose similarity is not computed yet (their `halves` say what to compare)."""
        return [item for _, item in self.heap if item.halves is not None]

    def cutoff(self) -> int:
        """Every key that enters the sample from now on is below this (it only ever decreases)."""
        return -self.heap[0][0] if len(self.heap) >= self.k else 1 << 64

    def wants(self, key: int) -> bool:
        """Whether a row with this hash enters the sample (checked before computing anything)."""
        return (len(self.heap) < self.k or -self.heap[0][0] > key) and key not in self.keys

    def put(self, key: int, chosen: str | Sequence[int], rejected: str | Sequence[int]) -> None:
        self._push(key, _Similarity(chosen, rejected))

    def put_measured(self, key: int, value: float) -> None:
        """`put` for a row whose similarity was computed already (its halves are long)."""
        item = _Similarity.__new__(_Similarity)
        item.halves, item._value = None, value
        self._push(key, item)

    def _push(self, key: int, similarity_: "_Similarity") -> None:
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


# ----------------------------------------------------------------------------- compact rows

OUTCOMES = ("kept", "dropped", "quarantined")  # codes of CompactRows.outcome
SEVERITY_CODES = (None, "warn", "drop", "error")  # codes of CompactRows.severity


@dataclass
class TokenLengths:
    """Token counts of one pair before truncation, and which parts truncation cut."""

    prompt: int
    chosen: int
    rejected: int
    cut_prompt: bool
    cut_chosen: bool
    cut_rejected: bool


@dataclass
class CompactRows:
    """A run of consecutive records of one file, checked elsewhere (e.g. in worker processes).

    What `ReportBuilder.add` would take from each row, as arrays; the few rows the report describes
    one by one (flagged or quarantined) come back in full through `detail`."""

    source_file: str
    lines: "np.ndarray"  # source line of each record
    outcome: "np.ndarray"  # per record, an index into OUTCOMES
    severity: "np.ndarray"  # per record, an index into SEVERITY_CODES (0 for quarantined records)
    pair_index: "np.ndarray"  # positions of the records that are pairs (not quarantined)
    prompt_keys: "np.ndarray"  # per pair: the report's prompt and pair keys (report._pair_keys)
    pair_keys: "np.ndarray"
    lengths: "np.ndarray"  # per pair: characters of prompt, chosen, rejected, shape (pairs, 3)
    detailed: list[int]  # positions of flagged or quarantined records, ascending
    detail: Callable[[int], "CheckedRow"]  # the full row at a position
    # The similarity sample's candidates: position -> the halves it compares, or their similarity
    # when they are longer than _Similarity.DEFER_CHARS (measured at once anyway). Must hold every
    # pair whose key is below the sample's current cut-off (`SimilaritySample.cutoff()`).
    halves: dict[int, tuple[Any, Any] | float] = field(default_factory=dict)
    excerpts: list[str] | None = None  # excerpt(prompt) per record ("" when quarantined), while needed
    tokens: dict[int, TokenLengths] = field(default_factory=dict)  # position -> token lengths


# ----------------------------------------------------------------------------- the builder


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


class ReportBuilder:
    """Accumulates the report over a stream of CheckedRow objects (one per input record)."""

    def __init__(
        self,
        policy: Any = None,
        *,
        examples_per_flag: int = EXAMPLES_PER_FLAG,
        truncation_known: bool = True,
        quarantine_severity: str | None = None,
    ) -> None:
        self.policy = policy
        # None: decided in build() from meta["command"] (see QUARANTINE_SEVERITY), "error" otherwise.
        self.quarantine_severity = quarantine_severity
        # False when re-checking stored rows: their ids are already truncated and the lengths
        # before truncation are gone, so truncation rates cannot be measured.
        self.truncation_known = truncation_known
        self.examples_per_flag = examples_per_flag
        self.rows = 0
        self.outcomes: Counter[str] = Counter({"kept": 0, "dropped": 0, "quarantined": 0})
        self.severities: Counter[str] = Counter()
        self.flag_counts: Counter[str] = Counter()
        self.flag_examples: dict[str, list[dict[str, Any]]] = {}
        self.flagged: list[tuple[Any, ...]] = []  # see _flagged_rows() for the fields
        self.flagged_total = 0
        self.flagged_rows_any = 0  # rows with at least one flag (for max_flagged_share)
        self.quarantine_reasons: dict[str, list[Any]] = {}  # reason -> [count, [locations]]
        self.quarantine_other = 0
        # Per-row compact arrays: location of every record, hashes of every pair.
        self.files: dict[str, int] = {}
        self.file_index = array("I")
        self.line = array("q")
        self.pair_row = array("q")  # record ordinal of each pair
        self.prompt_key = array("Q")
        self.pair_key = array("Q")
        self.prompt_excerpts: list[str] = []  # for the first EXCERPT_ROWS records
        self.chars = {name: IntDistribution() for name in ("prompt", "chosen", "rejected")}
        self.tokens = {name: IntDistribution() for name in ("prompt", "chosen", "rejected")}
        self.bias = {"chars": Counter(), "tokens": Counter()}
        # (prompt, chosen, rejected) character lengths not yet in `chars`/`bias`, counted in bulk.
        self._pending_chars = array("q")
        self.tokenized_rows = 0
        self.truncated: Counter[str] = Counter()
        self.similarity = SimilaritySample()
        self.near_duplicates: list[dict[str, Any]] = []
        self.near_duplicate_clusters = 0
        self.near_duplicate_rows = 0
        self.near_duplicates_run = False
        # Pairs whose halves exceed EXACT_LIMIT together: near_duplicate and the similarity sample
        # measured them with the bounded method; the report names them.
        self.bounded_rows = 0
        self.bounded_examples: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ per row

    def add(self, row: "CheckedRow") -> None:
        ordinal = self.rows
        self.rows += 1
        self.outcomes[row.outcome] += 1
        raw = row.raw
        file_id = self.files.setdefault(raw.source_file, len(self.files))
        self.file_index.append(file_id)
        self.line.append(raw.source_line)
        pair = row.pair
        if ordinal < EXCERPT_ROWS:
            self.prompt_excerpts.append(excerpt(pair.prompt) if pair is not None else "")
        if pair is None:
            self._add_quarantined(row)
            return
        if row.severity:
            self.severities[row.severity] += 1
        if row.flags:
            self._add_flagged(row)
        self._add_dataset_keys(ordinal, row)
        self._add_lengths(row)
        halves = (pair.chosen_ids or [], pair.rejected_ids or []) if ids_mode(pair) else (pair.chosen, pair.rejected)
        if len(halves[0]) + len(halves[1]) > EXACT_LIMIT:
            self._add_bounded(raw.source_file, raw.source_line)

    def add_compact(self, rows: CompactRows) -> None:
        """`add` for every record of `rows`, in bulk: the same report as adding them one by one."""
        import numpy as np

        n = len(rows.lines)
        first = self.rows
        self.rows += n
        for code, count in enumerate(np.bincount(rows.outcome, minlength=len(OUTCOMES)).tolist()):
            if count:
                self.outcomes[OUTCOMES[code]] += count
        for code, count in enumerate(np.bincount(rows.severity, minlength=len(SEVERITY_CODES)).tolist()):
            if count and code:
                self.severities[SEVERITY_CODES[code]] += count
        file_id = self.files.setdefault(rows.source_file, len(self.files))
        self.file_index.frombytes(np.full(n, file_id, dtype=np.uint32).tobytes())
        self.line.frombytes(np.asarray(rows.lines, dtype=np.int64).tobytes())
        if first < EXCERPT_ROWS:
            assert rows.excerpts is not None and len(rows.excerpts) == n, "excerpts are needed up to EXCERPT_ROWS"
            self.prompt_excerpts.extend(rows.excerpts[: EXCERPT_ROWS - first])
        at_pair = np.searchsorted(rows.pair_index, rows.detailed)
        for position, at in zip(rows.detailed, at_pair.tolist()):  # in input order, as flagged_rows keeps it
            row = rows.detail(position)
            if row.pair is None:
                self._add_quarantined(row)
            else:
                self._add_flagged(row, f"{int(rows.pair_keys[at]):016x}")
        pairs = np.asarray(rows.pair_index, dtype=np.int64)
        self.pair_row.frombytes((pairs + first).tobytes())
        self.prompt_key.frombytes(np.asarray(rows.prompt_keys, dtype=np.uint64).tobytes())
        self.pair_key.frombytes(np.asarray(rows.pair_keys, dtype=np.uint64).tobytes())
        self._sample_compact(rows, pairs)
        lengths = np.asarray(rows.lengths, dtype=np.int64).reshape(-1, 3)
        for at in np.flatnonzero(lengths[:, 1] + lengths[:, 2] > EXACT_LIMIT).tolist():
            self._add_bounded(rows.source_file, int(rows.lines[int(pairs[at])]))
        self._pending_chars.frombytes(np.ascontiguousarray(rows.lengths, dtype=np.int64).tobytes())
        if len(self._pending_chars) >= 3 * LENGTH_FLUSH_ROWS:
            self._flush_lengths()
        for position in sorted(rows.tokens):
            self._add_token_lengths(rows.tokens[position])

    def _sample_compact(self, rows: CompactRows, pairs: "np.ndarray") -> None:
        """The similarity sample's share of `add_compact`: only keys below the cut-off can enter."""
        import numpy as np

        sample = self.similarity
        sample.seen += len(pairs)
        keys = np.asarray(rows.pair_keys, dtype=np.uint64)
        cutoff = sample.cutoff()
        below = np.flatnonzero(keys < np.uint64(cutoff)) if cutoff < 1 << 64 else np.arange(len(keys))
        for at in below.tolist():
            key = int(keys[at])
            if sample.wants(key):
                halves = rows.halves[int(pairs[at])]
                if type(halves) is float:
                    sample.put_measured(key, halves)
                else:
                    sample.put(key, *halves)

    def _add_bounded(self, source_file: str, source_line: int) -> None:
        self.bounded_rows += 1
        if len(self.bounded_examples) < LINES_PER_REASON:
            self.bounded_examples.append({"source_file": source_file, "source_line": source_line})

    def _similarity_section(self, threshold: float | None) -> dict[str, Any]:
        section = self.similarity.to_dict(threshold)
        section["exact_limit"] = EXACT_LIMIT
        section["bounded"] = {"method": BOUNDED_METHOD, "rows": self.bounded_rows, "examples": self.bounded_examples}
        return section

    def _add_quarantined(self, row: "CheckedRow") -> None:
        reason = row.error or "unreadable record"
        location = {"source_file": row.raw.source_file, "source_line": row.raw.source_line}
        entry = self.quarantine_reasons.get(reason)
        if entry is None:
            if len(self.quarantine_reasons) >= MAX_QUARANTINE_REASONS:
                self.quarantine_other += 1
                entry = None
            else:
                entry = self.quarantine_reasons[reason] = [0, []]
        if entry is not None:
            entry[0] += 1
            if len(entry[1]) < LINES_PER_REASON:
                entry[1].append(location)
        self._remember_flagged(row, [], None)  # severity filled in by build()

    def _add_flagged(self, row: "CheckedRow", digest: str | None = None) -> None:
        """`digest`: the row's content_hash, when known already."""
        pair = row.pair
        assert pair is not None
        self.flagged_rows_any += 1
        for flag in row.flags:
            self.flag_counts[flag] += 1
            examples = self.flag_examples.setdefault(flag, [])
            if len(examples) < self.examples_per_flag:
                examples.append(
                    {
                        "source_file": row.raw.source_file,
                        "source_line": row.raw.source_line,
                        "outcome": row.outcome,
                        "prompt": excerpt(pair.prompt),
                        "chosen": excerpt(pair.chosen),
                        "rejected": excerpt(pair.rejected),
                    }
                )
        self._remember_flagged(row, list(dict.fromkeys(row.flags)), row.severity, digest)

    def _remember_flagged(
        self, row: "CheckedRow", flags: list[str], severity: str | None, digest: str | None = None
    ) -> None:
        self.flagged_total += 1
        if len(self.flagged) >= MAX_FLAGGED_ROWS:
            return
        # A tuple, not a dict: a large dirty dataset keeps many of these until build().
        detail = row.error if row.pair is None else excerpt(row.pair.prompt, 60)
        file_id = self.files[row.raw.source_file]
        digest = digest or row_hash(row)
        self.flagged.append((digest, file_id, row.raw.source_line, tuple(flags), severity, row.outcome, detail))

    def _add_dataset_keys(self, ordinal: int, row: "CheckedRow") -> None:
        pair = row.pair
        assert pair is not None
        prompt_key, pair_key = _pair_keys(pair)
        self.pair_row.append(ordinal)
        self.prompt_key.append(prompt_key)
        self.pair_key.append(pair_key)
        sample = self.similarity
        sample.seen += 1
        if sample.wants(pair_key):  # most rows stop here: the similarity is computed for few
            if ids_mode(pair):
                sample.put(pair_key, pair.chosen_ids or [], pair.rejected_ids or [])
            else:
                sample.put(pair_key, completion_content(pair, "chosen")[0], completion_content(pair, "rejected")[0])

    def _add_lengths(self, row: "CheckedRow") -> None:
        pair = row.pair
        assert pair is not None
        pending = self._pending_chars
        pending.append(len(pair.prompt))
        pending.append(len(pair.chosen))
        pending.append(len(pair.rejected))
        if len(pending) >= 3 * LENGTH_FLUSH_ROWS:
            self._flush_lengths()
        tok = row.tokenized
        if tok is not None:
            self._add_token_lengths(token_lengths(tok))

    def _add_token_lengths(self, tok: TokenLengths) -> None:
        self.tokenized_rows += 1
        # Lengths before truncation describe the data; truncation rates say what the limits cut.
        tokens = self.tokens
        tokens["prompt"].add(tok.prompt)
        tokens["chosen"].add(tok.chosen)
        tokens["rejected"].add(tok.rejected)
        self.bias["tokens"][_compare(tok.chosen, tok.rejected)] += 1
        self.truncated["prompt"] += tok.cut_prompt
        self.truncated["chosen"] += tok.cut_chosen
        self.truncated["rejected"] += tok.cut_rejected
        self.truncated["any"] += tok.cut_prompt or tok.cut_chosen or tok.cut_rejected

    def _flush_lengths(self) -> None:
        """Move the pending character lengths into the distributions and the length-bias counts."""
        import numpy as np

        if not self._pending_chars:
            return
        values = np.frombuffer(self._pending_chars, dtype=np.int64).reshape(-1, 3)
        for column, name in enumerate(("prompt", "chosen", "rejected")):
            self.chars[name].add_many(values[:, column])
        chosen, rejected = values[:, 1], values[:, 2]
        bias = self.bias["chars"]
        for key, count in (
            ("chosen", int((chosen > rejected).sum())),
            ("rejected", int((rejected > chosen).sum())),
            ("equal", int((chosen == rejected).sum())),
        ):
            if count:
                bias[key] += count
        del values, chosen, rejected  # release the buffer export before replacing the array
        self._pending_chars = array("q")

    # ------------------------------------------------------------------ near-duplicate prompts

    def location(self, ordinal: int) -> dict[str, Any]:
        """Where record `ordinal` (0-based, in `add` order) came from."""
        files = self._file_names()
        out: dict[str, Any] = {"source_file": files[self.file_index[ordinal]], "source_line": self.line[ordinal]}
        if ordinal < len(self.prompt_excerpts):
            out["excerpt"] = self.prompt_excerpts[ordinal]
        return out

    def add_near_duplicate_prompts(
        self, clusters: Iterable[Iterable[int]], line_of: Mapping[int, Any] | Callable[[int], Any]
    ) -> None:
        """Record MinHash near-duplicate prompt clusters.

        `line_of(row_id)` (or `line_of[row_id]`) gives a line number, a (file, line) tuple, or a dict
        with source_file/source_line (and optionally excerpt)."""
        lookup = line_of.__getitem__ if isinstance(line_of, Mapping) else line_of
        self.near_duplicates_run = True
        materialized = [sorted(cluster) for cluster in clusters]
        sized = sorted((c for c in materialized if len(c) > 1), key=lambda c: (-len(c), c[0]))
        self.near_duplicate_clusters = len(sized)
        self.near_duplicate_rows = sum(len(c) for c in sized)
        self.near_duplicates = [
            {"size": len(c), "rows": [_as_location(lookup(i)) for i in c[:LINES_PER_GROUP]]} for c in sized[:TOP_GROUPS]
        ]

    # ------------------------------------------------------------------ build

    def build(self, accounting: Mapping[str, int] | None = None, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        meta = dict(meta or {})
        self._flush_lengths()
        policy = self.policy
        q_severity = self.quarantine_severity or QUARANTINE_SEVERITY.get(meta.get("command") or "", "error")
        flagged_rows = self._flagged_rows(q_severity)
        severities = self.severities + Counter({q_severity: self.outcomes["quarantined"]})
        pairs = len(self.pair_row)
        accounting = dict(accounting or {})
        accounting.setdefault("rows_in", self.rows)
        accounting.setdefault("rows_out", self.outcomes["kept"])
        accounting.setdefault("rows_dropped", self.outcomes["dropped"])
        accounting.setdefault("rows_quarantined", self.outcomes["quarantined"])

        tokens = self.tokenized_rows > 0
        unit = "tokens" if tokens else "characters"
        lengths_src = self.tokens if tokens else self.chars
        bias = self.bias["tokens" if tokens else "chars"]
        bias_total = sum(bias.values())
        length_bias = {
            "unit": unit,
            "pairs": bias_total,
            "chosen_longer": _share(bias["chosen"], bias_total),
            "rejected_longer": _share(bias["rejected"], bias_total),
            "equal": _share(bias["equal"], bias_total),
        }
        flags = {
            flag: {
                "count": count,
                "severity": _severity(policy, flag),
                "examples": self.flag_examples.get(flag, []),
            }
            for flag, count in sorted(self.flag_counts.items(), key=lambda kv: (-kv[1], kv[0]))
        }
        findings = self._findings(flags, pairs, length_bias, q_severity)
        # Rows at error severity (quarantined records included) plus each exceeded threshold.
        errors = severities["error"] + sum(1 for f in findings if f["kind"] == "threshold" and f["exceeded"])
        warnings = severities["warn"]
        report: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "prefdata_version": __version__,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": meta.pop("command", None),
            "input": meta.pop("input", None),
            "tokenizer": meta.pop("tokenizer", None),
            "policy": _policy_section(policy),
            "status": "fail" if errors else ("warn" if (warnings or severities["drop"]) else "pass"),
            "errors": errors,
            "warnings": warnings,
            "accounting": accounting,
            "outcomes": dict(self.outcomes),
            "rows_checked": pairs,
            "rows_flagged": self.flagged_rows_any,
            "findings": findings,
            "flags": flags,
            "quarantine": self._quarantine_section(q_severity),
            "dataset": self._dataset_section(),
            "lengths": {
                "unit": unit,
                "measured": ("before truncation" if self.truncation_known else "as stored")
                if tokens
                else "normalized text",
                **{name: dist.to_dict() for name, dist in lengths_src.items()},
            },
            "truncation": self._truncation_section(),
            "length_bias": {**length_bias, "limit": getattr(policy, "length_bias_limit", None)},
            "similarity": self._similarity_section(getattr(policy, "near_duplicate_threshold", None)),
            "flagged_rows": flagged_rows,
            "flagged_rows_total": self.flagged_total,
            "flagged_rows_complete": self.flagged_total == len(self.flagged),
        }
        if meta:
            report["meta"] = meta
        return report

    def _findings(
        self, flags: dict[str, Any], pairs: int, length_bias: dict[str, Any], q_severity: str
    ) -> list[dict[str, Any]]:
        """Everything that can fail a check: flags at error severity, quarantine, exceeded thresholds."""
        findings: list[dict[str, Any]] = []
        for flag, info in flags.items():
            if info["severity"] in ("error", "warn", "drop"):
                findings.append({"kind": "flag", "name": flag, "severity": info["severity"], "count": info["count"]})
        quarantined = self.outcomes["quarantined"]
        if quarantined:
            findings.append(
                {"kind": "quarantine", "name": "quarantined", "severity": q_severity, "count": quarantined}
            )
        # Same meaning as policy.dataset_limit_findings: flagged = any warn-or-worse flag (ignored flags
        # are already removed), length bias = share of pairs whose chosen half is longer.
        policy = self.policy
        max_share = getattr(policy, "max_flagged_share", None)
        if max_share is not None and pairs:
            share = self.flagged_rows_any / pairs
            findings.append(_threshold("max_flagged_share", share, max_share, share > max_share))
        bias_limit = getattr(policy, "length_bias_limit", None)
        if bias_limit is not None and length_bias["pairs"]:
            share = length_bias["chosen_longer"]
            findings.append(_threshold("length_bias", share, bias_limit, share > bias_limit))
        order = {"error": 0, "drop": 1, "warn": 2, None: 3}
        findings.sort(key=lambda f: (order.get(f["severity"], 3), -f.get("count", 0), f["name"]))
        return findings

    def _flagged_rows(self, q_severity: str) -> list[dict[str, Any]]:
        files = self._file_names()
        rows = []
        for digest, file_id, line, flags, severity, outcome, detail in self.flagged:
            quarantined = outcome == "quarantined"
            rows.append(
                {
                    "hash": digest,
                    "source_file": files[file_id],
                    "source_line": line,
                    "flags": list(flags),
                    "severity": q_severity if quarantined else severity,
                    "outcome": outcome,
                    ("error" if quarantined else "excerpt"): detail,
                }
            )
        return rows

    def _quarantine_section(self, q_severity: str) -> dict[str, Any]:
        reasons = sorted(self.quarantine_reasons.items(), key=lambda kv: (-kv[1][0], kv[0]))
        return {
            "count": self.outcomes["quarantined"],
            "severity": q_severity,
            "reasons": [{"reason": reason, "count": count, "rows": rows} for reason, (count, rows) in reasons],
            "other_reasons_count": self.quarantine_other,
        }

    def _file_names(self) -> list[str]:
        names = [""] * len(self.files)
        for name, index in self.files.items():
            names[index] = name
        return names

    def _groups(self, keys: array) -> dict[str, Any]:
        """Exact duplicate groups among 64-bit keys: rows involved, groups, and the largest groups."""
        import numpy as np

        if not len(keys):
            return {"groups": 0, "rows": 0, "extra_copies": 0, "top": []}
        values = np.frombuffer(keys, dtype=np.uint64)
        # Only keys that occur more than once matter: one plain sort finds them, and only their rows
        # get the (slower) stable sort that keeps the first occurrence first within a group.
        sorted_all = np.sort(values)
        repeated = np.unique(sorted_all[1:][sorted_all[1:] == sorted_all[:-1]])
        del sorted_all
        at = np.minimum(np.searchsorted(repeated, values), max(repeated.size - 1, 0))
        members = np.flatnonzero(repeated[at] == values) if repeated.size else np.zeros(0, dtype=np.int64)
        order = members[np.argsort(values[members], kind="stable")]
        sorted_values = values[order]
        starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]]) if order.size else order
        sizes = np.diff(np.r_[starts, len(order)])
        dup = np.flatnonzero(sizes > 1)
        rows_in_groups = int(sizes[dup].sum()) if len(dup) else 0
        # Largest first; ties by first appearance in the input.
        firsts = order[starts[dup]]
        ranked = sorted(zip((-sizes[dup]).tolist(), firsts.tolist(), starts[dup].tolist()))[:TOP_GROUPS]
        top = []
        for neg_size, _, start in ranked:
            members = sorted(order[start : start - neg_size].tolist())[:LINES_PER_GROUP]
            ordinals = [self.pair_row[m] for m in members]
            top.append(
                {
                    "count": -neg_size,
                    "excerpt": self.prompt_excerpts[ordinals[0]] if ordinals[0] < len(self.prompt_excerpts) else None,
                    "rows": [
                        {"source_file": loc["source_file"], "source_line": loc["source_line"]}
                        for loc in map(self.location, ordinals)
                    ],
                }
            )
        return {"groups": len(dup), "rows": rows_in_groups, "extra_copies": rows_in_groups - len(dup), "top": top}

    def _dataset_section(self) -> dict[str, Any]:
        conflicting = self.flag_counts.get("conflicting_pair", 0)
        return {
            "duplicate_prompts": self._groups(self.prompt_key),
            "duplicate_pairs": self._groups(self.pair_key),
            "conflicting_pairs": {
                "count": conflicting,
                "examples": self.flag_examples.get("conflicting_pair", []),
                "note": "counted from the conflicting_pair flag (absent when the policy ignores it)",
            },
            "near_duplicate_prompts": {
                "method": "minhash",
                "computed": self.near_duplicates_run,
                "threshold": getattr(self.policy, "near_duplicate_prompt_threshold", None),
                "clusters": self.near_duplicate_clusters,
                "rows": self.near_duplicate_rows,
                "top": self.near_duplicates,
            },
        }

    def _truncation_section(self) -> dict[str, Any]:
        n = self.tokenized_rows
        if not self.truncation_known:
            return {"available": False, "rows": n, "reason": "stored ids are already truncated"}
        if not n:
            return {"available": False, "rows": 0, "reason": "no tokenizer"}
        return {
            "available": True,
            "rows": n,
            **{f"{name}_rate": _share(self.truncated[name], n) for name in ("prompt", "chosen", "rejected", "any")},
            **{f"{name}_count": self.truncated[name] for name in ("prompt", "chosen", "rejected", "any")},
        }


def token_lengths(tok: Any) -> TokenLengths:
    """The report's view of a TokenizedPair: lengths before truncation, and what was cut."""
    return TokenLengths(
        tok.prompt_len_full,
        tok.chosen_len_full,
        tok.rejected_len_full,
        len(tok.prompt_ids) < tok.prompt_len_full,
        len(tok.chosen_ids) < tok.chosen_len_full,
        len(tok.rejected_ids) < tok.rejected_len_full,
    )


def _compare(chosen: int, rejected: int) -> str:
    return "chosen" if chosen > rejected else ("rejected" if rejected > chosen else "equal")


def _threshold(name: str, value: float, limit: float, exceeded: bool) -> dict[str, Any]:
    return {
        "kind": "threshold",
        "name": name,
        "value": round(value, 6),
        "limit": limit,
        "exceeded": exceeded,
        "severity": "error" if exceeded else None,
        "count": 1 if exceeded else 0,
    }


def _severity(policy: Any, flag: str) -> str | None:
    if policy is None:
        return None
    try:
        return policy.severity(flag)
    except Exception:  # a flag the policy does not know (e.g. from an older OUT/)
        return None


def _policy_section(policy: Any) -> dict[str, Any] | None:
    if policy is None:
        return None
    source = getattr(policy, "source", None)
    settings = policy.to_dict() if hasattr(policy, "to_dict") else {}
    return {"source": str(source) if source is not None else None, "settings": settings}


def _as_location(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return {"source_file": value[0], "source_line": value[1]}
    return {"source_file": None, "source_line": int(value)}


# ----------------------------------------------------------------------------- baseline


def _finding_keys(report: Mapping[str, Any]) -> set[tuple[str, str]]:
    keys = set()
    for row in report.get("flagged_rows", []):
        for flag in row.get("flags") or ["quarantined"]:
            keys.add((row["hash"], flag))
    return keys


def compare_to_baseline(report: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """What changed since `baseline` (a report of the base branch).

    A finding is (content hash, flag); it is new when the baseline has no row with the same content
    carrying the same flag, so moving or reordering rows is not a change. Regressions are new findings
    at error severity, and thresholds exceeded now but not in the baseline."""
    before = _finding_keys(baseline)
    new_rows = []
    for row in report.get("flagged_rows", []):
        new_flags = [f for f in (row.get("flags") or ["quarantined"]) if (row["hash"], f) not in before]
        if new_flags:
            new_rows.append({**row, "new_flags": new_flags})
    now_keys = _finding_keys(report)
    resolved = len({h for h, _ in before} - {h for h, _ in now_keys})

    base_flags = {name: info.get("count", 0) for name, info in baseline.get("flags", {}).items()}
    cur_flags = {name: info.get("count", 0) for name, info in report.get("flags", {}).items()}
    deltas = {
        name: {"before": base_flags.get(name, 0), "after": cur_flags.get(name, 0), "delta": cur_flags.get(name, 0) - base_flags.get(name, 0)}
        for name in sorted(set(base_flags) | set(cur_flags))
    }
    q_before = baseline.get("quarantine", {}).get("count", 0)
    q_after = report.get("quarantine", {}).get("count", 0)
    if q_before or q_after:
        deltas["quarantined"] = {"before": q_before, "after": q_after, "delta": q_after - q_before}

    base_exceeded = {f["name"] for f in baseline.get("findings", []) if f.get("kind") == "threshold" and f.get("exceeded")}
    new_thresholds = [
        f for f in report.get("findings", []) if f.get("kind") == "threshold" and f.get("exceeded") and f["name"] not in base_exceeded
    ]
    new_errors = [r for r in new_rows if r.get("severity") == "error"]
    return {
        "schema_version": baseline.get("schema_version"),
        "input": baseline.get("input"),
        "new_flagged_rows": len(new_rows),
        "new_error_rows": len(new_errors),
        "resolved_rows": resolved,
        "new_rows": new_rows[:1000],
        "new_thresholds_exceeded": [f["name"] for f in new_thresholds],
        "flag_deltas": deltas,
        "rows_in": {"before": baseline.get("accounting", {}).get("rows_in"), "after": report.get("accounting", {}).get("rows_in")},
        "baseline_complete": bool(baseline.get("flagged_rows_complete", True)),
        "regressions": len(new_errors) + len(new_thresholds),
    }


def apply_baseline(report: dict[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Attach the comparison and make `status` reflect regressions only (what a PR check wants)."""
    comparison = compare_to_baseline(report, baseline)
    report["baseline"] = comparison
    if comparison["regressions"]:
        report["status"] = "fail"
    elif report["status"] == "fail":
        report["status"] = "warn"  # known findings: not this change's fault, still worth reading
    return report
