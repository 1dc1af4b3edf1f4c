"""Dataset-wide checks: duplicate/conflicting pairs in input order (prefdata.checks.partitioned), prompt leaks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks.dataset import PromptLeakIndex, text_digest
from prefdata.checks.digests import digest_block
from prefdata.checks.pair import normalize_whitespace
from prefdata.core import flags as F
from prefdata.checks.partitioned import dataset_flags, partitioned_dataset_checks
from prefdata.core.records import Pair


def pair(prompt, chosen, rejected, line=1, source="a.jsonl", **kw) -> Pair:
    return Pair(source, line, prompt, chosen, rejected, **kw)


def observe(*pairs: Pair, block_rows: int = 2) -> list[list[str]]:
    """Each pair's dataset-wide flags, the rows in blocks of `block_rows` over 3 partitions."""
    blocks = [digest_block(range(s, min(s + block_rows, len(pairs))), pairs[s : s + block_rows])
              for s in range(0, len(pairs), block_rows)]
    result = partitioned_dataset_checks(blocks, 3)
    duplicate, conflicting = result.flags_of(range(len(pairs)))
    return [dataset_flags(bool(d), bool(c)) for d, c in zip(duplicate, conflicting)]


def test_duplicate_flags_later_occurrences_only():
    pairs = [pair("p", "good", "bad", 1), pair("p", "good", "worse", 2), pair("p", "good", "bad", 3),
             pair(" p ", "good\n", "bad", 4), pair("q", "good", "bad", 5)]  # normalized text; another prompt
    assert observe(*pairs) == [[], [], [F.DUPLICATE_PAIR], [F.DUPLICATE_PAIR], []]
    blocks = [digest_block(range(5), pairs)]
    result = partitioned_dataset_checks(blocks, 2)
    assert result.rows == 5 and result.duplicate_prompt_rows == 3 and result.distinct_prompts == 2


def test_conflicting_pair_is_the_later_swapped_row():
    assert observe(pair("p", "A", "B", 1, source="x.jsonl"), pair("p", "B", "A", 2, source="y.jsonl"),
                   pair("p", "B", "A", 3)) == [[], [F.CONFLICTING_PAIR], [F.DUPLICATE_PAIR, F.CONFLICTING_PAIR]]


def test_identical_pair_is_not_its_own_conflict():
    assert observe(pair("p", "A", "A", 1), pair("p", "A", "A", 2)) == [[], [F.DUPLICATE_PAIR]]


def test_fields_do_not_bleed_into_each_other():
    assert observe(pair("ab", "c", "d"), pair("a", "bc", "d"), pair("a", "b", "cd")) == [[], [], []]


def test_pretokenized_pairs_hash_ids():
    ids = {"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4]}
    swapped = {"prompt_ids": [1, 2], "chosen_ids": [4], "rejected_ids": [3]}
    assert observe(pair("", "", "", **ids), pair("", "", "", 2, **ids), pair("", "", "", 3, **swapped)) == [
        [], [F.DUPLICATE_PAIR], [F.CONFLICTING_PAIR]]


def test_multi_message_completions_hash_roles():
    a = [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "y"}]
    b = [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    one = [{"role": "assistant", "content": "z"}]
    assert observe(pair("p", "x y", "z", chosen_messages=a, rejected_messages=one),
                   pair("p", "x y", "z", chosen_messages=b, rejected_messages=one),
                   pair("p", "x y", "z", chosen_messages=a, rejected_messages=one)) == [[], [], [F.DUPLICATE_PAIR]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("pq"), st.sampled_from("abc"), st.sampled_from("abc")), max_size=40),
       st.integers(1, 9))
def test_matches_a_reference_implementation(rows, block_rows):
    got = observe(*[pair(p, c, r, i + 1) for i, (p, c, r) in enumerate(rows)], block_rows=block_rows)
    seen: set[tuple[str, str, str]] = set()
    for i, (p, c, r) in enumerate(rows):
        expected = []
        if (p, c, r) in seen:
            expected.append(F.DUPLICATE_PAIR)
        if c != r and (p, r, c) in seen:
            expected.append(F.CONFLICTING_PAIR)
        seen.add((p, c, r))
        assert got[i] == expected


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
