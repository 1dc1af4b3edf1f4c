"""Reasoning traces in text and messages: where the thinking ends and the answer begins.

Reasoning models write their trace inline (`<think>…</think>` before the answer) or the data keeps it
in a message field (`reasoning_content`; some exports say `thinking` or `reasoning`, which
`prefdata.io.formats` records as `reasoning_content`). A template that opens the think block in its
generation prompt (DeepSeek-R1, `…<|Assistant|><think>\\n`) leaves the completion with only the
closing tag, so a text with `</think>` and no `<think>` is a trace too.

Plain string functions only: the checks, `--loss-on answer`, `show` and online scoring all ask the
same question of a text, and must agree on the answer.
"""

from __future__ import annotations

from typing import Any, Mapping

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# Field names that hold a message's reasoning, in the order they are read; the first is the one
# prefdata writes (what Qwen3, DeepSeek and TRL's chat templates read).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of one completion text.

    `reasoning` is None when the text holds no think block, "" for an empty block (`<think>\\n\\n</think>`,
    what a template writes for a turn without reasoning). The answer is what follows `</think>`, with
    the whitespace a template puts between the two removed from its start.
    """
    close = text.find(THINK_CLOSE)
    if close < 0:
        return None, text
    open_at = text.find(THINK_OPEN, 0, close)
    if open_at >= 0:
        if text[:open_at].strip():  # text before the block: the block is not a leading trace
            return None, text
        start = open_at + len(THINK_OPEN)
    else:
        start = 0  # the generation prompt opened the block
    reasoning = text[start:close].strip()
    answer = text[close + len(THINK_CLOSE) :].lstrip()
    return reasoning, answer


def reasoning_end(text: str) -> int:
    """Character offset where the answer starts (after `</think>` and the whitespace behind it); 0
    when the text holds no leading think block."""
    reasoning, answer = split_reasoning(text)
    if reasoning is None:
        return 0
    return len(text) - len(answer)


def message_reasoning(message: Mapping[str, Any]) -> str | None:
    """A message's reasoning: its `reasoning_content` field, else an inline think block in its
    content; None when it has neither (a field that is present but blank counts as "")."""
    value = message.get("reasoning_content")
    if isinstance(value, str):
        return value.strip()
    content = message.get("content")
    if isinstance(content, str):
        return split_reasoning(content)[0]
    return None


def message_answer(message: Mapping[str, Any]) -> str:
    """A message's final answer: its content without an inline think block."""
    content = message.get("content")
    if not isinstance(content, str):
        return ""
    if isinstance(message.get("reasoning_content"), str):
        return content
    return split_reasoning(content)[1]


def carries_reasoning_or_tools(messages: list[Mapping[str, Any]] | None) -> bool:
    """Whether any message has a field beyond role/content (reasoning, tool calls, a tool turn's id)
    or an inline `</think>`, or a tool turn: the one cheap test before the reasoning checks and the render
    check."""
    for message in messages or ():
        if len(message) > 2 or message.get("role") == "tool" or THINK_CLOSE in (message.get("content") or ""):
            return True
    return False
