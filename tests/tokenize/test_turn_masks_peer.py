"""Peer check of the loss masks of multi-turn completions (issue 40 item 1): for the agent trajectories
in examples/agent, a trajectory whose first model turn is text plus a tool call, and a system message
that a template moves, the tokens prefdata trains on (mask 1) equal what an independent computation
gives, for every tokenizer in ../shared and for Qwen3's chat template (Qwen2.5's vocabulary, the
template in tests/fixtures/qwen3_chat_template.jinja).

The independent computation never uses prefdata's renders: it renders the whole conversation once
with transformers, and trains, as TRL's completion-only collator does with a response template, every
span from an assistant header (the template's own marker, in the table below) to the end-of-turn token
after it; where the rest of the render after the last turn is an end of sequence, it belongs to that
turn. For SmolLM3, whose template has `{% generation %}` blocks, the trained tokens also equal
transformers' assistant masks (TRL's `assistant_only_loss`) less the role header each block opens with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefdata.core import flags as F
from prefdata.core.errors import RecordError
from prefdata.core.records import RawRecord
from prefdata.io.formats import normalize_record
from prefdata.tokenize.pairs import PairTokenizer
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.template import TemplateSettings, pinned_clock

REPO = Path(__file__).resolve().parents[2]
QWEN3_TEMPLATE = REPO / "tests" / "fixtures" / "qwen3_chat_template.jinja"

CHATML = (("<|im_start|>assistant\n",), ("<|im_end|>",))
# Per template: the markers after which an assistant turn starts, and the tokens that end one.
MARKERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "qwen3": CHATML,
    "qwen2.5-instruct": CHATML,
    "cogito-v1-preview-qwen-14b": CHATML,
    "smollm2-135m-instruct": CHATML,
    "smollm3-3b": CHATML,
    "phi-3-mini-4k-instruct": (("<|assistant|>\n",), ("<|end|>",)),
    "mistral-7b-instruct-v0.3": (("[/INST]", "[/TOOL_RESULTS]"), ("</s>",)),
    "deepseek-r1-distill-qwen": (("<｜Assistant｜>", "<｜tool▁outputs▁end｜>"), ("<｜end▁of▁sentence｜>",)),
}


def _call(call_id: str, name: str, args: dict[str, Any], text: str = "") -> dict[str, Any]:
    return {"role": "assistant", "content": text,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]}


def _tool(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


_TOOLS = [{"type": "function", "function": {"name": name, "description": name, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}} for name in ("get_weather", "get_time")]
_ASK = {"role": "user", "content": "Weather in Paris?"}
# Text and a tool call in one model turn, its result, the final answer (Qwen3 renders the first turn
# differently once the answer follows).
TEXT_AND_CALL = {
    "id": "text-and-call", "tools": _TOOLS,
    "chosen": [_ASK, _call("c1", "get_weather", {"city": "Paris"}, "Let me check."), _tool("c1", "14C, cloudy"),
               {"role": "assistant", "content": "It is 14C and cloudy."}],
    "rejected": [_ASK, _call("c1", "get_time", {"city": "Paris"}, "One moment."), _tool("c1", "14:02"),
                 {"role": "assistant", "content": "It is two o'clock."}],
}
# The same with calls only and 9-character ids: what Mistral's template accepts.
CALL_ONLY = {
    "id": "call-only", "tools": _TOOLS,
    "chosen": [_ASK, _call("call00001", "get_weather", {"city": "Paris"}), _tool("call00001", "14C, cloudy"),
               {"role": "assistant", "content": "It is 14C and cloudy."}],
    "rejected": [_ASK, _call("call00001", "get_time", {"city": "Paris"}), _tool("call00001", "14:02"),
                 {"role": "assistant", "content": "It is two o'clock."}],
}
# A developer message (read as system) and a user turn inside the completion: Mistral's template puts the
# system text into the last user turn, so the prompt renders differently once the completion follows.
DEVELOPER = {
    "id": "developer",
    "chosen": [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "Bye"},
               {"role": "assistant", "content": "Au revoir !"}],
    "rejected": [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"},
                 {"role": "assistant", "content": "Goodbye!"}],
}


# A system message, tools and a user turn inside the completion: Mistral moves both the system text
# and the tools list into that last user turn, two blocks out of the prompt's own render.
AGENT_THEN_USER = {
    "id": "agent-then-user", "tools": _TOOLS,
    "chosen": [{"role": "system", "content": "Be brief."}, _ASK, _call("call00001", "get_weather", {"city": "Paris"}),
               _tool("call00001", "14C"), {"role": "assistant", "content": "Mild."},
               {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Welcome."}],
    "rejected": [{"role": "system", "content": "Be brief."}, _ASK, _call("call00001", "get_time", {"city": "Paris"}),
                 _tool("call00001", "14:02"), {"role": "assistant", "content": "Two o'clock."},
                 {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Sure."}],
}


def _rows() -> list[dict[str, Any]]:
    path = REPO / "examples" / "agent" / "trajectories.jsonl"
    shipped = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return shipped + [TEXT_AND_CALL, CALL_ONLY, DEVELOPER, AGENT_THEN_USER]


_TOKENIZERS: dict[str, PairTokenizer] = {}


def _pair_tokenizer(name: str, shared_tokenizer) -> PairTokenizer:
    if name not in _TOKENIZERS:
        if name == "qwen3":
            template = TemplateSettings(chat_template_text=QWEN3_TEMPLATE.read_text(encoding="utf-8"))
            pt = PairTokenizer(shared_tokenizer("qwen2.5-instruct"), TokenizeSettings(template=template))
        else:
            pt = PairTokenizer(shared_tokenizer(name), TokenizeSettings())
        pt.setup()
        _TOKENIZERS[name] = pt
    return _TOKENIZERS[name]


def _only_end_of_sequence(text: str, specials: list[str]) -> bool:
    for special in sorted(specials, key=len, reverse=True):
        text = text.replace(special, "")
    return not text.strip()


def expected_spans(full: str, completion_start: int, starts_with_model: bool, name: str,
                   specials: list[str]) -> list[tuple[int, int]]:
    """Character spans of the assistant turns in the completion part of `full`, from the template's markers."""
    headers, ends = MARKERS[name]
    starts = [completion_start] if starts_with_model else []
    for header in headers:  # a header ending where the completion starts opens its first turn
        at = full.find(header, max(completion_start - len(header), 0))
        while at >= 0:
            starts.append(at + len(header))
            at = full.find(header, at + 1)
    spans = []
    for start in sorted(set(starts)):
        stop = min((found + len(end) for end in ends if (found := full.find(end, start)) >= 0), default=len(full))
        if _only_end_of_sequence(full[stop:], specials):
            stop = len(full.rstrip())
        spans.append((start, stop))
    return spans


def _mask_of(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    return [int(any(begin < stop and end > start for start, stop in spans) and end > begin)
            for begin, end in offsets]


def _as_template_reads(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's `developer` role is a system message to every template here (docs/formats.md: message roles)."""
    return [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]


def _full_render(pt: PairTokenizer, messages: list[dict[str, Any]], tools: Any) -> str:
    with pinned_clock(pt._day):  # SmolLM3 prints the date; prefdata pins it, so does this render
        return pt.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **pt._render_kwargs)


@pytest.mark.parametrize("name", sorted(MARKERS))
def test_trained_tokens_equal_an_independent_render_of_each_assistant_turn(name, shared_tokenizer):
    if not QWEN3_TEMPLATE.is_file():
        pytest.skip("tests/fixtures/qwen3_chat_template.jinja is missing")
    pt = _pair_tokenizer(name, shared_tokenizer)
    tok = pt.tokenizer
    specials = list(tok.get_added_vocab())
    checked = 0
    for row in _rows():
        pair = normalize_record(RawRecord("t.jsonl", 1, row))
        result = pt.tokenize_pairs_or_errors([pair])[0]
        if isinstance(result, RecordError):  # a template that refuses the row (Mistral's 9-character ids)
            assert "\n" not in str(result) and str(result).startswith("chat template failed")
            continue
        assert F.TURN_RENDERS_DIFFERENTLY not in result.flags, (name, row["id"])
        if pair.chosen_messages[0]["role"] != "assistant":  # split at a tool result: dropped, never trained
            assert F.ENVIRONMENT_DIFFERS in pair.flags or F.DIVERGES_AT_NON_MODEL_TURN in pair.flags
            continue
        assert F.PROMPT_BOUNDARY_MISMATCH not in result.flags, (name, row["id"])
        for half in ("chosen", "rejected"):
            completion = getattr(pair, f"{half}_messages")
            messages = _as_template_reads((row.get("prompt") or []) + row[half])
            full = _full_render(pt, messages, row.get("tools"))
            encoding = tok(full, add_special_tokens=False, return_offsets_mapping=True)
            ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
            prompt_ids = list(result.prompt_ids)
            completion_ids = list(getattr(result, f"{half}_ids"))
            assert ids[: len(prompt_ids)] == prompt_ids, (name, row["id"], half)
            here = slice(len(prompt_ids), len(prompt_ids) + len(completion_ids))
            assert ids[here] == completion_ids, (name, row["id"], half)
            spans = expected_spans(full, offsets[len(prompt_ids)][0], completion[0]["role"] == "assistant", name,
                                   specials)
            expected = _mask_of(offsets[here], spans)
            mask = getattr(result, f"{half}_loss_mask") or [1] * len(completion_ids)
            assert mask == expected, (name, row["id"], half, _show(tok, completion_ids, mask, expected))
            assert sum(mask) > 0
            checked += 1
    assert checked >= 6


def _show(tok: Any, ids: list[int], mask: list[int], expected: list[int]) -> str:
    """The completion with prefdata's trained tokens in [ ] and the expected ones in { }."""
    out = []
    for token, got, want in zip(ids, mask, expected):
        text = tok.decode([token])
        out.append(f"[{text}]" if got and want else f"<got:{text}>" if got else f"<want:{text}>" if want else text)
    return "".join(out)


def test_smollm3_masks_equal_its_generation_blocks(shared_tokenizer):
    """TRL's assistant-only loss reads `{% generation %}` blocks through transformers' assistant masks:
    prefdata trains the same tokens, less the '<|im_start|>assistant\\n' header each block opens with and
    the '\\n' it ends with."""
    pt = _pair_tokenizer("smollm3-3b", shared_tokenizer)
    tok = pt.tokenizer
    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for row in _rows():
        pair = normalize_record(RawRecord("t.jsonl", 1, row))
        result = pt.tokenize_pairs([pair])[0]
        for half in ("chosen", "rejected"):
            messages = _as_template_reads((row.get("prompt") or []) + row[half])
            with pinned_clock(pt._day):
                rendered = tok.apply_chat_template(messages, tools=row.get("tools"), tokenize=True, return_dict=True,
                                                   return_assistant_tokens_mask=True, **pt._render_kwargs)
            ids, blocks = list(rendered["input_ids"]), list(rendered["assistant_masks"])
            for i in range(len(ids) - len(header) + 1):  # the header opening each block: not the model's text
                if ids[i : i + len(header)] == header and all(blocks[i : i + len(header)]):
                    blocks[i : i + len(header)] = [0] * len(header)
            for i in range(len(ids) - 1):  # the '\n' after <|im_end|> separates turns: not the model's either
                if ids[i] == end and blocks[i + 1] and not tok.decode([ids[i + 1]]).strip():
                    blocks[i + 1] = 0
            n = len(result.prompt_ids)
            completion_ids = list(getattr(result, f"{half}_ids"))
            assert ids[n : n + len(completion_ids)] == completion_ids
            mask = getattr(result, f"{half}_loss_mask") or [1] * len(completion_ids)
            assert mask == blocks[n : n + len(completion_ids)], (row["id"], half)


_WORDS = st.sampled_from(["Let me check.", "ok", "It rains.", "14C", "Paris 🙂", "x = 1", "\nLeading newline", "Done."])


@st.composite
def _trajectories(draw):
    """A user question, then per half: model turns (text, a tool call, reasoning, in any mix) with tool
    results or user turns between them, ending in an answer; the halves differ in their first turn."""
    halves = []
    for side in range(2):
        messages = []
        for step in range(draw(st.integers(0, 3))):
            turn: dict[str, Any] = {"role": "assistant", "content": draw(st.sampled_from(["", "Let me check."]))}
            if draw(st.booleans()):
                turn["reasoning_content"] = draw(_WORDS)
            if draw(st.booleans()) or not turn["content"]:
                call_id = f"c{step}"
                turn["tool_calls"] = [{"id": call_id, "type": "function",
                                       "function": {"name": "get_weather", "arguments": {"city": draw(_WORDS)}}}]
                messages += [turn, _tool(call_id, draw(_WORDS))]
            else:
                messages += [turn, {"role": "user", "content": draw(_WORDS)}]
        messages.append({"role": "assistant", "content": draw(_WORDS)})
        messages[0] = {**messages[0], "content": messages[0]["content"] + (" A" if side == 0 else " B")}
        halves.append(messages)
    ask = [{"role": "user", "content": draw(_WORDS)}]
    return {"id": "generated", "tools": _TOOLS, "chosen": ask + halves[0], "rejected": ask + halves[1]}


@given(row=_trajectories())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_qwen3_masks_of_generated_trajectories_equal_the_independent_render(shared_tokenizer, row):
    pt = _pair_tokenizer("qwen3", shared_tokenizer)
    tok = pt.tokenizer
    pair = normalize_record(RawRecord("t.jsonl", 1, row))
    result = pt.tokenize_pairs([pair])[0]
    assert F.TURN_RENDERS_DIFFERENTLY not in result.flags
    for half in ("chosen", "rejected"):
        completion = getattr(pair, f"{half}_messages")
        full = _full_render(pt, row[half], row["tools"])
        encoding = tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        n, completion_ids = len(result.prompt_ids), list(getattr(result, f"{half}_ids"))
        assert ids[: n + len(completion_ids)] == list(result.prompt_ids) + completion_ids
        spans = expected_spans(full, offsets[n][0], completion[0]["role"] == "assistant", "qwen3",
                               list(tok.get_added_vocab()))
        mask = getattr(result, f"{half}_loss_mask") or [1] * len(completion_ids)
        assert mask == _mask_of(offsets[n : n + len(completion_ids)], spans), _show(
            tok, completion_ids, mask, _mask_of(offsets[n : n + len(completion_ids)], spans))


# No leading newline here: ChatML's '\n' header end and a '\n' opening the answer tokenize together
# ('\n\n'), which prefdata flags as prompt_boundary_mismatch; that is not what this test is about.
_CHAT_WORDS = st.sampled_from(["Let me check.", "ok", "It rains.", "14C", "Paris 🙂", "x = 1", "Done."])


@st.composite
def _chats(draw):
    """Chats with an optional system (or developer) message and user turns inside the completions."""
    lead = []
    if draw(st.booleans()):
        lead.append({"role": draw(st.sampled_from(["system", "developer"])), "content": "Be brief."})
    lead.append({"role": "user", "content": draw(_CHAT_WORDS)})
    turns = draw(st.integers(1, 3))
    halves = []
    for side in ("A", "B"):
        messages = [{"role": "assistant", "content": f"{draw(_CHAT_WORDS)} {side}"}]
        for _ in range(turns - 1):
            messages += [{"role": "user", "content": draw(_CHAT_WORDS)}, {"role": "assistant", "content": draw(_CHAT_WORDS)}]
        halves.append(messages)
    return {"id": "generated", "chosen": lead + halves[0], "rejected": lead + halves[1]}


@pytest.mark.parametrize("name", sorted(MARKERS))
@given(row=_chats())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_masks_of_generated_chats_equal_the_independent_render(shared_tokenizer, name, row):
    pt = _pair_tokenizer(name, shared_tokenizer)
    tok = pt.tokenizer
    pair = normalize_record(RawRecord("t.jsonl", 1, row))
    result = pt.tokenize_pairs([pair])[0]
    assert F.TURN_RENDERS_DIFFERENTLY not in result.flags and F.PROMPT_BOUNDARY_MISMATCH not in result.flags
    for half in ("chosen", "rejected"):
        full = _full_render(pt, _as_template_reads(row[half]), None)
        encoding = tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        n, completion_ids = len(result.prompt_ids), list(getattr(result, f"{half}_ids"))
        assert ids[: n + len(completion_ids)] == list(result.prompt_ids) + completion_ids
        spans = expected_spans(full, offsets[n][0], True, name, list(tok.get_added_vocab()))
        expected = _mask_of(offsets[n : n + len(completion_ids)], spans)
        mask = getattr(result, f"{half}_loss_mask") or [1] * len(completion_ids)
        assert mask == expected, _show(tok, completion_ids, mask, expected)
