"""The contract every engine and every stage keep: `Stage`, `Engine`, and what `map_ordered` returns.

    class Stage(Protocol[U, R]):
        def setup(self) -> None: ...       # once per worker (process or Ray actor) before its first
                                           # unit (load a tokenizer, ...); idempotent: the caller may
                                           # have run it
        def run(self, unit: U) -> R: ...   # one work unit -> its result

    class Engine(Protocol):
        def map_ordered(self, stage: Stage[U, R], units: Iterable[U]) -> ClosableIterator[tuple[U, R]]: ...

- A stage is picklable (a worker or a Ray actor gets a copy); `run` keeps no state from one unit
  to the next, so any worker may run any unit and the results do not depend on how units are spread.
- Units and results are picklable and small enough to hold a few of at once (a chunk of records).
- `map_ordered` yields (unit, result) strictly in the order of `units`, whatever the number of
  workers, with a bounded number of units in flight, so memory stays flat however many units come.
  `units` is read lazily, a few units ahead of the results, so a unit may carry state the caller
  computed while merging earlier results. An error raised by `units` comes after the results of
  the units before it; an error in `run` is raised where its unit's result would be.
- The iterator has `close()` (a generator is one): callers that stop early close it
  (`contextlib.closing`), which stops the work, a unit still running included: its result is no
  longer wanted, and Ctrl-C must not wait minutes for one huge record.

The engines: prefdata.engine.local (worker processes on this machine; one worker: this process)
and prefdata.engine.ray (Ray Data actors). Both import this module; neither knows any stage.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Protocol, TypeVar

U = TypeVar("U")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
U_contra = TypeVar("U_contra", contravariant=True)


class Stage(Protocol[U_contra, R_co]):
    """A picklable per-unit step (see the module doc)."""

    def setup(self) -> None: ...

    def run(self, unit: U_contra) -> R_co: ...


class ClosableIterator(Iterator[R_co], Protocol[R_co]):
    def close(self) -> None: ...


class Engine(Protocol):
    """Runs a stage over units, yielding (unit, result) in input order (see the module doc)."""

    def map_ordered(self, stage: Stage[U, R], units: Iterable[U]) -> ClosableIterator[tuple[U, R]]: ...
