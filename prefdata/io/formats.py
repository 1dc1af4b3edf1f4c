"""Turn one raw record into a canonical `Pair`, detecting its input shape per row.

Shapes (README.md, "Input formats"): explicit strings, conversational (TRL), implicit-prompt HH transcripts,
conversational implicit prompt (UltraFeedback-binarized), ShareGPT (LLaMA-Factory), OpenAI/Azure
DPO, pre-tokenized, and LLaMA-Factory's alpaca preference rows (`instruction`/`input`).

A row that cannot be used raises RecordError with a one-line reason naming the field; a valid
object that is no preference data at all (KTO, SFT, prompt-only rows) raises UnknownShapeError.
This runs per row, so it uses plain type checks and dict lookups.
"""

from __future__ import annotations

import json
from typing import Any

from prefdata.core import flags
from prefdata.core.errors import RecordError, UnknownShapeError
from prefdata.core.reasoning import REASONING_FIELDS, THINK_CLOSE, THINK_OPEN
from prefdata.core.records import Message, Pair, RawRecord
from prefdata.io.images import IMAGE_COLUMNS, image_refs
from prefdata.io.json_decode import TOO_DEEP, nesting_exceeds

HH_ASSISTANT = "\n\nAssistant:"
IMAGE_MARK = "<image>"  # an image part in text (reports, text checks); the images' bytes go in the digests
HH_HUMAN = "\n\nHuman:"
MAX_TOKEN_ID = 2**31 - 1  # token ids are stored as int32/int64; larger values are garbage

# Role names as they appear in the wild, mapped to the four chat-template roles.
ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for system
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "bot": "assistant",
    "model": "assistant",  # Gemini
    "function_call": "assistant",  # ShareGPT: the assistant calling a tool
    "tool": "tool",
    "observation": "tool",  # ShareGPT: the tool's answer
    "function": "tool",
    "ipython": "tool",  # Llama 3
}

_PREFERENCE_KEYS = ("chosen", "rejected", "preferred_output", "non_preferred_output", "rejected_messages")
# Fields each shape turns into the pair; the rest pass through. `tools` is read on every shape.
_CONSUMED = {
    "explicit": frozenset({"prompt", "chosen", "rejected", "tools"}),
    "alpaca": frozenset({"instruction", "input", "chosen", "rejected", "tools"}),
    "sharegpt": frozenset({"conversations", "chosen", "rejected", "system", "tools"}),
    "openai": frozenset({"input", "preferred_output", "non_preferred_output", "tools"}),
    "llamafactory_v1": frozenset({"chosen_messages", "rejected_messages", "tools"}),
    "pretokenized": frozenset(
        {"prompt_ids", "chosen_ids", "rejected_ids", "prompt", "chosen", "rejected"}
    ),
}


def normalize_record(raw: RawRecord) -> Pair:
    """The canonical pair of one record, or RecordError/UnknownShapeError with a one-line reason."""
    if raw.error is not None:
        raise RecordError(raw.error)
    row = raw.value
    if type(row) is not dict:
        raise RecordError(f"record is a {type(row).__name__}, not an object")
    if "chosen_ids" in row or "rejected_ids" in row:
        return _pretokenized(raw, row)
    if "preferred_output" in row or "non_preferred_output" in row:
        return _openai(raw, row)
    if "conversations" in row and ("chosen" in row or "rejected" in row):
        return _sharegpt(raw, row)
    if "chosen_messages" in row and "chosen" not in row:
        return _llamafactory_v1(raw, row)
    if "chosen" not in row or "rejected" not in row:
        if any(key in row for key in _PREFERENCE_KEYS):
            raise RecordError(_missing_field(row, "rejected" if "chosen" in row else "chosen"))
        raise UnknownShapeError(_unknown_shape(row))
    chosen, rejected = row["chosen"], row["rejected"]
    prompt = row.get("prompt")
    if type(prompt) is list:
        return _conversational(raw, row)
    if type(chosen) is str and type(rejected) is str:
        if "prompt" in row:
            return _explicit(raw, row)
        if "instruction" in row:
            return _alpaca(raw, row)
        return _hh(raw, row, chosen, rejected)
    if type(chosen) is list and type(rejected) is list:
        return _conversational_implicit(raw, row)
    # Report the first field with a wrong type.
    for key in ("chosen", "rejected"):
        value = row[key]
        if type(value) not in (str, list):
            raise RecordError(_type_error(key, value, "a string or a list of messages"))
    raise RecordError("fields 'chosen' and 'rejected' mix a string and a list of messages")


# ---------------------------------------------------------------------------------------------
# Helpers


def _unknown_shape(row: dict[str, Any]) -> str:
    keys = ", ".join(repr(k) for k in list(row)[:8]) or "none"
    hint = ""
    near = [f"{found!r} for {key!r}" for key in ("chosen", "rejected") if (found := _near_key(row, key))]
    if near:
        hint = f" (a typo? {', '.join(near)})"
    elif "label" in row or "completion" in row:
        hint = " (looks like unpaired KTO data)"
    elif "messages" in row or "conversations" in row or "text" in row:
        hint = " (looks like SFT data)"
    elif "prompt" in row:
        hint = " (prompt-only row)"
    return f"not preference data{hint}: no chosen/rejected fields; keys: {keys}"


def _near_key(row: dict[str, Any], key: str) -> str | None:
    """A key of the record that looks like a misspelling of `key` ('choosen' for 'chosen'), if any."""
    import difflib

    others = [k for k in row if type(k) is str and k != key]
    close = difflib.get_close_matches(key, others, n=1, cutoff=0.75)
    return close[0] if close else None


def _missing_field(row: dict[str, Any], key: str, why: str = "") -> str:
    """`missing field 'chosen'`, naming a key of the record that looks like its misspelling."""
    near = _near_key(row, key)
    return f"missing field {key!r}" + (f" (the record has {near!r}: a typo?)" if near else why)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _type_error(field: str, value: Any, expected: str) -> str:
    return f"field {field!r} must be {expected}, got {_type_name(value)}"


def _string(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if type(value) is not str:
        if key not in row:
            raise RecordError(_missing_field(row, key))
        raise RecordError(_type_error(key, value, "a string"))
    return value


def _extra(row: dict[str, Any], consumed: frozenset[str]) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key not in consumed}


def _content(value: Any, field: str, extras: dict[str, list[str]] | None = None) -> str | list[dict[str, str]]:
    """A message's text. Content parts (OpenAI `text`, LLaMA-Factory v1 `value`) are joined; v1's
    `reasoning`, `tool_calls` and `tools` parts go to `extras` (under the message field names) when
    the caller takes them, else they are refused like any other part prefdata cannot render.
    Content with `{"type": "image"}` parts stays a list of text and image parts, in order (TRL's
    conversational image rows), so the processor's template puts each placeholder where it was."""
    if type(value) is str:
        return value
    if type(value) is list:
        texts = []
        parts: list[dict[str, str]] = []  # text and image parts in order; used when an image is among them
        for i, part in enumerate(value):
            where = f"{field}[{i}]"
            kind = part.get("type", "text") if type(part) is dict else None
            if kind is None:
                raise RecordError(f"field {where!r}: unsupported content part {_type_name(part)!r}")
            if kind in _PART_FIELDS and extras is not None:
                extras.setdefault(_PART_FIELDS[kind], []).append(_part_text(part, where))
                continue
            if kind == "image":
                # Arrow input gives every part the struct's fields, unused ones null ({"text": None}).
                if any(part.get(key) is not None for key in ("image", "url", "path")):
                    raise RecordError(f"field {where!r}: an image part must not carry its image; put it in the 'images' column")
                parts.append({"type": "image"})
                continue
            if kind != "text":
                raise RecordError(f"field {where!r}: unsupported content part {kind!r}")
            text = _part_text(part, where)
            texts.append(text)
            parts.append({"type": "text", "text": text})
        if len(parts) != len(texts):
            return parts
        return "".join(texts)
    if value is None:
        raise RecordError(f"field {field!r} is null")
    raise RecordError(_type_error(field, value, "a string"))


# LLaMA-Factory v1 content parts that are not text, and the message field each one fills.
_PART_FIELDS = {"reasoning": "reasoning_content", "tool_calls": "tool_calls", "tools": "tools"}


def _part_text(part: dict[str, Any], where: str) -> str:
    text = part.get("text", part.get("value"))
    if type(text) is not str:
        raise RecordError(_type_error(f"{where}.text", text, "a string"))
    return text


def _json_value(value: Any, field: str) -> Any:
    """A field that may hold JSON text (LLaMA-Factory and many exports store tools that way)."""
    if type(value) is not str:
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        raise RecordError(f"field {field!r} is not valid JSON") from None
    except RecursionError:
        raise RecordError(f"field {field!r} is JSON text with {TOO_DEEP}") from None
    if nesting_exceeds(parsed, value):  # as deep records are (io.json_decode.MAX_NESTING)
        raise RecordError(f"field {field!r} is JSON text with {TOO_DEEP}")
    return parsed


def _tool_calls(value: Any, field: str) -> list[dict[str, Any]]:
    """Tool calls in OpenAI's shape: [{"type": "function", "function": {"name", "arguments"}, "id"?}].

    Accepts a JSON string, one call or a list, and flat {"name", "arguments"} calls. `arguments` is
    stored as JSON text (one Arrow type for every row): an object is serialized, a string kept as
    written, so invalid JSON reaches the `tool_call_invalid` check instead of vanishing here."""
    value = _json_value(value, field)
    calls = [value] if type(value) is dict else value
    if type(calls) is not list:
        raise RecordError(_type_error(field, value, "a list of tool calls"))
    out: list[dict[str, Any]] = []
    for i, call in enumerate(calls):
        where = f"{field}[{i}]"
        if type(call) is not dict:
            raise RecordError(_type_error(where, call, "a tool call object"))
        function = call.get("function", call)
        if type(function) is not dict:
            raise RecordError(_type_error(f"{where}.function", function, "an object"))
        name = function.get("name")
        if type(name) is not str:
            raise RecordError(_type_error(f"{where}.function.name", name, "a string"))
        arguments = function.get("arguments", function.get("parameters"))
        if type(arguments) is not str:
            arguments = "{}" if arguments is None else json.dumps(arguments, ensure_ascii=False)
        normalized: dict[str, Any] = {
            "type": call.get("type") or "function", "function": {"name": name, "arguments": arguments},
        }
        if type(call.get("id")) is str:
            normalized["id"] = call["id"]
        out.append(normalized)
    return out


def _tools(value: Any, field: str = "tools") -> list[Any] | None:
    """A row's tool schemas (a list, or JSON text of one), as the template's `tools` argument."""
    if value is None:
        return None
    value = _json_value(value, field)
    if type(value) is dict:
        value = [value]
    if type(value) is not list or any(type(tool) is not dict for tool in value):
        raise RecordError(_type_error(field, value, "a list of tool schemas"))
    return value or None


def _message(item: Any, field: str, tools_out: list[Any] | None = None) -> Message:
    """One message with every field a chat template reads (records.Message); roles normalized.

    Reasoning is read from `reasoning_content`, `thinking` or `reasoning` and recorded as
    `reasoning_content`; inline `<think>` stays in the content as written (prefdata.core.reasoning
    finds it). An assistant turn that only calls tools may have no content."""
    if type(item) is not dict:
        raise RecordError(_type_error(field, item, "a message object"))
    role = item.get("role", item.get("from"))
    if role is None:
        raise RecordError(f"field {field!r}: message has no role")
    if type(role) is not str:
        raise RecordError(_type_error(f"{field}.role", role, "a string"))
    mapped = ROLE_ALIASES.get(role) or ROLE_ALIASES.get(role.strip().lower())
    if mapped is None:
        raise RecordError(f"field {field!r}: unknown role {role[:40]!r}")
    parts: dict[str, list[str]] = {}
    key = "content" if "content" in item else "value" if "value" in item else None
    raw_calls = item.get("tool_calls")
    if key is None or (item[key] is None and raw_calls):
        if not raw_calls:
            raise RecordError(f"field {field!r}: message has no content")
        content = ""
    else:
        content = _content(item[key], f"{field}.{key}", parts if tools_out is not None else None)
    message: Message = {"role": mapped, "content": content}
    if len(item) == 2 and key is not None and not parts:  # role and content only: the common case
        return message
    reasoning = next((item[name] for name in REASONING_FIELDS if item.get(name) is not None), None)
    if "reasoning_content" in parts:
        reasoning = "".join(parts["reasoning_content"])
    if reasoning is not None:
        if type(reasoning) is not str:
            raise RecordError(_type_error(f"{field}.reasoning_content", reasoning, "a string"))
        message["reasoning_content"] = reasoning
    calls = [call for text in parts.get("tool_calls", []) for call in _tool_calls(text, f"{field}.tool_calls")]
    if raw_calls:
        calls += _tool_calls(raw_calls, f"{field}.tool_calls")
    if calls:
        message["tool_calls"] = calls
    for name in ("tool_call_id", "name"):
        if type(item.get(name)) is str:
            message[name] = item[name]
    if tools_out is not None:
        for text in parts.get("tools", []):
            tools_out.extend(_tools(text, f"{field}.tools") or [])
    return message


def _messages(value: Any, field: str, single_ok: bool = False, tools_out: list[Any] | None = None) -> list[Message]:
    """Validated messages (records.Message) with normalized roles."""
    if single_ok and type(value) is dict:
        return [_message(value, field, tools_out)]
    if type(value) is not list:
        if value is None:
            raise RecordError(f"field {field!r} is null")
        raise RecordError(_type_error(field, value, "a list of messages"))
    if not value:
        raise RecordError(f"field {field!r} is an empty list of messages")
    return [_message(item, f"{field}[{i}]", tools_out) for i, item in enumerate(value)]


def _completion_messages(value: Any, field: str) -> list[Message]:
    """A completion next to a message-list prompt: messages, one message, or a plain string."""
    if type(value) is str:
        return [{"role": "assistant", "content": value}]
    return _messages(value, field, single_ok=True)


def _require_assistant(messages: list[Message], field: str) -> None:
    for message in messages:
        if message["role"] == "assistant":
            return
    raise RecordError(f"field {field!r} has no assistant message")


def message_text(message: Message) -> str:
    """A message's text as the text checks and reports see it: its reasoning (as an inline think
    block) and its tool calls are part of it, so two halves that differ only there are not equal."""
    content = message.get("content") or ""
    if type(content) is list:  # image parts: each image is one IMAGE_MARK in the text checks' view
        content = "".join(IMAGE_MARK if part["type"] == "image" else part["text"] for part in content)
    if len(message) == 2:
        return content
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        content = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{content}"
    for call in message.get("tool_calls") or ():
        function = call["function"]
        content += f'\n<tool_call>{{"name": {json.dumps(function["name"], ensure_ascii=False)}, "arguments": {function["arguments"]}}}</tool_call>'
    return content


def _render(messages: list[Message]) -> str:
    return "\n\n".join(f"{m['role']}: {message_text(m)}" for m in messages)


def _completion_text(messages: list[Message]) -> str:
    if len(messages) == 1 and messages[0]["role"] == "assistant":
        return message_text(messages[0])
    return _render(messages)


def text_of(value: Any, completion: bool) -> str:
    """The plain text of a stored text column value: a string as is, a message list as rendered for
    text-level checks (what `normalize_record` puts in `Pair.prompt`/`chosen`/`rejected`)."""
    if type(value) is list:
        messages = [m for m in value if type(m) is dict]
        return _completion_text(messages) if completion else _render(messages)
    return value if type(value) is str else ""


def _assistant_turns(messages: list[Message]) -> int:
    return sum(1 for m in messages if m["role"] == "assistant")


def _message_pair(
    raw: RawRecord,
    row: dict[str, Any],
    shape: str,
    consumed: frozenset[str],
    prompt: list[Message],
    chosen: list[Message],
    rejected: list[Message],
    fields: tuple[str, str] = ("chosen", "rejected"),
    tools: list[Any] | None = None,
) -> Pair:
    _require_assistant(chosen, fields[0])
    _require_assistant(rejected, fields[1])
    pair = Pair(
        tools=tools if tools is not None else _tools(row.get("tools")),
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=_render(prompt),
        chosen=_completion_text(chosen),
        rejected=_completion_text(rejected),
        prompt_messages=prompt,
        chosen_messages=chosen,
        rejected_messages=rejected,
        extra=_extra(row, consumed),
        shape=shape,
    )
    if _assistant_turns(chosen) > 1 or _assistant_turns(rejected) > 1:
        pair.flags.append(flags.MULTI_TURN_COMPLETION)
    for messages in (prompt, chosen, rejected):
        for message in messages:
            if type(message["content"]) is list:
                pair.image_parts += sum(1 for part in message["content"] if part["type"] == "image")
    return _take_images(pair)


def _take_images(pair: Pair) -> Pair:
    """Image pairs: the `images` (or `image`) column is the pair's, not a pass-through, so that a row
    with images is never tokenized as text alone (its placeholders are checked, its images counted)."""
    for name in IMAGE_COLUMNS:
        if name in pair.extra:
            value = pair.extra.pop(name)
            if value is not None and value != []:
                pair.images = image_refs(value, name)
            break
    return pair


# ---------------------------------------------------------------------------------------------
# Shapes


def _explicit(raw: RawRecord, row: dict[str, Any]) -> Pair:
    prompt = row["prompt"]
    if type(prompt) is not str:
        raise RecordError(_type_error("prompt", prompt, "a string or a list of messages"))
    return _take_images(Pair(
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=prompt,
        chosen=row["chosen"],
        rejected=row["rejected"],
        extra=_extra(row, _CONSUMED["explicit"]),
        shape="explicit",
        tools=_tools(row.get("tools")),
    ))


def _alpaca(raw: RawRecord, row: dict[str, Any]) -> Pair:
    instruction = _string(row, "instruction")
    extra_input = row.get("input", "")
    if extra_input is None:
        extra_input = ""
    if type(extra_input) is not str:
        raise RecordError(_type_error("input", extra_input, "a string"))
    prompt = f"{instruction}\n{extra_input}" if extra_input else instruction
    return Pair(
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=prompt,
        chosen=row["chosen"],
        rejected=row["rejected"],
        extra=_extra(row, _CONSUMED["alpaca"]),
        shape="alpaca",
        tools=_tools(row.get("tools")),
    )


def _common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix, by binary search over C-speed slice compares."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # invariant: a[:low] == b[:low], a[:high+1] != b[:high+1]
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def split_hh(chosen: str, rejected: str) -> tuple[str, str, str, bool]:
    """Split two HH-RLHF transcripts into (prompt, chosen, rejected, multi_turn).

    The prompt is the shared prefix cut at its last "\\n\\nAssistant:" marker, so the cut never
    lands mid-word; the prompt keeps the marker and each completion starts right after it.
    `multi_turn` is True when the transcripts diverge before their last assistant turn.
    """
    shared = _common_prefix_len(chosen, rejected)
    cut = chosen.rfind(HH_ASSISTANT, 0, shared)
    if cut < 0 or cut + len(HH_ASSISTANT) > shared:
        raise RecordError(
            "chosen and rejected transcripts share no '\\n\\nAssistant:' turn to split the prompt at"
        )
    end = cut + len(HH_ASSISTANT)
    chosen_part, rejected_part = chosen[end:], rejected[end:]
    multi_turn = any(
        HH_ASSISTANT in part or HH_HUMAN in part for part in (chosen_part, rejected_part)
    )
    return chosen[:end], chosen_part, rejected_part, multi_turn


def _hh(raw: RawRecord, row: dict[str, Any], chosen: str, rejected: str) -> Pair:
    if HH_ASSISTANT not in chosen:
        raise RecordError(_missing_field(row, "prompt", " (and 'chosen' is not a Human/Assistant transcript)"))
    prompt, chosen_part, rejected_part, multi_turn = split_hh(chosen, rejected)
    pair = Pair(
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=prompt,
        chosen=chosen_part,
        rejected=rejected_part,
        extra=_extra(row, _CONSUMED["explicit"]),
        shape="hh",
        tools=_tools(row.get("tools")),
    )
    if multi_turn:
        pair.flags.append(flags.MULTI_TURN_COMPLETION)
    return pair


def _conversational(raw: RawRecord, row: dict[str, Any]) -> Pair:
    prompt = _messages(row["prompt"], "prompt")
    chosen = _completion_messages(row["chosen"], "chosen")
    rejected = _completion_messages(row["rejected"], "rejected")
    # Some exports repeat the prompt at the start of each completion list: keep it once.
    n = len(prompt)
    if len(chosen) > n and len(rejected) > n and chosen[:n] == prompt and rejected[:n] == prompt:
        chosen, rejected = chosen[n:], rejected[n:]
    return _message_pair(
        raw, row, "conversational", _CONSUMED["explicit"], prompt, chosen, rejected
    )


def _shared_prefix(chosen: list[Message], rejected: list[Message]) -> int:
    """How many leading messages both conversations share, moved back so that each completion
    starts at an assistant turn in both lists (0 when none does)."""
    limit = min(len(chosen), len(rejected))
    shared = 0
    while shared < limit and chosen[shared] == rejected[shared]:
        shared += 1
    while shared > 0 and not (
        shared < len(chosen)
        and shared < len(rejected)
        and chosen[shared]["role"] == "assistant"
        and rejected[shared]["role"] == "assistant"
    ):
        shared -= 1
    return shared


def _conversational_implicit(raw: RawRecord, row: dict[str, Any]) -> Pair:
    """Full conversations in chosen/rejected: the prompt is their shared leading messages.

    The split is moved back so each completion starts at an assistant turn; a `prompt` string
    column (UltraFeedback-binarized) is not used for splitting, only as the user turn when the
    two lists hold nothing but completions.
    """
    chosen = _messages(row["chosen"], "chosen")
    rejected = _messages(row["rejected"], "rejected")
    shared = _shared_prefix(chosen, rejected)
    prompt_text = row.get("prompt")
    if shared == 0:
        if type(prompt_text) is str and prompt_text:
            prompt = [{"role": "user", "content": prompt_text}]
            return _message_pair(
                raw, row, "conversational", _CONSUMED["explicit"], prompt, chosen, rejected
            )
        raise RecordError(
            "fields 'chosen' and 'rejected' share no leading prompt messages before an assistant turn"
        )
    if prompt_text is not None and type(prompt_text) is not str:
        raise RecordError(_type_error("prompt", prompt_text, "a string or a list of messages"))
    prompt = chosen[:shared]
    chosen, rejected = chosen[shared:], rejected[shared:]
    return _message_pair(
        raw, row, "conversational_implicit", _CONSUMED["explicit"], prompt, chosen, rejected
    )


def _llamafactory_v1(raw: RawRecord, row: dict[str, Any]) -> Pair:
    """LLaMA-Factory v1: `chosen_messages`/`rejected_messages` as whole conversations whose content
    is a list of typed parts ({"type": "text" | "reasoning" | "tool_calls" | "tools", "value"}) and
    whose messages carry a `loss_weight`. The prompt is the shared leading messages; tools found
    in a `tools` part join the row's tools; the weights pass through as `loss_weight`
    ({"chosen": [...], "rejected": [...]}, one per message, prompt included)."""
    if "rejected_messages" not in row:
        raise RecordError("missing field 'rejected_messages'")
    tools: list[Any] = []
    chosen = _messages(row["chosen_messages"], "chosen_messages", tools_out=tools)
    rejected = _messages(row["rejected_messages"], "rejected_messages", tools_out=[])
    shared = _shared_prefix(chosen, rejected)
    if shared == 0:
        raise RecordError(
            "fields 'chosen_messages' and 'rejected_messages' share no leading prompt messages before an assistant turn"
        )
    pair = _message_pair(
        raw, row, "llamafactory_v1", _CONSUMED["llamafactory_v1"], chosen[:shared], chosen[shared:],
        rejected[shared:], fields=("chosen_messages", "rejected_messages"),
        tools=(_tools(row.get("tools")) or []) + tools or None,
    )
    weights = {
        half: [item.get("loss_weight") if type(item) is dict else None for item in row[f"{half}_messages"]]
        for half in ("chosen", "rejected")
    }
    if any(w is not None for values in weights.values() for w in values):
        pair.extra["loss_weight"] = weights
    return pair


def _sharegpt(raw: RawRecord, row: dict[str, Any]) -> Pair:
    prompt = _messages(row["conversations"], "conversations")
    system = row.get("system")
    if system is not None and type(system) is not str:
        raise RecordError(_type_error("system", system, "a string"))
    if system:
        prompt = [{"role": "system", "content": system}, *prompt]
    for key in ("chosen", "rejected"):
        if key not in row:
            raise RecordError(_missing_field(row, key))
    chosen = _messages(row["chosen"], "chosen", single_ok=True)
    rejected = _messages(row["rejected"], "rejected", single_ok=True)
    return _message_pair(raw, row, "sharegpt", _CONSUMED["sharegpt"], prompt, chosen, rejected)


def _openai(raw: RawRecord, row: dict[str, Any]) -> Pair:
    for key in ("input", "preferred_output", "non_preferred_output"):
        if key not in row:
            raise RecordError(_missing_field(row, key))
    source = row["input"]
    if type(source) is not dict:
        raise RecordError(_type_error("input", source, "an object with 'messages'"))
    if "messages" not in source:
        raise RecordError("missing field 'input.messages'")
    prompt = _messages(source["messages"], "input.messages")
    chosen = _messages(row["preferred_output"], "preferred_output", single_ok=True)
    rejected = _messages(row["non_preferred_output"], "non_preferred_output", single_ok=True)
    return _message_pair(
        raw,
        row,
        "openai",
        _CONSUMED["openai"],
        prompt,
        chosen,
        rejected,
        fields=("preferred_output", "non_preferred_output"),
    )


def _ids(row: dict[str, Any], key: str) -> list[int]:
    value = row.get(key)
    if type(value) is not list:
        if key not in row:
            raise RecordError(_missing_field(row, key))
        raise RecordError(_type_error(key, value, "a list of token ids"))
    for i, token in enumerate(value):
        if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
            raise RecordError(f"field '{key}[{i}]' is not a token id (non-negative int): {token!r:.40}")
    return value


def _pretokenized(raw: RawRecord, row: dict[str, Any]) -> Pair:
    ids = {key: _ids(row, key) for key in ("prompt_ids", "chosen_ids", "rejected_ids")}
    # Text next to the ids (TRL keeps it, as strings or message lists) is used for text-level checks.
    texts = {key: text_of(row.get(key, ""), completion=key != "prompt") for key in ("prompt", "chosen", "rejected")}
    return Pair(
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=texts["prompt"],
        chosen=texts["chosen"],
        rejected=texts["rejected"],
        prompt_ids=ids["prompt_ids"],
        chosen_ids=ids["chosen_ids"],
        rejected_ids=ids["rejected_ids"],
        extra=_extra(row, _CONSUMED["pretokenized"]),
        shape="pretokenized",
    )
