"""Runs a stage over work units on a Ray cluster (Ray Data `map_batches`), in input order.

Same contract as the local engine (prefdata.engine.stage): a stage is a picklable object whose `setup()` runs once per
worker (here: once per Ray actor) and whose call maps one work unit to its result; `map_ordered`
yields (unit, result) in input order, so the output is the same as on one machine.

Units and results cross the cluster as pickled bytes in one Arrow binary column each (a unit may
be any picklable object: a byte-range chunk, a batch of records). Units are read lazily in windows
of `window` units, one Ray Data execution per window (each starts its actor pool: seconds), and
window k+1 runs while the caller consumes window k: the driver holds two windows (flat memory), and
a unit is read at most two windows ahead of the results merged before it. Byte-range chunks are
read by the workers from their path, so on a cluster the input must be on storage every node sees.

Besides stages over units, the engine runs ranks (`run_ranks`): one long-lived actor per GPU (or
CPU), all placed at once, each constructed with its rank and the world size and called once, with
Ray restarting a dead actor and retrying its call (`prefdata refs --engine ray`).

Connection: `address` (from `--ray-address`), else RAY_ADDRESS, else a local Ray is started.
"""

from __future__ import annotations

import logging
import os
import pickle
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Sequence

from prefdata.core.errors import PrefdataError
from prefdata.engine.stage import U, Stage

INSTALL_HINT = 'the Ray engine needs Ray: pip install "prefdata[ray]"'
# Units per Ray Data execution. The next window runs while the caller consumes this one, so
# actor start-up hides behind the caller's work; two windows of results are held at most.
DEFAULT_WINDOW = 32


def import_ray() -> Any:
    """`ray`, or a one-line PrefdataError naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401  (the Data library is part of the extra, not of bare ray)
    except ImportError:
        raise PrefdataError(INSTALL_HINT) from None
    return ray


def connect(address: str | None = None) -> Any:
    """Connect to the cluster at `address` / RAY_ADDRESS, or start a local Ray; returns `ray`.

    An already connected driver (e.g. a test's cluster, or a user's own `ray.init`) is reused."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    target = address or os.environ.get("RAY_ADDRESS") or None
    # Workers import prefdata from the driver's environment; keep Ray's own logs off the terminal.
    try:
        ray.init(address=target, logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = target or "a local Ray"
        raise PrefdataError(f"cannot connect to Ray at {where}: {str(exc).splitlines()[0]}") from None
    return ray


def _quiet_data_context(ray: Any) -> Any:
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # results come back in unit order
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    return ctx


class _StageActor:
    """The callable class Ray Data runs in each actor: the stage is set up once per actor."""

    def __init__(self, stage_bytes: bytes) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the actors are the parallelism
        self.stage = pickle.loads(stage_bytes)
        self.stage.setup()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from ray import cloudpickle

        results = []
        for unit in batch["unit"]:
            try:
                result: Any = self.stage.run(pickle.loads(unit))
            except PrefdataError as exc:
                result = _StageFailed(str(exc))
            results.append(cloudpickle.dumps(result))
        return {"index": batch["index"], "result": results}


def cluster_cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class RayEngine:
    """`map_ordered(stage, units)` on Ray Data: one actor per worker slot, order preserved."""

    def __init__(self, address: str | None = None, workers: int | None = None, window: int = DEFAULT_WINDOW,
                 cpus_per_worker: float = 1.0) -> None:
        if window < 1:
            raise PrefdataError("the Ray window must hold at least one unit")
        self.ray = connect(address)
        self.workers = workers or cluster_cpus(self.ray)
        self.window = window
        self.cpus_per_worker = cpus_per_worker

    def map_ordered(self, stage: Stage[U, Any], units: Iterable[U]) -> "RayResults[U]":
        """(unit, stage.run(unit)) for every unit, in input order (an iterator and a context manager,
        as the local engine's)."""
        return RayResults(self._windows(stage, units))

    def _windows(self, stage: Stage[U, Any], units: Iterable[U]) -> Iterator[tuple[U, Any]]:
        """Window k+1 runs (actors starting, units computed) while the caller consumes window k."""
        stage_bytes = self.ray.cloudpickle.dumps(stage)  # by value where needed (a stage in __main__)
        ahead = ThreadPoolExecutor(1, thread_name_prefix="ray-window")
        try:
            pending: tuple[list[U], Future[list[Any]]] | None = None
            for window, error in _take_windows(units, self.window):
                running = (window, ahead.submit(self._collect, stage_bytes, window)) if window else None
                if pending is not None:
                    yield from _results_of(*pending)
                pending = running
                if error is not None:  # after the results of the units read before it, as locally
                    if pending is not None:
                        yield from _results_of(*pending)
                    raise error
            if pending is not None:
                yield from _results_of(*pending)
        finally:
            ahead.shutdown(wait=True, cancel_futures=True)

    def rank_slots(self, workers: int | None, use_gpu: bool) -> int:
        """How many ranks `run_ranks` places: `workers`, default one per GPU (`use_gpu`), else one per
        CPU; a one-line error when the cluster cannot place them all at once."""
        resources = self.ray.cluster_resources()
        slots = int(resources.get("GPU", 0)) if use_gpu else max(1, int(resources.get("CPU", 1)))
        ranks = workers or slots
        if ranks > slots:
            raise PrefdataError(f"--workers {ranks} exceeds the cluster's {slots} {'GPUs' if use_gpu else 'CPUs'}")
        return ranks

    def cluster_gpus(self) -> int:
        return int(self.ray.cluster_resources().get("GPU", 0))

    def run_ranks(self, worker: type, ranks: int, args: tuple[Any, ...], *, use_gpu: bool, max_restarts: int = 2,
                  env: dict[str, str] | None = None, what: str = "rank") -> list[Any]:
        """`worker(rank, ranks).run(*args)` on one actor per rank (one GPU each, or one CPU), all
        placed at once; the results in rank order. A dead actor is restarted and its call retried
        up to `max_restarts` times; the first failure after that is one line, the other actors are
        then killed. `env`: environment variables the actors see; `what` names the workers in an error."""
        ray = self.ray
        actor_class = ray.remote(worker).options(
            num_gpus=1 if use_gpu else 0,
            num_cpus=0 if use_gpu else 1,
            max_restarts=max_restarts,
            max_task_retries=max_restarts,
            runtime_env={"env_vars": env} if env else None,
        )
        actors = [actor_class.remote(rank, ranks) for rank in range(ranks)]
        calls = [actor.run.remote(*args) for actor in actors]
        try:
            return _gather(ray, calls, what)
        finally:
            for actor in actors:
                ray.kill(actor)

    def put(self, value: Any) -> Any:
        """`value` in the object store (on this node, spilled to disk when full); its reference."""
        return self.ray.put(value)

    def shuffle(self, split: Callable[[Any, int], list[Any]], reduce: Callable[[list[Any]], Any],
                blocks: Sequence[Any], partitions: int, fetch: bool = True) -> list[Any]:
        """Hash-partition shuffle: one task per block splits it into `partitions` parts, one task
        per partition reduces the parts it receives. Parts go from task to task through the
        object store (never through this process); `blocks` may be values or object references.
        `fetch=False` returns the reducers' references, to feed a next shuffle without fetching."""
        ray = self.ray
        split_remote = ray.remote(_split_task).options(num_returns=partitions, num_cpus=self.cpus_per_worker)
        reduce_remote = ray.remote(_reduce_task).options(num_cpus=self.cpus_per_worker)
        parts = [split_remote.remote(split, block, partitions) for block in blocks]
        if partitions == 1:
            parts = [[p] for p in parts]
        results = [reduce_remote.remote(reduce, *[p[i] for p in parts]) for i in range(partitions)]
        try:
            return ray.get(results) if fetch else results
        except PrefdataError:
            raise
        except Exception as exc:
            raise _stage_error(exc) from None

    def _collect(self, stage_bytes: bytes, window: list[Any]) -> list[Any]:
        return list(self._run_window(stage_bytes, window))

    def _run_window(self, stage_bytes: bytes, window: list[Any]) -> Iterator[Any]:
        ray = self.ray
        _quiet_data_context(ray)
        items = [{"index": i, "unit": ray.cloudpickle.dumps(unit)} for i, unit in enumerate(window)]
        size = max(1, min(self.workers, len(window)))
        dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            _StageActor,
            fn_constructor_args=(stage_bytes,),
            batch_size=1,  # one unit per call: units are already sized for one worker call
            compute=ray.data.ActorPoolStrategy(size=size),
            num_cpus=self.cpus_per_worker,
        )
        expected = 0
        try:
            for row in dataset.iter_rows():
                if row["index"] != expected:  # preserve_order is what makes this hold; never guess
                    raise PrefdataError(f"Ray returned unit {row['index']} where {expected} was due")
                expected += 1
                yield pickle.loads(row["result"])  # a _StageFailed is raised where it is consumed
        except PrefdataError:
            raise
        except Exception as exc:  # Ray wraps a worker's exception in its own types
            raise _stage_error(exc) from None
        if expected != len(window):
            raise PrefdataError(f"Ray returned {expected} of {len(window)} units")


def _take_windows(units: Iterable[U], size: int) -> Iterator[tuple[list[U], BaseException | None]]:
    """Windows of `size` units; the last with the error `units` raised, if any."""
    iterator = iter(units)
    while True:
        window: list[U] = []
        try:
            for unit in iterator:
                window.append(unit)
                if len(window) == size:
                    break
        except Exception as exc:  # noqa: BLE001 - raised once the units before it are through
            yield window, exc
            return
        if not window:
            return
        yield window, None
        if len(window) < size:
            return


def _results_of(window: list[U], future: "Future[list[Any]]") -> Iterator[tuple[U, Any]]:
    for unit, result in zip(window, future.result()):
        if isinstance(result, _StageFailed):
            raise PrefdataError(result.message)
        yield unit, result


class RayResults(Iterator[tuple[U, Any]]):
    """What `RayEngine.map_ordered` returns: iterate it; closing it stops the running execution."""

    def __init__(self, results: Iterator[tuple[U, Any]]) -> None:
        self._results = results

    def __iter__(self) -> "RayResults[U]":
        return self

    def __next__(self) -> tuple[U, Any]:
        return next(self._results)

    def close(self) -> None:
        close = getattr(self._results, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "RayResults[U]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _gather(ray: Any, calls: list[Any], what: str) -> list[Any]:
    """Every call's result; the first failure (after Ray's retries) as one line, the rest cancelled."""
    pending = list(calls)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except PrefdataError as exc:  # the worker's own one-line error (Ray re-raises its type)
            raise PrefdataError(str(exc.args[0]) if exc.args else str(exc)) from None
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            if isinstance(cause, PrefdataError):
                raise PrefdataError(str(cause)) from None
            first = (str(cause).strip().splitlines() or [""])[0]
            raise PrefdataError(f"a {what} worker failed: {type(cause).__name__}: {first}"[:400]) from None
    return ray.get(calls)


def _split_task(split: Callable[[Any, int], list[Any]], block: Any, partitions: int) -> Any:
    parts = split(block, partitions)
    return parts[0] if partitions == 1 else tuple(parts)


def _reduce_task(reduce: Callable[[list[Any]], Any], *parts: Any) -> Any:
    return reduce(list(parts))


def _stage_error(exc: BaseException) -> PrefdataError:
    """One line for an exception Ray raised in the driver (a crashed worker, a lost node)."""
    causes = [exc]
    while (nxt := causes[-1].__cause__ or getattr(causes[-1], "cause", None)) is not None and len(causes) < 8:
        causes.append(nxt)
    inner = causes[-1]
    lines = str(inner).strip().splitlines()
    return PrefdataError(f"a Ray worker failed: {type(inner).__name__}: {lines[0] if lines else ''}"[:400])


class _StageFailed:
    """A stage's PrefdataError, returned as a result: it is the input's fault, so no retry, and
    the driver raises it as the same one line the local engine would."""

    def __init__(self, message: str) -> None:
        self.message = message
