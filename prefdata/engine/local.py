"""The local engine: run a stage over work units in worker processes, results in input order.

The engine knows nothing of records, chunks, tokenizers or checks; the stages (in io/, tokenize/,
checks/, validate/) and the callers' order-dependent merge steps do. The contract it keeps, which
the Ray engine keeps as well (so the same stage objects run past one machine), is
prefdata.engine.stage: `Stage` (setup once per worker, run one unit), `Engine.map_ordered`
((unit, result) in input order, a bounded number in flight, closable).

`LocalEngine` forks `workers` processes (fork: fast, and the stage is inherited, not pickled); the
workers ignore SIGINT (Ctrl-C is the main process's to report; closing the iterator on the way out
terminates them, mid-unit if need be) and exit when the main process dies, even by SIGKILL. With
one worker the stage runs in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Generic, Iterable, Iterator

from prefdata.engine.stage import R, U, ClosableIterator, Engine, Stage

__all__ = ["ClosableIterator", "Engine", "LocalEngine", "OrderedResults", "Stage", "default_workers"]


def default_workers() -> int:
    """All cores, at most 8 (beyond that the main process's merge becomes the bottleneck)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


class LocalEngine:
    """`Engine` on this machine: `workers` processes (1: this process), `in_flight` units at most
    submitted and not yet yielded (default 2 per worker + 1, so no worker waits on the main one)."""

    def __init__(self, workers: int, in_flight: int | None = None) -> None:
        self.workers = max(1, workers)
        self.in_flight = in_flight or 2 * self.workers + 1

    def map_ordered(self, stage: Stage[U, R], units: Iterable[U]) -> "OrderedResults[U, R]":
        """(unit, result) for every unit, in input order. Worker processes start, and the first
        units are submitted, right away (before the first result is asked for), so the caller can
        do other work meanwhile. Close the iterator (or exhaust it) to stop the workers."""
        return OrderedResults(stage, units, self.workers, self.in_flight)


# Worker-process state, set once by the pool initializer.
_WORKER_STAGE: Any = None


def _exit_when_orphaned(parent: int) -> None:
    """A main process killed with SIGKILL cannot stop its pool: each worker watches for that."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _init_worker(stage: Stage[Any, Any], parent: int) -> None:
    global _WORKER_STAGE
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to report
    stage.setup()
    _WORKER_STAGE = stage


def _run_in_worker(unit: Any) -> Any:
    return _WORKER_STAGE.run(unit)


def _terminate_workers(pool: ProcessPoolExecutor, grace_s: float = 2.0) -> None:
    """End the pool's worker processes now, mid-unit: SIGTERM, then SIGKILL for any still alive
    after `grace_s` (a handler a library installed may hold SIGTERM off). The pool then finds its
    workers gone and shuts down without waiting for their units. The workers ignore SIGINT, so
    this is what makes Ctrl-C stop a busy worker."""
    result_queue = getattr(pool, "_result_queue", None)  # taken first: a shutdown drops it
    terminate_workers = getattr(pool, "terminate_workers", None)  # Python 3.14+
    if terminate_workers is not None:
        terminate_workers()
    else:
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for process in processes:
            process.terminate()
        deadline = time.monotonic() + grace_s
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
    # A worker killed while sending its result (a chunk's is MBs, the pipe holds 64 KB) leaves the
    # pool's manager thread reading the rest of that message, forever: this process holds the
    # result pipe's write end too, so no EOF comes, and shutdown(wait=True) waited on that thread
    # (Ctrl-C then hung validate). Closing our copy lets the read end in EOF, the pool counts itself
    # broken and shuts down. Nothing here writes to that pipe; the workers have their own copies.
    writer = getattr(result_queue, "_writer", None)
    if writer is not None:
        writer.close()


@contextmanager
def _interrupt_after() -> Iterator[None]:
    """Hold a Ctrl-C that comes while the block runs, and raise it when the block is done.

    Forking the workers runs `os.register_at_fork` hooks (logging's lock release) in this process, and
    a KeyboardInterrupt raised inside one is printed and dropped: the run then went on to its end as if
    never interrupted (about 1 Ctrl-C in 150 at the right moment). Outside the main thread, or where
    SIGINT is ignored, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, None)  # Python's own handler raises KeyboardInterrupt here
        else:
            raise KeyboardInterrupt


class OrderedResults(Generic[U, R]):
    """The iterator `LocalEngine.map_ordered` returns (a context manager too)."""

    def __init__(self, stage: Stage[U, R], units: Iterable[U], workers: int, in_flight: int) -> None:
        self._stage = stage
        self._units = iter(units)
        self._in_flight = in_flight
        self._pending: deque[tuple[U, Future[R]]] = deque()
        self._units_error: BaseException | None = None  # raised by `units`, due after the pending results
        self._pool: ProcessPoolExecutor | None = None
        self._set_up = False
        if workers > 1:
            # fork starts fast and shares what is loaded already (a leak index, a tokenizer) unpickled.
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self._pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context(method),
                initializer=_init_worker,
                initargs=(stage, os.getpid()),
            )
            try:
                with _interrupt_after():  # the first submit forks the workers
                    self._fill()
            except BaseException:
                self.close()
                raise

    def _fill(self) -> None:
        assert self._pool is not None
        while self._units_error is None and len(self._pending) < self._in_flight:
            try:
                unit = next(self._units)
            except StopIteration:
                return
            except Exception as exc:  # noqa: BLE001 - re-raised once the units before it are yielded
                self._units_error = exc
                return
            self._pending.append((unit, self._pool.submit(_run_in_worker, unit)))

    def __iter__(self) -> "OrderedResults[U, R]":
        return self

    def __next__(self) -> tuple[U, R]:
        try:
            if self._pool is None:
                return self._next_here()
            if not self._pending:
                if self._units_error is not None:
                    error, self._units_error = self._units_error, None
                    raise error
                raise StopIteration
            unit, future = self._pending[0]
            result = future.result()  # still pending while it waits, so close() sees the unit running
            self._pending.popleft()
            self._fill()
            return unit, result
        except BaseException:  # the end, an error or Ctrl-C: the workers go
            self.close()
            raise

    def _next_here(self) -> tuple[U, R]:
        unit = next(self._units)
        if not self._set_up:
            self._stage.setup()
            self._set_up = True
        return unit, self._stage.run(unit)

    def close(self) -> None:
        """Stop: cancel what has not started; terminate the workers still running a unit (its result
        is not wanted, and one huge record can take minutes: Ctrl-C must end the run in seconds);
        then wait for the workers to exit, which idle ones do at once."""
        unfinished = any(not future.done() for _, future in self._pending)
        self._pending.clear()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            if unfinished:
                _terminate_workers(pool)
            pool.shutdown(wait=True, cancel_futures=True)
        self._units = iter(())

    def __enter__(self) -> "OrderedResults[U, R]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
