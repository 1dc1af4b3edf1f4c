"""Checks of reasoning traces and tool calls, on the text (no tokenizer needed).

- `reasoning_mismatch`: one half reasons and the other does not (or holds an empty think block): the
  model would learn a format preference ("think" vs "don't"), not a content one.
- `same_final_answer`: the halves differ only inside the reasoning; their answers are equal.
- `tool_call_invalid`: a call's arguments are not a JSON object, name a function the row's `tools`
  do not list, or break that function's parameter schema (JSON Schema, checked in bounded time by
  `prefdata.checks.tool_schema`), or that schema cannot be evaluated (a `$ref` loop or one that does
  not resolve, more work than the check's budget).

`reasoning_lost` needs the rendered text and is set where rows are rendered (tokenize.pairs).
"""

from __future__ import annotations

import json
from typing import Any

from prefdata.checks.tool_schema import Verdict, check_arguments, start_budget
from prefdata.core import flags as F
from prefdata.core.reasoning import (
    THINK_CLOSE,
    carries_reasoning_or_tools,
    message_answer,
    message_reasoning,
    split_reasoning,
)
from prefdata.core.records import Pair

def has_reasoning_or_tools(pair: Pair) -> bool:
    """Cheap test for whether `reasoning_flags` can find anything (most rows have neither)."""
    if pair.tools:
        return True
    if pair.is_conversational:
        return any(carries_reasoning_or_tools(m) for m in (pair.prompt_messages, pair.chosen_messages, pair.rejected_messages))
    return THINK_CLOSE in pair.chosen or THINK_CLOSE in pair.rejected


def reasoning_flags(pair: Pair) -> list[str]:
    """The reasoning and tool-call flags of one pair (unordered; the caller orders them)."""
    found: list[str] = []
    chosen_reasoning, chosen_answer = _half(pair, "chosen")
    rejected_reasoning, rejected_answer = _half(pair, "rejected")
    if chosen_reasoning is not None or rejected_reasoning is not None:
        if bool(chosen_reasoning) != bool(rejected_reasoning):
            found.append(F.REASONING_MISMATCH)
        elif chosen_answer.strip() == rejected_answer.strip() and chosen_reasoning != rejected_reasoning:
            found.append(F.SAME_FINAL_ANSWER)
    if _invalid_tool_call(pair):
        found.append(F.TOOL_CALL_INVALID)
    return found


def _half(pair: Pair, which: str) -> tuple[str | None, str]:
    """(reasoning of the half's assistant turns or None when it has no trace, the rest of its text)."""
    messages = pair.chosen_messages if which == "chosen" else pair.rejected_messages
    if messages is None:
        return split_reasoning(pair.chosen if which == "chosen" else pair.rejected)
    reasoning: list[str] = []
    answers: list[str] = []
    has_trace = False
    for message in messages:
        trace = message_reasoning(message) if message.get("role") == "assistant" else None
        if trace is not None:
            has_trace = True
            reasoning.append(trace)
        answers.append(message_answer(message))
        answers.extend(json.dumps(call["function"], sort_keys=True) for call in message.get("tool_calls") or ())
    return ("\n".join(reasoning) if has_trace else None), "\n".join(answers)


def _invalid_tool_call(pair: Pair) -> bool:
    schemas = _tool_schemas(pair.tools)
    start_budget()  # the pair's calls share one budget of schema work
    for messages in (pair.prompt_messages, pair.chosen_messages, pair.rejected_messages):
        for message in messages or ():
            for call in message.get("tool_calls") or ():
                if not _call_is_valid(call["function"], schemas):
                    return True
    return False


def _tool_schemas(tools: list[Any] | None) -> dict[str, Any] | None:
    """Function name -> parameter schema (None: no schema); None when the row lists no tools."""
    if not tools:
        return None
    out: dict[str, Any] = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out[function["name"]] = function.get("parameters")
    return out


def _call_is_valid(function: dict[str, Any], schemas: dict[str, Any] | None) -> bool:
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder goes
        return False
    if not isinstance(parsed, dict):
        return False
    if schemas is None:
        return True  # nothing to check the call against
    if function.get("name") not in schemas:
        return False
    schema = schemas[function["name"]]
    if not isinstance(schema, dict):
        return True
    return check_arguments(schema, parsed) is Verdict.VALID
