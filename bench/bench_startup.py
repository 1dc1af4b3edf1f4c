"""Start-up of `prefdata validate` and `prefdata prepare` on a small file, as whole processes (issue 45).

    python bench/bench_startup.py                      # this tree's prefdata/, 5 runs of each command
    python bench/bench_startup.py --before ../old/     # the same commands on another tree's prefdata, alternated
    python bench/bench_startup.py --before 6c01d35     # ... or on a git revision's prefdata/ (git archive)

Runs each command as a fresh `python -m prefdata ...` process: the first N rows of the UltraFeedback
sample (default 50; ../shared/assets/data/ultrafeedback-sample/train.jsonl) validated text-only,
validated with `--tokenizer` (as it comes: a worker process per core; and with `--workers 1`), and
prepared with `--workers 1`. Prints each command's best and median
wall time and its CPU time (user + sys of the process and its children), then one extra run under
`python -X importtime` for what does not depend on the machine's load: how many modules were imported,
the summed import time, and which of torch, pandas and datasets were among them. `--before DIR`
puts DIR (a directory holding another tree's `prefdata/` package, or a git revision of this
repository, exported to a temporary directory) first on PYTHONPATH for the B runs; A and B alternate run by run, so a change in the
machine's load reaches both. On a loaded machine compare the CPU medians, not wall times.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "assets"
_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def _commands(data: Path, tokenizer: str, out: Path) -> dict[str, list[str]]:
    return {
        "validate (text checks)": ["validate", str(data), "--no-progress"],
        "validate --tokenizer": ["validate", str(data), "--tokenizer", tokenizer, "--no-progress"],
        # validate's default forks a worker per core even for one chunk of input: this row shows that cost
        "validate --tokenizer --workers 1": ["validate", str(data), "--tokenizer", tokenizer, "--workers", "1",
                                             "--no-progress"],
        "prepare --workers 1": ["prepare", str(data), str(out), "--overwrite", "--tokenizer", tokenizer,
                                "--workers", "1", "--no-progress"],
    }


def _env(tree: str) -> dict[str, str]:
    """The environment whose `python -m prefdata` runs `tree`'s prefdata/: first on PYTHONPATH, ahead
    of the editable install (which points at whichever checkout was installed, not this one)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _before_dir(before: str, work: Path) -> str:
    """`before` as a directory holding a prefdata/ package: itself, or a git revision's prefdata/."""
    if Path(before).is_dir():
        return str(Path(before).resolve())
    target = work / "before"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", before, "prefdata"], capture_output=True, check=False)
    if archive.returncode != 0:
        sys.exit(f"bench_startup: --before {before}: neither a directory nor a git revision "
                 f"({archive.stderr.decode(errors='replace').strip()})")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return str(target)


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    start_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "prefdata", *args], env=env, cwd=tempfile.gettempdir(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    end_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (end_cpu.ru_utime - start_cpu.ru_utime) + (end_cpu.ru_stime - start_cpu.ru_stime)
    return wall, cpu


HEAVY = ("torch", "pandas", "datasets")  # none of them needed unless a model is loaded (issue 45)


def _imports(args: list[str], env: dict[str, str]) -> tuple[int, float, list[str]]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "prefdata", *args], env=env,
                          cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False)
    rows = [m for m in map(_IMPORT_LINE.match, done.stderr.splitlines()) if m]
    names = {m[4] for m in rows}
    return len(rows), sum(int(m[1]) for m in rows) / 1e6, [name for name in HEAVY if name in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "qwen2.5-instruct"))
    parser.add_argument("--data", default=str(SHARED / "data" / "ultrafeedback-sample" / "train.jsonl"))
    parser.add_argument("--before", default=None,
                        help="a directory holding another tree's prefdata/ package, or a git revision")
    args = parser.parse_args()
    if not Path(args.data).is_file() or not Path(args.tokenizer).is_dir():
        sys.exit(f"bench_startup: needs {args.data} and {args.tokenizer} (../shared/assets)")
    work = Path(tempfile.mkdtemp(prefix="prefdata-startup-"))
    data = work / f"pairs-{args.rows}.jsonl"
    with open(args.data, encoding="utf-8") as source, open(data, "w", encoding="utf-8") as sink:
        for _, line in zip(range(args.rows), source):
            sink.write(line)
    sides = {"A (this tree)": _env(str(REPO))}
    if args.before:
        sides["B (--before)"] = _env(_before_dir(args.before, work))
    print(f"{args.rows} rows, tokenizer {Path(args.tokenizer).name}, {args.runs} runs after one warm-up, "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    commands = _commands(data, args.tokenizer, work / "out")
    width = max(map(len, commands))
    for name, command in commands.items():
        results: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        for side, env in sides.items():
            _timed(command, env)  # warm-up: page cache, bytecode
        for _ in range(args.runs):
            for side, env in sides.items():
                results[side].append(_timed(command, env))
        for side, env in sides.items():
            walls = [w for w, _ in results[side]]
            cpus = [c for _, c in results[side]]
            modules, import_s, heavy = _imports(command, env)
            print(f"{name:{width}s} {side:14s} wall best {min(walls):5.2f} s, "
                  f"median {statistics.median(walls):5.2f} s; CPU median {statistics.median(cpus):5.2f} s; {modules} modules imported in {import_s:4.2f} s"
                  f"{'; among them ' + ', '.join(heavy) if heavy else '; no ' + '/'.join(HEAVY)}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
