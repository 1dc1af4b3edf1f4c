"""Chat templates shipped with prefdata (package data), found by name from any directory:
`--chat-template-file deepseek-r1-keep-reasoning` (docs/reasoning.md says what each one changes)."""

from __future__ import annotations

from importlib import resources
from typing import Any

SUFFIX = ".jinja"

# The template each bundled one was made from, known by text that only that template (in all its
# published versions) holds: a bundled template is suggested only to a tokenizer whose own template
# holds all of it. DeepSeek-R1's: its turn markers, and the cut at `</think>` that loses the trace.
MADE_FOR: dict[str, tuple[str, ...]] = {
    "deepseek-r1-keep-reasoning": ("<｜User｜>", "<｜Assistant｜>", "</think>"),
}


def bundled_template_names() -> list[str]:
    """Names of the bundled templates (file names without `.jinja`)."""
    return sorted(entry.name[: -len(SUFFIX)] for entry in resources.files(__name__).iterdir()
                  if entry.name.endswith(SUFFIX))


def bundled_template_text(name: str) -> str | None:
    """The bundled template called `name` (with or without `.jinja`), or None when there is none."""
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    if stem not in bundled_template_names():
        return None
    return resources.files(__name__).joinpath(stem + SUFFIX).read_text(encoding="utf-8")


def bundled_templates_for(chat_template: Any) -> list[str]:
    """The bundled templates made for a tokenizer whose chat template is `chat_template` (a string,
    or transformers' named templates as a dict or list); [] for none."""
    if isinstance(chat_template, dict):
        texts = [str(value) for value in chat_template.values()]
    elif isinstance(chat_template, list):
        texts = [str(item.get("template", "")) if isinstance(item, dict) else str(item) for item in chat_template]
    elif isinstance(chat_template, str):
        texts = [chat_template]
    else:
        return []
    return [name for name, marks in MADE_FOR.items() if any(all(m in text for m in marks) for text in texts)]
