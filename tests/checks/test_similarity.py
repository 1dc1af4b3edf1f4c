"""checks.similarity: exact where cheap, bounded in time beyond a documented size (issue 16)."""

from __future__ import annotations

import random
import time

from rapidfuzz.distance import Indel

from prefdata.checks.similarity import (
    EXACT_LIMIT,
    at_least,
    is_bounded,
    length_bound,
    similarity,
)


def _words(seed: int, count: int, vocab_size: int = 5000) -> str:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 9))) for _ in range(vocab_size)]
    return " ".join(rng.choice(vocab) for _ in range(count))


def test_exact_below_the_limit_and_the_length_bound_is_an_upper_bound():
    rng = random.Random(0)
    for _ in range(200):
        a = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 60)))
        b = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 60)))
        exact = Indel.normalized_similarity(a, b)
        assert similarity(a, b) == exact
        assert exact <= length_bound(len(a), len(b)) + 1e-12
        for threshold in (0.5, 0.8, 0.95):
            assert at_least(a, b, threshold) == (exact >= threshold)
    assert similarity([1, 2, 3], [1, 2, 4]) == Indel.normalized_similarity([1, 2, 3], [1, 2, 4])


def test_bounded_method_tells_near_copies_from_unrelated_text():
    text = _words(1, 40_000)  # ~240k characters: beyond EXACT_LIMIT
    assert is_bounded(len(text), len(text))
    edited = text[:50_000] + " inserted words here " + text[50_010:]
    assert similarity(text, edited) >= 0.99
    assert at_least(text, edited, 0.95)
    other = _words(2, 40_000)  # same vocabulary, different text
    assert similarity(text, other) < 0.2
    assert not at_least(text, other, 0.95)
    # Never above what the lengths allow, even when one half is a prefix of the other.
    assert similarity(text, text[: len(text) // 2]) <= length_bound(len(text), len(text) // 2)
    # Repetitive text (few distinct words) with one insertion is still a near copy.
    repeated = "lorem ipsum dolor sit amet, " * 20_000
    assert at_least(repeated, repeated[:100_000] + " hello " + repeated[100_000:], 0.95)
    # Id sequences beyond the limit: one id changed out of 100k.
    ids = list(range(100_000))
    assert at_least(ids, ids[:500] + [-1] + ids[501:], 0.95)
    assert similarity(ids, list(range(100_000, 200_000))) == 0.0


def test_the_bounded_method_is_deterministic_and_handles_odd_text():
    text = _words(3, 30_000) + " \udc80 lone surrogate é ü 中文"
    assert similarity(text, text + " x") == similarity(text, text + " x")
    assert similarity(" " * EXACT_LIMIT, "\n" * EXACT_LIMIT) == 1.0  # whitespace only: nothing differs
    assert 0.0 <= similarity(text, "x" * EXACT_LIMIT) <= 1.0


def test_a_huge_pair_is_checked_in_seconds():
    chosen = _words(4, 1_000_000)  # ~6 MB of plain words
    rejected = chosen[: len(chosen) * 5 // 6]  # ~5 MB: the 149 s case
    started = time.perf_counter()
    assert not at_least(chosen, rejected, 0.95)  # the length bound alone decides
    assert time.perf_counter() - started < 1.0
    started = time.perf_counter()
    assert at_least(chosen, chosen[:-3] + "zzz", 0.95)  # same length: the bounded method runs
    similarity(chosen, rejected)
    assert time.perf_counter() - started < 60  # generous: a busy CI machine; ~2 s idle
