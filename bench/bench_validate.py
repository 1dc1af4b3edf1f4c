"""Scale benchmark for text-level validation: the real `prefdata validate FILE.jsonl`, end to end.

    python bench/bench_validate.py --rows 100000 --rows 1000000

Synthetic pairs are generated batch by batch (never all in memory) with planted problems at known
rates: exact duplicate pairs, swapped (conflicting) pairs, identical and whitespace-only pairs, and
near-duplicate prompts (one word substituted or inserted into an earlier prompt). They are written to
a .jsonl file first (not timed; cached under --data-dir), then a child process per size times
`prefdata.validate.command.validate(path, format="json", output=..., progress=False)`: reading and parsing
the JSON lines, normalizing, the pair and dataset-wide checks, the report, MinHash near-duplicate
prompts and rendering the report. Prints pairs/s (wall and CPU time of the child, all threads), the
child's peak RSS, the hash-table sizes, and the recall of every planted kind (from the report's
flagged rows, and from the near-duplicate clusters validate computed).

`--checks-only` adds the old row: only the checks loop (`run_checks`) over in-memory pairs.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefdata.checks.digests import digest_block  # noqa: E402
from prefdata.checks.partitioned import dataset_flags, partitioned_dataset_checks  # noqa: E402
from prefdata.checks.pair import apply_policy, text_flags  # noqa: E402
from prefdata.checks.policy import Policy, load_policy  # noqa: E402
from prefdata.core import flags as F  # noqa: E402
from prefdata.core.records import Pair  # noqa: E402

RATES = {"duplicate": 0.02, "conflict": 0.005, "identical": 0.005, "whitespace": 0.005, "near_prompt": 0.02}


@dataclass
class Planted:
    duplicate_rows: set[int] = field(default_factory=set)
    conflict_rows: set[int] = field(default_factory=set)
    identical_rows: set[int] = field(default_factory=set)
    whitespace_rows: set[int] = field(default_factory=set)
    near_prompt_pairs: list[tuple[int, int, float]] = field(default_factory=list)  # (orig, copy, jaccard)


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = "".join(c if c.isalnum() or ord(c) > 127 else " " for c in text.lower()).split()
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)} if len(words) >= 3 else {tuple(words)}


def _jaccard(a: str, b: str) -> float:
    sa, sb = _shingles(a), _shingles(b)
    return len(sa & sb) / len(sa | sb)


class PairGenerator:
    """Deterministic synthetic pairs with planted problems; keeps a small window of recent pairs."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.py = random.Random(seed)
        syllables = ["ka", "lo", "mi", "ne", "ru", "so", "ta", "vi", "ze", "po", "qu", "an", "el", "or"]
        words = {"".join(self.py.choice(syllables) for _ in range(self.py.randint(1, 4))) for _ in range(60000)}
        self.vocab = np.array(sorted(words), dtype=object)
        # Zipf-like word frequencies, like natural text.
        ranks = np.arange(1, len(self.vocab) + 1)
        self.p = (1 / ranks**1.05) / (1 / ranks**1.05).sum()
        sentences = self.rng.choice(len(self.vocab), size=(40000, 12), p=self.p)
        punct = [". ", "? ", ", ", "! ", ".\n"]
        self.sentences = [" ".join(self.vocab[s].tolist()) + punct[i % 5] for i, s in enumerate(sentences)]
        self.window: list[Pair] = []
        self.planted = Planted()
        self.n = 0

    def _text(self, n_words: int) -> str:
        return " ".join(self.vocab[self.rng.choice(len(self.vocab), size=n_words, p=self.p)].tolist())

    def _completion(self, n_sentences: int) -> str:
        idx = self.rng.integers(0, len(self.sentences), n_sentences)
        return "".join(self.sentences[i] for i in idx).strip()

    def batch(self, size: int) -> list[Pair]:
        rng, py = self.rng, self.py
        kinds = rng.random(size)
        prompt_words = np.clip(rng.lognormal(3.6, 0.8, size).astype(int), 3, 600)
        chosen_sents = np.clip(rng.lognormal(2.2, 0.7, size).astype(int), 1, 120)
        rejected_sents = np.clip(rng.lognormal(2.2, 0.7, size).astype(int), 1, 120)
        out: list[Pair] = []
        edges = np.cumsum([RATES[k] for k in ("duplicate", "conflict", "identical", "whitespace", "near_prompt")])
        for i in range(size):
            row = self.n
            self.n += 1
            k = kinds[i]
            earlier = self.window[py.randrange(len(self.window))] if self.window else None
            if earlier is not None and k < edges[0]:
                pair = Pair("synthetic.jsonl", row + 1, earlier.prompt, earlier.chosen, earlier.rejected)
                self.planted.duplicate_rows.add(row)
            elif earlier is not None and k < edges[1] and earlier.chosen.split() != earlier.rejected.split():
                # (a pair whose halves are equal up to whitespace is its own swap: no conflict)
                pair = Pair("synthetic.jsonl", row + 1, earlier.prompt, earlier.rejected, earlier.chosen)
                self.planted.conflict_rows.add(row)
            else:
                prompt = self._text(int(prompt_words[i]))
                chosen = self._completion(int(chosen_sents[i]))
                rejected = self._completion(int(rejected_sents[i]))
                if k < edges[2]:
                    rejected = chosen
                    self.planted.identical_rows.add(row)
                elif k < edges[3]:
                    rejected = " " + chosen.replace(". ", ".  ") + "\n"
                    self.planted.whitespace_rows.add(row)
                elif earlier is not None and k < edges[4]:
                    words = earlier.prompt.split(" ")
                    j = py.randrange(len(words))
                    new_word = self.vocab[py.randrange(len(self.vocab))]
                    if py.random() < 0.5:
                        words[j] = new_word
                    else:
                        words.insert(j, new_word)
                    prompt = " ".join(words)
                    self.planted.near_prompt_pairs.append(
                        (earlier.source_line - 1, row, _jaccard(earlier.prompt, prompt))
                    )
                pair = Pair("synthetic.jsonl", row + 1, prompt, chosen, rejected)
            out.append(pair)
            if len(self.window) < 5000:
                self.window.append(pair)
            elif py.random() < 0.05:
                self.window[py.randrange(5000)] = pair
        return out


def run_checks(batches: Iterator[list[Pair]], policy: Policy) -> dict:
    """The text-level validate loop: pair checks, dataset-wide checks, MinHash near-duplicate prompts.

    Returns flag counts, per-row flags of interest, clusters, and the time spent (excluding the time
    the `batches` iterator spends generating).
    """
    blocks: list = []  # the dataset-wide checks' digests, answered once every row is through
    pair_found: list[list[str]] = []
    counts: Counter[str] = Counter()
    flagged: dict[str, set[int]] = {F.DUPLICATE_PAIR: set(), F.CONFLICTING_PAIR: set(), F.IDENTICAL: set(),
                                    F.WHITESPACE_ONLY: set()}
    wall = cpu = 0.0
    rows = 0
    for batch in batches:
        w0, c0 = time.perf_counter(), time.process_time()
        for pair in batch:
            pair_found.append(text_flags(pair, policy))
        blocks.append(digest_block([pair.source_line - 1 for pair in batch], batch))
        rows += len(batch)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
    w0, c0 = time.perf_counter(), time.process_time()
    table_bytes = sum(_block_bytes(block) for block in blocks)
    answers = partitioned_dataset_checks(blocks, 16, threshold=policy.near_duplicate_prompt_threshold)
    duplicate, conflicting = answers.flags_of(np.arange(rows))
    for row, found in enumerate(pair_found):
        kept, _severity = apply_policy(found + dataset_flags(bool(duplicate[row]), bool(conflicting[row])), policy)
        for flag in kept:
            counts[flag] += 1
            if flag in flagged:
                flagged[flag].add(row)
    wall += time.perf_counter() - w0
    cpu += time.process_time() - c0
    return {"rows": rows, "wall": wall, "cpu": cpu, "counts": counts, "flagged": flagged,
            "clusters": answers.near_duplicate_groups, "table_bytes": table_bytes}


def _block_bytes(block) -> int:  # noqa: ANN001
    """Bytes of a DigestBlock's arrays (what the dataset-wide checks hold until their shuffle)."""
    return block.offsets.nbytes + sum(getattr(block.digests, name).nbytes for name in vars(block.digests))




# ----------------------------------------------------------------------------- synthetic file


def write_dataset(rows: int, batch_size: int, seed: int, data_dir: Path) -> tuple[Path, Path]:
    """(FILE.jsonl, planted.json) for `rows` synthetic pairs; reused when already written."""
    import json

    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"synthetic-{rows}-seed{seed}.jsonl"
    planted_path = data_dir / f"synthetic-{rows}-seed{seed}.planted.json"
    if path.is_file() and planted_path.is_file():
        return path, planted_path
    gen = PairGenerator(seed)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        done = 0
        while done < rows:
            size = min(batch_size, rows - done)
            fh.writelines(
                json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}, ensure_ascii=False) + "\n"
                for p in gen.batch(size)
            )
            done += size
    planted = gen.planted
    planted_path.write_text(
        json.dumps(
            {
                "duplicate": sorted(planted.duplicate_rows),
                "conflict": sorted(planted.conflict_rows),
                "identical": sorted(planted.identical_rows),
                "whitespace": sorted(planted.whitespace_rows),
                "near_prompt_pairs": planted.near_prompt_pairs,
            }
        ),
        encoding="utf-8",
    )
    tmp.replace(path)
    return path, planted_path


# ----------------------------------------------------------------------------- child: one timed run


def child(path: Path, planted_path: Path, report_path: Path) -> None:
    """Time `validate` end to end in this (fresh) process and print one JSON line of results.

    The near-duplicate clusters and the table sizes are captured by thin wrappers around the
    methods validate already calls (nothing extra runs inside the timed region)."""
    import json

    from prefdata.validate import command as V
    from prefdata.checks import partitioned as _P

    captured: dict = {"dataset_bytes": 0}
    original_checks = _P.partitioned_dataset_checks
    original_build = V.build_report

    def checks(blocks, *args, **kwargs):  # noqa: ANN001
        captured["dataset_bytes"] = sum(_block_bytes(block) for block in blocks)
        result = original_checks(blocks, *args, **kwargs)
        captured["clusters"] = result.near_duplicate_groups
        return result

    def build(builder, *args, **kwargs):  # noqa: ANN001
        captured["report_row_bytes"] = sum(
            a.itemsize * len(a) for a in (builder.file_index, builder.line, builder.pair_row, builder.prompt_key,
                                          builder.pair_key)
        )
        return original_build(builder, *args, **kwargs)

    _P.partitioned_dataset_checks, V.build_report = checks, build
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    w0, c0 = time.perf_counter(), time.process_time()
    result = V.validate(path, format="json", output=report_path, progress=False)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # Worker processes (joined by the time validate returns): their CPU time and largest peak RSS.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = children.ru_utime + children.ru_stime
    worker_peak = children.ru_maxrss / 1024

    report = result.report
    rows = report["accounting"]["rows_in"]
    planted = json.loads(planted_path.read_text(encoding="utf-8"))
    policy = load_policy()
    flagged: dict[str, set[int]] = {}
    for entry in report["flagged_rows"]:
        for flag in entry["flags"]:
            flagged.setdefault(flag, set()).add(entry["source_line"] - 1)

    def recall(expected: list[int], flag: str) -> float:
        return len(set(expected) & flagged.get(flag, set())) / len(expected) if expected else float("nan")

    # Row ids in the clusters are record ordinals; every synthetic line is a record, so ordinal = line - 1.
    cluster_of = {row: i for i, cluster in enumerate(captured.get("clusters", [])) for row in cluster}
    near_pairs = planted["near_prompt_pairs"]
    at_threshold = [(a, b) for a, b, j in near_pairs if j >= policy.near_duplicate_prompt_threshold]
    found = [cluster_of.get(a, -1) == cluster_of.get(b, -2) for a, b in at_threshold]
    dataset_bytes = captured["dataset_bytes"]
    out = {
        "rows": rows,
        "wall_s": wall,
        "cpu_s": cpu + worker_cpu,
        "main_cpu_s": cpu,
        "worker_cpu_s": worker_cpu,
        "pairs_per_s_wall": rows / wall,
        "pairs_per_s_cpu": rows / (cpu + worker_cpu),
        "peak_rss_mib": peak,
        "worker_peak_rss_mib": worker_peak,
        "rss_before_mib": rss_before,
        "file_mib": path.stat().st_size / 2**20,
        "table_mib": (dataset_bytes + captured.get("report_row_bytes", 0)) / 2**20,
        "dataset_table_mib": dataset_bytes / 2**20,
        "minhash_mib": captured.get("minhash_bytes", 0) / 2**20,
        "report_rows_mib": captured.get("report_row_bytes", 0) / 2**20,
        "near_dup_prompt_recall": sum(found) / len(found) if found else float("nan"),
        "near_dup_prompt_planted": len(near_pairs),
        "near_dup_prompt_at_threshold": len(at_threshold),
        "clusters": len(captured.get("clusters", [])),
        "flagged_rows_complete": report["flagged_rows_complete"],
        "duplicate_recall": recall(planted["duplicate"], F.DUPLICATE_PAIR),
        "conflict_recall": recall(planted["conflict"], F.CONFLICTING_PAIR),
        "identical_recall": recall(planted["identical"], F.IDENTICAL),
        "whitespace_recall": recall(planted["whitespace"], F.WHITESPACE_ONLY),
        "exit_code": result.exit_code,
        "counts": {flag: info["count"] for flag, info in report["flags"].items()},
    }
    print("RESULT " + json.dumps(out), flush=True)


def bench_end_to_end(rows: int, batch_size: int, seed: int, data_dir: Path) -> dict:
    import json
    import subprocess
    import tempfile

    path, planted_path = write_dataset(rows, batch_size, seed, data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", str(path), str(planted_path), str(report)],
            capture_output=True, text=True, check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


# ----------------------------------------------------------------------------- checks-only row


def bench_checks_only(rows: int, batch_size: int, seed: int) -> dict:
    gen = PairGenerator(seed)
    policy = load_policy()

    def batches() -> Iterator[list[Pair]]:
        done = 0
        while done < rows:
            size = min(batch_size, rows - done)
            yield gen.batch(size)
            done += size

    result = run_checks(batches(), policy)
    cluster_of = {row: i for i, cluster in enumerate(result["clusters"]) for row in cluster}
    at_threshold = [(a, b) for a, b, j in gen.planted.near_prompt_pairs if j >= policy.near_duplicate_prompt_threshold]
    found = [cluster_of.get(a, -1) == cluster_of.get(b, -2) for a, b in at_threshold]
    return {
        "rows": rows,
        "pairs_per_s_wall": rows / result["wall"],
        "pairs_per_s_cpu": rows / result["cpu"],
        "table_mib": result["table_bytes"] / 2**20,
        "near_dup_prompt_recall": sum(found) / len(found) if found else float("nan"),
    }


def _load() -> str:
    import os

    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, action="append", help="pairs to generate (repeatable)")
    parser.add_argument("--batch-size", type=int, default=5000, help="generator batch size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/prefdata-bench-validate"),
                        help="where the synthetic .jsonl files are written (and reused)")
    parser.add_argument("--checks-only", action="store_true", help="also time the old checks-only loop")
    parser.add_argument("--child", nargs=3, metavar=("FILE", "PLANTED", "REPORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*map(Path, args.child))
        return
    for rows in args.rows or [100_000]:
        write_dataset(rows, args.batch_size, args.seed, args.data_dir)  # not timed
        print(f"[{_load()} before the run]", flush=True)
        r = bench_end_to_end(rows, args.batch_size, args.seed, args.data_dir)
        print(
            f"validate rows={r['rows']:,} ({r['file_mib']:.0f} MiB jsonl) wall={r['wall_s']:.1f}s "
            f"cpu={r['cpu_s']:.1f}s (main {r['main_cpu_s']:.1f}s + workers {r['worker_cpu_s']:.1f}s) "
            f"pairs/s wall={r['pairs_per_s_wall']:,.0f} cpu={r['pairs_per_s_cpu']:,.0f} "
            f"peak_rss={r['peak_rss_mib']:.0f}MiB (after imports {r['rss_before_mib']:.0f}MiB, "
            f"largest worker {r['worker_peak_rss_mib']:.0f}MiB) "
            f"tables={r['table_mib']:.1f}MiB (dataset {r['dataset_table_mib']:.1f} + minhash {r['minhash_mib']:.1f} "
            f"+ report rows {r['report_rows_mib']:.1f}) "
            f"near_dup_recall={r['near_dup_prompt_recall']:.3f} "
            f"(planted {r['near_dup_prompt_planted']}, {r['near_dup_prompt_at_threshold']} at J>=threshold) "
            f"clusters={r['clusters']} dup_recall={r['duplicate_recall']:.3f} "
            f"conflict_recall={r['conflict_recall']:.3f} identical_recall={r['identical_recall']:.3f} "
            f"whitespace_recall={r['whitespace_recall']:.3f} exit={r['exit_code']} [{_load()} after]",
            flush=True,
        )
        print("  flag counts:", r["counts"], flush=True)
        if args.checks_only:
            c = bench_checks_only(rows, args.batch_size, args.seed)
            print(
                f"checks-only rows={c['rows']:,} pairs/s wall={c['pairs_per_s_wall']:,.0f} "
                f"cpu={c['pairs_per_s_cpu']:,.0f} tables={c['table_mib']:.1f}MiB "
                f"near_dup_recall={c['near_dup_prompt_recall']:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
