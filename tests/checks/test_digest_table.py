"""The compact dataset-wide state (issue 45) gives exactly the findings of the plain definitions:
digest_table.U64Table against a dict, and NearDuplicatePrompts against a direct restatement of its
algorithm (first row of each raw prompt, full signatures, each band's equal keys joined to their
previous occurrence, verified on the whole signature, connected components)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks import digest_table
from prefdata.checks.digest_table import U64Table
from prefdata.checks.minhash import (
    NearDuplicatePrompts,
    accept_threshold,
    jaccard_estimate,
    prompt_digest,
    prompt_signatures,
)

_KEY = st.integers(0, 60).map(lambda k: (k * 0x9E3779B97F4A7C15) % (1 << 64))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(_KEY, max_size=40)), max_size=12), st.booleans())
def test_table_is_a_first_value_wins_dict(steps, with_values):
    digest_table_pending = digest_table.PENDING
    digest_table.PENDING = 3  # many runs and merges from few keys
    try:
        table, reference, position = U64Table(values=with_values), {}, 0
        for one_at_a_time, keys in steps:
            if one_at_a_time:
                for key in keys:
                    expected = reference.setdefault(key or 1, position)
                    got = table.setdefault(key, position)
                    assert got == (None if expected == position else expected if with_values else 0)
                    position += 1
            else:
                values = np.arange(position, position + len(keys))
                existed = table.setdefault_many(np.array(keys, dtype=np.uint64), values)
                expected = [(key or 1) in reference or reference.setdefault(key or 1, int(v)) != v
                            for key, v in zip(keys, values)]
                assert existed.tolist() == expected
                position += len(keys)
            assert len(table) == len(reference)
            assert table.nbytes == (16 if with_values else 8) * len(reference)
        probe = [(k * 0x9E3779B97F4A7C15) % (1 << 64) for k in range(64)]
        found, values = table.get_many(np.array(probe, dtype=np.uint64))
        for key, f, v in zip(probe, found.tolist(), values.tolist()):
            want = reference.get(key or 1)
            assert f == (want is not None) and table.get(key) == (None if want is None else want if with_values else 0)
            if f and with_values:
                assert v == want
    finally:
        digest_table.PENDING = digest_table_pending


def reference_clusters(row_ids: list[int], prompts: list[str], threshold: float = 0.8) -> list[list[int]]:
    """NearDuplicatePrompts.clusters restated plainly (the definition the compact state must keep)."""
    seen: set[int] = set()
    ids, texts = [], []
    for row, prompt in zip(row_ids, prompts):
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


def planted_prompts(n: int, seed: int) -> tuple[list[str], list[tuple[int, int]]]:
    """Prompts with exact copies, case/whitespace/punctuation variants and one-word edits of earlier
    ones, and the (earlier, later) row pairs planted as near-duplicates (variants and edits)."""
    rng = random.Random(seed)
    vocabulary = [f"word{i}" for i in range(400)] + ["é", "ü", "naïve", "中文"]
    prompts: list[str] = []
    planted: list[tuple[int, int]] = []
    long: list[int] = []
    for row in range(n):
        kind = rng.random()
        if prompts and kind < 0.1:
            prompts.append(prompts[rng.randrange(len(prompts))])  # exact copy: folded, never clustered
        elif prompts and kind < 0.2:
            source = rng.randrange(len(prompts))
            prompts.append("  " + prompts[source].upper().replace(" ", " , ") + "?")
            planted.append((source, row))
        elif long and kind < 0.3:  # one word of 40 or more: Jaccard of the 3-grams >= 0.86
            source = rng.choice(long)
            words = prompts[source].split()
            words[rng.randrange(len(words))] = "edited"
            prompts.append(" ".join(words))
            planted.append((source, row))
        else:
            prompts.append(" ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 60))))
            if len(prompts[-1].split()) >= 40:
                long.append(row)
    return prompts, planted


def _finder_clusters(prompts: list[str], batch: int, bulk: bool) -> list[list[int]]:
    finder = NearDuplicatePrompts(background=False)
    for lo in range(0, len(prompts), batch):
        part, ids = prompts[lo : lo + batch], list(range(lo, lo + min(batch, len(prompts) - lo)))
        if not bulk:
            finder.add_batch(ids, part)
            continue
        digests = np.array([prompt_digest(p) for p in part], dtype=np.uint64)
        firsts = np.zeros(len(part), dtype=bool)
        firsts[np.unique(digests, return_index=True)[1]] = True
        positions = np.flatnonzero(firsts)
        has_words, sigs = prompt_signatures([part[i].lower() for i in positions])
        rows = np.full(len(part), -1, dtype=np.int64)
        rows[positions[has_words]] = np.arange(int(has_words.sum()))
        finder.add_signatures(np.array(ids), digests, rows, sigs)
    return finder.clusters()


def test_planted_duplicates_and_near_duplicates_are_found_exactly_as_defined():
    prompts, planted = planted_prompts(3000, 45)
    expected = reference_clusters(list(range(len(prompts))), prompts)
    assert _finder_clusters(prompts, 256, bulk=False) == expected
    assert _finder_clusters(prompts, 1000, bulk=True) == expected
    together = {row: group[0] for group in expected for row in group}
    digests = [prompt_digest(p) for p in prompts]
    first_of = {}
    for row, digest in enumerate(digests):
        first_of.setdefault(digest, row)
    # Every planted variant or edit shares a cluster with (the first copy of) its source.
    met = [together.get(first_of[digests[a]], -1) == together.get(first_of[digests[b]], -2) for a, b in planted]
    assert sum(met) >= 0.95 * len(planted)
    assert not any(row != first_of[d] and row in together for row, d in enumerate(digests))  # copies folded


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "A", "b!"]), max_size=8).map(" ".join),
                max_size=120), st.integers(1, 50), st.booleans())
def test_any_prompts_any_batches_match_the_definition(prompts, batch, bulk):
    assert _finder_clusters(prompts, batch, bulk) == reference_clusters(list(range(len(prompts))), prompts)


def test_row_ids_beyond_uint32_are_kept_exactly():
    finder = NearDuplicatePrompts(background=False)
    finder.add_batch([5, 7], ["the same words here", "the same words here!"])
    finder.add_batch([1 << 40, (1 << 40) + 3], ["other words entirely now", "Other words entirely now."])
    assert finder.clusters() == [[5, 7], [1 << 40, (1 << 40) + 3]]


def test_signatures_do_not_depend_on_the_slicing(monkeypatch):
    from prefdata.checks import minhash

    rng = random.Random(7)
    texts = [" ".join(rng.choice(["ab", "cd", "é", "中文", "x1"]) for _ in range(rng.randint(0, 80))) for _ in range(300)]
    whole = prompt_signatures(texts)
    monkeypatch.setattr(minhash, "SLICE_CHARS", 50)
    sliced = prompt_signatures(texts)
    assert np.array_equal(whole[0], sliced[0]) and np.array_equal(whole[1], sliced[1])
