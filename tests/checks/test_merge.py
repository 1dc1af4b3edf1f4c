"""The dataset-wide merge gives the same flags and near-duplicate prompt clusters whether rows come
one at a time (merge_pair) or as chunks of digests computed elsewhere (merge_chunk), however the
rows are cut into chunks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from prefdata.checks.merge import DatasetMerge, dataset_flags, pair_digests
from prefdata.core import flags as F
from prefdata.core.records import Pair

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()


def _pairs(n: int, seed: int) -> list[Pair]:
    rng = random.Random(seed)
    prompts = [" ".join(rng.choices(WORDS, k=12)) for _ in range(n // 4)]
    pairs = []
    for line in range(1, n + 1):
        prompt = rng.choice(prompts)
        if rng.random() < 0.2:  # a near-duplicate: one word changed
            words = prompt.split()
            words[rng.randrange(len(words))] = rng.choice(WORDS)
            prompt = " ".join(words)
        chosen, rejected = rng.choice(["yes", "no", "maybe"]), rng.choice(["yes", "no", "later"])
        if rng.random() < 0.1:
            prompt = ""
        pairs.append(Pair("data.jsonl", line, prompt, chosen, rejected))
    return pairs


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
def test_chunks_and_single_rows_merge_alike(chunk_size: int) -> None:
    pairs = _pairs(300, seed=chunk_size)
    one = DatasetMerge(0.8)
    expected = [one.merge_pair(ordinal, pair) for ordinal, pair in enumerate(pairs)]

    many = DatasetMerge(0.8)
    got: list[list[str]] = []
    for start in range(0, len(pairs), chunk_size):
        chunk = pairs[start : start + chunk_size]
        lines = np.array([pair.source_line for pair in chunk], dtype=np.int64)
        ordinals = np.arange(start, start + len(chunk))
        duplicate, conflicting = many.merge_chunk("data.jsonl", lines, ordinals, pair_digests(chunk))
        got += [dataset_flags(bool(d), bool(c)) for d, c in zip(duplicate, conflicting)]

    assert got == expected
    assert any(F.DUPLICATE_PAIR in flags for flags in got) and any(F.CONFLICTING_PAIR in flags for flags in got)
    clusters = many.near_duplicate_clusters()
    assert clusters == one.near_duplicate_clusters() and clusters
    assert many.dataset.stats() == one.dataset.stats()
