"""Pair-level checks: each flag with positive and negative cases, thresholds, policy application."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks.pair import (
    apply_policy,
    normalize_whitespace,
    similarity,
    squeeze_whitespace,
    text_flags,
    token_flags,
)
from prefdata.checks.policy import load_policy
from prefdata.core import flags as F
from prefdata.core.records import Pair, TokenizedPair

POLICY = load_policy()


def pair(prompt="What is 2+2?", chosen="It is 4.", rejected="It is 5, I think.", **kw) -> Pair:
    return Pair("data.jsonl", 1, prompt, chosen, rejected, **kw)


def tok(chosen=(5, 6), rejected=(7,), flags=()) -> TokenizedPair:
    return TokenizedPair([1, 2], list(chosen), list(rejected), 2, len(chosen), len(rejected), list(flags))


def test_clean_pair_has_no_flags():
    assert text_flags(pair(), POLICY) == []


@pytest.mark.parametrize(
    "chosen, rejected, expected",
    [
        ("same answer", "same answer", [F.IDENTICAL]),
        (" same answer", "same answer", [F.WHITESPACE_ONLY]),  # leading space
        ("same  answer\n", "same answer", [F.WHITESPACE_ONLY]),
        ("same\tanswer", "same\u00a0answer", [F.WHITESPACE_ONLY]),  # non-ASCII whitespace
        ("same\u3000answer", "same answer", [F.WHITESPACE_ONLY]),
        ("sameanswer", "same answer", [F.NEAR_DUPLICATE]),  # a missing space is not whitespace_only
        ("The same answer, in full.", "the same answer, in full.", [F.NEAR_DUPLICATE]),
        ("x" * 100, "x" * 99 + "y", [F.NEAR_DUPLICATE]),
        ("short", "a completely different and longer text", []),
    ],
)
def test_completion_equality_flags(chosen, rejected, expected):
    assert text_flags(pair(chosen=chosen, rejected=rejected), POLICY) == expected


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"prompt": ""}, [F.EMPTY_PROMPT]),
        ({"prompt": " \n\t"}, [F.EMPTY_PROMPT]),
        ({"chosen": ""}, [F.EMPTY_CHOSEN]),
        ({"rejected": "  "}, [F.EMPTY_REJECTED]),
        ({"chosen": "", "rejected": ""}, [F.IDENTICAL, F.EMPTY_CHOSEN, F.EMPTY_REJECTED]),
        ({"chosen": " ", "rejected": ""}, [F.WHITESPACE_ONLY, F.EMPTY_CHOSEN, F.EMPTY_REJECTED]),
        ({"prompt": "."}, []),
    ],
)
def test_empty_flags(fields, expected):
    assert text_flags(pair(**fields), POLICY) == expected


def test_near_duplicate_threshold_is_inclusive_and_configurable(tmp_path):
    chosen, rejected = "a" * 19 + "b", "a" * 20  # Indel distance 2 over 40 chars -> 0.95
    assert similarity(chosen, rejected) == pytest.approx(0.95)
    assert F.NEAR_DUPLICATE in text_flags(pair(chosen=chosen, rejected=rejected), POLICY)
    path = tmp_path / "p.toml"
    path.write_text("[thresholds]\nnear_duplicate = 0.96\n")
    assert F.NEAR_DUPLICATE not in text_flags(pair(chosen=chosen, rejected=rejected), load_policy(path))
    path.write_text("[thresholds]\nnear_duplicate = 0.5\n")
    assert F.NEAR_DUPLICATE in text_flags(pair(chosen="abcdef", rejected="abcxyz"), load_policy(path))


def test_multi_message_completion_compared_with_roles():
    tool = [{"role": "assistant", "content": "Let me check."}, {"role": "tool", "content": "42"}]
    said = [{"role": "assistant", "content": "Let me check."}, {"role": "assistant", "content": "42"}]
    p = pair(chosen="Let me check.\n42", rejected="Let me check.\n42", chosen_messages=tool, rejected_messages=said)
    assert F.IDENTICAL not in text_flags(p, POLICY)  # same words, different speaker
    same = pair(chosen="x", rejected="x", chosen_messages=tool, rejected_messages=list(tool))
    assert text_flags(same, POLICY)[0] == F.IDENTICAL
    spaced = [dict(m, content=m["content"] + "  ") for m in tool]
    ws = pair(chosen="x", rejected="x ", chosen_messages=tool, rejected_messages=spaced)
    assert text_flags(ws, POLICY)[0] == F.WHITESPACE_ONLY
    blank = [{"role": "assistant", "content": " "}, {"role": "tool", "content": ""}]
    assert F.EMPTY_CHOSEN in text_flags(pair(chosen="", chosen_messages=blank, rejected_messages=tool), POLICY)


def test_single_assistant_message_uses_text():
    msgs = [{"role": "assistant", "content": "Hi"}]
    p = pair(chosen="Hi", rejected="Hi", chosen_messages=msgs, rejected_messages=list(msgs))
    assert text_flags(p, POLICY) == [F.IDENTICAL]


def test_pretokenized_pairs_compare_ids():
    def ids_pair(prompt_ids, chosen_ids, rejected_ids):
        return pair("", "", "", prompt_ids=prompt_ids, chosen_ids=chosen_ids, rejected_ids=rejected_ids)

    assert text_flags(ids_pair([1], [2, 3], [2, 4, 5, 6]), POLICY) == []
    assert text_flags(ids_pair([1], [2, 3], [2, 3]), POLICY) == [F.IDENTICAL]
    assert text_flags(ids_pair([], [2], [3]), POLICY) == [F.EMPTY_PROMPT]
    assert text_flags(ids_pair([1], [], [3]), POLICY) == [F.EMPTY_CHOSEN]
    long = list(range(100))
    assert text_flags(ids_pair([1], long, long[:-1] + [999]), POLICY) == [F.NEAR_DUPLICATE]
    # Text present: the text is checked (token-level checks cover the ids).
    with_text = pair(chosen="a", rejected="b", prompt_ids=[1], chosen_ids=[2], rejected_ids=[2])
    assert text_flags(with_text, POLICY) == []


def test_token_flags():
    assert token_flags(tok(), []) == []
    assert token_flags(tok(chosen=()), []) == [F.NO_COMPLETION_TOKENS]
    assert token_flags(tok(rejected=()), [F.EMPTY_REJECTED]) == [F.EMPTY_REJECTED, F.NO_COMPLETION_TOKENS]
    assert token_flags(tok(chosen=(5, 6), rejected=(5, 6)), []) == [F.IDENTICAL_AFTER_TRUNCATION]
    assert token_flags(tok(chosen=(5, 6), rejected=(5, 6)), [F.IDENTICAL]) == [F.IDENTICAL]
    assert token_flags(tok(chosen=(5, 6), rejected=(5, 7)), []) == []
    merged = token_flags(tok(flags=[F.COMPLETION_TRUNCATED, F.COMPLETION_TRUNCATED]), [F.NEAR_DUPLICATE])
    assert merged == [F.NEAR_DUPLICATE, F.COMPLETION_TRUNCATED]
    # empty vs empty is no_completion_tokens, not identical_after_truncation
    assert token_flags(tok(chosen=(), rejected=()), []) == [F.NO_COMPLETION_TOKENS]


def test_apply_policy(tmp_path):
    kept, worst = apply_policy([F.DUPLICATE_PAIR, F.IDENTICAL, F.DUPLICATE_PAIR], POLICY)
    assert kept == [F.IDENTICAL, F.DUPLICATE_PAIR] and worst == "drop"
    assert apply_policy([], POLICY) == ([], None)
    assert apply_policy([F.NEAR_DUPLICATE], POLICY) == ([F.NEAR_DUPLICATE], "warn")
    path = tmp_path / "p.toml"
    path.write_text('[flags]\nnear_duplicate = "ignore"\nduplicate_pair = "error"\n')
    policy = load_policy(path)
    assert apply_policy([F.NEAR_DUPLICATE], policy) == ([], None)
    assert apply_policy([F.IDENTICAL, F.DUPLICATE_PAIR], policy) == ([F.IDENTICAL, F.DUPLICATE_PAIR], "error")
    with pytest.raises(ValueError):
        apply_policy(["bogus"], POLICY)


text_st = st.text(alphabet=st.sampled_from(list("ab \t\n\u00a0\u3000\x1cé")), max_size=30)


@given(text_st)
def test_normalize_whitespace_properties(text):
    normalized = normalize_whitespace(text)
    assert normalize_whitespace(normalized) == normalized
    assert normalized == normalized.strip() and "  " not in normalized
    assert squeeze_whitespace(text) == "".join(text.split()).encode()


@settings(max_examples=300)
@given(text_st, text_st)
def test_equality_flags_are_exclusive_and_exact(a, b):
    found = text_flags(pair(chosen=a, rejected=b), POLICY)
    equality = [f for f in found if f in (F.IDENTICAL, F.WHITESPACE_ONLY, F.NEAR_DUPLICATE)]
    assert len(equality) <= 1
    assert (F.IDENTICAL in found) == (a == b)
    assert (F.WHITESPACE_ONLY in found) == (a != b and normalize_whitespace(a) == normalize_whitespace(b))
    if not equality:
        assert similarity(a, b) < POLICY.near_duplicate_threshold
    assert found == sorted(found, key=F.ALL_FLAGS.index)


def test_text_flags_speed_typical_row():
    p = pair(prompt="Explain photosynthesis briefly. " * 4, chosen="Plants turn light into sugar. " * 12,
             rejected="Photosynthesis is how plants eat sunlight, roughly speaking. " * 5)
    text_flags(p, POLICY)
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        text_flags(p, POLICY)
    per_pair = (time.perf_counter() - start) / n
    assert per_pair < 200e-6  # generous bound for loaded CI; the target is well under 20 us
