"""Benchmark: the Ray engine vs the local engine on this machine, and a projection past one machine.

Same synthetic input (distinct pairs, bench_scale's generator), same tokenizer, each run in a fresh
child process: `prepare` and text-level `validate` with `--engine local` (worker processes) and
`--engine ray` (a local Ray with as many CPUs as the local engine has workers). Reported per run:
wall seconds, pairs/s, the Ray/local wall ratio (the overhead of Ray on one machine), and for
prepare the split the projection needs:
  - per-worker rate: pairs per second of stage time inside a worker (parse, normalize, tokenize,
    pair checks, digests), measured in the workers themselves;
  - driver rate: pairs per second of the main process's own work (the in-order merge, report,
    writing), i.e. wall time minus the time it waited for results;
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
        self.wait = self.stage = self.worker_rss = 0.0
        self.workers = getattr(inner, "workers", 1)  # what the partitioned checks size their shuffle by
        if hasattr(inner, "shuffle"):
            self.put, self.shuffle = inner.put, inner.shuffle

    def map_ordered(self, stage, units):  # noqa: ANN001, ANN201
        engine = self

        class Results:
            def __init__(self) -> None:
                self.results = engine.inner.map_ordered(stage, units)

            def __iter__(self):  # noqa: ANN204
                return self

            def __next__(self):  # noqa: ANN204
                started = time.perf_counter()
                try:
                    unit, result = next(self.results)
                finally:
                    engine.wait += time.perf_counter() - started
                engine.stage += getattr(result, "stage_seconds", 0.0)
                engine.worker_rss = max(engine.worker_rss, getattr(result, "worker_rss_mib", 0.0))
                return unit, result

            def close(self) -> None:
                self.results.close()

        return Results()


def run_child(command: str, engine: str, raw: str, out: str, tokenizer: str, workers: int) -> None:
    """In a fresh process: one run, then one JSON line of measurements. `engine` "ray+partitioned":
    Ray with the dataset-wide checks by hash partitioning (a first pass over the input)."""
    partitioned = engine.endswith("+partitioned")
    engine = engine.removesuffix("+partitioned")
    sys.path.insert(0, str(REPO))
    import prefdata.ingest as ingest
    import prefdata.prepare as prepare_module
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
    ingest.CheckChunk = _measured_stage(ingest.CheckChunk)  # type: ignore[misc]
    started = time.perf_counter()
    if command == "prepare":
        from prefdata.prepare import prepare

        result = prepare(raw, out, tokenizer=tokenizer, max_length=256, workers=workers, progress=False, engine=engine,
                         partitioned_checks=partitioned)
        rows = result.rows_in
    else:
        from prefdata.validate.command import validate

        validate(raw, format="json", workers=workers, progress=False, engine=engine)
        rows = 0
    seconds = time.perf_counter() - started
    main = _TimedEngine(None)  # every map the command ran (the partitioned first pass too)
    for engine_used in timed:
        main.wait += engine_used.wait
        main.stage += engine_used.stage
        main.worker_rss = max(main.worker_rss, engine_used.worker_rss)
    print(json.dumps({
        "seconds": seconds, "rows": rows, "init_seconds": init_seconds, "wait_seconds": main.wait,
        "stage_seconds": main.stage, "peak_rss_mib": peak_rss_mib(), "worker_rss_mib": main.worker_rss,
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
        runs[("prepare", "ray+partitioned")] = measure("prepare", "ray+partitioned", raw, workdir, tokenizer, args.workers)
    print(f"\n{args.rows:,} synthetic pairs, tokenizer {Path(tokenizer).name}, {args.workers} local workers = "
          f"{args.workers} Ray CPUs on this machine\n")
    print("| command | engine | seconds | pairs/s | Ray/local wall | ray.init s | driver peak RSS MiB | worker peak RSS MiB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (command, engine), m in runs.items():
        ratio = m["seconds"] / runs[(command, "local")]["seconds"]
        print(f"| {command} | {engine} | {m['seconds']:.1f} | {args.rows / m['seconds']:,.0f} | {ratio:.2f} | "
              f"{m['init_seconds']:.1f} | {m['peak_rss_mib']:.0f} | {m['worker_rss_mib']:.0f} |")
    for engine in ("ray", "ray+partitioned"):
        m = runs[("prepare", engine)]
        per_worker = args.rows / m["stage_seconds"]  # the second pass (the first returns digests only)
        driver = args.rows / max(m["seconds"] - m["wait_seconds"], 1e-9)
        print(f"\nprepare --engine {engine}: per-worker stage rate {per_worker:,.0f} pairs/s; driver's own "
              f"work {driver:,.0f} pairs/s (wall {m['seconds']:.1f}s, waiting {m['wait_seconds']:.1f}s)")
    ray_prepare = runs[("prepare", "ray")]
    per_worker = args.rows / ray_prepare["stage_seconds"] if ray_prepare["stage_seconds"] else float("nan")
    driver = args.rows / max(ray_prepare["seconds"] - ray_prepare["wait_seconds"], 1e-9)
    project(per_worker, driver, ray_prepare["worker_rss_mib"])


def project(per_worker: float, driver: float, worker_rss_mib: float, rows: int = 100_000_000,
            cores_per_node: int = 32) -> None:
    """100M pairs: the workers scale out; the driver's in-order merge, report and writing do not."""
    workers = driver / per_worker  # workers that keep the driver busy; more only wait on it
    print(f"\nprojection for {rows:,} pairs ({cores_per_node}-core nodes):")
    print(f"  workers to saturate the driver: {workers:,.0f} ({workers / cores_per_node:.1f} nodes); "
          f"then {rows / driver / 3600:.1f} h, bound by the driver ({driver:,.0f} pairs/s)")
    print(f"  worker CPU: {rows / per_worker / 3600:,.0f} core-hours; memory per worker ~{worker_rss_mib:.0f} MiB (flat)")
    # bench_scale measured the main process growing ~0.7 KiB per distinct pair at 1M rows (merge
    # tables, MinHash signatures, the report's per-row arrays and excerpts).
    print(f"  driver memory: ~0.7 KiB per distinct pair (bench_scale, 1M rows): ~{rows * 700 / 2**30:.0f} GiB")


if __name__ == "__main__":
    main()
