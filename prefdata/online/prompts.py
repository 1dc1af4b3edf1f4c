"""Prompts to generate from, read from anything prefdata reads.

Prompt-only rows (`{"prompt": "..."}` or `{"prompt": [{role, content}, ...]}`) give their prompt as
given; preference rows in any shape `prepare` knows give their (normalized) prompt. Rows with no
usable prompt are skipped and counted, with the first reason, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError, RecordError
from prefdata.core.records import Message, RawRecord
from prefdata.io.formats import normalize_record
from prefdata.io.messages import ROLE_ALIASES
from prefdata.io.readers import iter_raw_records

Prompt = str | list[Message]


@dataclass
class PromptRow:
    """One prompt: as given (a string or a message list) and where it came from."""

    prompt: Prompt
    source_file: str
    source_line: int

    @property
    def is_conversational(self) -> bool:
        return isinstance(self.prompt, list)


@dataclass
class PromptSet:
    rows: list[PromptRow]
    skipped: int = 0
    first_problem: str | None = None  # "file:line: reason" of the first skipped row


def _prompt_messages(value: list[Any], where: str) -> list[Message]:
    messages: list[Message] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("content"), str):
            raise RecordError(f"{where}[{i}] is not a message with string content")
        role = item.get("role")
        if not isinstance(role, str) or ROLE_ALIASES.get(role.strip().lower()) is None:
            raise RecordError(f"{where}[{i}] has no known role")
        messages.append({"role": ROLE_ALIASES[role.strip().lower()], "content": item["content"]})
    if not messages:
        raise RecordError(f"{where} is an empty list of messages")
    return messages


def prompt_of(raw: RawRecord) -> Prompt:
    """The prompt of one record, or RecordError with a one-line reason."""
    if raw.error is not None:
        raise RecordError(raw.error)
    row = raw.value
    if not isinstance(row, dict):
        raise RecordError("record is not an object")
    if "chosen" not in row and "rejected" not in row and "preferred_output" not in row:
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            if not prompt.strip():
                raise RecordError("field 'prompt' is empty")
            return prompt
        if isinstance(prompt, list):
            return _prompt_messages(prompt, "prompt")
        raise RecordError("no 'prompt' field (a string or a list of messages)")
    pair = normalize_record(raw)
    if pair.prompt_messages is not None:
        return list(pair.prompt_messages)
    if not pair.prompt.strip():
        raise RecordError("the pair has an empty prompt")
    return pair.prompt


def iter_prompts(path: str | Path) -> Iterator[PromptRow | tuple[RawRecord, str]]:
    """Each record's PromptRow, or (record, reason) when it has no usable prompt."""
    for raw in iter_raw_records(path):
        try:
            yield PromptRow(prompt_of(raw), raw.source_file, raw.source_line)
        except RecordError as exc:
            yield raw, str(exc)


def read_prompts(path: str | Path) -> PromptSet:
    """Every usable prompt under `path`, in input order; PrefdataError when there is none."""
    result = PromptSet(rows=[])
    for item in iter_prompts(path):
        if isinstance(item, PromptRow):
            result.rows.append(item)
            continue
        raw, reason = item
        result.skipped += 1
        if result.first_problem is None:
            result.first_problem = f"{raw.source_file}:{raw.source_line}: {reason}"
    if not result.rows:
        detail = f" (first: {result.first_problem})" if result.first_problem else ""
        raise PrefdataError(f"{path}: no usable prompts{detail}")
    return result
