"""What prefdata hands a chat template, and what the template gave back.

- Template settings a user chooses (`--template-kwargs`, `--chat-template-file`) and a pinned date:
  templates that print today's date (SmolLM3's system header via `strftime_now`, Llama 3.1's
  `date_string`) would otherwise give the same input a different OUT on another day.
- Messages as templates expect them: tool-call `arguments` as objects (OUT stores them as JSON text,
  one Arrow type for every row; transformers documents objects, and Qwen2.5's template serializes
  them with `tojson`).
- `lost_fields`: which of a row's reasoning, tool calls, tool results and tools its render does not
  contain (the template ignores that field), for the `reasoning_lost` flag; `system_lost`: whether
  it ignores a system (or developer) message, for the flag of that name.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from prefdata.core.errors import PrefdataError
from prefdata.core.reasoning import REASONING_FIELDS, message_answer, message_reasoning
from prefdata.core.records import Message
from prefdata.templates import bundled_template_names, bundled_template_text

DEFAULT_TEMPLATE_DATE = "2026-01-01"  # what `strftime_now` and `date_string` read unless --template-date says


@dataclass
class TemplateSettings:
    """How conversations are rendered: extra template variables, a replacement template, the date."""

    kwargs: dict[str, Any] = field(default_factory=dict)  # --template-kwargs (enable_thinking=false, ...)
    chat_template_file: str | None = None  # --chat-template-file: a Jinja file replacing the tokenizer's
    chat_template_text: str | None = None  # its text (read once, so workers need not find the file)
    date: str = DEFAULT_TEMPLATE_DATE  # YYYY-MM-DD

    def __post_init__(self) -> None:
        if not isinstance(self.kwargs, dict):
            raise PrefdataError(f"template kwargs must be a table of names and values, got {self.kwargs!r}")
        try:
            _dt.date.fromisoformat(str(self.date))
        except ValueError:
            raise PrefdataError(f"--template-date must be YYYY-MM-DD, got {self.date!r}") from None
        if self.chat_template_file and self.chat_template_text is None:
            self.chat_template_text = read_chat_template(self.chat_template_file)

    def render_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `apply_chat_template`: the pinned `date_string` (Llama 3.1 reads it)
        and the user's variables. `strftime_now` is a function, which transformers does not pass to
        templates: see `pinned_clock`."""
        return {"date_string": self.day().strftime("%d %b %Y"), **self.kwargs}

    def day(self) -> _dt.datetime:
        return _dt.datetime.combine(_dt.date.fromisoformat(self.date), _dt.time())

    def record(self) -> dict[str, Any]:
        """What the manifest records (the template text by its hash)."""
        return {
            "template_kwargs": self.kwargs,
            "chat_template_file": self.chat_template_file,
            "chat_template_sha256": _sha256(self.chat_template_text) if self.chat_template_text else None,
            "template_date": self.date,
        }


def read_chat_template(name_or_path: str) -> str:
    """A `--chat-template-file`: a Jinja file, or a bundled template's name (prefdata.templates); a
    file of that name in the working directory wins, as with bundled policies."""
    path = Path(name_or_path)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    text = bundled_template_text(name_or_path) if "/" not in name_or_path and "\\" not in name_or_path else None
    if text is not None:
        return text
    names = ", ".join(bundled_template_names())
    raise PrefdataError(f"--chat-template-file: no such file: {path} (bundled templates, by name: {names})")


@contextmanager
def pinned_clock(day: _dt.datetime) -> Iterator[None]:
    """Within the block, transformers' `strftime_now` template global reads `day` instead of the
    clock. It calls `datetime.now()` through its module's `datetime` name, so that name is swapped
    for a subclass whose `now()` is `day`, and put back afterwards."""
    try:
        from transformers.utils import chat_template_utils as module
    except ImportError:  # pragma: no cover - transformers is a dependency
        yield
        return
    original = getattr(module, "datetime", None)
    if original is None or not isinstance(original, type):
        yield
        return

    class _PinnedDatetime(original):  # type: ignore[misc, valid-type]
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return day if tz is None else day.replace(tzinfo=tz)

    module.datetime = _PinnedDatetime
    try:
        yield
    finally:
        module.datetime = original


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def template_fingerprint(tokenizer_fingerprint: str, chat_template: Any, settings: TemplateSettings) -> str:
    """The tokenizer's fingerprint combined with everything that decides how text is rendered: the
    template in effect, the template variables and the pinned date."""
    record = {
        "tokenizer": tokenizer_fingerprint,
        "chat_template": chat_template,
        "kwargs": settings.kwargs,
        "date": settings.date,
    }
    return _sha256(json.dumps(record, sort_keys=True, default=str))


def parse_template_kwargs(items: dict[str, Any] | list[str] | str | None) -> dict[str, Any]:
    """`KEY=VALUE` pairs (comma-separated or repeated) to a dict; values are JSON where they parse
    (`false`, `3`, `"x"`) and strings otherwise. A dict (a config file's table) is taken as it is."""
    if isinstance(items, dict):
        return dict(items)
    if not items:
        return {}
    if isinstance(items, str):
        items = [items]
    out: dict[str, Any] = {}
    for item in items:
        for piece in item.split(","):
            piece = piece.strip()
            if not piece:
                continue
            key, sep, value = piece.partition("=")
            if not sep or not key.strip().isidentifier():
                raise PrefdataError(f"--template-kwargs wants NAME=VALUE pairs, got {piece!r}")
            try:
                out[key.strip()] = json.loads(value)
            except ValueError:
                out[key.strip()] = value
    return out


def template_messages(messages: list[Message]) -> list[Message]:
    """Messages as templates read them: tool-call arguments that are JSON objects become objects."""
    if not any("tool_calls" in m for m in messages):
        return messages
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [_call_for_template(call) for call in calls]}
        out.append(message)
    return out


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments  # invalid JSON renders as written; `tool_call_invalid` reports it
    if not isinstance(parsed, dict):
        parsed = arguments
    return {**call, "function": {**function, "arguments": parsed}}


# Renders conversations: (conversations, add_generation_prompt, tools) -> texts, as the tokenizer does.
Render = Callable[[list[list[Message]], bool, Any], list[str]]


@dataclass
class Rendered:
    """What a row's own render gave: its prompt with the generation prompt, prompt + each
    completion, and where the completions start in those (the prompt part both halves share)."""

    prompt: str
    fulls: tuple[str, str]
    cut: int


@dataclass
class _Check:
    """One field to confirm by rendering the row without it."""

    name: str
    conversation: list[Message]
    generation_prompt: bool
    tools: list[Any] | None
    part: str  # what the row's own render gave for the part that should hold the field


def lost_fields(
    prompt: list[Message], completions: tuple[list[Message], list[Message]], tools: list[Any] | None,
    rendered: Rendered, render: Render,
) -> list[str]:
    """Which of the row's fields its tokens do not contain: "reasoning" (a completion turn's trace),
    "tool_calls", "tool_results" (a tool turn's content), "tools" (the row's tools list).

    Each field is judged on the render of its own part: a completion's on that completion, so the
    function's name in the prompt's tools list (SmolLM3) or in the answer's own words cannot stand
    in for a call the template dropped. A field whose text is missing from its part is lost. One
    whose text is there is lost when rendering the row without it (reasoning removed, call
    arguments emptied, tool results blanked, no tools) gives that part unchanged: the text was
    there by coincidence. That costs one more render per part holding such a field (one batched
    call per row and kind of render), and none for rows without reasoning, tool calls or tools.
    Reasoning of earlier turns in the prompt is not asked for: templates drop it on purpose
    (Qwen3, DeepSeek-R1), as they do at inference."""
    lost: list[str] = []
    checks: list[_Check] = []
    for messages, full in zip(completions, rendered.fulls):
        part = full[rendered.cut :]
        for name in ("reasoning", "tool_calls", "tool_results"):
            variant = _without(name, messages)
            if variant is None or name in lost:
                continue
            if not _present(name, messages, part):
                lost.append(name)
            else:
                checks.append(_Check(name, prompt + variant, False, tools, part))
    for name in ("tool_calls", "tool_results"):  # earlier turns' calls and results, in the prompt
        variant = _without(name, prompt)
        if variant is None or name in lost:
            continue
        if not _present(name, prompt, rendered.prompt):
            lost.append(name)
        else:
            checks.append(_Check(name, variant, True, tools, rendered.prompt))
    if tools:
        if not all(name in rendered.prompt for name in _tool_names(tools)):
            lost.append("tools")
        else:
            checks.append(_Check("tools", prompt, True, None, rendered.prompt))
    checks = [check for check in checks if check.name not in lost]
    for check, text in zip(checks, _render_checks(checks, render)):
        # The prompt's variant must give the same prompt; a completion's, the same completion
        # (whatever its prompt part does). A variant the template refuses depends on the field.
        if text is None:
            continue
        same = text == check.part if check.generation_prompt else text.endswith(check.part)
        if same and check.name not in lost:
            lost.append(check.name)
    return lost


def system_lost(prompt: list[Message], completions: tuple[list[Message], list[Message]], tools: list[Any] | None,
                rendered: Rendered, render: Render) -> bool:
    """Whether a system message (a `developer` one is read as system) is missing from the row's
    tokens: its text is not in the render of its half, and rendering that half without it gives the
    same text (the template ignores it: SmolLM3 reads only a first system message). A message whose
    text a template rewrites (SmolLM3 strips '/think') is confirmed the same way, one render each."""
    for messages, full in zip(completions, rendered.fulls):
        conversation = prompt + messages
        for i, message in enumerate(conversation):
            text = _text_of(message.get("content")) if message.get("role") == "system" else ""
            if not text.strip() or text.strip() in full:
                continue
            try:
                again = render([conversation[:i] + conversation[i + 1 :]], False, tools)[0]
            except Exception:  # the template refuses the row without it: it reads the message
                continue
            if again == full:
                return True
    return False


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _render_checks(checks: list[_Check], render: Render) -> list[str | None]:
    """Each check's conversation rendered, None where the template fails on it: one call per kind
    of render (generation prompt, tools), one by one only when a batch fails."""
    out: list[str | None] = [None] * len(checks)
    kinds: dict[tuple[bool, bool], list[int]] = {}
    for i, check in enumerate(checks):
        kinds.setdefault((check.generation_prompt, check.tools is None), []).append(i)
    for indices in kinds.values():
        first = checks[indices[0]]
        try:
            texts = render([checks[i].conversation for i in indices], first.generation_prompt, first.tools)
        except Exception:
            texts = []
            for i in indices:
                try:
                    texts.append(render([checks[i].conversation], first.generation_prompt, first.tools)[0])
                except Exception:
                    texts.append(None)
        for i, text in zip(indices, texts):
            out[i] = text
    return out


def _without(name: str, messages: list[Message]) -> list[Message] | None:
    """The messages without the field `name` ("reasoning": traces removed, inline ones cut from the
    content; "tool_calls": arguments emptied, or the calls removed when none has arguments;
    "tool_results": tool turns' content blanked), or None when no message has it."""
    out: list[Message] = []
    changed = False
    calls_have_arguments = name == "tool_calls" and any(
        _arguments(call) for m in messages for call in m.get("tool_calls") or ()
    )
    for message in messages:
        if name == "reasoning" and message_reasoning(message):
            if isinstance(message.get("reasoning_content"), str):
                message = {key: value for key, value in message.items() if key not in REASONING_FIELDS}
            else:  # an inline think block: the content without it
                message = {**message, "content": message_answer(message)}
            changed = True
        elif name == "tool_calls" and message.get("tool_calls"):
            if calls_have_arguments:
                calls = [{**call, "function": {**(call.get("function") or {}), "arguments": {}}}
                         for call in message["tool_calls"]]
                message = {**message, "tool_calls": calls}
            else:
                message = {key: value for key, value in message.items() if key != "tool_calls"}
            changed = True
        elif name == "tool_results" and message.get("role") == "tool" and _has_text(message.get("content")):
            message = {**message, "content": ""}
            changed = True
        out.append(message)
    return out if changed else None


def _present(name: str, messages: list[Message], text: str) -> bool:
    """Whether `text` holds every instance of the field's text (a cheap first test: absent is lost)."""
    if name == "reasoning":
        return all(not r or r in text for r in map(message_reasoning, messages))
    if name == "tool_calls":
        return all(_call_rendered(call, text) for m in messages for call in m.get("tool_calls") or ())
    return all(_tool_result_rendered(m, text) for m in messages if m.get("role") == "tool")


def _arguments(call: dict[str, Any]) -> bool:
    """Whether a call passes any argument ({} and "" do not)."""
    arguments = (call.get("function") or {}).get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return bool(arguments.strip())
    return bool(arguments)


def _has_text(content: Any) -> bool:
    return bool(content.strip()) if isinstance(content, str) else bool(content)


def _tool_names(tools: list[Any]) -> list[str]:
    names = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            names.append(name)
    return names


def _call_rendered(call: dict[str, Any], text: str) -> bool:
    """Whether `text` holds the call: its function's name and every argument value (templates
    write arguments as JSON, XML or `key=value`, but each value appears in some spelling)."""
    function = call.get("function") or {}
    name = function.get("name")
    if isinstance(name, str) and name not in text:
        return False
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments.strip() in text  # invalid JSON renders as written
    return all(_value_rendered(value, text) for value in _leaf_values(parsed))


def _leaf_values(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaf_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaf_values(item)
    elif value is not None and value != "":
        yield value


def _value_rendered(value: Any, text: str) -> bool:
    if not isinstance(value, str):
        spellings = {json.dumps(value), str(value)}  # true / True, 3 / 3.0 as the template wrote it
    else:
        spellings = {
            value,
            json.dumps(value)[1:-1],  # `tojson`: escaped quotes, \n and \uXXXX
            json.dumps(value, ensure_ascii=False)[1:-1],
        }
    return any(spelling in text for spelling in spellings)


def _tool_result_rendered(message: Message, text: str) -> bool:
    content = message.get("content")
    if not isinstance(content, str) or not content.strip():
        return True
    return content.strip() in text or json.dumps(content.strip())[1:-1] in text
