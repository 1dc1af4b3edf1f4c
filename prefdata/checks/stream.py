"""What `prepare` and `validate` share around the checks' stage: the input as chunks (byte ranges
of JSON lines, read and parsed by the workers; record chunks of other files, a Hub split or a
mixture), the "not preference data" probe and progress bars. The passes themselves are
prefdata.pipeline.shards (and, for text-only validate, prefdata.validate.merge).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from prefdata.core.errors import PrefdataError
from prefdata.core.records import CheckedRow
from prefdata.io.chunks import Chunk, iter_chunks
from prefdata.io.hub import iter_hub_chunks, parse_hub_id
from prefdata.sets.mix import MixPlan, plan_mix, read_mix

# Chunks of a size that keeps every worker busy to the end: tokenizing a row costs up to
# milliseconds, so a 4 MiB chunk would leave the other workers idle at the end of the input.
CHUNK_BYTES = 256 << 10
CHUNK_LINES = 128  # records per chunk where the main process reads them (gzip, JSON arrays, Parquet)


def workers_for(raw_path: str | Path | MixPlan, workers: int | None, engine: str) -> int:
    """The worker count a run uses: the one given; else, on the local engine, every core
    (engine.local.default_workers) -- but one for an input that is a single file of at most one chunk
    (CHUNK_BYTES), where forking a worker that holds the tokenizer costs more than the rows do
    (0.1-0.16 s of a 50-row validate); on Ray 0, one actor per cluster CPU."""
    if workers is not None:
        return workers
    if engine != "local":
        return 0
    from prefdata.engine.local import default_workers

    if not isinstance(raw_path, MixPlan):
        path = Path(raw_path)
        if path.is_file() and path.stat().st_size <= CHUNK_BYTES:
            return 1
    return default_workers()


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
