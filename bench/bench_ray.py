"""Benchmark: the Ray engine vs the local engine on this machine, and a projection past one machine.

Same synthetic input (distinct pairs, bench_scale's generator), same tokenizer, each run in a fresh
child process: `prepare` and text-level `validate` with `--engine local` (worker processes) and
`--engine ray` (a local Ray with as many CPUs as the local engine has workers). `prepare` on Ray
runs as users get it (the workers write the Arrow shards: two passes, the dataset-wide checks by
hash partitioning; the one write path since issue 44, so the old driver-writes run is gone). Reported
per run: wall seconds, pairs/s, the Ray/local wall ratio (the overhead of Ray on one machine), and
for prepare the split the projection needs:
  - per-worker rate: pairs per second of stage time inside the workers (parse, normalize,
    tokenize, pair checks, digests; with worker writes also the second pass that writes the
    shards), measured in the workers themselves;
  - shuffle seconds: the hash-partitioned dataset-wide checks (cluster tasks);
  - driver rate: pairs per CPU-second of the main process (all its threads: unpickling results,
    the merge or join in input order, report, writing, start-up included, so a lower bound), and
    the time its loop spent on results between asking for them;
  - peak RSS of the driver and of the largest worker.
Ray's start-up (ray.init) is timed apart: on a cluster it is paid once, not per command.

Usage: python bench/bench_ray.py [--rows 100000] [--workers 2] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prepare import peak_rss_mib  # noqa: E402  (bench/ is on sys.path: these run as scripts)
from bench_scale import write_synthetic  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _measured_stage(base: type) -> type:
    """`base` (CheckChunk) whose results carry the worker's stage seconds and peak RSS."""

    class Measured(base):  # type: ignore[misc, valid-type]
        def run(self, unit):  # noqa: ANN001, ANN202
            started = time.perf_counter()
            result = base.run(self, unit)
            result.stage_seconds = time.perf_counter() - started
            result.worker_rss_mib = peak_rss_mib()
            return result

    return Measured


class _TimedEngine:
    """Wraps the engine `select_engine` gives: counts the time the caller waits for results, and
    collects what the measured stage reports."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner = inner
        self.wait = self.stage = self.worker_rss = self.shuffled = self.consume = 0.0
        self.workers = getattr(inner, "workers", 1)  # what the partitioned checks size their shuffle by
        if hasattr(inner, "shuffle"):
            self.put = inner.put

    def __getattr__(self, name: str):  # noqa: ANN204
        if name == "shuffle" and hasattr(self.inner, "shuffle"):
            return self._timed_shuffle
        raise AttributeError(name)

    def _timed_shuffle(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        started = time.perf_counter()
        try:
            return self.inner.shuffle(*args, **kwargs)
        finally:
            self.shuffled += time.perf_counter() - started

    def map_ordered(self, stage, units):  # noqa: ANN001, ANN201
        engine = self

        class Results:
            def __init__(self) -> None:
                self.results = engine.inner.map_ordered(stage, units)
                self.returned: float | None = None

            def __iter__(self):  # noqa: ANN204
                return self

            def __next__(self):  # noqa: ANN204
                started = time.perf_counter()
                if self.returned is not None:  # the caller's own work on the last result
                    engine.consume += started - self.returned
                try:
                    unit, result = next(self.results)
                finally:
                    self.returned = time.perf_counter()
                    engine.wait += self.returned - started
                engine.stage += getattr(result, "stage_seconds", 0.0)
                engine.worker_rss = max(engine.worker_rss, getattr(result, "worker_rss_mib", 0.0))
                return unit, result

            def close(self) -> None:
                self.results.close()

        return Results()


def run_child(command: str, engine: str, raw: str, out: str, tokenizer: str, workers: int) -> None:
    """In a fresh process: one run, then one JSON line of measurements."""
    sys.path.insert(0, str(REPO))
    import prefdata.checks.stream as stream
    import prefdata.prepare as prepare_module
    import prefdata.pipeline.shards as shards
    from prefdata.engine import select

    init_seconds = 0.0
    if engine == "ray":
        import ray

        started = time.perf_counter()
        ray.init(num_cpus=workers, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
        init_seconds = time.perf_counter() - started
    timed: list[_TimedEngine] = []
    original = select.select_engine

    def select_timed(name: str, n: int, address: str | None = None) -> _TimedEngine | None:
        inner = original(name, n, address)
        if inner is None:  # the local engine the command builds itself: its wall time is what counts
            return None
        timed.append(_TimedEngine(inner))
        return timed[-1]

    prepare_module.select_engine = select_timed  # type: ignore[assignment]
    select.select_engine = select_timed  # type: ignore[assignment]  (validate imports it when it runs)
    stream.CheckChunk = _measured_stage(stream.CheckChunk)  # type: ignore[misc]
    shards.ScanGroup = _measured_stage(shards.ScanGroup)  # type: ignore[misc]  (worker writes: both passes)
    shards.WriteShard = _measured_stage(shards.WriteShard)  # type: ignore[misc]
    started, cpu_started = time.perf_counter(), time.process_time()
    if command == "prepare":
        from prefdata.prepare import prepare

        result = prepare(raw, out, tokenizer=tokenizer, max_length=256, workers=workers, progress=False, engine=engine)
        rows = result.rows_in
    else:
        from prefdata.validate.command import validate

        validate(raw, format="json", workers=workers, progress=False, engine=engine)
        rows = 0
    seconds, driver_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    main = _TimedEngine(None)  # every map the command ran (the partitioned first pass too)
    for engine_used in timed:
        main.wait += engine_used.wait
        main.stage += engine_used.stage
        main.shuffled += engine_used.shuffled
        main.consume += engine_used.consume
        main.worker_rss = max(main.worker_rss, engine_used.worker_rss)
    print(json.dumps({
        "seconds": seconds, "rows": rows, "init_seconds": init_seconds, "wait_seconds": main.wait,
        "stage_seconds": main.stage, "shuffle_seconds": main.shuffled, "consume_seconds": main.consume, "driver_cpu_seconds": driver_cpu,
        "peak_rss_mib": peak_rss_mib(),
        "worker_rss_mib": main.worker_rss,
    }))


def measure(command: str, engine: str, raw: Path, workdir: Path, tokenizer: str, workers: int) -> dict:
    out = workdir / f"out-{command}-{engine}"
    proc = subprocess.run(
        [sys.executable, __file__, "--_child", command, engine, str(raw), str(out), tokenizer, str(workers)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if proc.returncode:
        sys.exit(f"{command} --engine {engine} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2, help="local worker processes = Ray CPUs (default 2)")
    parser.add_argument("--max-words", type=int, default=30, help="longest completion in words (prompts half that)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: ../shared Qwen2.5 if present)")
    parser.add_argument("--_child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        command, engine, raw, out, tokenizer, workers = args._child
        run_child(command, engine, raw, out, tokenizer, int(workers))
        return
    qwen = REPO.parent / "shared" / "assets" / "tokenizers" / "qwen2.5-instruct"
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        workdir = Path(tmp)
        tokenizer = args.tokenizer or str(qwen)
        raw = workdir / "pairs.jsonl"
        write_synthetic(raw, args.rows, max_words=args.max_words)
        runs = {(c, e): measure(c, e, raw, workdir, tokenizer, args.workers)
                for c in ("prepare", "validate") for e in ("local", "ray")}
    print(f"\n{args.rows:,} synthetic pairs, tokenizer {Path(tokenizer).name}, {args.workers} local workers = "
          f"{args.workers} Ray CPUs on this machine\n")
    print("| command | engine | seconds | pairs/s | Ray/local wall | ray.init s | driver peak RSS MiB | worker peak RSS MiB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (command, engine), m in runs.items():
        ratio = m["seconds"] / runs[(command, "local")]["seconds"]
        print(f"| {command} | {engine} | {m['seconds']:.1f} | {args.rows / m['seconds']:,.0f} | {ratio:.2f} | "
              f"{m['init_seconds']:.1f} | {m['peak_rss_mib']:.0f} | {m['worker_rss_mib']:.0f} |")
    # Marginal rates: the same Ray runs on a tenth of the input, so fixed costs (start-up, the
    # tokenizer load, task start-up of the shuffle) cancel out of the per-row figures.
    small_rows = max(1, args.rows // 10)
    with tempfile.TemporaryDirectory(prefix="bench-ray-small-") as tmp:
        small_raw = Path(tmp) / "pairs.jsonl"
        write_synthetic(small_raw, small_rows, max_words=args.max_words)
        small = {"ray": measure("prepare", "ray", small_raw, Path(tmp), tokenizer, args.workers)}
    rates = {}
    extra = args.rows - small_rows
    for engine in ("ray",):
        big, little = runs[("prepare", engine)], small[engine]
        per_worker = extra / max(big["stage_seconds"] - little["stage_seconds"], 1e-9)
        driver = extra / max(big["driver_cpu_seconds"] - little["driver_cpu_seconds"], 1e-9)
        shuffle = max(big["shuffle_seconds"] - little["shuffle_seconds"], 0.0) / extra
        rates[engine] = (per_worker, driver, shuffle)
        print(f"\nprepare --engine {engine}, marginal rates ({small_rows:,} vs {args.rows:,} pairs): per worker "
              f"{per_worker:,.0f} pairs per stage-second; driver {driver:,.0f} pairs per CPU-second (all its "
              f"threads); shuffle {shuffle * 1e6:.1f} us per pair. At {args.rows:,}: wall {big['seconds']:.1f}s, driver "
              f"{big['driver_cpu_seconds']:.1f} CPU-s, shuffle {big['shuffle_seconds']:.1f}s")
    project(*rates["ray"], runs[("prepare", "ray")]["worker_rss_mib"])


def project(per_worker: float, driver: float, shuffle_per_row: float, worker_rss_mib: float,
            rows: int = 100_000_000, cores_per_node: int = 32) -> None:
    """100M pairs with worker writes: the workers (both passes) and the shuffle scale out; the
    driver's in-order join of digests, dropped/quarantine lines and the report does not."""
    workers = driver / per_worker  # workers that keep the driver busy; more only wait on it
    print(f"\nprojection for {rows:,} pairs ({cores_per_node}-core nodes), workers writing the shards:")
    print(f"  worker CPU: {rows / per_worker / 3600:,.0f} core-hours (both passes); memory per worker "
          f"~{worker_rss_mib:.0f} MiB (flat)")
    print(f"  the driver keeps up with {workers:,.0f} workers ({workers / cores_per_node:.1f} nodes): "
          f"{rows / driver / 3600:.1f} h at best")
    for n in (1, 4, 16):
        hours = rows / min(driver, n * cores_per_node * per_worker) / 3600
        print(f"  {n:>2} node(s): ~{hours:.1f} h of the two passes")
    print(f"  shuffle (dataset-wide checks): ~{shuffle_per_row * rows / 3600:.2f} h of this machine's 2 CPUs, "
          f"spread over the partitions' tasks on a cluster")
    # The driver keeps the report's per-row arrays (file 4 B, line 8 B, pair row 8 B, prompt and
    # pair keys 16 B: report/builder.py) and only the flagged rows of the dataset-wide checks.
    print(f"  driver memory: the report's 36 B per row: ~{rows * 36 / 2**30:.1f} GiB, plus flagged rows")


if __name__ == "__main__":
    main()
