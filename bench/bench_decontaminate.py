"""Benchmark: `prefdata prepare` with and without `--decontaminate-against` a 100k-item benchmark.

The benchmark set is synthetic: N items of 20-80 words drawn from a 20k-word vocabulary (GSM8K /
MMLU-sized questions), a `question` field each, so nearly every 13-word run is distinct. The
training data is the UltraFeedback sample repeated to --rows pairs, with every 100th prompt given
a 15-word run of a benchmark item (so the check finds something to drop).

Measured, in the same run: (a) building the run table (seconds, distinct runs, bytes, bytes per
million runs, and this process's RSS growth while it is held); (b) prepare end to end without and
with decontamination, alternated for --repeat rounds, best wall time each (pairs/s).

Usage: python bench/bench_decontaminate.py [--items 100000] [--rows 2000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "assets"
DEFAULT_TOKENIZER = SHARED / "tokenizers" / "qwen2.5-instruct"
DEFAULT_DATA = SHARED / "data" / "ultrafeedback-sample" / "train.jsonl"


def rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def write_benchmark(path: Path, items: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    vocab = [f"w{rng.getrandbits(40):x}" for _ in range(20_000)]
    texts = []
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(items):
            words = rng.choices(vocab, k=rng.randint(20, 80))
            texts.append(words)
            handle.write(json.dumps({"question": " ".join(words).capitalize() + "?", "answer": "42"}) + "\n")
    return texts


def write_pairs(source: Path, rows: int, out: Path, bench: list[list[str]], every: int = 100) -> int:
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    contaminated = 0
    with open(out, "w", encoding="utf-8") as handle:
        for i in range(rows):
            row = json.loads(lines[i % len(lines)])
            if i % every == 0:
                item = bench[(i * 7919) % len(bench)]
                row["prompt"] = f"{row['prompt']} {' '.join(item[:15])}"
                contaminated += 1
            handle.write(json.dumps(row) + "\n")
    return contaminated


def time_prepare(raw: Path, out: Path, tokenizer: str, against: list[str] | None) -> tuple[float, dict]:
    from prefdata.prepare import prepare

    start = time.perf_counter()
    result = prepare(raw, out, tokenizer=tokenizer, max_length=1024, overwrite=True, progress=False,
                     decontaminate_against=against)
    return time.perf_counter() - start, dict(result.flag_counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    args = parser.parse_args()

    from prefdata.sets.decontaminate import build_benchmarks

    with tempfile.TemporaryDirectory(prefix="bench-decon-") as tmp:
        root = Path(tmp)
        bench_path = root / "benchmark.jsonl"
        bench = write_benchmark(bench_path, args.items)
        raw = root / "pairs.jsonl"
        contaminated = write_pairs(Path(args.data), args.rows, raw, bench)
        del bench
        gc.collect()

        before = rss_mib()
        start = time.perf_counter()
        index, catalog = build_benchmarks([str(bench_path)])
        build_s = time.perf_counter() - start
        held = rss_mib() - before
        runs, nbytes = catalog.runs, index.nbytes
        excerpt_bytes = sum(len(e.encode()) + 49 for e in catalog.excerpts)
        del index, catalog
        gc.collect()

        times: dict[str, float] = {"without": float("inf"), "with": float("inf")}
        flags: dict[str, dict] = {}
        for _ in range(args.repeat):
            for name, against in (("without", None), ("with", [str(bench_path)])):
                seconds, flag_counts = time_prepare(raw, root / f"out-{name}", args.tokenizer, against)
                times[name] = min(times[name], seconds)
                flags[name] = flag_counts
        load = os.getloadavg()[0]

    print(f"\nbenchmark: {args.items:,} synthetic items (20-80 words), {runs:,} distinct 13-word runs; "
          f"pairs: {args.rows:,} (UltraFeedback sample repeated, {contaminated} given a 15-word benchmark run); "
          f"{os.cpu_count()} CPUs, load {load:.1f}, best wall of {args.repeat}\n")
    print("| what | value |\n| --- | ---: |")
    print(f"| run table build (read + hash {args.items:,} items) | {build_s:.1f} s |")
    print(f"| run table (hashes + first item) | {nbytes / 2**20:.1f} MiB = {nbytes / runs * 1e6 / 2**20:.1f} MiB per million runs |")
    print(f"| item excerpts for the report (main process only) | {excerpt_bytes / 2**20:.1f} MiB |")
    print(f"| RSS growth of this process while both are held | {held:.0f} MiB |")
    for name in ("without", "with"):
        print(f"| prepare {name} decontamination | {args.rows / times[name]:,.0f} pairs/s ({times[name]:.1f} s) |")
    print(f"| with / without | {times['without'] / times['with'] * 100:.0f}% of the speed |")
    print(f"| benchmark_overlap flagged | {flags['with'].get('benchmark_overlap', 0)} of {contaminated} planted |")


if __name__ == "__main__":
    main()
