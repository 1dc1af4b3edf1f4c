"""Messages as chat templates read them: one message validated and normalized (roles, content parts,
reasoning, tool calls), a row's tool schemas, and a message list's text as text checks see it.

prefdata.io.formats builds a record's pair from these; a message that cannot be used raises
RecordError with a one-line reason naming the field (`chosen[1].content`).
"""

from __future__ import annotations

import json
from typing import Any

from prefdata.core.errors import RecordError
from prefdata.core.reasoning import REASONING_FIELDS, THINK_CLOSE, THINK_OPEN
from prefdata.core.records import Message
from prefdata.io.json_decode import TOO_DEEP, nesting_exceeds

IMAGE_MARK = "<image>"  # an image part in text (reports, text checks); the images' bytes go in the digests


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


def type_name(value: Any) -> str:
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


def type_error(field: str, value: Any, expected: str) -> str:
    return f"field {field!r} must be {expected}, got {type_name(value)}"


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
                raise RecordError(f"field {where!r}: unsupported content part {type_name(part)!r}")
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
    raise RecordError(type_error(field, value, "a string"))


# LLaMA-Factory v1 content parts that are not text, and the message field each one fills.
_PART_FIELDS = {"reasoning": "reasoning_content", "tool_calls": "tool_calls", "tools": "tools"}


def _part_text(part: dict[str, Any], where: str) -> str:
    text = part.get("text", part.get("value"))
    if type(text) is not str:
        raise RecordError(type_error(f"{where}.text", text, "a string"))
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
        raise RecordError(type_error(field, value, "a list of tool calls"))
    out: list[dict[str, Any]] = []
    for i, call in enumerate(calls):
        where = f"{field}[{i}]"
        if type(call) is not dict:
            raise RecordError(type_error(where, call, "a tool call object"))
        function = call.get("function", call)
        if type(function) is not dict:
            raise RecordError(type_error(f"{where}.function", function, "an object"))
        name = function.get("name")
        if type(name) is not str:
            raise RecordError(type_error(f"{where}.function.name", name, "a string"))
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


def read_tools(value: Any, field: str = "tools") -> list[Any] | None:
    """A row's tool schemas (a list, or JSON text of one), as the template's `tools` argument."""
    if value is None:
        return None
    value = _json_value(value, field)
    if type(value) is dict:
        value = [value]
    if type(value) is not list or any(type(tool) is not dict for tool in value):
        raise RecordError(type_error(field, value, "a list of tool schemas"))
    return value or None


def _message(item: Any, field: str, tools_out: list[Any] | None = None) -> Message:
    """One message with every field a chat template reads (records.Message); roles normalized.

    Reasoning is read from `reasoning_content`, `thinking` or `reasoning` and recorded as
    `reasoning_content`; inline `<think>` stays in the content as written (prefdata.core.reasoning
    finds it). An assistant turn that only calls tools may have no content."""
    if type(item) is not dict:
        raise RecordError(type_error(field, item, "a message object"))
    role = item.get("role", item.get("from"))
    if role is None:
        raise RecordError(f"field {field!r}: message has no role")
    if type(role) is not str:
        raise RecordError(type_error(f"{field}.role", role, "a string"))
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
            raise RecordError(type_error(f"{field}.reasoning_content", reasoning, "a string"))
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
            tools_out.extend(read_tools(text, f"{field}.tools") or [])
    return message


def read_messages(value: Any, field: str, single_ok: bool = False, tools_out: list[Any] | None = None) -> list[Message]:
    """Validated messages (records.Message) with normalized roles."""
    if single_ok and type(value) is dict:
        return [_message(value, field, tools_out)]
    if type(value) is not list:
        if value is None:
            raise RecordError(f"field {field!r} is null")
        raise RecordError(type_error(field, value, "a list of messages"))
    if not value:
        raise RecordError(f"field {field!r} is an empty list of messages")
    return [_message(item, f"{field}[{i}]", tools_out) for i, item in enumerate(value)]


def completion_messages(value: Any, field: str) -> list[Message]:
    """A completion next to a message-list prompt: messages, one message, or a plain string."""
    if type(value) is str:
        return [{"role": "assistant", "content": value}]
    return read_messages(value, field, single_ok=True)


def require_assistant(messages: list[Message], field: str) -> None:
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


def render_messages(messages: list[Message]) -> str:
    return "\n\n".join(f"{m['role']}: {message_text(m)}" for m in messages)


def completion_text(messages: list[Message]) -> str:
    if len(messages) == 1 and messages[0]["role"] == "assistant":
        return message_text(messages[0])
    return render_messages(messages)


def text_of(value: Any, completion: bool) -> str:
    """The plain text of a stored text column value: a string as is, a message list as rendered for
    text-level checks (what `normalize_record` puts in `Pair.prompt`/`chosen`/`rejected`)."""
    if type(value) is list:
        messages = [m for m in value if type(m) is dict]
        return completion_text(messages) if completion else render_messages(messages)
    return value if type(value) is str else ""
