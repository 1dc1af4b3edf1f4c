"""Text-level `validate` of raw input across worker processes, with the sequential path's report.

The main process cuts the input into chunks (`text_chunks`), worker processes check each chunk
(`text_scan`), and the main process merges the compact results strictly in input order: the
dataset-wide tables (duplicate and conflicting pairs: first occurrence wins), the policy, the
report and the MinHash tables -- vectorized per chunk. The few rows the report describes one by one
(flagged or quarantined) are re-read from the chunk in the main process. At most a few chunks are
in flight, so memory stays flat apart from the hash tables.

The report equals the one `ingest.iter_checked_rows` + `ReportBuilder.add` give (a test compares
them), and input errors are the same one-line PrefdataErrors, raised at the same point.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from prefdata import flags as F
from prefdata.report import builder as R
from prefdata.checks.pair import apply_policy, similarity
from prefdata.checks.dataset import DatasetWideChecks
from prefdata.errors import PrefdataError
from prefdata.io.formats import normalize_record
from prefdata.checks.minhash import NearDuplicatePrompts
from prefdata.checks.checker import build_leak_index
from prefdata.records import CheckedRow
from prefdata.checks.policy import Policy
from prefdata.report.builder import ReportBuilder
from prefdata.report.compact import OUTCOMES, SEVERITY_CODES, CompactRows
from prefdata.io.chunks import Chunk, RangeChunk, exact_record, iter_chunks
from prefdata.validate.scan import FLAG_BIT, ChunkScan, ScanSettings, flags_of, scan_chunk
from prefdata.tokenize.pairs import TokenizeSettings

_DUPLICATE, _CONFLICTING = FLAG_BIT[F.DUPLICATE_PAIR], FLAG_BIT[F.CONFLICTING_PAIR]
_KEPT, _DROPPED, _QUARANTINED = (OUTCOMES.index(o) for o in ("kept", "dropped", "quarantined"))


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
) -> None:
    """Check every record of raw INPUT (no tokenizer) into `builder`, near-duplicate prompts included.

    `workers` processes check the chunks (0: this process alone, for tests); `batch_size` only
    matters where the sequential path's behaviour depends on it (when a leading run of records
    that are not preference data fails the input)."""
    leak_index = build_leak_index(against) if against is not None else None
    scan_settings = ScanSettings(policy, settings, leak_index)
    merger = _Merger(input_path, builder, policy, batch_size, progress)
    with _Scanner(scan_settings, workers) as scanner, closing(merger):
        pending: deque[tuple[Chunk, Future[ChunkScan]]] = deque()
        chunks = iter_chunks(input_path)
        try:
            for chunk in chunks:
                cutoff, want_excerpts = builder.similarity.cutoff(), builder.rows < R.EXCERPT_ROWS
                pending.append((chunk, scanner.submit(chunk, cutoff, want_excerpts)))
                while len(pending) >= scanner.in_flight:
                    merger.merge(*_result(pending.popleft()))
        except PrefdataError:
            # A file-level error comes after the records read before it, as in the sequential path.
            while pending:
                merger.merge(*_result(pending.popleft()))
            raise
        while pending:
            merger.merge(*_result(pending.popleft()))
        merger.check_end()
        # The similarity sample is final: measure it in the workers while this process clusters.
        sampled = builder.similarity.unmeasured()
        measuring = [scanner.measure([item.halves for item in sampled[i : i + 500]]) for i in range(0, len(sampled), 500)]
        merger.cluster_prompts()
        for i, future in enumerate(measuring):
            for item, value in zip(sampled[500 * i : 500 * i + 500], future.result()):
                item.measured(value)


def _result(item: tuple[Chunk, Future[ChunkScan]]) -> tuple[Chunk, ChunkScan]:
    return item[0], item[1].result()


# ----------------------------------------------------------------------------- worker processes

_WORKER_SETTINGS: ScanSettings | None = None


def _init_worker(settings: ScanSettings, parent: int) -> None:
    from prefdata.engine.local import _exit_when_orphaned

    global _WORKER_SETTINGS
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to report
    _WORKER_SETTINGS = settings


def _scan_in_worker(chunk: Chunk, cutoff: int, want_excerpts: bool) -> ChunkScan:
    assert _WORKER_SETTINGS is not None
    return scan_chunk(chunk, _WORKER_SETTINGS, cutoff, want_excerpts)


def _measure(halves: list[tuple[Any, Any]]) -> list[float]:
    return [similarity(chosen, rejected) for chosen, rejected in halves]


class _Scanner:
    """`scan_chunk` in `workers` processes (or, with 0, in this one), a few chunks in flight."""

    def __init__(self, settings: ScanSettings, workers: int) -> None:
        self.settings = settings
        self.in_flight = 2 * workers + 1 if workers else 1
        self.pool: ProcessPoolExecutor | None = None
        if workers:
            # fork: starts fast and shares the loaded modules (the leak index too, without pickling).
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self.pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context(method),
                initializer=_init_worker,
                initargs=(settings, os.getpid()),
            )

    def submit(self, chunk: Chunk, cutoff: int, want_excerpts: bool) -> Future[ChunkScan]:
        if self.pool is not None:
            return self.pool.submit(_scan_in_worker, chunk, cutoff, want_excerpts)
        future: Future[ChunkScan] = Future()
        future.set_result(scan_chunk(chunk, self.settings, cutoff, want_excerpts))
        return future

    def measure(self, halves: list[tuple[Any, Any]]) -> Future[list[float]]:
        """checks.similarity of each (chosen, rejected)."""
        if self.pool is not None:
            return self.pool.submit(_measure, halves)
        future: Future[list[float]] = Future()
        future.set_result(_measure(halves))
        return future

    def __enter__(self) -> "_Scanner":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------- the in-order merge


class _Merger:
    """Folds chunk results into the dataset-wide tables, the report and MinHash, in input order."""

    def __init__(self, input_path: str | Path, builder: ReportBuilder, policy: Policy, batch_size: int, progress: bool):
        self.input_path = input_path
        self.builder = builder
        self.policy = policy
        self.dataset = DatasetWideChecks()
        self.near = NearDuplicatePrompts(threshold=policy.near_duplicate_prompt_threshold, background=False)
        # iter_checked_rows fails the input when its first batch holds nothing but unknown shapes
        # (then, or at the end of a shorter input: the same error either way).
        self.probe_records = batch_size
        self.next_line = 1  # of the next RangeChunk of the current file
        self.records = 0
        self.pairs = 0
        self.pairs_in_probe = 0
        self.only_unknown_shapes = True  # among the probed records
        self.first_problem: str | None = None
        self._verdicts: dict[int, tuple[list[str], int]] = {}  # flag mask -> (kept flags, severity code)
        self._open: tuple[str, BinaryIO] | None = None
        self.bar = _progress_bar(progress)

    def merge(self, chunk: Chunk, scan: ChunkScan) -> None:
        n = len(scan.lines)
        if isinstance(chunk, RangeChunk):  # its lines are numbered within it: place them in the file
            if chunk.start == 0:
                self.next_line = 1
            scan.lines += self.next_line - 1
            self.next_line += scan.line_count
        self._probe(chunk, scan)
        pairs = scan.pair_index
        duplicate, conflicting = self.dataset.observe_digests(
            chunk.source_file, scan.lines[pairs], scan.prompt_keys, scan.pair_keys, scan.swapped_keys,
            scan.halves_differ, scan.first_prompts, scan.first_pairs,
        )
        masks = scan.flag_bits[pairs] | np.where(duplicate, _DUPLICATE, 0).astype(np.uint32)
        masks |= np.where(conflicting, _CONFLICTING, 0).astype(np.uint32)
        distinct, inverse = np.unique(masks, return_inverse=True)
        verdicts = [self._verdict(int(mask)) for mask in distinct.tolist()]
        pair_severity = np.array([code for _, code in verdicts], dtype=np.int64)[inverse]
        severity = np.zeros(n, dtype=np.int64)
        severity[pairs] = pair_severity
        outcome = np.full(n, _QUARANTINED, dtype=np.int64)
        outcome[pairs] = np.where(pair_severity >= _DROP_CODE, _DROPPED, _KEPT)
        flagged = np.flatnonzero(pair_severity)  # kept flags <=> a severity
        kept_flags = {p: verdicts[i][0] for p, i in zip(pairs[flagged].tolist(), inverse[flagged].tolist())}
        errors = {position: error for position, error, _ in scan.quarantined}
        detailed = sorted([*kept_flags, *errors])

        def detail(position: int) -> CheckedRow:
            span = file = None
            if isinstance(chunk, RangeChunk):
                assert scan.spans is not None
                span, file = (int(scan.spans[position, 0]), int(scan.spans[position, 1])), self._file(chunk.path)
            raw = exact_record(chunk, position, int(scan.lines[position]), span, file)
            if position in errors:
                return CheckedRow(raw, None, None, [], None, "quarantined", error=errors[position])
            code = int(severity[position])
            name = OUTCOMES[int(outcome[position])]
            return CheckedRow(raw, normalize_record(raw), None, kept_flags[position], SEVERITY_CODES[code], name)

        first = self.builder.rows
        self.builder.add_compact(
            CompactRows(
                source_file=chunk.source_file,
                lines=scan.lines,
                outcome=outcome,
                severity=severity,
                pair_index=pairs,
                prompt_keys=scan.prompt_keys,
                pair_keys=scan.pair_keys,
                lengths=scan.lengths,
                detailed=detailed,
                detail=detail,
                halves=scan.halves,
                excerpts=scan.excerpts,
                tokens=scan.tokens,
            )
        )
        self.near.add_signatures(
            first + scan.prompt_positions, scan.prompt_digests, scan.signature_rows, scan.signatures, scan.first_digests
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
        """The sequential path's "not preference data" check, at the same record count."""
        n = len(scan.lines)
        if self.first_problem is None and scan.quarantined:
            position, error, _ = scan.quarantined[0]
            self.first_problem = f"{chunk.source_file}:{int(scan.lines[position])}: {error}"
        before = self.records
        self.records += n
        self.pairs += len(scan.pair_index)
        if before >= self.probe_records:
            return
        # Only the records up to the probe count decide (later ones cannot undo a failed probe).
        upto = self.probe_records - before
        pairs_in = int(np.count_nonzero(scan.pair_index < upto))
        known = all(unknown for position, _, unknown in scan.quarantined if position < upto)
        self.pairs_in_probe += pairs_in
        self.only_unknown_shapes = self.only_unknown_shapes and known
        if self.records >= self.probe_records and self.pairs_in_probe == 0 and self.only_unknown_shapes:
            raise PrefdataError(f"{self.input_path} does not look like preference data ({self.first_problem})")

    def check_end(self) -> None:
        """The sequential path's end-of-input errors."""
        if self.records == 0:
            what = "no records in any file" if Path(self.input_path).is_dir() else "empty file"
            raise PrefdataError(f"{self.input_path}: {what} (nothing to read)")
        if self.pairs == 0 and self.only_unknown_shapes:
            raise PrefdataError(f"{self.input_path} does not look like preference data ({self.first_problem})")

    def cluster_prompts(self) -> None:
        self.builder.add_near_duplicate_prompts(self.near.clusters(), self.builder.location)


_DROP_CODE = SEVERITY_CODES.index("drop")  # "drop" and "error" (the codes above it) drop the row


def _progress_bar(enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc="checking", unit=" rows", disable=None, mininterval=0.5)
