"""The streaming core `prepare` and `validate` share: read -> normalize -> tokenize -> check.

The input is cut into chunks (prefdata.io.chunks: byte ranges of JSON lines, read and parsed by
the workers); the engine (prefdata.engine.local) runs `CheckChunk` on each, in worker processes;
this process does only the order-dependent part, in input order: placing a chunk's lines in its
file, the dataset-wide flags (prefdata.checks.partitioned, answered by a first pass) and the policy's verdict.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from prefdata.checks.checker import build_leak_index, verdict
from prefdata.checks.digests import block_from_digests
from prefdata.checks.partitioned import PartitionedMerge, PartitionedResult, dataset_flags, partitioned_on
from prefdata.checks.policy import Policy, load_policy
from prefdata.checks.stage import CheckChunk, CheckedChunk
from prefdata.core.errors import PrefdataError
from prefdata.core.records import CheckedRow
from prefdata.engine.local import Engine, LocalEngine
from prefdata.io.chunks import Chunk, LineNumbers, iter_chunks
from prefdata.io.hub import iter_hub_chunks, parse_hub_id
from prefdata.sets.decontaminate import BenchmarkIndex
from prefdata.sets.mix import MixPlan, plan_mix, read_mix
from prefdata.sets.pairing import PairingSettings
from prefdata.tokenize.settings import TokenizeSettings

if TYPE_CHECKING:  # imported where a tokenizer is used: text-only validate starts without it (issue 45)
    from prefdata.tokenize.pairs import PairTokenizer

# Chunks of a size that keeps every worker busy to the end: tokenizing a row costs up to
# milliseconds, so a 4 MiB chunk would leave the other workers idle at the end of the input.
CHUNK_BYTES = 256 << 10
CHUNK_LINES = 128  # records per chunk where the main process reads them (gzip, JSON arrays, Parquet)
# Chunks in flight per worker: enough queued that a busy (or descheduled) main process does not
# leave the workers idle; small chunks, so memory stays flat all the same.
IN_FLIGHT_PER_WORKER = 8


def progress_bar(enabled: bool, what: str = "checking") -> Any:
    """A rows progress bar (None when disabled) for prepare's and validate's passes."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # disable=None: no bar when stderr is not a terminal (CI logs stay readable).
    return tqdm(desc=what, unit=" rows", disable=None, mininterval=0.5)


class ShapeProbe:
    """Fails an input that is not preference data: its first `probe` records (or all of a shorter
    input) are all quarantined as an unknown shape. Also fails an input without records."""

    def __init__(self, path: str | Path, probe: int) -> None:
        self.path, self.probe = path, probe
        self.records = self.pairs = 0
        self.only_unknown_shapes = True
        self.first_problem: str | None = None

    def add(self, row: CheckedRow, unknown_shape: bool) -> None:
        self.records += 1
        if row.outcome != "quarantined":  # a pair, or scored completions that made none: preference data
            self.pairs += 1
        else:
            self.only_unknown_shapes = self.only_unknown_shapes and unknown_shape
            self.first_problem = self.first_problem or f"{row.raw.source_file}:{row.raw.source_line}: {row.error}"
        if self.records == self.probe:
            self._check()

    def add_chunk(self, records: int, pair_index: np.ndarray, quarantined: list[tuple[int, str, bool]]) -> None:
        """`add` for a chunk's records at once (workers checked them): `pair_index`, the positions
        of its pairs and unpaired rows; `quarantined`: (position, "file:line: error", unknown shape), ascending. The
        probe is checked at the same record as `add` would."""
        at_probe = self.probe - self.records
        cut = at_probe if 0 < at_probe <= records else records
        pairs_before_cut = int(np.count_nonzero(pair_index < cut))
        self._take(pairs_before_cut, [q for q in quarantined if q[0] < cut])
        self.records += cut
        if self.records == self.probe:
            self._check()
        self._take(len(pair_index) - pairs_before_cut, [q for q in quarantined if q[0] >= cut])
        self.records += records - cut

    def _take(self, pairs: int, quarantined: list[tuple[int, str, bool]]) -> None:
        self.pairs += pairs
        for _position, problem, unknown in quarantined:
            self.only_unknown_shapes = self.only_unknown_shapes and unknown
            self.first_problem = self.first_problem or problem

    def _check(self) -> None:
        if self.pairs == 0 and self.only_unknown_shapes:
            raise PrefdataError(f"{self.path} does not look like preference data ({self.first_problem})")

    def finish(self) -> None:
        if self.records == 0:
            what = "no records in any file" if Path(self.path).is_dir() else "empty file"
            raise PrefdataError(f"{self.path}: {what} (nothing to read)")
        self._check()


def input_chunks(raw_path: str | Path | MixPlan) -> Iterator[Chunk]:
    """The input as work units: byte ranges of JSON lines (the workers read them), record chunks of
    other files, or of a Hub split (`org/name:split`, streamed here: prefdata.io.hub); a mixture's
    sources one after the other, each chunk with its sample (prefdata.sets.mix)."""
    if isinstance(raw_path, MixPlan):
        return raw_path.chunks()
    hub = parse_hub_id(raw_path)
    if hub:
        return iter_hub_chunks(hub, CHUNK_LINES)
    return iter_chunks(raw_path, max_lines=CHUNK_LINES, max_bytes=CHUNK_BYTES)


def plan_input_mix(raw_path: str | Path) -> MixPlan:
    """The mix file at `raw_path`, read and planned with the chunk sizes this module reads in."""
    return plan_mix(read_mix(raw_path), CHUNK_LINES, CHUNK_BYTES)


def iter_checked_rows(
    raw_path: str | Path | MixPlan,
    *,
    policy: Policy | None = None,
    settings: TokenizeSettings | None = None,
    batch_size: int = 1000,
    progress: bool = True,
    against: str | Path | None = None,
    pair_tokenizer: PairTokenizer | None = None,
    workers: int = 1,
    merge: PartitionedMerge | None = None,
    engine: Engine | None = None,
    benchmarks: BenchmarkIndex | None = None,
    pairing: PairingSettings | None = None,
) -> Iterator[CheckedRow]:
    """Stream every input record through normalize, tokenize (when a tokenizer is given) and checks.

    Memory stays flat: a few chunks are in flight; only the dataset-wide hash tables grow. Output
    order equals input order whatever `batch_size` and the number of `workers` (processes that
    parse, normalize, tokenize and check; `engine`: another Engine to run them on). `merge`: the
    dataset-wide answers (a first pass over the input computes them by hash partitioning; on Ray no
    process holds every row's digests), to read its near-duplicate prompt clusters (by row ordinal)
    once the rows are through. An input whose first `batch_size` records are all of an unknown
    shape is not preference data.
    `benchmarks`: flag `benchmark_overlap` against them (prefdata.sets.decontaminate).
    `pairing`: how records of scored completions become pairs (one row per pair, or one "unpaired" row).
    """
    policy = policy or load_policy(None)
    settings = settings or TokenizeSettings()
    leak_index = build_leak_index(against) if against is not None else None
    stage = CheckChunk(pair_tokenizer, settings, policy, leak_index, benchmarks, pairing or PairingSettings())
    engine = engine or LocalEngine(workers, in_flight=IN_FLIGHT_PER_WORKER * workers)
    merge = merge or PartitionedMerge(policy.near_duplicate_prompt_threshold)
    probe = ShapeProbe(raw_path.mix.path if isinstance(raw_path, MixPlan) else raw_path, batch_size)
    lines = LineNumbers()
    bar = progress_bar(progress)
    chunks = input_chunks(raw_path)
    rows = 0
    merge.result = _partitioned_answers(engine, stage, raw_path, merge.threshold)  # the first pass
    try:
        with closing(engine.map_ordered(stage, chunks)) as results:
            for chunk, checked in results:
                for row, unknown_shape in _merge_chunk(chunk, checked, lines, merge, policy, rows):
                    probe.add(row, unknown_shape)
                    yield row
                rows += len(checked.records)
                if bar is not None:
                    bar.update(len(checked.records))
    finally:
        if bar is not None:
            bar.close()
    probe.finish()


class _DigestsOf:
    """A stage: the CheckChunk of a chunk reduced to what the partitioned checks need."""

    def __init__(self, stage: CheckChunk) -> None:
        self.stage = stage

    def setup(self) -> None:
        self.stage.setup()

    def run(self, chunk: Chunk) -> tuple[int, np.ndarray, Any]:
        checked = self.stage.run(chunk)
        return len(checked.records), checked.pair_index, checked.digests


def _partitioned_answers(runner: Any, stage: CheckChunk, raw_path: str | Path | MixPlan, threshold: float) -> PartitionedResult:
    """Duplicates, conflicts and near-duplicate prompts of the whole input by hash partitioning
    (prefdata.checks.partitioned): the workers' digests go to the object store as they come (a
    Ray engine), and the shuffle runs there; only the flagged rows come back. On an engine
    without a shuffle (local) the same partitioning runs in this process."""
    put = getattr(runner, "put", lambda value: value)
    blocks, first = [], 0
    with closing(runner.map_ordered(_DigestsOf(stage), input_chunks(raw_path))) as results:
        for _, (records, pair_index, digests) in results:
            blocks.append(put(block_from_digests(pair_index + first, digests)))
            first += records
    return partitioned_on(runner, blocks, threshold)


def _merge_chunk(
    chunk: Chunk, checked: CheckedChunk, lines: LineNumbers, merge: PartitionedMerge, policy: Policy,
    first: int,
) -> Iterator[tuple[CheckedRow, bool]]:
    """(row, whether quarantined as an unknown shape) for the chunk's records, which follow `first`
    rows: lines placed, dataset-wide flags merged, the policy applied."""
    records = checked.records
    offset = lines.offset(chunk, checked.line_count)
    if offset:
        for record in records:
            record.raw.source_line += offset
            if record.pair is not None:
                record.pair.source_line += offset
    pair_index = checked.pair_index
    pair_lines = [records[i].raw.source_line for i in pair_index.tolist()]
    duplicate, conflicting = merge.merge_chunk(
        chunk.source_file, np.array(pair_lines, dtype=np.int64), pair_index + first, checked.digests
    )
    at_pair = 0
    for record in records:
        if record.pair is None:
            if record.error is None:  # scored completions that made no pair: dropped.jsonl says why
                yield CheckedRow(record.raw, None, None, [], None, "unpaired", scored=record.scored), False
                continue
            yield CheckedRow(record.raw, None, None, [], None, "quarantined", error=record.error), record.unknown_shape
            continue
        found = record.flags + dataset_flags(bool(duplicate[at_pair]), bool(conflicting[at_pair]))
        at_pair += 1
        yield CheckedRow(record.raw, record.pair, record.tokenized, *verdict(found, policy), scored=record.scored), False
