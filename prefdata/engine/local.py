"""Normalize + tokenize record batches, in this process or in worker processes, in input order.

Tokenization dominates `prepare` (a long row costs milliseconds), so batches go to worker
processes, each with its own single-threaded tokenizer; everything order-dependent (dataset-wide
checks, reports, writing) stays in the main process. Results come back in submission order, so the
output is the same for any number of workers, and at most a few batches are in flight, so memory
stays flat.
"""

from __future__ import annotations

import multiprocessing
from array import array
import os
import signal
import threading
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator

from prefdata.errors import RecordError, UnknownShapeError
from prefdata.io.formats import normalize_record
from prefdata.records import Pair, RawRecord, TokenizedPair
from prefdata.tokenize.pairs import PairTokenizer, TokenizeSettings, truncate_pair


@dataclass
class ProcessedRecord:
    """One record after normalize and tokenize. `pair` is None when it must be quarantined."""

    pair: Pair | None
    tokenized: TokenizedPair | None
    error: str | None = None
    unknown_shape: bool = False  # the error says "not a preference shape" (for the KTO/SFT check)


def process_batch(
    records: list[RawRecord], pair_tokenizer: PairTokenizer | None, settings: TokenizeSettings
) -> list[ProcessedRecord]:
    """Normalize every record and tokenize the pairs in one batched call."""
    results: list[ProcessedRecord] = []
    pairs: list[Pair] = []
    for raw in records:
        if raw.error is not None:
            results.append(ProcessedRecord(None, None, raw.error))
            continue
        try:
            pair = normalize_record(raw)
        except UnknownShapeError as exc:
            results.append(ProcessedRecord(None, None, str(exc), unknown_shape=True))
            continue
        except RecordError as exc:
            results.append(ProcessedRecord(None, None, str(exc)))
            continue
        results.append(ProcessedRecord(pair, None))
        pairs.append(pair)

    if pair_tokenizer is not None:
        tokenized: list[TokenizedPair | RecordError | None] = list(pair_tokenizer.tokenize_pairs_or_errors(pairs))
    else:  # without a tokenizer only pre-tokenized rows get token-level checks
        tokenized = [
            truncate_pair(p.prompt_ids, p.chosen_ids, p.rejected_ids, settings, None) if p.is_pretokenized else None
            for p in pairs
        ]
    it = iter(tokenized)
    for result in results:
        if result.pair is None:
            continue
        token_pair = next(it)
        if isinstance(token_pair, RecordError):  # e.g. the chat template refuses the roles
            result.pair, result.error = None, str(token_pair)
        elif token_pair is not None:
            result.tokenized = compact_ids(token_pair)
    return results


def compact_ids(tokenized: TokenizedPair) -> TokenizedPair:
    """The same pair with its id lists as array('i') (token ids are below 2**31).

    Ids then cross the process boundary as one bytes copy each instead of hundreds of pickled ints,
    and the Arrow writer and the content digest read them without per-element work."""
    tokenized.prompt_ids = array("i", tokenized.prompt_ids)  # type: ignore[assignment]
    tokenized.chosen_ids = array("i", tokenized.chosen_ids)  # type: ignore[assignment]
    tokenized.rejected_ids = array("i", tokenized.rejected_ids)  # type: ignore[assignment]
    return tokenized


# Rows per worker task: small enough that no worker idles at the end of the input, large enough
# that batched tokenizer calls and pickling stay efficient.
TASK_ROWS = 128

# Worker-process state, set once by the pool initializer.
_WORKER_TOKENIZER: PairTokenizer | None = None
_WORKER_SETTINGS: TokenizeSettings | None = None


def _exit_when_orphaned(parent: int) -> None:
    """A main process killed with SIGKILL cannot stop its pool: each worker watches for that."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _init_worker(pair_tokenizer: PairTokenizer | None, settings: TokenizeSettings, parent: int) -> None:
    global _WORKER_TOKENIZER, _WORKER_SETTINGS
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
    # One tokenizer thread per process: the processes are the parallelism.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Ctrl-C is the main process's to handle; workers must not print their own tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_TOKENIZER, _WORKER_SETTINGS = pair_tokenizer, settings
    if pair_tokenizer is not None:
        pair_tokenizer.setup()


def _process_in_worker(records: list[RawRecord]) -> list[ProcessedRecord]:
    assert _WORKER_SETTINGS is not None
    return process_batch(records, _WORKER_TOKENIZER, _WORKER_SETTINGS)


def default_workers() -> int:
    """All cores, at most 8 (beyond that the main process's checks become the bottleneck)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


def process_batches(
    batches: Iterable[list[RawRecord]],
    pair_tokenizer: PairTokenizer | None,
    settings: TokenizeSettings,
    workers: int,
) -> Iterator[tuple[list[RawRecord], list[ProcessedRecord]]]:
    """(batch, its results) in input order, using `workers` processes (1: this process)."""
    if workers <= 1:
        for batch in batches:
            yield batch, process_batch(batch, pair_tokenizer, settings)
        return
    # fork starts fast and shares the loaded libraries; the parent has not run the tokenizer yet.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pending: deque[tuple[list[RawRecord], list[Future]]] = deque()
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context(method),
        initializer=_init_worker,
        initargs=(pair_tokenizer, settings, os.getpid()),
    )
    in_flight = 0  # rows submitted and not yet yielded
    limit = max(2 * workers * TASK_ROWS, 2)
    try:
        for batch in batches:
            # Small tasks keep every worker busy to the end (a 1000-row task would leave one idle).
            tasks = [pool.submit(_process_in_worker, batch[i : i + TASK_ROWS]) for i in range(0, len(batch), TASK_ROWS)]
            pending.append((batch, tasks))
            in_flight += len(batch)
            while pending and in_flight - len(pending[-1][0]) >= limit:  # bounded: flat memory
                done_batch, futures = pending.popleft()
                in_flight -= len(done_batch)
                yield done_batch, [result for future in futures for result in future.result()]
        while pending:
            done_batch, futures = pending.popleft()
            yield done_batch, [result for future in futures for result in future.result()]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
