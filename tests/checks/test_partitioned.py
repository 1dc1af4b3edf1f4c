"""The dataset-wide checks (hash partitioning, prefdata.checks.partitioned) give exactly the plain
definitions' answers, whatever the blocks and the partitions: duplicate and conflicting pairs from
a dict of first rows, near-duplicate prompt groups from a direct restatement of the MinHash
algorithm (first row of each raw prompt, full signatures, each band's equal keys joined to their
previous occurrence, verified on the whole signature, connected components)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks.dataset import pair_digests_and_key
from prefdata.checks.digests import digest_block, join_blocks, pair_digests, shift_rows
from prefdata.checks.minhash import accept_threshold, jaccard_estimate, prompt_digest, prompt_signatures
from prefdata.checks.partitioned import groups_from_edges, partitioned_dataset_checks
from prefdata.core.records import Pair

WORDS = "the a plant light water sun leaf root grow green food energy cell make how why does what".split()


def make_pairs(n: int, seed: int) -> list[Pair]:
    """Pairs with exact and whitespace duplicates, swapped halves, equal halves and near-duplicate prompts."""
    rng = random.Random(seed)
    bases = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) for _ in range(n // 6 + 1)]
    pairs: list[Pair] = []
    for i in range(n):
        roll = rng.random()
        if pairs and roll < 0.15:
            old = rng.choice(pairs)
            prompt, chosen, rejected = old.prompt, old.chosen, old.rejected
            if rng.random() < 0.5:
                chosen, rejected = rejected, chosen  # conflict
            elif rng.random() < 0.5:
                prompt = "  " + prompt.replace(" ", "\n")  # duplicate after whitespace removal
        else:
            prompt = rng.choice(bases)
            if rng.random() < 0.3:  # a near-duplicate: one word changed or the case changed
                words = prompt.split()
                words[rng.randrange(len(words))] = rng.choice(WORDS)
                prompt = " ".join(words).upper() if rng.random() < 0.3 else " ".join(words)
            chosen, rejected = f"answer {rng.randint(0, 30)}", f"answer {rng.randint(0, 30)}"
        if rng.random() < 0.02:
            prompt = "!!"  # no words: never in a near-duplicate group
        elif rng.random() < 0.02:
            prompt = ""  # no prompt: not seen by the near-duplicate check at all
        pairs.append(Pair("data.jsonl", i + 1, prompt, chosen, rejected))
    return pairs


def reference_clusters(rows: list[int], prompts: list[str], threshold: float = 0.8) -> list[list[int]]:
    """The near-duplicate prompt groups, restated plainly."""
    seen: set[int] = set()
    ids, texts = [], []
    for row, prompt in zip(rows, prompts):
        digest = prompt_digest(prompt)
        if digest not in seen:
            seen.add(digest)
            ids.append(row)
            texts.append(prompt.lower())
    has_words, sigs = prompt_signatures(texts)
    ids = [row for row, has in zip(ids, has_words.tolist()) if has]
    parent = list(range(len(ids)))

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    accept = accept_threshold(threshold, 64)
    for band in range(16):
        last: dict[bytes, int] = {}
        for j in range(len(ids)):
            key = sigs[j, 4 * band : 4 * band + 4].tobytes()
            i = last.get(key)
            last[key] = j
            if i is not None and jaccard_estimate(np.array([(sigs[i] == sigs[j]).mean()]))[0] >= accept:
                a, b = root(i), root(j)
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for j, row in enumerate(ids):
        groups.setdefault(root(j), []).append(row)
    return sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: g[0])


def reference(rows: list[int], pairs: list[Pair]) -> dict:
    """Every dataset-wide finding by its definition: a dict of each key's first row."""
    first: dict[int, int] = {}
    duplicate, conflicting, prompts = [], [], set()
    for row, pair in zip(rows, pairs):
        hp, hc, hr, key = pair_digests_and_key(pair)
        prompts.add(hp)
        if key in first:
            duplicate.append(row)
        first.setdefault(key, row)
        swapped = pair_digests_and_key(Pair("x", 1, pair.prompt, pair.rejected, pair.chosen))[3]
        if hc != hr and first.get(swapped, row) < row:
            conflicting.append(row)
    prompted = [(row, pair.prompt) for row, pair in zip(rows, pairs) if pair.prompt]
    return {
        "duplicate": duplicate, "conflicting": conflicting, "distinct_prompts": len(prompts),
        "groups": reference_clusters([r for r, _ in prompted], [p for _, p in prompted]),
        "prompts_seen": len(prompted), "distinct_texts": len({prompt_digest(p) for _, p in prompted}),
    }


def blocks_of(rows: list[int], pairs: list[Pair], block_rows: int) -> list:
    return [digest_block(rows[s : s + block_rows], pairs[s : s + block_rows]) for s in range(0, len(pairs), block_rows)]


def assert_matches(result, expected: dict) -> None:
    assert result.duplicate_rows.tolist() == expected["duplicate"]
    assert result.conflicting_rows.tolist() == expected["conflicting"]
    assert result.distinct_prompts == expected["distinct_prompts"]
    assert result.near_duplicate_groups == expected["groups"]
    assert (result.prompts_seen, result.distinct_prompt_texts) == (expected["prompts_seen"], expected["distinct_texts"])


@pytest.mark.parametrize(("partitions", "block_rows"), [(1, 5000), (3, 64), (16, 17)])
def test_partitioned_checks_equal_the_definitions(partitions: int, block_rows: int) -> None:
    pairs = make_pairs(1500, seed=partitions)
    rows = [2 * i + 1 for i in range(len(pairs))]  # quarantined records between pairs: ordinals skip
    expected = reference(rows, pairs)
    blocks = blocks_of(rows, pairs, block_rows)
    result = partitioned_dataset_checks(blocks, partitions)
    assert not blocks  # each block dropped once split
    assert_matches(result, expected)
    assert len(expected["duplicate"]) > 50 and len(expected["conflicting"]) > 20 and len(expected["groups"]) > 5
    assert result.rows == len(pairs) and result.duplicate_prompt_rows == len(pairs) - expected["distinct_prompts"]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(["a", "b", "c", "d", "A", "b!", "é"]), max_size=7).map(" ".join),
                          st.sampled_from(["x", "y", " x"]), st.sampled_from(["x", "y", "z"])), max_size=80),
       st.integers(1, 30), st.integers(1, 7))
def test_any_pairs_any_blocks_any_partitions_match_the_definitions(rows, block_rows, partitions):
    pairs = [Pair("f", i + 1, p, c, r) for i, (p, c, r) in enumerate(rows)]
    ordinals = list(range(len(pairs)))
    assert_matches(partitioned_dataset_checks(blocks_of(ordinals, pairs, block_rows), partitions),
                   reference(ordinals, pairs))


def test_joined_and_shifted_blocks_keep_every_row_and_signature() -> None:
    pairs = make_pairs(300, seed=9)
    parts = [digest_block(range(s, min(s + 40, 300)), pairs[s : s + 40]) for s in range(0, 300, 40)]
    joined = shift_rows(join_blocks([shift_rows(b, -100) for b in parts]), 100 + (1 << 33))
    whole = digest_block(range(1 << 33, (1 << 33) + 300), pairs)
    assert joined.rows.tolist() == whole.rows.tolist() and joined.prompt_rows.tolist() == whole.prompt_rows.tolist()
    # A block signs the first copy of each prompt in it: joined blocks sign what each block signed.
    signed_rows = joined.prompt_rows[joined.digests.signed.astype(np.int64)]
    assert set(whole.prompt_rows[whole.digests.signed.astype(np.int64)].tolist()) <= set(signed_rows.tolist())
    result = partitioned_dataset_checks([joined], 4)
    assert_matches(result, reference(list(range(1 << 33, (1 << 33) + 300)), pairs))
    assert pair_digests([]).signatures.shape == (0, 64)


def test_groups_join_chains_and_sort() -> None:
    edges = np.array([[9, 4], [4, 7], [2, 3]], dtype=np.int64)
    assert groups_from_edges(edges) == [[2, 3], [4, 7, 9]]
    assert groups_from_edges(np.zeros((0, 2), dtype=np.int64)) == []
