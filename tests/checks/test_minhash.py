"""MinHash near-duplicate prompts (prefdata.checks.partitioned over prefdata.checks.minhash's
signatures): recall/precision on planted near-duplicates, determinism, signatures."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks.digests import digest_block
from prefdata.checks.minhash import prompt_signatures
from prefdata.checks.partitioned import partitioned_dataset_checks
from prefdata.core.records import Pair


def shingles(text: str) -> set[tuple[str, ...]]:
    words = "".join(c if c.isalnum() or ord(c) > 127 else " " for c in text.lower()).split()
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)} if len(words) >= 3 else {tuple(words)}


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


def corpus(n_base=3000, n_near=400, seed=1):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(8000)]
    prompts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(25, 150))) for _ in range(n_base)]
    planted = []
    for _ in range(n_near):
        i = rng.randrange(n_base)
        words = prompts[i].split()
        j = rng.randrange(len(words))
        if rng.random() < 0.5:
            words[j] = rng.choice(vocab)
        else:
            words.insert(j, rng.choice(vocab))
        planted.append((i, len(prompts)))
        prompts.append(" ".join(words))
    return prompts, planted


def run(prompts, batch=500, threshold=0.8, partitions=4, first_row=0):
    """The near-duplicate prompt groups of `prompts` at rows first_row, first_row + 1, ..."""
    pairs = [Pair("f", i + 1, prompt, "a", "b") for i, prompt in enumerate(prompts)]
    blocks = [digest_block(range(first_row + lo, first_row + min(lo + batch, len(prompts))), pairs[lo : lo + batch])
              for lo in range(0, len(prompts), batch)]
    return partitioned_dataset_checks(blocks, partitions, threshold=threshold).near_duplicate_groups


def test_recall_and_precision_on_planted_near_duplicates():
    prompts, planted = corpus()
    clusters = run(prompts, threshold=0.8)
    cluster_of = {row: i for i, cluster in enumerate(clusters) for row in cluster}
    at_threshold = [(a, b) for a, b in planted if jaccard(prompts[a], prompts[b]) >= 0.8]
    assert len(at_threshold) > 200
    found = sum(cluster_of.get(a, -1) == cluster_of.get(b, -2) for a, b in at_threshold)
    assert found / len(at_threshold) >= 0.9
    # Precision: pairs inside clusters are near-duplicates, essentially never unrelated prompts.
    pairs = [(a, b) for c in clusters for i, a in enumerate(c) for b in c[i + 1 :]]
    unrelated = sum(jaccard(prompts[a], prompts[b]) < 0.5 for a, b in pairs)
    assert unrelated <= 0.01 * len(pairs)


def test_unrelated_prompts_do_not_cluster():
    rng = random.Random(3)
    vocab = [f"v{i}" for i in range(20000)]
    prompts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 80))) for _ in range(3000)]
    assert run(prompts) == []


def test_case_whitespace_punctuation_and_exact_duplicates():
    prompts = [
        "Write a poem about the sea and the sky at night",
        "write a poem   about the SEA, and the sky at night!",  # Jaccard 1 after tokenizing
        "Write a poem about the sea and the sky at night",  # exact duplicate: folded into row 0
        "Summarize this article about tax law in three sentences",
        "",
        "...",
    ]
    clusters = run(prompts, batch=2)
    assert clusters == [[0, 1]]


def test_short_prompts():
    assert run(["hi", "Hi!", "hello there", "hello there friend", "bye"]) == [[0, 1]]


def test_threshold_controls_what_counts():
    base = " ".join(f"t{i}" for i in range(40))
    words = base.split()
    words[20] = "changed"
    edited = " ".join(words)  # 3 of 38 shingles change: Jaccard 35/41 ~ 0.85
    assert 0.8 < jaccard(base, edited) < 0.9
    assert run([base, edited], threshold=0.7) == [[0, 1]]
    assert run([base, edited], threshold=0.99) == []


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 700), st.integers(1, 9))
def test_same_result_whatever_the_blocks_or_partitions(batch, partitions):
    prompts, _ = corpus(n_base=300, n_near=60, seed=7)
    expected = run(prompts, batch=len(prompts), partitions=1)
    assert expected
    assert run(prompts, batch=batch, partitions=partitions) == expected


def test_row_ids_are_reported_back_beyond_uint32():
    prompts, planted = corpus(n_base=200, n_near=30, seed=5)
    base = run(prompts)
    assert base and run(prompts, first_row=(1 << 40)) == [[(1 << 40) + row for row in group] for group in base]


def test_signatures_do_not_depend_on_the_slicing(monkeypatch):
    from prefdata.checks import minhash

    rng = random.Random(7)
    texts = [" ".join(rng.choice(["ab", "cd", "é", "中文", "x1"]) for _ in range(rng.randint(0, 80))) for _ in range(300)]
    whole = prompt_signatures(texts)
    monkeypatch.setattr(minhash, "SLICE_CHARS", 50)
    sliced = prompt_signatures(texts)
    assert np.array_equal(whole[0], sliced[0]) and np.array_equal(whole[1], sliced[1])


def test_single_shingle_prompts_do_not_collide_through_densification():
    rng = random.Random(11)
    prompts = [" ".join(f"u{rng.randrange(10**6)}" for _ in range(3)) for _ in range(20000)]
    assert run(prompts, batch=5000) == []
