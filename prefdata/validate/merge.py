"""Text-level `validate` of raw input on the engine: one pipeline, whatever the number of workers.

The main process cuts the input into chunks (prefdata.io.chunks), the engine (prefdata.engine.local:
worker processes, or this process for one worker; prefdata.engine.ray) checks each chunk
(`ScanChunks`, prefdata.validate.scan), and the main process merges the compact results strictly in
input order: the dataset-wide flags (prefdata.checks.partitioned: duplicate and conflicting pairs,
first occurrence wins; MinHash -- answered once every chunk is scanned: the compact scans wait in a
temporary file), the policy and the report -- vectorized per chunk. The few rows the report
describes one by one (flagged or quarantined) are re-read from the chunk in the main process. At
most a few chunks are in flight, so memory stays flat apart from the digests the checks keep.

The report is the same for any number of workers, and byte for byte the one prepare's checked-row
stream gives for the same rows (tests/test_content_hash_pin.py pins both); input errors are the
same one-line PrefdataErrors, raised at the same point.
"""

from __future__ import annotations

import heapq
import pickle
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np

from prefdata.checks.checker import build_leak_index
from prefdata.checks.pair import apply_policy
from prefdata.checks.policy import Policy
from prefdata.checks.digests import block_from_digests
from prefdata.checks.partitioned import PartitionedResult, partitioned_on
from prefdata.checks.stream import ShapeProbe, progress_bar
from prefdata.core import flags as F
from prefdata.core.records import CheckedRow
from prefdata.engine.local import Engine, LocalEngine
from prefdata.io import chunks as text_chunks
from prefdata.io.chunks import Chunk, LineNumbers, RangeChunk, exact_record, iter_chunks
from prefdata.io.hub import iter_hub_chunks, parse_hub_id
from prefdata.report import builder as R
from prefdata.report.builder import ReportBuilder
from prefdata.report.compact import OUTCOMES, SEVERITY_CODES, CompactRows
from prefdata.sets.decontaminate import BenchmarkIndex
from prefdata.sets.pairing import PairingSettings
from prefdata.sets.scored import record_pairs
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.validate.scan import FLAG_BIT, ChunkScan, MeasureSimilarity, ScanChunks, ScanSettings, ScanUnit, flags_of

_DUPLICATE, _CONFLICTING = FLAG_BIT[F.DUPLICATE_PAIR], FLAG_BIT[F.CONFLICTING_PAIR]
_KEPT, _DROPPED, _QUARANTINED, _UNPAIRED = (OUTCOMES.index(o) for o in ("kept", "dropped", "quarantined", "unpaired"))


def check_raw_text(
    input_path: str | Path,
    builder: ReportBuilder,
    *,
    policy: Policy,
    settings: TokenizeSettings,
    against: str | Path | None = None,
    batch_size: int = 1000,
    progress: bool = True,
    workers: int = 2,
    engine: Engine | None = None,
    benchmarks: BenchmarkIndex | None = None,
    pairing: PairingSettings | None = None,
) -> None:
    """Check every record of raw INPUT (no tokenizer) into `builder`, near-duplicate prompts included.

    `workers` processes check the chunks (0 or 1: this process alone); `batch_size` only matters
    where the sequential path's behaviour depends on it (when a leading run of records that are
    not preference data fails the input). `engine`: another Engine to run the chunks on (a Ray one).
    The chunks are scanned once: their digests go to the dataset-wide checks (hash partitioning,
    prefdata.checks.partitioned: on Ray no process holds every row's digests) and their compact
    scans to a temporary file, read back in input order once the dataset-wide answers are in."""
    leak_index = build_leak_index(against) if against is not None else None
    engine = engine or LocalEngine(workers)
    pairing = pairing or PairingSettings()
    scan_settings = ScanSettings(policy, settings, leak_index, benchmarks, pairing)
    merger = _Merger(input_path, builder, policy, batch_size, progress, benchmarks, pairing)
    with closing(merger), tempfile.TemporaryFile(prefix="prefdata-scans-") as cache:
        scanned = _scan_all(engine, ScanChunks(scan_settings), input_path, merger, cache)
        cache.seek(0)
        for _ in range(scanned):
            merger.merge(*pickle.load(cache))
        # The similarity sample is final: measure it in the workers while this process clusters.
        # The similarity sample is final: measure it in the workers while this process clusters.
        sampled = builder.similarity.unmeasured()
        batches = [[item.halves for item in sampled[i : i + 500]] for i in range(0, len(sampled), 500)]
        with closing(engine.map_ordered(MeasureSimilarity(), batches)) as measured:
            merger.cluster_prompts()
            values = [value for _, batch in measured for value in batch]
        for item, value in zip(sampled, values):
            item.measured(value)


def _scan_all(engine: Engine, stage: ScanChunks, input_path: str | Path, merger: "_Merger", cache: Any) -> int:
    """Scan every chunk on the engine: lines placed and the probe run in input order, the digests
    kept for the dataset-wide checks (on Ray in the object store), each (chunk, scan) pickled to
    `cache`; then the dataset-wide answers. Returns the number of chunks."""
    put = getattr(engine, "put", lambda value: value)
    blocks: list[Any] = []
    keys = _SampleKeys(merger.builder.similarity.k)
    rows = scanned = 0
    # Units are made as the engine takes them: what the report will want from a chunk (the
    # similarity sample's cut-off, excerpts) follows from the chunks scanned before it -- or most of
    # them: the cut-off only falls, so a chunk handed out early brings a few halves too many.
    units = (ScanUnit(chunk, keys.cutoff(), rows < R.EXCERPT_ROWS) for chunk in _input_chunks(input_path))
    with closing(engine.map_ordered(stage, units)) as scans:
        for unit, scan in scans:
            merger.place(unit.chunk, scan)
            blocks.append(put(block_from_digests(scan.pair_index + rows, scan.digests)))
            keys.offer(scan.digests.pair_keys)
            rows += len(scan.lines)
            pickle.dump((unit.chunk, scan), cache, protocol=pickle.HIGHEST_PROTOCOL)
            scanned += 1
    merger.check_end()
    threshold = merger.policy.near_duplicate_prompt_threshold
    merger.answers = partitioned_on(engine, blocks, threshold)
    return scanned


class _SampleKeys:
    """The similarity sample's keys (report.similarity.SimilaritySample: the k smallest distinct
    pair keys, every pair offered in input order), to say which halves a chunk must bring."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.heap: list[int] = []  # -key: a max-heap
        self.keys: set[int] = set()

    def cutoff(self) -> int:
        return -self.heap[0] if len(self.heap) >= self.k else 1 << 64

    def offer(self, pair_keys: np.ndarray) -> None:
        cutoff = self.cutoff()
        below = pair_keys[pair_keys < np.uint64(cutoff)] if cutoff < 1 << 64 else pair_keys
        for key in below.tolist():
            if key in self.keys or (len(self.heap) >= self.k and -self.heap[0] <= key):
                continue
            self.keys.add(key)
            if len(self.heap) < self.k:
                heapq.heappush(self.heap, -key)
            else:
                self.keys.discard(-heapq.heapreplace(self.heap, -key))


def _input_chunks(input_path: str | Path) -> Iterator[Chunk]:
    """A plain file or directory in byte ranges (the workers read them), a Hub split in record chunks
    read here (prefdata.io.hub)."""
    hub = parse_hub_id(input_path)
    if hub is not None:
        return iter_hub_chunks(hub, text_chunks.CHUNK_LINES)
    return iter_chunks(input_path)


# ----------------------------------------------------------------------------- the in-order merge


class _Merger:
    """Folds chunk results into the dataset-wide tables, the report and MinHash, in input order."""

    def __init__(self, input_path: str | Path, builder: ReportBuilder, policy: Policy, batch_size: int, progress: bool,
                 benchmarks: BenchmarkIndex | None = None, pairing: PairingSettings | None = None):
        self.input_path = input_path
        self.benchmarks = benchmarks  # the workers' matches are not sent back: a detailed row is matched again
        self.pairing = pairing or PairingSettings()
        self.builder = builder
        self.policy = policy
        self.answers: PartitionedResult | None = None  # the dataset-wide checks', once every chunk is scanned
        # The checked-row stream's probe: the input fails when its first batch holds nothing but
        # unknown shapes (then, or at the end of a shorter input: the same error either way).
        self.probe = ShapeProbe(input_path, batch_size)
        self.lines = LineNumbers()
        self._verdicts: dict[int, tuple[list[str], int]] = {}  # flag mask -> (kept flags, severity code)
        self._open: tuple[str, BinaryIO] | None = None
        self.bar = progress_bar(progress)

    def place(self, chunk: Chunk, scan: ChunkScan) -> None:
        """The chunk's lines placed in its file, its rows shown to the probe (in input order)."""
        scan.lines += self.lines.offset(chunk, scan.line_count)
        self._probe(chunk, scan)

    def merge(self, chunk: Chunk, scan: ChunkScan) -> None:
        """The placed chunk's dataset-wide flags (answered), the policy and the report."""
        n = len(scan.lines)
        pairs = scan.pair_index
        first = self.builder.rows
        assert self.answers is not None, "merged before the dataset-wide answers"
        duplicate, conflicting = self.answers.flags_of(first + pairs)
        masks = scan.flag_bits[pairs] | np.where(duplicate, _DUPLICATE, 0).astype(np.uint64)
        masks |= np.where(conflicting, _CONFLICTING, 0).astype(np.uint64)
        distinct, inverse = np.unique(masks, return_inverse=True)
        verdicts = [self._verdict(int(mask)) for mask in distinct.tolist()]
        pair_severity = np.array([code for _, code in verdicts], dtype=np.int64)[inverse]
        severity = np.zeros(n, dtype=np.int64)
        severity[pairs] = pair_severity
        outcome = np.full(n, _QUARANTINED, dtype=np.int64)
        outcome[pairs] = np.where(pair_severity >= _DROP_CODE, _DROPPED, _KEPT)
        outcome[scan.unpaired] = _UNPAIRED
        flagged = np.flatnonzero(pair_severity)  # kept flags <=> a severity
        kept_flags = {p: verdicts[i][0] for p, i in zip(pairs[flagged].tolist(), inverse[flagged].tolist())}
        errors = {position: error for position, error, _ in scan.quarantined}
        detailed = sorted([*kept_flags, *errors])

        def detail(position: int) -> CheckedRow:
            span = file = None
            if isinstance(chunk, RangeChunk):
                assert scan.spans is not None
                span, file = (int(scan.spans[position, 0]), int(scan.spans[position, 1])), self._file(chunk.path)
            record = position if scan.record_of is None else int(scan.record_of[position])
            raw = exact_record(chunk, record, int(scan.lines[position]), span, file)
            if position in errors:
                return CheckedRow(raw, None, None, [], None, "quarantined", error=errors[position])
            code = int(severity[position])
            name = OUTCOMES[int(outcome[position])]
            # The row's pair: a record of scored completions gives several, in order (pairing is deterministic).
            first = position if scan.record_of is None else int(np.searchsorted(scan.record_of, record))
            pair = record_pairs(raw, self.pairing).pairs[position - first]
            if self.benchmarks is not None and F.BENCHMARK_OVERLAP in kept_flags[position]:
                pair.benchmark_match = self.benchmarks.match(pair)
            return CheckedRow(raw, pair, None, kept_flags[position], SEVERITY_CODES[code], name)

        self.builder.add_compact(
            CompactRows(
                source_file=chunk.source_file,
                lines=scan.lines,
                outcome=outcome,
                severity=severity,
                pair_index=pairs,
                prompt_keys=scan.digests.prompt_keys,
                pair_keys=scan.digests.pair_keys,
                lengths=scan.lengths,
                detailed=detailed,
                detail=detail,
                halves=scan.halves,
                excerpts=scan.excerpts,
                tokens=scan.tokens,
                scored=scan.scored,
                images=scan.images,
            )
        )
        if self.bar is not None:
            self.bar.update(n)

    def _file(self, path: str) -> BinaryIO:
        """The open data file the last detail came from (rows are re-read one at a time)."""
        if self._open is None or self._open[0] != path:
            self.close()
            self._open = (path, open(path, "rb"))
        return self._open[1]

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _verdict(self, mask: int) -> tuple[list[str], int]:
        """(flags the policy keeps, severity code) for a flag mask: apply_policy, once per mask."""
        verdict = self._verdicts.get(mask)
        if verdict is None:
            kept, severity = apply_policy(flags_of(mask), self.policy)
            verdict = self._verdicts[mask] = (kept, SEVERITY_CODES.index(severity))
        return verdict

    def _probe(self, chunk: Chunk, scan: ChunkScan) -> None:
        """The chunk's rows to the shape probe: its pairs and unpaired rows are preference data."""
        known = np.union1d(scan.pair_index, np.array(scan.unpaired, dtype=np.int64))
        problems = [(position, f"{chunk.source_file}:{int(scan.lines[position])}: {error}", unknown)
                    for position, error, unknown in scan.quarantined]
        self.probe.add_chunk(len(scan.lines), known, problems)

    def check_end(self) -> None:
        """The checked-row stream's end-of-input errors."""
        self.probe.finish()

    def cluster_prompts(self) -> None:
        assert self.answers is not None
        self.builder.add_near_duplicate_prompts(self.answers.near_duplicate_groups, self.builder.location)


_DROP_CODE = SEVERITY_CODES.index("drop")  # "drop" and "error" (the codes above it) drop the row
