"""The two worker stages of the two-pass pipeline (prefdata.pipeline.shards drives them).

`ScanGroup` (first pass): check a group of consecutive chunks -- parse, normalize, tokenize, the
pair's own flags -- keep the result in a cache file next to the output, and return only what the
dataset-wide checks and the line numbering need: digests, record counts, quarantine reasons.

`WriteShard` (second pass, once the dataset-wide answers are known): read the group back from its
cache, place its lines, add its rows' duplicate/conflict flags, apply the policy, write the kept
rows to the group's own Arrow shard, and return the small things the main process joins in input
order: content digests, the report's compact rows, and the group's dropped and quarantine lines
as two small files beside the cache (the main process appends their bytes, parsing nothing).

Both are engine stages (prefdata.engine.local): picklable, `run` keeps no state between units, so
they run unchanged in local worker processes and in Ray actors. On a cluster OUT must be on
storage that every node sees (the cache and the shards are written there).
"""

from __future__ import annotations

import os
import pickle
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prefdata.checks.checker import verdict
from prefdata.checks.digests import DigestBlock, block_from_digests, join_blocks
from prefdata.checks.partitioned import dataset_flags, member
from prefdata.checks.policy import Policy
from prefdata.checks.stage import CheckChunk, CheckedChunk
from prefdata.core import flags as F
from prefdata.core.records import CheckedRow, Pair, RawRecord, ScoredSummary
from prefdata.io.chunks import Chunk
from prefdata.io.ledger import Ledger
from prefdata.io.rows import dropped_record, output_row, quarantine_record, row_digest
from prefdata.io.writer import DatasetWriter, WrittenParts, jsonl_line, rewrite_part
from prefdata.report.compact import EXCERPT_CHARS, OUTCOMES, SEVERITY_CODES, excerpt, sample_halves, token_row
from prefdata.report.images import ImageFacts, ImageFactsCollector
from prefdata.report.similarity import SIMILARITY_SAMPLE
from prefdata.sets.balance import CHOSEN_LONGER, NOT_CHOSEN_LONGER, OWN_DROP

# Kept rows are written every `batch_size` rows, or sooner once their images reach this many bytes:
# image rows carry their encoded images (RLAIF-V's ~100 KB-1 MB), so 1,000 of them could be a GB.
WRITE_BATCH_BYTES = 64 << 20
ALONE_IDS = 1 << 20  # ids in a row that PendingRows writes alone

_QUARANTINED = OUTCOMES.index("quarantined")
_UNPAIRED = OUTCOMES.index("unpaired")


# --------------------------------------------------------------------------- first pass


@dataclass
class GroupUnit:
    """Consecutive chunks that become one cache file and, later, one shard."""

    index: int
    chunks: list[Chunk]


@dataclass
class ChunkCounts:
    """What the main process needs of one checked chunk to number its lines and rows."""

    records: int  # rows (a record of scored completions may give several)
    line_count: int  # of a RangeChunk (prefdata.io.chunks.LineNumbers), else 0
    pair_index: np.ndarray  # (p,) positions of its pairs (row ordinals of --balance-length's classes)
    known: np.ndarray  # positions of its rows that are preference data: pairs and unpaired rows (ShapeProbe)
    quarantined: list[tuple[int, int, str, bool]]  # (position, line within the chunk, error, unknown shape)
    classes: np.ndarray | None = None  # with --balance-length: per pair, pair_classes


@dataclass
class GroupScan:
    cache: str  # the file WriteShard reads the group back from
    chunks: list[ChunkCounts]
    block: DigestBlock  # the group's digests, rows numbered from 0 at the group's first record


@dataclass
class ScanGroup:
    """First-pass stage: `run(GroupUnit)` -> GroupScan."""

    check: CheckChunk
    cache_dir: str
    balance: bool = False  # also each pair's class for --balance-length (prefdata.sets.balance)

    def setup(self) -> None:
        self.check.setup()

    def run(self, unit: GroupUnit) -> GroupScan:
        cache = Path(self.cache_dir) / f"group-{unit.index:06d}.pickle"
        counts: list[ChunkCounts] = []
        blocks: list[DigestBlock] = []
        rows = 0
        with open(cache, "wb") as handle:  # one pickle per chunk: the worker holds one chunk at a time
            for chunk in unit.chunks:
                checked = self.check.run(chunk)
                pickle.dump(checked, handle, protocol=pickle.HIGHEST_PROTOCOL)
                quarantined = [
                    (i, r.raw.source_line, str(r.error), r.unknown_shape)
                    for i, r in enumerate(checked.records) if r.quarantined
                ]
                known = np.array([i for i, r in enumerate(checked.records) if not r.quarantined], dtype=np.int64)
                classes = pair_classes(checked, self.check.policy) if self.balance else None
                counts.append(ChunkCounts(len(checked.records), checked.line_count, checked.pair_index, known,
                                          quarantined, classes))
                blocks.append(block_from_digests(checked.pair_index + rows, checked.digests))
                rows += len(checked.records)
        return GroupScan(str(cache), counts, join_blocks(blocks))


# --------------------------------------------------------------------------- second pass


@dataclass
class ChunkPlace:
    """Where a chunk sits in the input, known once the chunks before it were counted."""

    source_file: str
    line_offset: int  # added to its line numbers
    first_row: int  # ordinal of its first record in the input


@dataclass
class ShardUnit:
    index: int
    cache: str
    places: list[ChunkPlace]
    duplicate_rows: np.ndarray  # the group's rows flagged duplicate_pair (ordinals, ascending)
    conflicting_rows: np.ndarray  # ... and conflicting_pair
    sample_cutoff: int  # pairs with a report key below it bring their halves (the similarity sample)
    want_excerpts: bool  # the report still keeps prompt excerpts
    # The group's rows --balance-length removes (ordinals, ascending): flagged length_balance.
    balance_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    sample_k: int = SIMILARITY_SAMPLE  # the similarity sample's size (report.similarity.SimilaritySample.k)


@dataclass
class ChunkReport:
    """One chunk in the report's compact form (report.compact.CompactRows without the callable)."""

    source_file: str
    lines: np.ndarray
    outcome: np.ndarray
    severity: np.ndarray
    pair_index: np.ndarray
    prompt_keys: np.ndarray
    pair_keys: np.ndarray
    lengths: np.ndarray
    details: dict[int, CheckedRow]  # flagged and quarantined records, by position
    halves: dict[int, Any]
    excerpts: list[str] | None
    # report.compact.token_row of each tokenized pair, in order: a list while the chunk is read,
    # then a (k, 6) int64 array (a tuple of Python ints per pair would cross to the main process).
    tokens: list[tuple[int, ...]] | np.ndarray
    scored: list[tuple[int, ScoredSummary]] = field(default_factory=list)  # (position, summary), as CompactRows
    images: ImageFacts | None = None  # of its pairs with images, as CompactRows


@dataclass
class ShardWritten:
    parts: WrittenParts  # the shard's Arrow file(s), not yet named as the dataset's
    digests: bytes  # io.rows.row_digest of each kept row, in order (16 bytes each)
    dropped: tuple[str, int] = ("", 0)  # (file of dropped.jsonl lines, lines in it)
    quarantined: tuple[str, int] = ("", 0)  # ... of quarantine.jsonl lines
    chunks: list[ChunkReport] = field(default_factory=list)
    flag_counts: Counter[str] = field(default_factory=Counter)
    errors: int = 0  # rows with a flag at error severity
    ledger: Ledger = field(default_factory=Ledger)  # the shard's rows, records and pairs
    writer_pid: int = 0  # the process that wrote the shard


@dataclass
class WriteShard:
    """Second-pass stage: `run(ShardUnit)` -> ShardWritten; the shard files go to `directory`.
    `write=False` (validate): the same rows, flags, counts and report, and no file written."""

    policy: Policy
    directory: str
    batch_size: int
    write: bool = True

    def setup(self) -> None:
        pass  # the tokenizer is not needed: the cache holds the tokenized rows

    def run(self, unit: ShardUnit) -> ShardWritten:
        result = ShardWritten(WrittenParts([], set(), set(), 0), b"", writer_pid=os.getpid())
        writer = DatasetWriter(Path(self.directory), prefix=f"shard-{unit.index:06d}") if self.write else None
        pending = PendingRows(writer, self.batch_size) if writer is not None else None
        digests = bytearray()
        lines = _GroupLines(unit.cache, self.write)
        with open(unit.cache, "rb") as handle, lines:
            for place in unit.places:
                checked: CheckedChunk = pickle.load(handle)
                for row in self._rows(checked, place, unit, result, lines):
                    if row.outcome == "kept" and pending is not None:
                        out_row = output_row(row)
                        digests += row_digest(out_row)
                        pending.add(out_row)
        if writer is not None and pending is not None:
            pending.flush()
            result.parts = writer.close()
        result.dropped, result.quarantined = lines.dropped, lines.quarantined
        result.digests = bytes(digests)
        _keep_sample_halves(result.chunks, unit.sample_k)
        return result

    def _rows(self, checked: CheckedChunk, place: ChunkPlace, unit: ShardUnit, result: ShardWritten,
              lines: "_GroupLines") -> list[CheckedRow]:
        """The chunk's rows with lines placed, dataset flags added and the policy applied; its
        dropped/quarantine lines go to `lines`, its compact report and counts into `result`."""
        records = checked.records
        for record in records:
            record.raw.source_line += place.line_offset
            if record.pair is not None:
                record.pair.source_line += place.line_offset
        pairs = checked.pair_index
        ordinals = pairs + place.first_row
        duplicate, conflicting = member(ordinals, unit.duplicate_rows), member(ordinals, unit.conflicting_rows)
        balanced = member(ordinals, unit.balance_rows) if len(unit.balance_rows) else None
        keys = checked.digests.pair_keys
        below = set(pairs[keys < np.uint64(unit.sample_cutoff)].tolist()) if unit.sample_cutoff < 1 << 64 else None
        n = len(records)
        outcome = np.full(n, _QUARANTINED, dtype=np.int64)
        severity = np.zeros(n, dtype=np.int64)
        report = ChunkReport(
            place.source_file, np.array([r.raw.source_line for r in records], dtype=np.int64), outcome, severity,
            pairs, checked.digests.prompt_keys, checked.digests.pair_keys, np.zeros((len(pairs), 3), np.int64), {},
            {}, [] if unit.want_excerpts else None, [],
        )
        rows: list[CheckedRow] = []
        images = ImageFactsCollector()
        at_pair = 0
        for position, record in enumerate(records):
            pair = record.pair
            if record.scored is not None:
                report.scored.append((position, record.scored))
            if record.unpaired:  # scored completions that made no pair: a dropped.jsonl line with the reason
                row = CheckedRow(record.raw, None, None, [], None, "unpaired", scored=record.scored)
                outcome[position] = _UNPAIRED
                lines.drop(row)
                result.ledger.add(row)
                if report.excerpts is not None:
                    report.excerpts.append(excerpt(record.scored.prompt if record.scored is not None else ""))
                continue
            if pair is None:
                row = CheckedRow(record.raw, None, None, [], None, "quarantined", error=record.error)
                lines.quarantine(row)
                result.ledger.add(row)
                report.details[position] = row
                if report.excerpts is not None:
                    report.excerpts.append("")
                continue
            found = record.flags + dataset_flags(bool(duplicate[at_pair]), bool(conflicting[at_pair]))
            if balanced is not None and balanced[at_pair]:
                found.append(F.LENGTH_BALANCE)  # an ordinary dropped pair (a pair of scored completions too)
            row = CheckedRow(record.raw, pair, record.tokenized, *verdict(found, self.policy), scored=record.scored)
            result.ledger.add(row)
            report.lengths[at_pair] = (len(pair.prompt), len(pair.chosen), len(pair.rejected))
            at_pair += 1
            outcome[position] = OUTCOMES.index(row.outcome)
            severity[position] = SEVERITY_CODES.index(row.severity)
            result.flag_counts.update(row.flags)
            result.errors += row.severity == "error"
            if row.flags:
                report.details[position] = _for_report(row)
            if record.tokenized is not None:
                report.tokens.append(token_row(record.tokenized))
            if pair.image_data:
                images.add(pair.image_data, record.tokenized.image_tokens if record.tokenized is not None else None)
            if below is None or position in below:
                report.halves[position] = sample_halves(pair)
            if report.excerpts is not None:
                report.excerpts.append(excerpt(pair.prompt))
            if row.outcome == "dropped":
                lines.drop(row)
            rows.append(row)
        report.images = images.facts()
        report.tokens = np.array(report.tokens, dtype=np.int64).reshape(-1, 6)
        result.chunks.append(report)
        return rows


class PendingRows:
    """Kept rows waiting for `writer.write_rows`, flushed by count or by image bytes (the rows and
    their order are the same either way; only where Arrow batches break moves)."""

    def __init__(self, writer: Any, batch_size: int):
        self.writer, self.batch_size = writer, batch_size
        self.rows: list[dict[str, Any]] = []
        self.image_bytes = 0

    def add(self, row: dict[str, Any]) -> None:
        if sum(len(row[key]) for key in ("prompt_ids", "chosen_ids", "rejected_ids")) >= ALONE_IDS:
            # A huge row (a 10 MB reasoning trace: 9 M ids) goes in a batch of its own, so its ids
            # become the Arrow column without a copy (io.columns): the peak is one copy, not two.
            self.flush()
            self.rows.append(row)
            self.flush()
            return
        self.rows.append(row)
        self.image_bytes += sum(len(image["bytes"] or b"") for image in row.get("images") or ())
        if len(self.rows) >= self.batch_size or self.image_bytes >= WRITE_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        self.writer.write_rows(self.rows)
        self.rows, self.image_bytes = [], 0


class _GroupLines:
    """A group's dropped.jsonl and quarantine.jsonl lines, in files next to its cache (`write`
    False: only counted)."""

    def __init__(self, cache: str, write: bool = True) -> None:
        self.write = write
        self.dropped = (cache + ".dropped.jsonl" if write else "", 0)
        self.quarantined = (cache + ".quarantine.jsonl" if write else "", 0)

    def __enter__(self) -> "_GroupLines":
        if self.write:
            self._dropped = open(self.dropped[0], "w", encoding="utf-8")
            self._quarantined = open(self.quarantined[0], "w", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.write:
            self._dropped.close()
            self._quarantined.close()

    def drop(self, row: CheckedRow) -> None:
        if self.write:
            self._dropped.write(jsonl_line(dropped_record(row)))
        self.dropped = (self.dropped[0], self.dropped[1] + 1)

    def quarantine(self, row: CheckedRow) -> None:
        if self.write:
            self._quarantined.write(jsonl_line(quarantine_record(row)))
        self.quarantined = (self.quarantined[0], self.quarantined[1] + 1)


def _keep_sample_halves(chunks: list[ChunkReport], k: int) -> None:
    """Drop the halves of pairs that cannot be in the report's final similarity sample: the k
    smallest distinct pair keys of the whole input are each among the k smallest of the group
    they are first seen in. The first units leave before the sample has a cut-off, and without
    this each would bring every pair's halves to the main process at once."""
    if not chunks:
        return
    distinct = np.unique(np.concatenate([np.asarray(c.pair_keys, dtype=np.uint64) for c in chunks]))
    if len(distinct) <= k:
        return
    bound = distinct[k - 1]
    for chunk in chunks:
        if not chunk.halves:
            continue
        positions = np.fromiter(chunk.halves, dtype=np.int64, count=len(chunk.halves))
        keys = np.asarray(chunk.pair_keys, dtype=np.uint64)[np.searchsorted(chunk.pair_index, positions)]
        chunk.halves = {p: chunk.halves[p] for p in positions[keys <= bound].tolist()}


def _for_report(row: CheckedRow) -> CheckedRow:
    """What the report reads of a flagged row, and no more: where it is, its verdict, and the
    start of each text (excerpts read at most 4 x EXCERPT_CHARS characters, so they come out the
    same); no ids, messages or pass-through columns travel to the main process."""
    pair = row.pair
    assert pair is not None
    cut = 4 * EXCERPT_CHARS
    light = Pair(pair.source_file, pair.source_line, pair.prompt[:cut], pair.chosen[:cut], pair.rejected[:cut])
    light.benchmark_match = pair.benchmark_match  # small: the report names the benchmark item
    return CheckedRow(RawRecord(row.raw.source_file, row.raw.source_line), light, None, row.flags, row.severity,
                      row.outcome)


# --------------------------------------------------------------------------- schema unification


@dataclass
class RewritePart:
    """Stage: rewrite one shard to the dataset's final schema (a column another shard typed wider,
    JSON-encoded, or mixed text kinds): `run((part, final file, columns to JSON-encode))`."""

    schema: Any  # pa.Schema

    def setup(self) -> None:
        pass

    def run(self, job: tuple[Path, Path, set[str]]) -> str:
        src, dst, to_encode = job
        rewrite_part(src, dst, self.schema, to_encode)
        return dst.name


def pair_classes(checked: CheckedChunk, policy: Policy) -> np.ndarray:
    """Per pair of the chunk (in `pair_index` order): OWN_DROP when its own flags drop it, else
    whether chosen is longer in tokens (before truncation; characters for an untokenized pair)."""
    classes = np.empty(len(checked.pair_index), dtype=np.int8)
    for at, position in enumerate(checked.pair_index.tolist()):
        record = checked.records[position]
        if verdict(record.flags, policy)[2] == "dropped":
            classes[at] = OWN_DROP
            continue
        tok, pair = record.tokenized, record.pair
        if tok is not None:
            longer = tok.chosen_len_full > tok.rejected_len_full
        else:
            longer = len(pair.chosen) > len(pair.rejected)  # type: ignore[union-attr]
        classes[at] = CHOSEN_LONGER if longer else NOT_CHOSEN_LONGER
    return classes
