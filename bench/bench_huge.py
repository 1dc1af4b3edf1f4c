"""Huge inputs (issue 16): one 10 MB pair through `prefdata validate` and `prefdata prepare`.

Rows printed:
- the near_duplicate measure alone on the issue's 6 MB / 5 MB pair (lengths rule it out) and on a
  5 MB / 5 MB near copy (the bounded method runs), against the old exact rapidfuzz call with
  score_cutoff on a 1/10-size pair (600 kB / 500 kB) in the same run -- the old call is quadratic,
  so the full-size figure is about 100x that (the issue measured 149 s);
- `validate` (no tokenizer) and `prepare` (tiny tokenizer from prefdata.tiny) end to end on a file
  with the 10 MB pair and two small rows, wall and CPU time.

Usage: python bench/bench_huge.py [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import tempfile
import time
from pathlib import Path


def _words(rng: random.Random, chars: int) -> str:
    vocab = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    return " ".join(rng.choice(vocab) for _ in range(chars // 5))[:chars]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(u.ru_utime + u.ru_stime for u in usage)


def _timed(label: str, call) -> float:
    wall, cpu = time.perf_counter(), _cpu()
    call()
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    print(f"| {label} | {wall:.2f} | {cpu:.2f} |", flush=True)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="prefdata-huge-"))
    work.mkdir(parents=True, exist_ok=True)

    from rapidfuzz.distance import Indel

    from prefdata.checks.similarity import at_least, similarity
    from prefdata.prepare import prepare
    from prefdata.tiny import build_tiny_tokenizer
    from prefdata.validate.command import validate

    rng = random.Random(16)
    six, five = _words(rng, 6_000_000), _words(rng, 5_000_000)
    near = five[:2_500_000] + " one small edit " + five[2_500_016:]
    print("| measure | wall s | CPU s |\n| --- | ---: | ---: |")
    old = _timed(
        "before: rapidfuzz Indel(score_cutoff=0.95), 600 kB / 500 kB (1/10 size)",
        lambda: Indel.normalized_similarity(six[:600_000], five[:500_000], score_cutoff=0.95),
    )
    new = _timed("after: checks.similarity.at_least, 6 MB / 5 MB", lambda: at_least(six, five, 0.95))
    _timed("after: checks.similarity.at_least, 5 MB / 5 MB near copy (bounded method)", lambda: at_least(five, near, 0.95))
    _timed("after: checks.similarity.similarity, 6 MB / 5 MB (report sample)", lambda: similarity(six, five))
    print(f"\nold call at 1/10 size: {old:.2f} s (full size ~{old * 100:.0f} s, quadratic); new at full size: {new:.4f} s\n")

    raw = work / "huge.jsonl"
    rows = [
        {"prompt": "q1?", "chosen": "yes", "rejected": "no"},
        {"prompt": "Summarize.", "chosen": five, "rejected": near},
        {"prompt": "q3?", "chosen": "good", "rejected": "bad"},
    ]
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = work / "tokenizer"
    if not tokenizer.is_dir():
        build_tiny_tokenizer(tokenizer)
    print(f"input: {raw.stat().st_size / 1e6:.1f} MB, 3 rows\n")
    print("| command | wall s | CPU s (incl. workers) |\n| --- | ---: | ---: |")
    _timed("validate (no tokenizer)", lambda: validate(raw, progress=False, format="json", output=work / "report.json"))
    out = work / "out"
    _timed("prepare (tiny tokenizer)", lambda: prepare(raw, out, tokenizer=str(tokenizer), progress=False, overwrite=True))


if __name__ == "__main__":
    main()
