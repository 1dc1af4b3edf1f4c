"""Scale benchmark for text-level validation: pair checks + duplicates/conflicts + MinHash prompts.

    python bench/bench_validate.py --rows 100000 --rows 1000000

Synthetic pairs are generated batch by batch (never all in memory) with planted problems at known
rates: exact duplicate pairs, swapped (conflicting) pairs, identical and whitespace-only pairs, and
near-duplicate prompts (one word substituted or inserted into an earlier prompt). Only the checker
loop (`run_checks`) is timed; generation is excluded. Prints pairs/s (wall and CPU), peak RSS, the
hash-table sizes, and the recall of every planted kind.

`run_checks` is the one function to swap for the real `prefdata validate` entry point.
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

from prefdata import flags as F  # noqa: E402
from prefdata.checks import apply_policy, text_flags  # noqa: E402
from prefdata.dataset_checks import DatasetWideChecks  # noqa: E402
from prefdata.minhash import NearDuplicatePrompts  # noqa: E402
from prefdata.policy import Policy, load_policy  # noqa: E402
from prefdata.records import Pair  # noqa: E402

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
    dataset = DatasetWideChecks()
    near = NearDuplicatePrompts(threshold=policy.near_duplicate_prompt_threshold)
    counts: Counter[str] = Counter()
    flagged: dict[str, set[int]] = {F.DUPLICATE_PAIR: set(), F.CONFLICTING_PAIR: set(), F.IDENTICAL: set(),
                                    F.WHITESPACE_ONLY: set()}
    wall = cpu = 0.0
    rows = 0
    for batch in batches:
        w0, c0 = time.perf_counter(), time.process_time()
        ids: list[int] = []
        prompts: list[str] = []
        for pair in batch:
            found = text_flags(pair, policy)
            found += dataset.observe(pair)
            kept, _severity = apply_policy(found, policy)
            row = pair.source_line - 1
            for flag in kept:
                counts[flag] += 1
                if flag in flagged:
                    flagged[flag].add(row)
            if pair.prompt:
                ids.append(row)
                prompts.append(pair.prompt)
        near.add_batch(ids, prompts)
        rows += len(batch)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
    w0, c0 = time.perf_counter(), time.process_time()
    clusters = near.clusters()
    wall += time.perf_counter() - w0
    cpu += time.process_time() - c0
    return {"rows": rows, "wall": wall, "cpu": cpu, "counts": counts, "flagged": flagged, "clusters": clusters,
            "table_bytes": dataset.stats()["hash_table_bytes"] + near.nbytes}


def bench(rows: int, batch_size: int, seed: int) -> dict:
    gen = PairGenerator(seed)
    policy = load_policy()

    def batches() -> Iterator[list[Pair]]:
        done = 0
        while done < rows:
            size = min(batch_size, rows - done)
            yield gen.batch(size)
            done += size

    result = run_checks(batches(), policy)
    planted = gen.planted
    cluster_of = {row: i for i, cluster in enumerate(result["clusters"]) for row in cluster}

    def recall(expected: set[int], got: set[int]) -> float:
        return len(expected & got) / len(expected) if expected else float("nan")

    near_pairs = planted.near_prompt_pairs
    at_threshold = [(a, b) for a, b, j in near_pairs if j >= policy.near_duplicate_prompt_threshold]
    found = [cluster_of.get(a, -1) == cluster_of.get(b, -2) for a, b in at_threshold]
    return {
        "rows": rows,
        "pairs_per_s_wall": rows / result["wall"],
        "pairs_per_s_cpu": rows / result["cpu"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "table_mib": result["table_bytes"] / 2**20,
        "near_dup_prompt_recall": sum(found) / len(found) if found else float("nan"),
        "near_dup_prompt_planted": len(near_pairs),
        "near_dup_prompt_at_threshold": len(at_threshold),
        "clusters": len(result["clusters"]),
        "duplicate_recall": recall(planted.duplicate_rows, result["flagged"][F.DUPLICATE_PAIR]),
        "conflict_recall": recall(planted.conflict_rows, result["flagged"][F.CONFLICTING_PAIR]),
        "identical_recall": recall(planted.identical_rows, result["flagged"][F.IDENTICAL]),
        "whitespace_recall": recall(planted.whitespace_rows, result["flagged"][F.WHITESPACE_ONLY]),
        "counts": dict(result["counts"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, action="append", help="pairs to generate (repeatable)")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for rows in args.rows or [100_000]:
        r = bench(rows, args.batch_size, args.seed)
        print(
            f"rows={r['rows']:,} pairs/s wall={r['pairs_per_s_wall']:,.0f} cpu={r['pairs_per_s_cpu']:,.0f} "
            f"peak_rss={r['peak_rss_mib']:.0f}MiB tables={r['table_mib']:.1f}MiB "
            f"near_dup_recall={r['near_dup_prompt_recall']:.3f} "
            f"(planted {r['near_dup_prompt_planted']}, {r['near_dup_prompt_at_threshold']} at J>=threshold) "
            f"clusters={r['clusters']} dup_recall={r['duplicate_recall']:.3f} "
            f"conflict_recall={r['conflict_recall']:.3f} identical_recall={r['identical_recall']:.3f} "
            f"whitespace_recall={r['whitespace_recall']:.3f}",
            flush=True,
        )
        print("  flag counts:", r["counts"], flush=True)


if __name__ == "__main__":
    main()
