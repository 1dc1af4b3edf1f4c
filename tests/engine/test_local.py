"""The local engine: results in input order whatever the workers, bounded read-ahead, errors where
they belong, stages set up once per worker, and workers=1 in this process."""

from __future__ import annotations

import json
import os
import pickle
import signal
import time

import pytest

from prefdata.engine.local import Engine, LocalEngine


class Square:
    """A stage whose results reveal which process ran them and how often setup ran there."""

    def __init__(self) -> None:
        self.setups = 0

    def setup(self) -> None:
        self.setups += 1

    def run(self, unit: int) -> tuple[int, int, int]:
        if unit == -1:
            raise ValueError("unlucky unit")
        time.sleep(0.002 * (unit % 3))  # uneven work: later units finish first
        return unit * unit, os.getpid(), self.setups


@pytest.mark.parametrize("workers", [1, 3])
def test_results_come_in_input_order(workers: int) -> None:
    engine: Engine = LocalEngine(workers)
    units = list(range(40))
    with engine.map_ordered(Square(), units) as results:
        got = list(results)
    assert [unit for unit, _ in got] == units
    assert [result[0] for _, result in got] == [u * u for u in units]
    assert {result[2] for _, result in got} == {1}  # set up once in every process that ran it


def test_one_worker_runs_here_and_several_run_elsewhere() -> None:
    here = {pid for _, (_, pid, _) in LocalEngine(1).map_ordered(Square(), range(5))}
    assert here == {os.getpid()}
    there = {pid for _, (_, pid, _) in LocalEngine(2).map_ordered(Square(), range(20))}
    assert os.getpid() not in there and len(there) >= 1


def test_units_are_read_a_bounded_number_ahead() -> None:
    pulled: list[int] = []

    def units():
        for i in range(1000):
            pulled.append(i)
            yield i

    results = LocalEngine(2, in_flight=4).map_ordered(Square(), units())
    try:
        assert len(pulled) == 4  # started at once, but only `in_flight` units taken
        for expected in range(3):
            assert next(results)[0] == expected
        assert len(pulled) == 4 + 3  # one more taken per result given
    finally:
        results.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_in_the_units_comes_after_the_results_before_it(workers: int) -> None:
    def units():
        yield from range(5)
        raise RuntimeError("file 2 is unreadable")

    seen: list[int] = []
    with pytest.raises(RuntimeError, match="file 2 is unreadable"):
        for unit, _ in LocalEngine(workers).map_ordered(Square(), units()):
            seen.append(unit)
    assert seen == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_in_a_stage_is_raised_at_its_unit(workers: int) -> None:
    seen: list[int] = []
    units = [*range(13), -1, *range(14, 20)]
    with pytest.raises(ValueError, match="unlucky unit"):
        for unit, _ in LocalEngine(workers).map_ordered(Square(), units):
            seen.append(unit)
    assert seen == list(range(13))


class Stall:
    """A stage whose unit 0 takes a minute (a huge record): closing must not wait for it."""

    def setup(self) -> None:
        pass

    def run(self, unit: int) -> int:
        if unit == 0:
            time.sleep(60)
        return unit


def test_closing_early_ends_a_busy_worker_instead_of_waiting() -> None:
    results = LocalEngine(2).map_ordered(Stall(), range(4))
    workers = list(results._pool._processes.values())  # type: ignore[union-attr]
    time.sleep(0.5)  # unit 0 is running
    started = time.monotonic()
    results.close()  # what Ctrl-C (or a caller's error) does on the way out
    assert time.monotonic() - started < 5
    assert not any(worker.is_alive() for worker in workers)


def test_a_finished_run_lets_its_workers_exit_on_their_own() -> None:
    results = LocalEngine(2).map_ordered(Square(), range(10))
    workers = list(results._pool._processes.values())  # type: ignore[union-attr]
    assert len(list(results)) == 10
    assert all(worker.exitcode == 0 for worker in workers)  # shut down, not terminated


class CopyingEngine:
    """Another Engine, the way a Ray Data one treats stages: each runner gets a pickled copy."""

    def map_ordered(self, stage, units):
        copy = pickle.loads(pickle.dumps(stage))
        copy.setup()
        return ((unit, copy.run(unit)) for unit in units)


def test_the_passes_run_unchanged_on_another_engine(tmp_path, monkeypatch) -> None:
    """prefdata.pipeline.shards' stages, pickled for each runner as Ray Data does, give the report
    worker processes and this process give."""
    from prefdata.checks import stream
    from prefdata.checks.policy import load_policy
    from prefdata.checks.stage import CheckChunk
    from prefdata.pipeline import shards
    from prefdata.report.builder import ReportBuilder
    from prefdata.report.sections import build_report
    from prefdata.tokenize.settings import TokenizeSettings

    rows = [json.dumps({"prompt": f"q{i % 7}", "chosen": f"a{i}", "rejected": f"b{i % 5}"}) for i in range(300)]
    rows[40] = "{oops"
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(rows) + "\n")

    def report(engine) -> dict:
        policy = load_policy(None)
        builder = ReportBuilder(policy)
        shards.check_without_writing(stream.input_chunks(path), builder, check=CheckChunk(None, TokenizeSettings(), policy),
                                     engine=engine, shard_bytes=4000, batch_size=1000, input_name=str(path),
                                     progress=False)
        built = build_report(builder, None, {"command": "validate"})
        built.pop("generated_at", None)
        return built

    monkeypatch.setattr(stream, "CHUNK_BYTES", 1000)  # many chunks, several groups
    assert report(CopyingEngine()) == report(LocalEngine(2)) == report(LocalEngine(1))


# Armed by the test below: sends this process SIGINT from inside an at-fork hook, where Python prints
# and drops the KeyboardInterrupt it raises (hooks cannot be unregistered, hence the flag).
_INTERRUPT_NEXT_FORK: list[bool] = []


def _interrupt_inside_the_fork_hook() -> None:
    if _INTERRUPT_NEXT_FORK:
        _INTERRUPT_NEXT_FORK.clear()
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):  # Python runs the signal handler here, inside the hook
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_interrupt_inside_the_fork_hook)


def test_ctrl_c_while_the_workers_are_forked_is_not_lost() -> None:
    """A Ctrl-C landing while the workers fork stops the run; it used to vanish in a fork hook and the
    run finished as if never interrupted."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Ctrl-C finds it
    try:
        _INTERRUPT_NEXT_FORK.append(True)
        with pytest.raises(KeyboardInterrupt):
            list(LocalEngine(workers=2).map_ordered(Square(), range(20)))
    finally:
        _INTERRUPT_NEXT_FORK.clear()
        signal.signal(signal.SIGINT, previous)
