"""Per-token loss masks of completions that hold turns the model did not write (prefdata.tokenize.turns):
agent trajectories with tool results, multi-turn chats, HH transcripts. What the mask must be is
stated from the rendered text, independently of how prefdata finds it: the trained tokens decode to
exactly the assistant turns' text (with their end-of-turn token), nothing of a tool result, a user
turn or a role header."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefdata.core import flags as F
from prefdata.core.records import RawRecord
from prefdata.io.formats import normalize_record
from prefdata.tokenize.pairs import PairTokenizer
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.template import pinned_clock
from prefdata.tokenize.turns import generation_spans, has_generation_blocks, hh_spans, token_mask

_CACHE: dict[tuple[str, str, int | None], PairTokenizer] = {}


def _tokenizer(path: str, train_turns: str = "all", max_length: int | None = None) -> PairTokenizer:
    key = (path, train_turns, max_length)
    if key not in _CACHE:
        _CACHE[key] = PairTokenizer(path, TokenizeSettings(max_length=max_length, train_turns=train_turns))
        _CACHE[key].setup()
    return _CACHE[key]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def call(call_id, name, args):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def tool(call_id, text):
    return {"role": "tool", "tool_call_id": call_id, "content": text}


TOOLS = [{"type": "function", "function": {"name": name, "description": name, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "hours": {"type": "integer"}}}}}
    for name in ("get_weather", "get_forecast", "get_time")]
SHARED = [
    {"role": "system", "content": "You are a helpful agent."},
    user("What's the weather in Paris and should I bring an umbrella?"),
    call("c1", "get_weather", {"city": "Paris"}),
    tool("c1", '{"temp": 14, "sky": "cloudy"}'),
]
TRAJECTORY = {
    "chosen": SHARED + [call("c2", "get_forecast", {"city": "Paris", "hours": 6}), tool("c2", '{"rain_prob": 0.8}'),
                        assistant("It is 14C and cloudy with an 80% chance of rain: bring an umbrella.")],
    "rejected": SHARED + [call("c3", "get_time", {"city": "Paris"}), tool("c3", '{"time": "14:02"}'),
                          assistant("It is 14C and cloudy. No umbrella needed.")],
    "tools": TOOLS,
}
CHAT = {
    "chosen": [user("Hi"), assistant("Hello! How can I help?"), user("Tell a joke."),
               assistant("Why did the chicken cross the road?")],
    "rejected": [user("Hi"), assistant("Go away."), user("Tell a joke."), assistant("No.")],
}


def _pair(row):
    return normalize_record(RawRecord("t.jsonl", 1, row))


def _trained_runs(tok, ids, mask) -> list[str]:
    """The decoded text of each maximal run of trained tokens."""
    runs, current = [], []
    for token, keep in zip(ids, mask):
        if keep:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tok.decode(run) for run in runs]


def test_the_trajectory_splits_after_the_shared_tool_result_and_trains_only_the_model_turns(shared_tokenizer):
    pair = _pair(TRAJECTORY)
    assert pair.prompt_messages == SHARED  # the prompt ends after the shared tool result
    assert [m["role"] for m in pair.chosen_messages] == ["assistant", "tool", "assistant"]
    pt = _tokenizer(shared_tokenizer("qwen2.5-instruct"))
    tokenized = pt.tokenize_pairs([pair])[0]
    tok = pt.tokenizer
    for half, second_call in (("chosen", "get_forecast"), ("rejected", "get_time")):
        ids, mask = getattr(tokenized, f"{half}_ids"), getattr(tokenized, f"{half}_loss_mask")
        assert len(mask) == len(ids) and set(mask) == {0, 1}
        runs = _trained_runs(tok, ids, mask)
        final = getattr(pair, f"{half}_messages")[-1]["content"]
        assert len(runs) == 2
        assert runs[0].startswith("<tool_call>") and second_call in runs[0] and runs[0].endswith("</tool_call><|im_end|>")
        assert runs[1] == final + "<|im_end|>"
        untrained = tok.decode([t for t, m in zip(ids, mask) if not m])
        result = getattr(pair, f"{half}_messages")[1]["content"]
        assert result in untrained and "<|im_start|>user" in untrained and "<|im_start|>assistant" in untrained
    assert F.NO_TRAINED_TOKENS not in tokenized.flags


def test_train_turns_last_trains_only_the_final_answer(shared_tokenizer):
    pt = _tokenizer(shared_tokenizer("qwen2.5-instruct"), train_turns="last")
    tokenized = pt.tokenize_pairs([_pair(TRAJECTORY)])[0]
    runs = _trained_runs(pt.tokenizer, tokenized.chosen_ids, tokenized.chosen_loss_mask)
    assert runs == ["It is 14C and cloudy with an 80% chance of rain: bring an umbrella.<|im_end|>"]
    everything = _tokenizer(shared_tokenizer("qwen2.5-instruct")).tokenize_pairs([_pair(TRAJECTORY)])[0]
    assert everything.chosen_ids == tokenized.chosen_ids  # the sequence is the same; only the loss differs


@pytest.mark.parametrize("name, end", [("qwen2.5-instruct", "<|im_end|>"), ("smollm3-3b", "<|im_end|>"),
                                       ("phi-3-mini-4k-instruct", "<|end|>"), ("mistral-7b-instruct-v0.3", "</s>")])
def test_multi_turn_chat_masks_the_user_turn_and_its_headers(shared_tokenizer, name, end):
    pt = _tokenizer(shared_tokenizer(name))
    pair = _pair(CHAT)
    tokenized = pt.tokenize_pairs([pair])[0]
    for half in ("chosen", "rejected"):
        ids, mask = getattr(tokenized, f"{half}_ids"), getattr(tokenized, f"{half}_loss_mask")
        runs = [run.strip() for run in _trained_runs(pt.tokenizer, ids, mask)]
        answers = [m["content"] for m in getattr(pair, f"{half}_messages") if m["role"] == "assistant"]
        assert len(runs) == len(answers)
        for run, answer in zip(runs, answers):
            # SentencePiece decodes drop spaces between single pieces: compare without them.
            assert run.replace(" ", "").startswith(answer.replace(" ", "")) and end in run
            assert "Tell" not in run and "user" not in run and "assistant" not in run


@pytest.mark.parametrize("train_turns", ["all", "last"])
def test_generation_blocks_and_incremental_renders_agree(shared_tokenizer, train_turns):
    """SmolLM3 has {% generation %}: that path is taken, and gives the same mask as the renders would."""
    pt = _tokenizer(shared_tokenizer("smollm3-3b"), train_turns)
    pair = _pair(CHAT)
    conversation = pair.prompt_messages + pair.chosen_messages
    full = pt._render([conversation], False)[0]
    with pinned_clock(pt._day):  # SmolLM3 prints today's date: prefdata pins it
        assert generation_spans(pt.tokenizer, conversation, full, None, pt._render_kwargs) is not None
    with_blocks = pt.tokenize_pairs([pair])[0]
    template = pt.tokenizer.chat_template
    try:
        pt.tokenizer.chat_template = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)
        assert not has_generation_blocks(pt.tokenizer.chat_template)
        without = pt.tokenize_pairs([pair])[0]
    finally:
        pt.tokenizer.chat_template = template
    assert without.chosen_ids == with_blocks.chosen_ids
    assert without.chosen_loss_mask == with_blocks.chosen_loss_mask
    assert without.rejected_loss_mask == with_blocks.rejected_loss_mask
    runs = _trained_runs(pt.tokenizer, with_blocks.chosen_ids, with_blocks.chosen_loss_mask)
    assert len(runs) == (2 if train_turns == "all" else 1) and runs[-1].startswith("Why did the chicken")


def test_hh_transcript_diverging_before_its_last_turn_masks_the_human_turns(shared_tokenizer):
    chosen = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Joke?\n\nAssistant: Sure."
    rejected = "\n\nHuman: Hi\n\nAssistant: Go away.\n\nHuman: Joke?\n\nAssistant: No."
    pair = _pair({"chosen": chosen, "rejected": rejected})
    assert F.MULTI_TURN_COMPLETION in pair.flags
    pt = _tokenizer(shared_tokenizer("gpt2"))
    tokenized = pt.tokenize_pairs([pair])[0]
    assert _trained_runs(pt.tokenizer, tokenized.chosen_ids, tokenized.chosen_loss_mask) == [
        " Hello!", " Sure.<|endoftext|>"]
    assert _trained_runs(pt.tokenizer, tokenized.rejected_ids, tokenized.rejected_loss_mask) == [
        " Go away.", " No.<|endoftext|>"]


def test_hh_spans_of_a_completion_that_ends_in_a_human_turn():
    text = " A\n\nHuman: B\n\nAssistant: C\n\nHuman: D"
    spans, ends_in_model = hh_spans(text, "all")
    assert [text[a:b] for a, b in spans] == [" A", " C"] and not ends_in_model
    assert hh_spans(text, "last") == ([], False)


def test_single_turn_pairs_carry_no_mask_and_keep_their_ids(shared_tokenizer):
    row = {"chosen": [user("Q"), assistant("A")], "rejected": [user("Q"), assistant("B")]}
    pt_all = _tokenizer(shared_tokenizer("qwen2.5-instruct"))
    pt_last = _tokenizer(shared_tokenizer("qwen2.5-instruct"), train_turns="last")
    a, b = pt_all.tokenize_pairs([_pair(row)])[0], pt_last.tokenize_pairs([_pair(row)])[0]
    assert a.chosen_loss_mask is None and a.rejected_loss_mask is None and b.chosen_loss_mask is None
    assert (a.prompt_ids, a.chosen_ids, a.rejected_ids) == (b.prompt_ids, b.chosen_ids, b.rejected_ids)


def test_truncation_cuts_the_mask_with_the_ids_and_flags_a_half_left_untrained(shared_tokenizer):
    pt = _tokenizer(shared_tokenizer("qwen2.5-instruct"))
    pair = _pair(TRAJECTORY)
    whole = pt.tokenize_pairs([pair])[0]
    prompt = len(whole.prompt_ids)
    first_zero = whole.chosen_loss_mask.index(0)
    short = _tokenizer(shared_tokenizer("qwen2.5-instruct"), max_length=prompt + first_zero + 2)
    cut = short.tokenize_pairs([pair])[0]
    assert cut.chosen_loss_mask == whole.chosen_loss_mask[: len(cut.chosen_ids)]
    assert len(cut.rejected_loss_mask) == len(cut.rejected_ids)
    assert F.NO_TRAINED_TOKENS not in cut.flags
    last = _tokenizer(shared_tokenizer("qwen2.5-instruct"), "last", max_length=prompt + first_zero + 2)
    assert F.NO_TRAINED_TOKENS in last.tokenize_pairs([pair])[0].flags  # the final answer was cut away


def test_token_mask_marks_tokens_touching_a_span():
    offsets = [(0, 3), (3, 5), (5, 9), (9, 10), (10, 14)]
    assert token_mask(offsets, [(3, 9)]) == [0, 1, 1, 0, 0]
    assert token_mask(offsets, [(4, 6), (13, 20)]) == [0, 1, 1, 0, 1]
    assert token_mask([(2, 5), (5, 9)], [(0, 3)], shift=2) == [1, 0]


_WORDS = st.sampled_from(["hi", "the sea", "tool says 7", "ok!", "Paris", "emoji 🙂", "x = 1", "no"])


@st.composite
def _chats(draw):
    """A conversation that diverges at an assistant turn, then user turns between assistant turns."""
    turns = draw(st.integers(1, 5))
    halves = []
    for _ in range(2):
        messages = [assistant(draw(_WORDS) + " a")]
        for _ in range(turns - 1):
            messages += [user(draw(_WORDS)), assistant(draw(_WORDS))]
        halves.append(messages)
    if halves[0][0] == halves[1][0]:
        halves[1][0] = assistant(halves[1][0]["content"] + " b")
    prompt = [user(draw(_WORDS))]
    return {"chosen": prompt + halves[0], "rejected": prompt + halves[1]}


@given(row=_chats())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_trained_tokens_are_exactly_the_assistant_turns(tiny_tokenizer_dir, row):
    pt = _tokenizer(tiny_tokenizer_dir)
    pair = _pair(row)
    tokenized = pt.tokenize_pairs([pair])[0]
    for half in ("chosen", "rejected"):
        ids, mask = getattr(tokenized, f"{half}_ids"), getattr(tokenized, f"{half}_loss_mask")
        messages = getattr(pair, f"{half}_messages")
        if len(messages) == 1:
            assert mask is None or mask == [1] * len(ids)
            continue
        assert len(mask) == len(ids)
        answers = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        assert _trained_runs(pt.tokenizer, ids, mask) == answers


def test_huge_completions_get_the_same_mask_counted_piecewise(tiny_tokenizer_dir, monkeypatch):
    """A completion of HUGE_TEXT_CHARS or more is not tokenized with offsets (tokenize.pieces): its mask
    comes from token counts before each span edge, and must equal the offsets' mask."""
    from prefdata.tokenize import pairs, pieces

    row = {"chosen": [user("Q"), assistant("the sea " * 40), user("more?"), assistant("ok! " * 30)],
           "rejected": [user("Q"), assistant("no"), user("more?"), assistant("Paris x = 1")]}
    pt = PairTokenizer(tiny_tokenizer_dir, TokenizeSettings())
    expected = pt.tokenize_pairs([_pair(row)])[0]
    monkeypatch.setattr(pieces, "HUGE_TEXT_CHARS", 100)
    monkeypatch.setattr(pairs, "HUGE_TEXT_CHARS", 100)
    piecewise = PairTokenizer(tiny_tokenizer_dir, TokenizeSettings()).tokenize_pairs([_pair(row)])[0]
    assert list(piecewise.chosen_ids) == list(expected.chosen_ids)
    assert piecewise.chosen_loss_mask == expected.chosen_loss_mask and 0 in expected.chosen_loss_mask
    assert piecewise.rejected_loss_mask == expected.rejected_loss_mask


def test_a_template_that_fails_on_a_partial_conversation_costs_that_row_only(tiny_tokenizer_dir):
    """The turn renders (the conversation up to a later turn, with the generation prompt) are renders
    the row never needed before: a template that refuses one quarantines that row, not the batch."""
    from prefdata.core.errors import RecordError
    from prefdata.tiny.text import CHATML_TEMPLATE
    from prefdata.tokenize.template import TemplateSettings

    picky = ("{% if add_generation_prompt and messages | length > 2 %}"
             "{{ raise_exception('no generation prompt after a second turn') }}{% endif %}" + CHATML_TEMPLATE)
    pt = PairTokenizer(tiny_tokenizer_dir, TokenizeSettings(template=TemplateSettings(chat_template_text=picky)))
    single = {"chosen": [user("Q"), assistant("A")], "rejected": [user("Q"), assistant("B")]}
    results = pt.tokenize_pairs_or_errors([_pair(CHAT), _pair(single)])
    assert isinstance(results[0], RecordError) and "no generation prompt after a second turn" in str(results[0])
    assert "\n" not in str(results[0])
    assert results[1].chosen_loss_mask is None and len(results[1].chosen_ids) > 0


def test_a_turn_that_cannot_be_located_flags_the_row_instead_of_training_on_less(tiny_tokenizer_dir, tmp_path):
    """A template that rewrites an earlier turn once a later one follows (here: upper-cases it) gives
    renders prefdata cannot align: the row is flagged `turn_renders_differently` (error by default:
    removed, exit 1), never kept with that turn silently out of the loss."""
    from prefdata.prepare import prepare
    from prefdata.tokenize.template import TemplateSettings

    rewriting = (
        "{% for message in messages %}{% set text = message['content'] %}"
        "{% if message['role'] == 'assistant' and not loop.last %}{% set text = text | upper %}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + text + '<|im_end|>' + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    pt = PairTokenizer(tiny_tokenizer_dir, TokenizeSettings(template=TemplateSettings(chat_template_text=rewriting)))
    tokenized = pt.tokenize_pairs([_pair(CHAT)])[0]
    assert F.TURN_RENDERS_DIFFERENTLY in tokenized.flags
    single = {"chosen": [user("Q"), assistant("yes")], "rejected": [user("Q"), assistant("no")]}
    assert F.TURN_RENDERS_DIFFERENTLY not in pt.tokenize_pairs([_pair(single)])[0].flags

    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps(CHAT) + "\n" + json.dumps(single) + "\n", encoding="utf-8")
    template = tmp_path / "rewriting.jinja"
    template.write_text(rewriting, encoding="utf-8")
    result = prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, chat_template_file=str(template),
                     progress=False, workers=1)
    assert result.exit_code == 1 and (result.rows_out, result.rows_dropped) == (1, 1)
    dropped = [json.loads(line) for line in (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()]
    assert [d["flags"] for d in dropped] == [[F.TURN_RENDERS_DIFFERENTLY]]


def test_validate_out_keeps_a_stored_turn_renders_differently(tiny_tokenizer_dir, tmp_path):
    """A policy that only warns keeps the row; `validate OUT` (which does not render again) reports the
    flag prepare stored, as it does prompt_boundary_mismatch."""
    from prefdata.prepare import prepare
    from prefdata.validate import validate

    rewriting = (
        "{% for message in messages %}{% set text = message['content'] %}"
        "{% if message['role'] == 'assistant' and not loop.last %}{% set text = text | upper %}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + text + '<|im_end|>' + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    (tmp_path / "rewriting.jinja").write_text(rewriting, encoding="utf-8")
    (tmp_path / "warn.toml").write_text('[flags]\nturn_renders_differently = "warn"\n', encoding="utf-8")
    (tmp_path / "raw.jsonl").write_text(json.dumps(CHAT) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    result = prepare(tmp_path / "raw.jsonl", out, tokenizer=tiny_tokenizer_dir, policy=tmp_path / "warn.toml",
                     chat_template_file=str(tmp_path / "rewriting.jinja"), progress=False, workers=1)
    assert result.exit_code == 0 and result.rows_out == 1
    report = validate(out, policy=tmp_path / "warn.toml", format="json").report
    assert report["flags"][F.TURN_RENDERS_DIFFERENTLY]["count"] == 1
