"""Long trajectories' turn renders built from windows (prefdata.tokenize.turn_windows, issue 41): the
same ids, masks and flags as rendering every turn's conversation whole, for every chat template
../shared has and conversation shapes that make templates render turns differently (system messages,
user turns, reasoning, late divergence); and the work grows linearly with the trajectory, counted in
messages rendered (deterministic: no clock)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prefdata.core.errors import RecordError
from prefdata.core.records import RawRecord
from prefdata.io.formats import normalize_record
from prefdata.tokenize import turn_windows
from prefdata.tokenize.pairs import PairTokenizer
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.template import TemplateSettings

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from bench_trajectory import trajectory_pair  # noqa: E402

QWEN3_TEMPLATE = REPO / "tests" / "fixtures" / "qwen3_chat_template.jinja"
TEMPLATED = ["qwen2.5-instruct", "smollm2-135m-instruct", "mistral-7b-instruct-v0.3", "phi-3-mini-4k-instruct",
             "deepseek-r1-distill-qwen", "cogito-v1-preview-qwen-14b", "qwen3"]


def _chat(variant: str, system: bool, reasoning: bool) -> list[dict]:
    """A multi-turn chat whose completion holds user turns; halves differ from the first assistant turn."""
    out = [{"role": "system", "content": "Be brief."}] if system else []
    out.append({"role": "user", "content": "Hi"})
    for turn in range(7):
        message = {"role": "assistant", "content": f"[{variant}] answer {turn}"}
        if reasoning:
            message["reasoning_content"] = f"thinking about {turn}"
        out += [message, {"role": "user", "content": f"question {turn}"}]
    return out + [{"role": "assistant", "content": f"[{variant}] last"}]


def _late(messages: int) -> dict:
    """Trajectories that share their first ten messages and differ after them."""
    row = trajectory_pair(messages)
    shared = row["chosen"][:10]
    return {**row, "chosen": shared + row["chosen"][10:], "rejected": shared + row["rejected"][10:]}


ROWS = {
    "trajectory": trajectory_pair(30),
    "late": _late(40),
    "chat": {"chosen": _chat("a", False, False), "rejected": _chat("b", False, False)},
    "system_chat": {"chosen": _chat("a", True, False), "rejected": _chat("b", True, False)},
    "reasoning_chat": {"chosen": _chat("a", True, True), "rejected": _chat("b", True, True)},
}


def _tokenizer(shared_tokenizer, name: str) -> PairTokenizer:
    if name == "qwen3":
        if not QWEN3_TEMPLATE.is_file():
            pytest.skip("tests/fixtures/qwen3_chat_template.jinja is missing")
        settings = TokenizeSettings(template=TemplateSettings(chat_template_file=str(QWEN3_TEMPLATE)))
        tokenizer = PairTokenizer(shared_tokenizer("qwen2.5-instruct"), settings)
    else:
        tokenizer = PairTokenizer(shared_tokenizer(name), TokenizeSettings())
    tokenizer.setup()
    return tokenizer


def _prepared(tokenizer: PairTokenizer, row: dict, windows_from: int, monkeypatch) -> object:
    monkeypatch.setattr(turn_windows, "WINDOWED_MIN_TURNS", windows_from)
    result = tokenizer.tokenize_pairs_or_errors([normalize_record(RawRecord("t.jsonl", 1, row))])[0]
    return str(result) if isinstance(result, RecordError) else result


@pytest.mark.parametrize("name", TEMPLATED)
def test_windows_give_what_whole_renders_give(name, shared_tokenizer, monkeypatch):
    tokenizer = _tokenizer(shared_tokenizer, name)
    for shape, row in ROWS.items():
        windowed = _prepared(tokenizer, row, 1, monkeypatch)
        whole = _prepared(tokenizer, row, 10**9, monkeypatch)
        assert windowed == whole, f"{name}, {shape}: windowed turn renders changed the output"


def _messages_rendered(tokenizer: PairTokenizer, messages: int, monkeypatch) -> int:
    rendered = 0
    render = tokenizer._render

    def counting(conversations, generation_prompt, tools=None):
        nonlocal rendered
        rendered += sum(len(c) for c in conversations)
        return render(conversations, generation_prompt, tools)

    monkeypatch.setattr(tokenizer, "_render", counting)
    result = tokenizer.tokenize_pairs([normalize_record(RawRecord("t.jsonl", 1, trajectory_pair(messages)))])[0]
    assert result.chosen_loss_mask is not None and not result.flags
    monkeypatch.undo()
    return rendered


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "qwen3"])
def test_a_999_message_pair_renders_linearly_many_messages(name, shared_tokenizer, monkeypatch):
    """Rendering each turn's conversation whole renders ~25x the messages for 999 messages as for 200
    (quadratic); windows render ~5x. The bound catches the quadratic path coming back."""
    tokenizer = _tokenizer(shared_tokenizer, name)
    short = _messages_rendered(tokenizer, 200, monkeypatch)
    long = _messages_rendered(tokenizer, 999, monkeypatch)
    assert long / short < 8, f"{long} messages rendered for 999, {short} for 200: quadratic in turns"
    assert long < 40 * 999, f"{long} messages rendered for a 999-message pair"
