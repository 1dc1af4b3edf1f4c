"""Scale: a synthetic N-pair input (default 1M) streamed through `prefdata prepare` (or `validate`).

Generates distinct pairs (so the dataset-wide hash tables really grow), with 1% identical and 1%
whitespace-only pairs planted, writes them as JSONL (not timed), then runs `prefdata prepare` with
the tiny tokenizer in a child process and reports wall time, pairs/s and peak RSS of the main
process and of the largest worker process.

Memory per pair (issue 45): the same command also runs on `--base-rows` rows (default 20,000: past
the fixed working set of chunks in flight, tokenizer and libraries), and each size prints its main
process's peak RSS above that base, per pair, and the growth per pair from the previous size.

Usage: python bench/bench_scale.py [--rows 1000000] [--rows 100000 ...] [--workers N]
       python bench/bench_scale.py --memory            # 50k / 200k / 1M pairs, KB a pair above the base
       python bench/bench_scale.py --memory --command validate --workers 1   # text-only checks
       python bench/bench_scale.py --memory --command state   # the dataset-wide checks' state alone
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_prepare import peak_rss_mib  # bench/ is on sys.path: these run as scripts

REPO = Path(__file__).resolve().parents[1]
WORDS = (
    "the a of to and in is it you that he was for on are with as I his they be at one have this from "
    "or had by hot word but what some we can out other were all there when up use your how said an each "
    "she which do their time if will way about many then them write would like so these her long make "
    "thing see him two has look more day could go come did number sound no most people my over know water"
).split()


def write_synthetic(path: Path, rows: int, seed: int = 0, max_words: int = 120) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            prompt = f"Question {i}: " + " ".join(rng.choices(WORDS, k=rng.randint(5, max(5, max_words // 2))))
            chosen = " ".join(rng.choices(WORDS, k=rng.randint(3, max_words)))
            kind = i % 100
            if kind == 0:
                rejected = chosen  # identical
            elif kind == 1:
                rejected = "  " + chosen.replace(" ", "  ") + "\n"  # whitespace only
            else:
                rejected = " ".join(rng.choices(WORDS, k=rng.randint(3, max_words)))
            handle.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected, "id": i}) + "\n")


def run_child(raw: str, out: str, tokenizer: str, workers: int, command: str = "prepare") -> None:
    """In a fresh process: prepare (or validate, text-only), then print wall seconds and peak RSS of
    main and workers."""
    sys.path.insert(0, str(REPO))
    started = time.perf_counter()
    if command == "validate":
        from prefdata.validate.command import validate

        accounting = validate(raw, workers=workers, progress=False).report["accounting"]
        rows_in, rows_out, rows_dropped = accounting["rows_in"], accounting["rows_out"], accounting["rows_dropped"]
    else:
        from prefdata.prepare import prepare

        result = prepare(raw, out, tokenizer=tokenizer, max_length=256, workers=workers, progress=False)
        rows_in, rows_out, rows_dropped = result.rows_in, result.rows_out, result.rows_dropped
    seconds = time.perf_counter() - started
    print(json.dumps({
        "seconds": seconds,
        "rows_in": rows_in,
        "rows_out": rows_out,
        "rows_dropped": rows_dropped,
        "peak_rss_mib": peak_rss_mib(),
        "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }))


def run_state_child(raw: str) -> None:
    """In a fresh process: only the dataset-wide checks (checks.partitioned over checks.digests'
    blocks: duplicate and conflict digests, MinHash signatures), a block per 1,000 rows as the
    workers send them, then the in-process shuffle; prints the peak RSS above the peak after the
    first block, and what is held before the shuffle."""
    import itertools

    import numpy as np

    sys.path.insert(0, str(REPO))
    from prefdata.checks.digests import block_from_digests, pair_digests
    from prefdata.checks.partitioned import partitioned_on
    from prefdata.core.records import Pair

    blocks, base, rows = [], 0.0, 0
    started = time.perf_counter()
    with open(raw, encoding="utf-8") as handle:
        while lines := list(itertools.islice(handle, 1000)):
            records = [json.loads(line) for line in lines]
            pairs = [Pair(raw, rows + i + 1, r["prompt"], r["chosen"], r["rejected"]) for i, r in enumerate(records)]
            blocks.append(block_from_digests(np.arange(rows, rows + len(pairs)), pair_digests(pairs)))
            rows += len(pairs)
            base = base or peak_rss_mib()
    held = peak_rss_mib()
    clusters = partitioned_on(None, blocks, 0.8).near_duplicate_groups
    print(json.dumps({"seconds": time.perf_counter() - started, "rows_in": rows, "rows_out": rows, "rows_dropped": 0,
                      "base_mib": base, "held_mib": held, "peak_rss_mib": peak_rss_mib(), "clusters": len(clusters),
                      "worker_peak_rss_mib": 0.0}))


def measure(rows: int, workers: int, workdir: Path, tokenizer: str, max_words: int, command: str = "prepare") -> dict:
    raw = workdir / f"synthetic-{rows}.jsonl"
    write_synthetic(raw, rows, max_words=max_words)
    size_mib = raw.stat().st_size / 2**20
    result = subprocess.run(
        [sys.executable, __file__, "--_child", str(raw), str(workdir / f"out-{rows}"), tokenizer, str(workers), command],
        capture_output=True, text=True, check=True,
    )
    raw.unlink()
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    measured["input_mib"] = size_mib
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, action="append", help="sizes (repeatable; default 1000000)")
    parser.add_argument("--workers", type=int, default=None, help="prepare --workers (default: all cores)")
    parser.add_argument("--max-words", type=int, default=30, help="longest completion in words (prompts half that)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: ../shared Qwen2.5 if present, else the tiny one)")
    parser.add_argument("--command", choices=("prepare", "validate", "state"), default="prepare",
                        help="prepare (default), validate (text-only checks), or state: the dataset-wide "
                             "checks alone (their digest blocks and the shuffle), above the first block")
    parser.add_argument("--memory", action="store_true",
                        help="sizes 50k / 200k / 1M (unless --rows) and peak RSS above a --base-rows run, per pair")
    parser.add_argument("--base-rows", type=int, default=20_000, help="the base run's size for --memory (default 20000)")
    parser.add_argument("--_child", nargs="+", help=argparse.SUPPRESS)  # RAW OUT TOKENIZER WORKERS [COMMAND]
    args = parser.parse_args()
    if args._child:
        raw, out, tokenizer, workers, command = (*args._child, "prepare")[:5]
        if command == "state":
            run_state_child(raw)
        else:
            run_child(raw, out, tokenizer, int(workers), command)
        return
    sys.path.insert(0, str(REPO))
    from prefdata.tiny import build_tiny_tokenizer
    from prefdata.engine.local import default_workers

    workers = args.workers or default_workers()
    sizes = args.rows or ([50_000, 200_000, 1_000_000] if args.memory else [1_000_000])
    qwen = REPO.parent / "shared" / "assets" / "tokenizers" / "qwen2.5-instruct"
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workdir = Path(tmp)
        tokenizer = args.tokenizer or (str(qwen) if qwen.is_dir() else None)
        if tokenizer is None:
            build_tiny_tokenizer(workdir / "tok")
            tokenizer = str(workdir / "tok")
        base = None
        if args.memory and args.command != "state":
            base = measure(args.base_rows, workers, workdir, tokenizer, args.max_words, args.command)
        results = {}
        for n in sizes:
            results[n] = measure(n, workers, workdir, tokenizer, args.max_words, args.command)
            print(f"{n:,} rows: {json.dumps(results[n])}", file=sys.stderr, flush=True)
    settings = (f"tokenizer {Path(tokenizer).name}, --max-length 256, " if args.command == "prepare" else "text-only, ")
    print(f"\nprefdata {args.command} on synthetic distinct pairs ({settings}completions up to "
          f"{args.max_words} words, --workers {workers})\n")
    if args.command == "state":
        print_state(results)
        return
    if base is not None:
        print_memory(args.base_rows, base, results)
        return
    print("| rows | input MiB | seconds | pairs/s | kept | dropped | peak RSS main (MiB) | peak RSS largest worker (MiB) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, m in results.items():
        print(f"| {n:,} | {m['input_mib']:.0f} | {m['seconds']:.0f} | {n / m['seconds']:,.0f} | {m['rows_out']:,} | "
              f"{m['rows_dropped']:,} | {m['peak_rss_mib']:.0f} | {m['worker_peak_rss_mib']:.0f} |")


def print_memory(base_rows: int, base: dict, results: dict[int, dict]) -> None:
    """Peak RSS of the main process above the base run, per pair, and the growth from the size before."""
    print(f"base: {base_rows:,} rows, peak RSS main {base['peak_rss_mib']:.0f} MiB\n")
    print("| rows | seconds | peak RSS main (MiB) | above base (MiB) | KB a pair above base | KB a pair from the size before | peak RSS largest worker (MiB) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    before_rows, before_peak = base_rows, base["peak_rss_mib"]
    for n, m in results.items():
        above = m["peak_rss_mib"] - base["peak_rss_mib"]
        slope = (m["peak_rss_mib"] - before_peak) * 2**20 / 1000 / max(1, n - before_rows)
        print(f"| {n:,} | {m['seconds']:.0f} | {m['peak_rss_mib']:.0f} | {above:.0f} | {above * 2**20 / 1000 / n:.2f} | "
              f"{slope:.2f} | {m['worker_peak_rss_mib']:.0f} |")
        before_rows, before_peak = n, m["peak_rss_mib"]


def print_state(results: dict[int, dict]) -> None:
    print("| rows | seconds | peak before the shuffle (MiB) | KB a pair | peak (MiB) | peak KB a pair | near-duplicate clusters |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, m in results.items():
        held, peak = m["held_mib"] - m["base_mib"], m["peak_rss_mib"] - m["base_mib"]
        print(f"| {n:,} | {m['seconds']:.0f} | {held:.1f} | {held * 2**20 / 1000 / n:.3f} | {peak:.1f} | "
              f"{peak * 2**20 / 1000 / n:.3f} | {m['clusters']:,} |")


if __name__ == "__main__":
    main()
