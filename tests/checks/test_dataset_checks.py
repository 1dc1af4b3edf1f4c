"""Dataset-wide checks: duplicate/conflicting pairs in input order, the hash table, prompt leaks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks.dataset import DatasetWideChecks, PromptLeakIndex, U64Table, text_digest
from prefdata.checks.pair import normalize_whitespace
from prefdata.core import flags as F
from prefdata.core.records import Pair


def pair(prompt, chosen, rejected, line=1, source="a.jsonl", **kw) -> Pair:
    return Pair(source, line, prompt, chosen, rejected, **kw)


def test_duplicate_flags_later_occurrences_only():
    checks = DatasetWideChecks()
    assert checks.observe(pair("p", "good", "bad", 1)) == []
    assert checks.observe(pair("p", "good", "worse", 2)) == []
    assert checks.observe(pair("p", "good", "bad", 3)) == [F.DUPLICATE_PAIR]
    assert checks.observe(pair(" p ", "good\n", "bad", 4)) == [F.DUPLICATE_PAIR]  # normalized text
    assert checks.observe(pair("q", "good", "bad", 5)) == []  # other prompt
    assert checks.first_line_of(pair("p", "good", "bad")) == ("a.jsonl", 1)
    assert checks.first_line_of(pair("p", "never", "seen")) is None
    assert checks.duplicate_pairs == 2 and checks.rows == 5
    assert checks.duplicate_prompt_rows == 3 and checks.distinct_prompts == 2
    assert checks.first_prompt_line_of(pair("q", "", "")) == ("a.jsonl", 5)


def test_conflicting_pair_is_the_later_swapped_row():
    checks = DatasetWideChecks()
    assert checks.observe(pair("p", "A", "B", 1, source="x.jsonl")) == []
    assert checks.observe(pair("p", "B", "A", 2, source="y.jsonl")) == [F.CONFLICTING_PAIR]
    assert checks.observe(pair("p", "B", "A", 3)) == [F.DUPLICATE_PAIR, F.CONFLICTING_PAIR]
    assert checks.first_line_of(pair("p", "B", "A"), swapped=True) == ("x.jsonl", 1)
    assert checks.first_line_of(pair("p", "B", "A")) == ("y.jsonl", 2)
    assert checks.conflicting_pairs == 2


def test_identical_pair_is_not_its_own_conflict():
    checks = DatasetWideChecks()
    assert checks.observe(pair("p", "A", "A", 1)) == []
    assert checks.observe(pair("p", "A", "A", 2)) == [F.DUPLICATE_PAIR]


def test_fields_do_not_bleed_into_each_other():
    checks = DatasetWideChecks()
    assert checks.observe(pair("ab", "c", "d")) == []
    assert checks.observe(pair("a", "bc", "d")) == []
    assert checks.observe(pair("a", "b", "cd")) == []


def test_pretokenized_pairs_hash_ids():
    checks = DatasetWideChecks()
    ids = {"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4]}
    assert checks.observe(pair("", "", "", **ids)) == []
    assert checks.observe(pair("", "", "", 2, **ids)) == [F.DUPLICATE_PAIR]
    swapped = {"prompt_ids": [1, 2], "chosen_ids": [4], "rejected_ids": [3]}
    assert checks.observe(pair("", "", "", 3, **swapped)) == [F.CONFLICTING_PAIR]


def test_multi_message_completions_hash_roles():
    checks = DatasetWideChecks()
    a = [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "y"}]
    b = [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    one = [{"role": "assistant", "content": "z"}]
    assert checks.observe(pair("p", "x y", "z", chosen_messages=a, rejected_messages=one)) == []
    assert checks.observe(pair("p", "x y", "z", chosen_messages=b, rejected_messages=one)) == []
    assert checks.observe(pair("p", "x y", "z", chosen_messages=a, rejected_messages=one)) == [F.DUPLICATE_PAIR]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("pq"), st.sampled_from("abc"), st.sampled_from("abc")), max_size=40))
def test_matches_a_reference_implementation(rows):
    checks = DatasetWideChecks()
    seen: set[tuple[str, str, str]] = set()
    for i, (p, c, r) in enumerate(rows):
        got = checks.observe(pair(p, c, r, i + 1))
        expected = []
        if (p, c, r) in seen:
            expected.append(F.DUPLICATE_PAIR)
        if c != r and (p, r, c) in seen:
            expected.append(F.CONFLICTING_PAIR)
        seen.add((p, c, r))
        assert got == expected


def test_u64_table_grows_and_keeps_first_value():
    table = U64Table(16)
    keys = np.random.default_rng(0).integers(0, 2**63, 50_000, dtype=np.int64).tolist() + [0]
    for i, key in enumerate(keys):
        assert table.setdefault(key, i) is None
    assert len(table) == len(keys)
    assert all(table.get(key) == i for i, key in enumerate(keys))
    assert table.setdefault(keys[5], 999) == 5
    assert table.get(123456789) is None
    # Colliding low bits (same home slot) still resolve.
    clash = U64Table(16)
    for i in range(1, 200):
        assert clash.setdefault(i << 32, i) is None
    assert all(clash.get(i << 32) == i for i in range(1, 200))
    assert table.nbytes <= 16 * 4 * len(keys)


def test_prompt_leak_index():
    index = PromptLeakIndex(["What is 2+2?", "  Name a   colour. ", "", [5, 6, 7]])
    assert len(index) == 3
    assert index.contains("What is 2+2?")
    assert index.contains("Name a colour.")
    assert not index.contains("What is 2+3?")
    assert not index.contains("")
    assert not index.contains("   ")
    assert index.contains([5, 6, 7]) and not index.contains([5, 6])
    assert index.contains_pair(pair("Name a colour.", "r", "g"))
    assert index.contains_pair(pair("", "", "", prompt_ids=[5, 6, 7], chosen_ids=[1], rejected_ids=[2]))
    assert not PromptLeakIndex([]).contains("anything")


@given(st.text(alphabet=st.sampled_from(list("ab \n\u00a0")), max_size=20))
def test_text_digest_depends_only_on_normalized_text(text):
    assert text_digest(text) == text_digest(normalize_whitespace(text))
