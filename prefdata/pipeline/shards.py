"""`prepare`'s one write path: the workers write the Arrow shards; no row passes through the main process.

Two passes over the input, both on the engine (local worker processes, Ray actors, or -- one
worker -- this process itself):

1. `ScanGroup` checks groups of consecutive chunks and caches them in OUT's staging directory;
   this process numbers their lines and rows, runs the "not preference data" probe, and the
   dataset-wide checks run by hash partitioning over the groups' digests
   (prefdata.checks.partitioned: on Ray the shuffle runs on the cluster).
2. `WriteShard` reads each group back, applies the dataset-wide flags and the policy, and writes
   the group's kept rows to its own shard. This process joins, in input order, only what is small:
   16-byte content digests and the report's compact rows, and appends the bytes of each group's
   dropped and quarantine lines (written by the worker) to dropped.jsonl and quarantine.jsonl.

The shards become the dataset's `data-XXXXX-of-YYYYY.arrow` files in input order (a shard whose
pass-through columns another shard typed wider is rewritten by a worker), so OUT is the local
OUT is the same (content hash, rows, flags, dropped/quarantine lines, report) whatever the engine,
the number of workers and the shard size.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections import Counter
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from prefdata.checks.digests import shift_rows
from prefdata.checks.partitioned import PartitionedResult, partitioned_on
from prefdata.checks.policy import Policy
from prefdata.checks.stage import CheckChunk
from prefdata.checks import stream
from prefdata.checks.stream import ShapeProbe, progress_bar
from prefdata.core.memory import trim_heap
from prefdata.engine.local import Engine
from prefdata.io import writer as W
from prefdata.io.chunks import Chunk, LineNumbers, RangeChunk
from prefdata.io.ledger import Ledger, check_files
from prefdata.pipeline.shard_stages import (
    ChunkPlace, GroupScan, GroupUnit, RewritePart, ScanGroup, ShardUnit, ShardWritten, WriteShard,
)
from prefdata.report.builder import EXCERPT_ROWS, ReportBuilder
from prefdata.report.compact import CompactRows
from prefdata.sets.balance import plan_balance

# A shard holds the records of up to this many input bytes (or SHARD_CHUNKS chunks read in this
# process: gzip, JSON arrays, Parquet, the Hub) -- fewer when the input is small, so that every
# worker gets several shards.
SHARD_BYTES = 64 << 20
SHARD_CHUNKS = 256
GROUPS_PER_WORKER = 16
CACHE_DIR = ".groups"  # inside the staging directory; removed as the shards are written


@dataclass
class Written:
    """What writing the rows left behind: the report so far, the counts, the content hash."""

    report: ReportBuilder
    accounting: dict[str, int]  # io.ledger.Ledger.accounting: rows, records, pairs, completions
    flag_counts: Counter[str]
    errors: int  # rows with a flag at error severity
    content_hash: str
    columns: list[str]
    json_columns: list[str]
    text_columns: Any  # how the text columns are stored (strings, messages, or both): io.writer
    shards: list[dict[str, Any]]  # the Arrow data files in order: {"file", "rows"}


@dataclass
class _Group:
    """What this process keeps of a group between the passes."""

    index: int
    cache: str
    places: list[ChunkPlace]
    first_row: int
    end_row: int


def shard_bytes_for(input_bytes: int, workers: int, chunk_bytes: int) -> int:
    """Input bytes per shard: at most SHARD_BYTES, and small enough that each of `workers` gets
    GROUPS_PER_WORKER shards (a small input still spreads over every worker)."""
    return max(chunk_bytes, min(SHARD_BYTES, input_bytes // max(1, GROUPS_PER_WORKER * workers)))


def shard_bytes_of(input_bytes: int | None, engine: Any) -> int:
    """Input bytes per shard for a run on `engine` (shard_bytes_for); `input_bytes` None: a Hub
    split, whose record chunks are grouped by count (SHARD_CHUNKS)."""
    if input_bytes is None:
        return SHARD_BYTES
    # stream.CHUNK_BYTES read at call time: the chunks are cut with its value then
    return shard_bytes_for(input_bytes, getattr(engine, "workers", 1), stream.CHUNK_BYTES)


def group_chunks(chunks: Iterable[Chunk], max_bytes: int, max_chunks: int | None = None) -> Iterator[GroupUnit]:
    """Consecutive chunks in groups of up to `max_bytes` of input (byte-range chunks) or
    `max_chunks` chunks (default SHARD_CHUNKS)."""
    max_chunks = max_chunks or SHARD_CHUNKS
    group: list[Chunk] = []
    size = index = 0
    for chunk in chunks:
        group.append(chunk)
        size += chunk.end - chunk.start if isinstance(chunk, RangeChunk) else 0
        if size >= max_bytes or len(group) >= max_chunks:
            yield GroupUnit(index, group)
            group, size, index = [], 0, index + 1
    if group:
        yield GroupUnit(index, group)


def write_with_workers(
    chunks: Iterable[Chunk], tmp: Path, *, check: CheckChunk, policy: Policy, engine: Engine, shard_bytes: int,
    batch_size: int, handoff: dict[str, Any], input_name: str, progress: bool,
    report: ReportBuilder | None = None, balance: tuple[float, int] | None = None,
) -> Written:
    """Both passes (see the module doc): OUT's dataset, dropped.jsonl, quarantine.jsonl and the
    report's rows, with the near-duplicate prompt groups already in the report. `report`: the
    builder to fill (default: a plain one). `balance`: (target, seed) of --balance-length: between
    the passes prefdata.sets.balance picks the pairs the second pass flags length_balance."""
    cache_dir = tmp / CACHE_DIR
    cache_dir.mkdir()
    groups, answers, classes = _first_pass(chunks, check, engine, cache_dir, shard_bytes, batch_size, input_name,
                                           progress, balance is not None)
    report = report or ReportBuilder(policy)
    drop_rows = np.zeros(0, dtype=np.int64)
    if balance is not None:
        plan = plan_balance(*classes, answers.duplicate_rows, answers.conflicting_rows, policy.severity, *balance)
        drop_rows = plan.drop_rows
        report.length_balance = plan.summary
        report.balance_dropped = plan.summary["dropped"]
    written = _second_pass(groups, answers, tmp, policy, engine, batch_size, handoff, progress, report, drop_rows)
    shutil.rmtree(cache_dir, ignore_errors=True)
    written.report.add_near_duplicate_prompts(answers.near_duplicate_groups, written.report.location)
    return written


def check_without_writing(
    chunks: Iterable[Chunk], report: ReportBuilder, *, check: CheckChunk, engine: Engine, shard_bytes: int,
    batch_size: int, input_name: str, progress: bool,
) -> None:
    """Both passes with nothing written (`validate`): the second pass returns the report's compact
    rows, flag counts and ledger but writes no Arrow shard and no dropped/quarantine line. The
    group cache lives in a temporary directory, removed however the run ends."""
    with tempfile.TemporaryDirectory(prefix="prefdata-validate-") as cache_dir:
        groups, answers, _ = _first_pass(chunks, check, engine, Path(cache_dir), shard_bytes, batch_size, input_name,
                                         progress)
        stage = WriteShard(check.policy, cache_dir, batch_size, write=False)
        for _shard in _shards(groups, answers, engine, stage, report, progress, np.zeros(0, dtype=np.int64)):
            pass
    report.add_near_duplicate_prompts(answers.near_duplicate_groups, report.location)


def _first_pass(
    chunks: Iterable[Chunk], check: CheckChunk, engine: Engine, cache_dir: Path, shard_bytes: int, batch_size: int,
    input_name: str, progress: bool, balance: bool = False,
) -> tuple[list[_Group], PartitionedResult, tuple[np.ndarray, np.ndarray]]:
    """Check and cache every group; number its lines and rows; the dataset-wide answers; with
    `balance`, every pair's row ordinal and class (prefdata.pipeline.shard_stages.pair_classes)."""
    put = getattr(engine, "put", lambda value: value)  # Ray: digests go to the object store at once
    probe = ShapeProbe(input_name, batch_size)
    lines = LineNumbers()
    groups: list[_Group] = []
    blocks: list[Any] = []
    ordinals: list[np.ndarray] = []
    classes: list[np.ndarray] = []
    rows = 0
    bar = progress_bar(progress, "checking")
    try:
        units = group_chunks(chunks, shard_bytes)
        with closing(engine.map_ordered(ScanGroup(check, str(cache_dir), balance), units)) as results:
            for unit, scan in results:
                groups.append(_place(unit, scan, lines, probe, rows))
                if balance:
                    for place, counts in zip(groups[-1].places, scan.chunks):
                        ordinals.append(counts.pair_index + place.first_row)
                        classes.append(counts.classes)  # type: ignore[arg-type]
                blocks.append(put(shift_rows(scan.block, rows)))
                rows = groups[-1].end_row
                if bar is not None:
                    bar.update(rows - groups[-1].first_row)
    finally:
        if bar is not None:
            bar.close()
    probe.finish()
    pairs = (np.concatenate(ordinals) if ordinals else np.zeros(0, dtype=np.int64),
             np.concatenate(classes) if classes else np.zeros(0, dtype=np.int8))
    return groups, partitioned_on(engine, blocks, check.policy.near_duplicate_prompt_threshold), pairs


def _place(unit: GroupUnit, scan: GroupScan, lines: LineNumbers, probe: ShapeProbe, first_row: int) -> _Group:
    """Each chunk's line offset and first row; the probe sees its records in input order."""
    places = []
    row = first_row
    for chunk, counts in zip(unit.chunks, scan.chunks):
        offset = lines.offset(chunk, counts.line_count)
        places.append(ChunkPlace(chunk.source_file, offset, row))
        problems = [(i, f"{chunk.source_file}:{line + offset}: {error}", unknown)
                    for i, line, error, unknown in counts.quarantined]
        probe.add_chunk(counts.records, counts.known, problems)
        row += counts.records
    return _Group(unit.index, scan.cache, places, first_row, row)


def _second_pass(
    groups: list[_Group], answers: PartitionedResult, tmp: Path, policy: Policy, engine: Engine, batch_size: int,
    handoff: dict[str, Any], progress: bool, report: ReportBuilder, balance_rows: np.ndarray,
) -> Written:
    dropped = W.JsonlWriter(tmp / "dropped.jsonl")
    quarantine = W.JsonlWriter(tmp / "quarantine.jsonl")
    content = hashlib.blake2b(digest_size=16)
    flag_counts: Counter[str] = Counter()
    errors = kept = 0
    ledger = Ledger()
    shards: list[W.WrittenParts] = []
    stage = WriteShard(policy, str(tmp), batch_size)
    for shard in _shards(groups, answers, engine, stage, report, progress, balance_rows):
        dropped.append_file(*shard.dropped)
        quarantine.append_file(*shard.quarantined)
        content.update(shard.digests)
        flag_counts.update(shard.flag_counts)
        errors += shard.errors
        ledger.merge(shard.ledger)
        kept += shard.parts.rows
        shards.append(shard.parts)
    dropped.close()
    quarantine.close()
    joined = W.WrittenParts.joined(shards)
    fingerprint = content.hexdigest()
    schema, files = W.finish_dataset(tmp, joined, fingerprint, {**handoff, "content_hash": fingerprint},
                                     rewrite=lambda jobs, final: _rewrite(engine, jobs, final))
    accounting = ledger.accounting()
    check_files(accounting, kept, dropped.count, quarantine.count)  # invariant 5
    assert report.rows == accounting["rows_in"], (report.rows, accounting)
    return Written(report, accounting, flag_counts, errors, fingerprint, schema.names, sorted(joined.json_columns),
                   joined.text_columns, files)


def _shards(
    groups: list[_Group], answers: PartitionedResult, engine: Engine, stage: WriteShard, report: ReportBuilder,
    progress: bool, balance_rows: np.ndarray,
) -> Iterator[ShardWritten]:
    """The second pass: `stage` on each group, in input order; each shard's compact rows go into
    `report` before it is yielded, and its cache file is removed."""
    bar = progress_bar(progress, "writing" if stage.write else "reporting")
    # Units are made as the engine takes them: the report's sample cut-off is the one after the
    # shards before it (it only falls, so an early unit brings a few halves too many).
    units = (
        ShardUnit(
            group.index, group.cache, group.places,
            _rows_between(answers.duplicate_rows, group.first_row, group.end_row),
            _rows_between(answers.conflicting_rows, group.first_row, group.end_row),
            report.similarity.cutoff(), group.first_row < EXCERPT_ROWS,
            _rows_between(balance_rows, group.first_row, group.end_row), report.similarity.k,
        )
        for group in groups
    )
    try:
        with closing(engine.map_ordered(stage, units)) as results:
            for unit, shard in results:
                # The cache goes once the shard is in hand: until then a retried unit can read it again.
                Path(unit.cache).unlink(missing_ok=True)
                _add_to_report(report, shard)
                if bar is not None:
                    bar.update(sum(len(chunk.lines) for chunk in shard.chunks))
                del shard.chunks[:]  # the report holds what it needs of them
                trim_heap()  # the unpickled shard's holes: else the heap keeps growing by each one's size
                yield shard
    finally:
        if bar is not None:
            bar.close()


def _rows_between(sorted_rows: np.ndarray, first: int, end: int) -> np.ndarray:
    return sorted_rows[np.searchsorted(sorted_rows, first):np.searchsorted(sorted_rows, end)]


def _add_to_report(report: ReportBuilder, shard: ShardWritten) -> None:
    for chunk in shard.chunks:
        report.add_compact(CompactRows(
            source_file=chunk.source_file, lines=chunk.lines, outcome=chunk.outcome, severity=chunk.severity,
            pair_index=chunk.pair_index, prompt_keys=chunk.prompt_keys, pair_keys=chunk.pair_keys,
            lengths=chunk.lengths, detailed=sorted(chunk.details), detail=chunk.details.__getitem__,
            halves=chunk.halves, excerpts=chunk.excerpts,
            tokens=np.asarray(chunk.tokens, dtype=np.int64).reshape(-1, 6), scored=chunk.scored, images=chunk.images,
        ))


def _rewrite(engine: Engine, jobs: list[tuple[Path, Path, set[str]]], schema: Any) -> None:
    """Shards that need the final schema are rewritten by the workers, not here."""
    with closing(engine.map_ordered(RewritePart(schema), jobs)) as results:
        for _ in results:
            pass
