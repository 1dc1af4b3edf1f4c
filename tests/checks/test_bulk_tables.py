"""The bulk (vectorized) forms of the dataset-wide tables and MinHash give exactly the state and
answers of their one-at-a-time forms: U64Table.setdefault_many, DatasetWideChecks.observe_digests,
NearDuplicatePrompts.add_signatures, ReportBuilder.add_compact (through text_validate)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks.dataset import DatasetWideChecks, U64Table, _PACK3, _xxh, pair_digests_and_key
from prefdata.checks.minhash import NearDuplicatePrompts, prompt_digest, prompt_signatures
from prefdata.core import flags as F
from prefdata.core.records import Pair


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=60), max_size=8))
def test_setdefault_many_matches_setdefault(batches):
    one, many = U64Table(16), U64Table(16)
    position = 0
    for batch in batches:
        keys = [(k * 0x9E3779B97F4A7C15) % (1 << 64) if k else 0 for k in batch]  # 0 and 1 collide, as in U64Table
        expected = []
        for key in keys:
            expected.append(one.setdefault(key, position) is not None)
            position += 1
        got = many.setdefault_many(np.array(keys, dtype=np.uint64), np.arange(position - len(keys), position))
        assert got.tolist() == expected
        assert len(many) == len(one) and many.nbytes == one.nbytes
    probe = [(k * 0x9E3779B97F4A7C15) % (1 << 64) for k in range(45)]
    found, values = many.get_many(np.array(probe, dtype=np.uint64))
    assert [v if f else None for f, v in zip(found.tolist(), values.tolist())] == [one.get(k) for k in probe]


def _pairs(n: int, seed: int) -> list[Pair]:
    rng = random.Random(seed)
    texts = ["a", "b", "c", "a ", " b", "d"]
    return [Pair("f.jsonl", i + 1, rng.choice(texts[:3]), rng.choice(texts), rng.choice(texts)) for i in range(n)]


def test_observe_digests_matches_observe():
    pairs = _pairs(500, 1)
    one, many = DatasetWideChecks(), DatasetWideChecks()
    expected = [one.observe(p) for p in pairs]
    got: list[list[str]] = []
    for lo in range(0, len(pairs), 37):
        chunk = pairs[lo : lo + 37]
        keys = np.array([pair_digests_and_key(p) for p in chunk], dtype=np.uint64).reshape(-1, 4)
        swapped = np.array([_xxh(_PACK3(int(k[0]), int(k[2]), int(k[1]))) for k in keys], dtype=np.uint64)
        duplicate, conflicting = many.observe_digests(
            "f.jsonl", np.array([p.source_line for p in chunk]), keys[:, 0], keys[:, 3], swapped, keys[:, 1] != keys[:, 2]
        )
        got += [[F.DUPLICATE_PAIR] * d + [F.CONFLICTING_PAIR] * c for d, c in zip(duplicate.tolist(), conflicting.tolist())]
    assert got == expected
    assert many.stats() == one.stats()
    assert many.first_line_of(pairs[-1]) == one.first_line_of(pairs[-1])


def test_add_signatures_matches_add_batch():
    rng = random.Random(2)
    words = [f"w{i}" for i in range(50)]
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) or "!" for _ in range(3000)]
    prompts += [p.upper() for p in prompts[:200]] + prompts[:300]  # case variants and exact copies
    one = NearDuplicatePrompts(background=False)
    many = NearDuplicatePrompts(background=False)
    for lo in range(0, len(prompts), 250):
        batch = prompts[lo : lo + 250]
        ids = list(range(lo, lo + len(batch)))
        one.add_batch(ids, batch)
        digests = [prompt_digest(p) for p in batch]
        firsts = {}
        rows = np.full(len(batch), -1)
        keep = [i for i, d in enumerate(digests) if firsts.setdefault(d, i) == i]
        has_words, sigs = prompt_signatures([batch[i].lower() for i in keep])
        rows[np.array(keep)[has_words]] = np.arange(int(has_words.sum()))
        many.add_signatures(np.array(ids), np.array(digests, dtype=np.uint64), rows, sigs)
    assert (one.prompts_seen, one.distinct_prompts) == (many.prompts_seen, many.distinct_prompts)
    assert one.clusters() == many.clusters() and one.nbytes == many.nbytes


def test_signatures_do_not_depend_on_the_batch():
    rng = random.Random(4)
    texts = [" ".join(rng.choice("ab cd ef gh ij kl é ü".split()) for _ in range(rng.randint(0, 30))) for _ in range(400)]
    whole = prompt_signatures(texts)
    parts = [prompt_signatures(texts[i : i + 33]) for i in range(0, len(texts), 33)]
    assert np.array_equal(whole[0], np.concatenate([p[0] for p in parts]))
    assert np.array_equal(whole[1], np.concatenate([p[1] for p in parts]))


def test_stable_order_is_a_stable_argsort():
    from prefdata.checks.minhash import _stable_order

    column = np.random.default_rng(5).integers(0, 50, 5000).astype(np.uint32)
    order, sorted_column = _stable_order(column)
    assert np.array_equal(order, np.argsort(column, kind="stable"))
    assert np.array_equal(sorted_column, np.sort(column))


def test_duplicate_groups_match_a_full_stable_sort():
    from array import array

    from prefdata.report.builder import ReportBuilder
    from prefdata.report.sections import LINES_PER_GROUP, TOP_GROUPS, duplicate_groups

    rng = np.random.default_rng(6)
    builder = ReportBuilder()
    for n, distinct in ((0, 1), (50, 1000), (3000, 400), (3000, 3000)):
        keys = array("Q", rng.integers(0, distinct, n).astype(np.uint64).tobytes())
        builder.pair_row = array("q", range(n))
        builder.prompt_excerpts = [f"row {i}" for i in range(n)]
        builder.file_index, builder.line, builder.files = array("I", [0] * n), array("q", range(1, n + 1)), {"f": 0}
        got = duplicate_groups(builder, keys)
        # The reference: a stable argsort of every key.
        values = np.frombuffer(keys, dtype=np.uint64)
        order = np.argsort(values, kind="stable")
        sorted_values = values[order]
        starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]]) if n else np.zeros(0, int)
        sizes = np.diff(np.r_[starts, n])
        dup = np.flatnonzero(sizes > 1)
        ranked = sorted(zip((-sizes[dup]).tolist(), order[starts[dup]].tolist(), starts[dup].tolist()))[:TOP_GROUPS]
        lines = [[m + 1 for m in sorted(order[a : a - s].tolist())[:LINES_PER_GROUP]] for s, _, a in ranked]
        assert got["groups"] == len(dup) and got["rows"] == int(sizes[dup].sum())
        assert [[r["source_line"] for r in g["rows"]] for g in got["top"]] == lines
