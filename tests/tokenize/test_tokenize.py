"""prefdata.tokenize.pairs: templates, BOS/EOS, invariant 2 against the joint tokenization, truncation."""

from __future__ import annotations

import json
import pickle
from itertools import islice

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError, RecordError
from prefdata.core.records import Pair
from prefdata.tokenize.pairs import PairTokenizer
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.tokenizer import load_tokenizer
from prefdata.tokenize.truncate import truncate_pair

TEMPLATED = ["qwen2.5-instruct", "mistral-7b-instruct-v0.3", "phi-3-mini-4k-instruct", "smollm2-135m-instruct"]
ALL_REAL = TEMPLATED + ["gpt2"]
N_REAL_ROWS = 80  # rows of real data per tokenizer and mode (the whole file takes too long for a unit test)

_CACHE: dict[tuple[str, bool, int | None, int | None], PairTokenizer] = {}


def _pair_tokenizer(path: str, chat_template: bool = False, max_length=None, max_prompt_length=None) -> PairTokenizer:
    """Loading a real tokenizer takes ~1 s: share them across tests."""
    key = (path, chat_template, max_length, max_prompt_length)
    if key not in _CACHE:
        tok = PairTokenizer(path, TokenizeSettings(max_length, max_prompt_length, chat_template))
        tok.setup()
        _CACHE[key] = tok
    return _CACHE[key]


def _conv(prompt: str, chosen: str, rejected: str, line: int = 1) -> Pair:
    return Pair(
        "t.jsonl", line, prompt, chosen, rejected,
        prompt_messages=[{"role": "user", "content": prompt}],
        chosen_messages=[{"role": "assistant", "content": chosen}],
        rejected_messages=[{"role": "assistant", "content": rejected}],
    )


def _text(prompt: str, chosen: str, rejected: str, line: int = 1) -> Pair:
    return Pair("t.jsonl", line, prompt, chosen, rejected)


@pytest.fixture(scope="module")
def ultrafeedback(shared_data) -> list[Pair]:
    path = shared_data("ultrafeedback-sample/train.jsonl")
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in islice(handle, 400)]
    # Skip the empty halves (quarantined or flagged upstream; some templates refuse empty content).
    rows = [r for r in rows if r["chosen"].strip() and r["rejected"].strip()]
    return [_text(r["prompt"], r["chosen"], r["rejected"], i + 1) for i, r in enumerate(rows[:N_REAL_ROWS])]


# -- settings and loading --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"max_length": 0}, {"max_length": -3}, {"max_prompt_length": 0}, {"max_length": True},
     {"max_length": 1.5}, {"max_length": 10, "max_prompt_length": 10}, {"max_length": 10, "max_prompt_length": 12}],
)
def test_settings_reject_bad_values(kwargs):
    with pytest.raises(PrefdataError):
        TokenizeSettings(**kwargs)


def test_settings_accept_good_values():
    TokenizeSettings(max_length=10, max_prompt_length=9)
    TokenizeSettings(max_prompt_length=4)
    TokenizeSettings()


def test_load_tokenizer_error_is_one_line(tmp_path):
    with pytest.raises(PrefdataError) as info:
        load_tokenizer(str(tmp_path / "nope"))
    assert "\n" not in str(info.value) and "not found" in str(info.value)
    with pytest.raises(PrefdataError) as info:
        load_tokenizer(str(tmp_path))  # exists, but holds no tokenizer
    assert "\n" not in str(info.value)


def test_pickle_before_and_after_setup(tiny_tokenizer_dir):
    tok = PairTokenizer(tiny_tokenizer_dir, TokenizeSettings(max_length=64))
    fresh = pickle.loads(pickle.dumps(tok))
    tok.setup()
    after = pickle.loads(pickle.dumps(tok))
    pairs = [_conv("What is the capital of France?", "Paris.", "Berlin.")]
    assert fresh.tokenize_pairs(pairs) == after.tokenize_pairs(pairs) == tok.tokenize_pairs(pairs)
    assert tok.fingerprint() == after.fingerprint() and tok.fingerprint().startswith("sha256:")


# -- the tiny tokenizer (always runs) ---------------------------------------------------------


def test_tiny_conversational_and_string_rows(tiny_tokenizer_dir):
    tok = _pair_tokenizer(tiny_tokenizer_dir)
    t = tok.tokenizer
    eos = t.eos_token_id
    conv, text = tok.tokenize_pairs([_conv("Hi", "Hello there.", "Go away."), _text("Hi", "Hello there.", "Go away.")])
    assert t.decode(conv.prompt_ids) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    # ChatML's '\n' after <|im_end|> is dropped: the turn (and the completion) ends at the EOS.
    assert t.decode(conv.chosen_ids) == "Hello there.<|im_end|>"
    assert t.decode(text.prompt_ids) == "Hi"
    for pair in (conv, text):
        for ids in (pair.chosen_ids, pair.rejected_ids):
            assert ids[-1] == eos and ids.count(eos) == 1
    assert conv.flags == [] and text.flags == []


def test_string_rows_through_template_match_conversational(tiny_tokenizer_dir):
    templated = _pair_tokenizer(tiny_tokenizer_dir, chat_template=True)
    plain = _pair_tokenizer(tiny_tokenizer_dir)
    [a] = templated.tokenize_pairs([_text("Hi", "Hello there.", "Go away.")])
    [b] = plain.tokenize_pairs([_conv("Hi", "Hello there.", "Go away.")])
    assert a == b


def test_completion_already_ending_with_eos_gets_no_second_one(tiny_tokenizer_dir):
    tok = _pair_tokenizer(tiny_tokenizer_dir)
    [pair] = tok.tokenize_pairs([_text("Hi", "Hello.<|im_end|>", "Bye.")])
    assert pair.chosen_ids.count(tok.eos_token_id) == 1 and pair.chosen_ids[-1] == tok.eos_token_id


def test_pretokenized_rows_are_kept_and_truncated(tiny_tokenizer_dir):
    tok = _pair_tokenizer(tiny_tokenizer_dir, max_length=6)
    pair = Pair("t", 1, "", "", "", prompt_ids=[1, 2, 3], chosen_ids=[4, 5], rejected_ids=[6, 7, 8, 9])
    [out] = tok.tokenize_pairs([pair])
    assert (out.prompt_ids, out.chosen_ids, out.rejected_ids) == ([1, 2, 3], [4, 5], [6, 7, 8])
    assert (out.prompt_len_full, out.chosen_len_full, out.rejected_len_full) == (3, 2, 4)
    assert out.flags == [F.COMPLETION_TRUNCATED]


def test_mixed_batch_keeps_order(tiny_tokenizer_dir):
    tok = _pair_tokenizer(tiny_tokenizer_dir)
    pairs = [
        _text("a", "b", "c", 1),
        Pair("t", 2, "", "", "", prompt_ids=[9], chosen_ids=[8], rejected_ids=[7]),
        _conv("d", "e", "f", 3),
        _text("g", "h", "i", 4),
    ]
    out = tok.tokenize_pairs(pairs)
    singles = [tok.tokenize_pairs([p])[0] for p in pairs]
    assert out == singles
    assert out[1].prompt_ids == [9]


# -- real tokenizers ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", TEMPLATED)
def test_real_conversational_rows(shared_tokenizer, name):
    tok = _pair_tokenizer(shared_tokenizer(name))
    t = tok.tokenizer
    messages = [{"role": "user", "content": "What is 2+2?"}]
    [pair] = tok.tokenize_pairs([_conv("What is 2+2?", "It is 4.", "It is 5.")])
    rendered = t.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert pair.prompt_ids == t(rendered, add_special_tokens=False)["input_ids"]
    eos = t.eos_token_id
    for ids in (pair.chosen_ids, pair.rejected_ids):
        assert ids[-1] == eos and ids.count(eos) == 1, t.convert_ids_to_tokens(ids)
    if t.bos_token_id is not None:  # (SmolLM2's "BOS" is <|im_start|>, which opens every turn)
        assert pair.prompt_ids[:2] != [t.bos_token_id, t.bos_token_id]
    assert pair.flags == []


def test_mistral_no_double_bos(shared_tokenizer):
    path = shared_tokenizer("mistral-7b-instruct-v0.3")
    for chat_template in (False, True):
        tok = _pair_tokenizer(path, chat_template=chat_template)
        bos = tok.tokenizer.bos_token_id
        for pair in tok.tokenize_pairs([_conv("Hi", "Hello.", "Bye."), _text("Hi", "Hello.", "Bye.")]):
            assert pair.prompt_ids[0] == bos and pair.prompt_ids[1] != bos
            assert (pair.prompt_ids + pair.chosen_ids).count(bos) == 1


def test_phi3_keeps_end_of_turn_then_eos(shared_tokenizer):
    tok = _pair_tokenizer(shared_tokenizer("phi-3-mini-4k-instruct"))
    t = tok.tokenizer
    [pair] = tok.tokenize_pairs([_conv("Hi", "Hello.", "Bye.")])
    assert t.convert_ids_to_tokens(pair.chosen_ids)[-2:] == ["<|end|>", "<|endoftext|>"]
    # Tokenized in the middle of the text: no SentencePiece '▁' prepended to the completion.
    full = t.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
                                 tokenize=False)
    assert pair.prompt_ids + pair.chosen_ids == t(full, add_special_tokens=False)["input_ids"]


def test_plain_prompt_uses_tokenizers_own_special_tokens(shared_tokenizer):
    for name in ("mistral-7b-instruct-v0.3", "gpt2", "qwen2.5-instruct"):
        tok = _pair_tokenizer(shared_tokenizer(name))
        [pair] = tok.tokenize_pairs([_text("Tell me a joke.", " Why did", " No.")])
        assert pair.prompt_ids == tok.tokenizer("Tell me a joke.")["input_ids"]


def test_gpt2_has_no_template(shared_tokenizer):
    path = shared_tokenizer("gpt2")
    with pytest.raises(PrefdataError):
        PairTokenizer(path, TokenizeSettings(chat_template=True)).setup()
    with pytest.raises(PrefdataError):
        _pair_tokenizer(path).tokenize_pairs([_conv("a", "b", "c")])


def test_template_failure_is_a_record_error_for_that_row_only(shared_tokenizer):
    tok = _pair_tokenizer(shared_tokenizer("mistral-7b-instruct-v0.3"))
    # Mistral's template refuses an assistant turn with empty content.
    out = tok.tokenize_pairs_or_errors([_conv("a", "b", "c"), _conv("a", "", "c"), _conv("d", "e", "f")])
    assert isinstance(out[1], RecordError) and "\n" not in str(out[1])
    assert not isinstance(out[0], RecordError) and not isinstance(out[2], RecordError)
    with pytest.raises(RecordError):
        tok.tokenize_pairs([_conv("a", "", "c")])


def _strip_added_eos(ids: list[int], text: str, eos_token: str) -> list[int]:
    """Plain text: the EOS was appended unless the completion text already ended with it."""
    return ids if text.endswith(eos_token) else ids[:-1]


@pytest.mark.parametrize("name", ALL_REAL)
def test_invariant2_plain_text_real_data(shared_tokenizer, ultrafeedback, name):
    """prompt_ids + completion_ids equals tokenizing the joint text, except on flagged rows, where
    it really differs; the prompt ids are shared by both halves."""
    tok = _pair_tokenizer(shared_tokenizer(name))
    t = tok.tokenizer
    out = tok.tokenize_pairs(ultrafeedback)
    prompt_ids = t([p.prompt for p in ultrafeedback])["input_ids"]
    joints_c = t([p.prompt + p.chosen for p in ultrafeedback])["input_ids"]
    joints_r = t([p.prompt + p.rejected for p in ultrafeedback])["input_ids"]
    for pair, tokenized, p_ids, jc, jr in zip(ultrafeedback, out, prompt_ids, joints_c, joints_r):
        assert tokenized.prompt_ids == p_ids
        agree = all(
            tokenized.prompt_ids + _strip_added_eos(ids, text, t.eos_token) == joint
            for ids, text, joint in ((tokenized.chosen_ids, pair.chosen, jc), (tokenized.rejected_ids, pair.rejected, jr))
        )
        assert agree == (F.PROMPT_BOUNDARY_MISMATCH not in tokenized.flags), pair.source_line
        for ids in (tokenized.chosen_ids, tokenized.rejected_ids):
            assert ids[-1] == t.eos_token_id and ids[-2] != t.eos_token_id


@pytest.mark.parametrize("name", TEMPLATED)
def test_invariant2_templated_real_data(shared_tokenizer, ultrafeedback, name):
    """Through the chat template: prompt_ids + completion_ids is a prefix of the tokenized full
    render, and what the full render has beyond it is only the template's trailing whitespace."""
    tok = _pair_tokenizer(shared_tokenizer(name), chat_template=True)
    t = tok.tokenizer
    out = tok.tokenize_pairs(ultrafeedback)
    users = [[{"role": "user", "content": p.prompt}] for p in ultrafeedback]
    prompts = t.apply_chat_template(users, tokenize=False, add_generation_prompt=True)
    prompt_ids = t(prompts, add_special_tokens=False)["input_ids"]
    joints = {}
    for half in ("chosen", "rejected"):
        convs = [u + [{"role": "assistant", "content": getattr(p, half)}] for u, p in zip(users, ultrafeedback)]
        joints[half] = t(t.apply_chat_template(convs, tokenize=False), add_special_tokens=False)["input_ids"]
    for i, (pair, tokenized) in enumerate(zip(ultrafeedback, out)):
        assert tokenized.prompt_ids == prompt_ids[i]
        for half, ids in (("chosen", tokenized.chosen_ids), ("rejected", tokenized.rejected_ids)):
            joint = joints[half][i]
            mine = tokenized.prompt_ids + ids
            if F.PROMPT_BOUNDARY_MISMATCH not in tokenized.flags:
                assert joint[: len(mine)] == mine, pair.source_line
                assert t.decode(joint[len(mine) :]).strip() == ""
            assert ids[-1] == t.eos_token_id and ids.count(t.eos_token_id) == 1


@pytest.mark.parametrize("name", ALL_REAL)
def test_boundary_mismatch_detected_on_merging_words(shared_tokenizer, name):
    """'Hello' + 'world' tokenizes as one word when joined: the split cannot match the joint text."""
    tok = _pair_tokenizer(shared_tokenizer(name))
    t = tok.tokenizer
    [merged, clean] = tok.tokenize_pairs([_text("Hello", "world", "there"), _text("Hello", " world", " there")])
    assert F.PROMPT_BOUNDARY_MISMATCH in merged.flags
    assert F.PROMPT_BOUNDARY_MISMATCH not in clean.flags
    # The boundary-correct split is kept: the prompt's own ids, then the completion's.
    assert merged.prompt_ids == t("Hello")["input_ids"]
    assert t.decode(merged.chosen_ids, skip_special_tokens=True) == "world"


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "mistral-7b-instruct-v0.3"])
def test_boundary_check_of_repeated_windows_matches_each_row_alone(shared_tokenizer, name):
    """A batch whose rows share window texts (one prompt, several pairs of its completions, as a
    record of scored completions makes) tokenizes each shared window once; every row's flags and
    ids are what that row gets alone."""
    tok = _pair_tokenizer(shared_tokenizer(name))
    completions = ["world", " world", "there", " there!", "world"]
    pairs = [_text("Hello", a, b) for a in completions for b in completions if a != b]
    pairs += [_text("Say hi.\n", "Hi", "Hello"), _text("Hello", "world", " world")]
    together = tok.tokenize_pairs(pairs)
    alone = [tok.tokenize_pairs([pair])[0] for pair in pairs]
    assert [t.flags for t in together] == [t.flags for t in alone]
    assert [(t.prompt_ids, t.chosen_ids, t.rejected_ids) for t in together] == \
        [(t.prompt_ids, t.chosen_ids, t.rejected_ids) for t in alone]
    assert {F.PROMPT_BOUNDARY_MISMATCH in t.flags for t in together} == {True, False}  # both kinds met


# -- truncation --------------------------------------------------------------------------------


def test_truncation_both_sides(tiny_tokenizer_dir):
    long_prompt = "Question: how many legs does a spider have? " * 5 + "Explain step by step."
    long_chosen = "Eight legs. " * 10
    long_rejected = "Four legs, like a cat. " * 10
    full = _pair_tokenizer(tiny_tokenizer_dir).tokenize_pairs([_conv(long_prompt, long_chosen, long_rejected)])[0]
    tok = _pair_tokenizer(tiny_tokenizer_dir, max_length=48, max_prompt_length=20)
    [cut] = tok.tokenize_pairs([_conv(long_prompt, long_chosen, long_rejected)])
    assert cut.prompt_ids == full.prompt_ids[-20:]  # cut from the left: the turn header survives
    assert tok.tokenizer.decode(cut.prompt_ids).endswith("<|im_start|>assistant\n")
    assert cut.chosen_ids == full.chosen_ids[:28] and cut.rejected_ids == full.rejected_ids[:28]
    assert len(cut.prompt_ids) + len(cut.chosen_ids) <= 48 and len(cut.prompt_ids) + len(cut.rejected_ids) <= 48
    assert (cut.prompt_len_full, cut.chosen_len_full, cut.rejected_len_full) == (
        len(full.prompt_ids), len(full.chosen_ids), len(full.rejected_ids))
    assert cut.flags == [F.COMPLETION_TRUNCATED]


def test_truncation_only_the_long_half_flagged_but_pair_flag_set():
    s = TokenizeSettings(max_length=8)
    out = truncate_pair([1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11], s, eos_token_id=11)
    assert out.chosen_ids == [4, 5] and out.rejected_ids == [6, 7, 8, 9, 10]
    assert out.flags == [F.COMPLETION_TRUNCATED]


def test_prompt_filling_max_length_leaves_no_completion_tokens():
    s = TokenizeSettings(max_length=4)
    out = truncate_pair([1, 2, 3, 4, 5, 6], [7, 8], [9, 8], s, eos_token_id=8)
    assert out.prompt_ids == [3, 4, 5, 6] and out.chosen_ids == [] and out.rejected_ids == []
    assert F.NO_COMPLETION_TOKENS in out.flags and F.COMPLETION_TRUNCATED in out.flags
    assert out.prompt_len_full == 6


def test_identical_after_truncation():
    s = TokenizeSettings(max_length=6)
    out = truncate_pair([1, 2], [3, 4, 5, 6, 7], [3, 4, 5, 6, 9], s, eos_token_id=0)
    assert out.chosen_ids == out.rejected_ids == [3, 4, 5, 6]
    assert F.IDENTICAL_AFTER_TRUNCATION in out.flags
    # Already identical before truncation: that is `identical`, a text check, not this flag.
    same = truncate_pair([1, 2], [3, 4, 5, 6, 7], [3, 4, 5, 6, 7], s, eos_token_id=0)
    assert F.IDENTICAL_AFTER_TRUNCATION not in same.flags


def test_identical_after_truncation_real_tokens(tiny_tokenizer_dir):
    tok = _pair_tokenizer(tiny_tokenizer_dir, max_length=30)
    shared = "Sure! Here are three tips: drink water, sleep well. "
    [pair] = tok.tokenize_pairs([_text("Tips?", shared * 3 + "Walk.", shared * 3 + "Run.")])
    assert F.IDENTICAL_AFTER_TRUNCATION in pair.flags and pair.chosen_ids == pair.rejected_ids


def test_no_truncation_settings_keep_everything():
    out = truncate_pair([1] * 50, [2] * 70, [3] * 90, TokenizeSettings(), eos_token_id=None)
    assert (len(out.prompt_ids), len(out.chosen_ids), len(out.rejected_ids)) == (50, 70, 90)
    assert out.flags == []


# -- property test -----------------------------------------------------------------------------

_PIECES = list("ab cdé\n!?日1") + ["<|im_end|>", "  ", "\t", "Hello", " world", "legs"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=12).map("".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=_TEXT, chosen=_TEXT, rejected=_TEXT,
       max_length=st.one_of(st.none(), st.integers(2, 40)), max_prompt=st.one_of(st.none(), st.integers(1, 40)))
def test_property_split_and_truncation(tiny_tokenizer_dir, prompt, chosen, rejected, max_length, max_prompt):
    if max_length is not None and max_prompt is not None and max_prompt >= max_length:
        max_prompt = max_length - 1
    full_tok = _pair_tokenizer(tiny_tokenizer_dir)
    [full] = full_tok.tokenize_pairs([_text(prompt, chosen, rejected)])
    t = full_tok.tokenizer
    eos = t.eos_token_id
    for ids, text in ((full.chosen_ids, chosen), (full.rejected_ids, rejected)):
        assert ids and ids[-1] == eos and (len(ids) == 1 or ids[-2] != eos)
        joint = t(prompt + text, add_special_tokens=False)["input_ids"]
        if F.PROMPT_BOUNDARY_MISMATCH not in full.flags:
            # A text ending in the literal end token several times keeps one (EOS exactly once).
            while len(joint) > len(full.prompt_ids) + 1 and joint[-1] == joint[-2] == eos:
                joint = joint[:-1]
            assert full.prompt_ids + _strip_added_eos(ids, text, t.eos_token) == joint
    assert (full.prompt_len_full, full.chosen_len_full, full.rejected_len_full) == (
        len(full.prompt_ids), len(full.chosen_ids), len(full.rejected_ids))

    cut = truncate_pair(full.prompt_ids, full.chosen_ids, full.rejected_ids,
                        TokenizeSettings(max_length=max_length, max_prompt_length=max_prompt), eos)
    assert cut.prompt_ids == full.prompt_ids[len(full.prompt_ids) - len(cut.prompt_ids):]  # a suffix
    assert cut.chosen_ids == full.chosen_ids[: len(cut.chosen_ids)]  # prefixes
    assert cut.rejected_ids == full.rejected_ids[: len(cut.rejected_ids)]
    if max_prompt is not None:
        assert len(cut.prompt_ids) <= max_prompt
    if max_length is not None:
        assert len(cut.prompt_ids) + max(len(cut.chosen_ids), len(cut.rejected_ids)) <= max_length
    lost = len(cut.chosen_ids) < len(full.chosen_ids) or len(cut.rejected_ids) < len(full.rejected_ids)
    assert (F.COMPLETION_TRUNCATED in cut.flags) == lost
    assert (F.NO_COMPLETION_TOKENS in cut.flags) == (not cut.chosen_ids or not cut.rejected_ids)
    assert (F.IDENTICAL_AFTER_TRUNCATION in cut.flags) == (
        cut.chosen_ids == cut.rejected_ids and full.chosen_ids != full.rejected_ids)


def test_completion_ending_in_literal_end_tokens_keeps_one_eos(tiny_tokenizer_dir):
    # Found by the property test: a completion whose text itself ends in the end token twice.
    tok = _pair_tokenizer(tiny_tokenizer_dir)
    eos_text = tok.tokenizer.eos_token
    [pair] = tok.tokenize_pairs([_text("Hi", "ok" + eos_text * 2, eos_text * 2)])
    eos = tok.tokenizer.eos_token_id
    for ids in (pair.chosen_ids, pair.rejected_ids):
        assert ids[-1] == eos and (len(ids) == 1 or ids[-2] != eos)
