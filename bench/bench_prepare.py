"""Benchmark: `prefdata prepare` vs TRL's DPO dataset preparation vs plain batch tokenization.

Same data, same tokenizer, same process:
  (a) TRL: `DPOTrainer._prepare_dataset` of the installed trl (add EOS map + tokenize map + the
      max_length filter, num_proc=1 as DPOConfig defaults to) on a `datasets.Dataset` of strings;
      exactly the code a TRL user's trainer runs on its train dataset.
  (b) plain: the fast tokenizer called once per batch of 1000 texts, prompt, chosen and rejected
      each tokenized once (no template, no checks, no writing): the floor for "tokenize each text once".
  (c) prefdata: `prefdata.prepare.prepare` end to end (read JSONL, normalize, tokenize, all checks,
      write the Arrow dataset, manifest and reports).
Plus peak RSS of `prepare` in a child process at two sizes (memory must stay flat).

Usage: python bench/bench_prepare.py [--rows 20000] [--repeat 3] [--quick] [--memory-rows 20000,200000]
prefdata, its tokenize stage, plain tokenization and TRL alternate for --repeat rounds; each keeps its best wall time.
"""

from __future__ import annotations

import argparse
import warnings
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "assets"
DEFAULT_TOKENIZER = SHARED / "tokenizers" / "qwen2.5-instruct"
DEFAULT_DATA = SHARED / "data" / "ultrafeedback-sample" / "train.jsonl"
MAX_LENGTH = 1024  # DPOConfig's default max_length; prefdata gets the same


class Timer:
    """Wall-clock and CPU seconds (all threads of this process and its worker processes). On a shared machine the CPU time
    says how much work each method does; the wall time also shows what batching over cores buys."""

    def __enter__(self) -> "Timer":
        self._wall, self._cpu = time.perf_counter(), _cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.times = (time.perf_counter() - self._wall, _cpu_seconds() - self._cpu)


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB: VmHWM, which starts afresh at exec. (ru_maxrss
    keeps the high-water mark of the process that forked us, here a parent holding the data.)"""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux

def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (prepare's worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def write_repeated(source: Path, rows: int, out: Path) -> Path:
    """The sample repeated (line by line) to `rows` rows."""
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    with open(out, "w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(lines[i % len(lines)] + "\n")
    return out


def load_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def time_trl(rows: list[dict], tokenizer_path: str) -> float:
    """TRL's own preparation code, called as DPOTrainer.__init__ calls it (no model needed)."""
    from types import SimpleNamespace

    from datasets import Dataset, disable_progress_bars
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    disable_progress_bars()
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("trl").setLevel(logging.ERROR)  # its once-per-message boundary warning floods stdout
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    with tempfile.TemporaryDirectory() as tmp:
        args = DPOConfig(output_dir=tmp, max_length=MAX_LENGTH, report_to=[], use_cpu=True, bf16=False)
        dataset = Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows])
        fake_trainer = SimpleNamespace(_tokenizer=tokenizer)
        with Timer() as timer:
            prepared = DPOTrainer._prepare_dataset(fake_trainer, dataset, tokenizer, args, "train")
    assert len(prepared) > 0 and "chosen_ids" in prepared.column_names
    return timer.times


def time_plain(rows: list[dict], tokenizer_path: str, batch_size: int = 1000) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    with Timer() as timer:
        for i in range(0, len(rows), batch_size):
            batch = rows[i : i + batch_size]
            for key in ("prompt", "chosen", "rejected"):
                tokenizer([r[key] for r in batch])["input_ids"]
    return timer.times


def time_prefdata(raw: Path, out: Path, tokenizer_path: str) -> float:
    from prefdata.prepare import prepare

    with Timer() as timer:
        prepare(raw, out, tokenizer=tokenizer_path, max_length=MAX_LENGTH, overwrite=True, progress=False)
    return timer.times


def time_tokenize_only(rows: list[dict], tokenizer_path: str, batch_size: int = 1000) -> float:
    """prefdata's tokenize stage alone (PairTokenizer.tokenize_pairs on already-normalized pairs)."""
    from prefdata.core.records import Pair
    from prefdata.tokenize.pairs import PairTokenizer
    from prefdata.tokenize.settings import TokenizeSettings

    tok = PairTokenizer(tokenizer_path, TokenizeSettings(max_length=MAX_LENGTH))
    tok.setup()
    pairs = [Pair("bench", i + 1, r["prompt"], r["chosen"], r["rejected"]) for i, r in enumerate(rows)]
    with Timer() as timer:
        for i in range(0, len(pairs), batch_size):
            tok.tokenize_pairs_or_errors(pairs[i : i + batch_size])
    return timer.times


def child_prepare(raw: str, out: str, tokenizer_path: str) -> None:
    """Runs in a fresh process: prepare, then report this process's peak RSS."""
    elapsed, _ = time_prefdata(Path(raw), Path(out), tokenizer_path)
    # prepare tokenizes in worker processes: the largest one's peak is reported beside the main's.
    worker_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # forked, not exec'd: theirs
    print(json.dumps({"peak_rss_mib": peak_rss_mib(), "worker_peak_rss_mib": worker_kib / 1024, "seconds": elapsed}))


def peak_rss(source: Path, rows: int, tokenizer_path: str, workdir: Path) -> dict:
    raw = write_repeated(source, rows, workdir / f"mem-{rows}.jsonl")
    out = workdir / f"mem-out-{rows}"
    result = subprocess.run(
        [sys.executable, __file__, "--_child", str(raw), str(out), tokenizer_path],
        capture_output=True, text=True, check=True, cwd=REPO,
    )
    raw.unlink()
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20000, help="rows for the throughput comparison")
    parser.add_argument("--quick", action="store_true", help="2,000 rows; memory at 2,000 and 20,000 rows")
    parser.add_argument("--memory-rows", default=None, help="comma-separated sizes for peak RSS (default 20000,200000; '' for none)")
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of prefdata/tokenize/plain/TRL, alternated; the best wall of each is kept")
    parser.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        child_prepare(*args._child)
        return

    rows = 2000 if args.quick else args.rows
    default_memory = "2000,20000" if args.quick else "20000,200000"
    memory_rows = [int(x) for x in (default_memory if args.memory_rows is None else args.memory_rows).split(",") if x]
    source = Path(args.data)
    if not source.exists() or not Path(args.tokenizer).is_dir():
        sys.exit(f"needs {source} and {args.tokenizer} (../shared)")
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # the default; silences the fork warning

    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        workdir = Path(tmp)
        raw = write_repeated(source, rows, workdir / "raw.jsonl")
        data = load_rows(raw)
        results: dict[str, tuple[float, float]] = {}

        def best(name: str, timing: tuple[float, float]) -> None:
            # Best of the rounds by wall time: other load on a shared machine only ever slows a run.
            if name not in results or timing[0] < results[name][0]:
                results[name] = timing

        # prefdata first and TRL last; each one warmed up on 200 rows so imports don't count.
        warm = write_repeated(source, 200, workdir / "warm.jsonl")
        time_prefdata(warm, workdir / "warm-out", args.tokenizer)
        time_plain(data[:200], args.tokenizer)
        if not args.skip_trl:
            time_trl(data[:200], args.tokenizer)
        # The methods alternate, so slow spells hit each of them; TRL too, each method keeping its best
        # round (one TRL run against three of prefdata's was unfair to TRL by a slow spell's size).
        for _ in range(args.repeat):
            best("prefdata prepare (end to end)", time_prefdata(raw, workdir / "out", args.tokenizer))
            best("prefdata tokenize stage only", time_tokenize_only(data, args.tokenizer))
            best("plain batch tokenization", time_plain(data, args.tokenizer))
            if not args.skip_trl:
                best("TRL DPOTrainer._prepare_dataset", time_trl(data, args.tokenizer))
        memory = {n: peak_rss(source, n, args.tokenizer, workdir) for n in memory_rows}

    rate = {name: rows / wall for name, (wall, _) in results.items()}
    cpu_rate = {name: rows / cpu for name, (_, cpu) in results.items()}
    import trl
    import transformers

    print(f"\n{rows} rows (UltraFeedback sample repeated), tokenizer {Path(args.tokenizer).name}, "
          f"max_length {MAX_LENGTH}, trl {trl.__version__}, transformers {transformers.__version__}, "
          f"{os.cpu_count()} CPUs, best wall of {args.repeat} rounds each\n")
    print("| method | wall s | pairs/s (wall) | CPU s | pairs per CPU-s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (wall, cpu) in results.items():
        print(f"| {name} | {wall:.1f} | {rate[name]:.0f} | {cpu:.1f} | {cpu_rate[name]:.0f} |")
    ours, plain = "prefdata prepare (end to end)", "plain batch tokenization"
    print()
    for label, table in (("wall", rate), ("CPU", cpu_rate)):
        # The targets are throughput (wall); the per-CPU-second ratios say how much work each does.
        target_trl, target_plain = (" (target >= 2.5x)", " (target >= 75%)") if label == "wall" else ("", "")
        if "TRL DPOTrainer._prepare_dataset" in table:
            print(f"{label}: prefdata / TRL = {table[ours] / table['TRL DPOTrainer._prepare_dataset']:.2f}x{target_trl}")
        print(f"{label}: prefdata / plain = {table[ours] / table[plain]:.0%}{target_plain}; "
              f"tokenize stage / plain = {table['prefdata tokenize stage only'] / table[plain]:.0%}")
    print("\n| prepare rows | peak RSS main process (MiB) | peak RSS largest worker (MiB) | seconds |")
    print("| ---: | ---: | ---: | ---: |")
    for n, m in memory.items():
        print(f"| {n} | {m['peak_rss_mib']:.0f} | {m['worker_peak_rss_mib']:.0f} | {m['seconds']:.1f} |")


if __name__ == "__main__":
    main()
