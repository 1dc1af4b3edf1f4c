"""System and `developer` messages (issue 41 item 9). `developer` (OpenAI's newer name for system) is
read as a system message. A template that ignores one (SmolLM3 reads only a first system message)
flags the row `system_lost` instead of training without it silently; a template that moves it
(Mistral puts the system text into the last user turn) keeps the prompt/completion boundary at a
token boundary and every assistant turn in the loss. Real SmolLM3, Mistral and Qwen2.5 tokenizers."""

from __future__ import annotations

import json

import pytest

from prefdata.core import flags as F
from prefdata.core.records import RawRecord
from prefdata.io.formats import normalize_record
from prefdata.tokenize.pairs import PairTokenizer
from prefdata.tokenize.settings import TokenizeSettings

_CACHE: dict[str, PairTokenizer] = {}


def _tokenizer(path: str) -> PairTokenizer:
    if path not in _CACHE:
        _CACHE[path] = PairTokenizer(path, TokenizeSettings())
        _CACHE[path].setup()
    return _CACHE[path]


def _msg(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


def _row(lead: list[dict[str, str]], chosen: list[str], rejected: list[str]) -> dict:
    """A row whose halves answer after `lead`, with a user turn between answers when there are two."""
    def half(answers: list[str]) -> list[dict[str, str]]:
        turns = [_msg("assistant", answers[0])]
        for answer in answers[1:]:
            turns += [_msg("user", "And then?"), _msg("assistant", answer)]
        return lead + turns
    return {"chosen": half(chosen), "rejected": half(rejected)}


def _tokenize(path: str, row: dict):
    pt = _tokenizer(path)
    return pt, pt.tokenize_pairs([normalize_record(RawRecord("t.jsonl", 1, row))])[0]


DEVELOPER = _msg("developer", "Answer in French.")
HI = _msg("user", "Hi")


@pytest.mark.parametrize("lead, lost", [
    ([DEVELOPER, HI], False),  # a first developer message is SmolLM3's system message
    ([_msg("system", "You are terse."), DEVELOPER, HI], True),  # a second one: SmolLM3 drops it
    ([HI, DEVELOPER], True),  # one after the user turn: dropped too
])
def test_smollm3_flags_a_developer_message_it_does_not_render(shared_tokenizer, lead, lost):
    pt, tokenized = _tokenize(shared_tokenizer("smollm3-3b"), _row(lead, ["Bonjour !"], ["Hello!"]))
    prompt = pt.tokenizer.decode(tokenized.prompt_ids)
    assert ("Answer in French." not in prompt) == lost
    assert (F.SYSTEM_LOST in tokenized.flags) == lost


def test_a_template_that_renders_every_system_message_is_not_flagged(shared_tokenizer):
    pt, tokenized = _tokenize(shared_tokenizer("qwen2.5-instruct"),
                              _row([_msg("system", "You are terse."), DEVELOPER, HI], ["Bonjour !"], ["Hello!"]))
    assert "Answer in French." in pt.tokenizer.decode(tokenized.prompt_ids)
    assert F.SYSTEM_LOST not in tokenized.flags


def test_mistral_moves_the_developer_text_but_keeps_the_boundary_and_every_turn(shared_tokenizer):
    """Mistral renders the system text in the last user turn: in a multi-turn completion that turn is
    in the completion. The prompt ends at its [/INST] in both halves (not mid-instruction), and both
    assistant turns are trained; the developer text stays in the tokens, as context."""
    row = _row([DEVELOPER, HI], ["Bonjour !", "Au revoir !"], ["Hello!", "Goodbye!"])
    pt, tokenized = _tokenize(shared_tokenizer("mistral-7b-instruct-v0.3"), row)
    tok = pt.tokenizer
    assert tok.decode(tokenized.prompt_ids).endswith("[/INST]")
    assert not {F.PROMPT_BOUNDARY_MISMATCH, F.SYSTEM_LOST, F.TURN_RENDERS_DIFFERENTLY} & set(tokenized.flags)
    for half, answers in (("chosen", ["Bonjour !", "Au revoir !"]), ("rejected", ["Hello!", "Goodbye!"])):
        ids, mask = getattr(tokenized, f"{half}_ids"), getattr(tokenized, f"{half}_loss_mask")
        trained = tok.decode([t for t, m in zip(ids, mask) if m]).replace(" ", "")
        untrained = tok.decode([t for t, m in zip(ids, mask) if not m])
        assert trained == "".join(a.replace(" ", "") + "</s>" for a in answers)
        assert "Answer in French." in untrained and "And then?" in untrained
        whole = tok.apply_chat_template([_msg("system", "Answer in French."), HI] + row[half][2:], tokenize=False)
        assert tok.encode(whole, add_special_tokens=False) == list(tokenized.prompt_ids) + list(ids)


def test_prepare_refuses_rows_whose_system_message_the_template_drops(tmp_path, shared_tokenizer):
    from prefdata.prepare import prepare

    raw = tmp_path / "raw.jsonl"
    rows = [_row([_msg("system", "You are terse."), DEVELOPER, HI], ["Bonjour !"], ["Hello!"]),
            _row([DEVELOPER, HI], ["Bonjour !"], ["Hello!"])]
    raw.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    result = prepare(raw, tmp_path / "out", tokenizer=shared_tokenizer("smollm3-3b"), progress=False, workers=1)
    assert result.exit_code == 1 and (result.rows_out, result.rows_dropped) == (1, 1)
    dropped = [json.loads(line) for line in (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()]
    assert [(d["source_line"], d["flags"]) for d in dropped] == [(1, [F.SYSTEM_LOST])]
