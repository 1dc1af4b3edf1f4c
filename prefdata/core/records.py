"""The record types that flow between stages.

raw file --readers--> RawRecord --formats.normalize_record--> Pair --tokenize--> TokenizedPair
--checks--> CheckedRow (flags and the policy's verdict)

A record of scored completions (sets.scored) becomes several Pairs, or none (an "unpaired" row).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# {"role", "content"} plus, when the data has them, the other fields a chat template reads:
# "reasoning_content", "tool_calls" (OpenAI shape, arguments as a JSON string), "tool_call_id", "name".
# A message with image parts keeps its content as TRL's list of parts: {"type": "text", "text"} and
# {"type": "image"} in their order (image pairs); every other content is a string.
Message = dict[str, Any]


@dataclass
class RawRecord:
    """One record as read from a file, before any interpretation.

    Exactly one of `value` and `error` is set: a record that could not even be parsed (bad JSON,
    invalid UTF-8, ...) carries the one-line `error` and goes straight to quarantine.
    """

    source_file: str
    source_line: int  # 1-based line where the record starts (JSON lines, JSON arrays), else 1-based record index
    value: Any = None
    error: str | None = None
    raw_text: str | None = None  # the raw text of the record when known (for quarantine.jsonl)


@dataclass
class Pair:
    """A canonical preference pair.

    Text fields always hold plain normalized text (what text-level checks compare). When the input
    was conversational, the `*_messages` fields keep the structure so the tokenizer can render the
    chat template; `chosen_messages`/`rejected_messages` hold only the completion turn(s).
    Pre-tokenized input sets the `*_ids` fields instead.
    """

    source_file: str
    source_line: int
    prompt: str
    chosen: str
    rejected: str
    prompt_messages: list[Message] | None = None
    chosen_messages: list[Message] | None = None
    rejected_messages: list[Message] | None = None
    prompt_ids: list[int] | None = None
    chosen_ids: list[int] | None = None
    rejected_ids: list[int] | None = None
    # Pre-tokenized rows may give per-token loss masks (0/1 per completion id), as OUT stores them.
    chosen_loss_mask: list[int] | None = None
    rejected_loss_mask: list[int] | None = None
    tools: list[Any] | None = None  # the row's tool schemas (JSON objects), passed to the chat template
    extra: dict[str, Any] = field(default_factory=dict)  # pass-through columns, untouched
    flags: list[str] = field(default_factory=list)  # flags found while normalizing
    shape: str = ""  # which input shape was detected (explicit, conversational, hh, ...)
    # With --decontaminate-against: the benchmark item this pair overlaps (a
    # prefdata.sets.decontaminate.BenchmarkMatch), else None.
    benchmark_match: Any = None
    # Image pairs: the row's images (prefdata.io.images.ImageRef) as the row names them, and, once
    # read in the worker, the decoded images (LoadedImage). None on rows without images.
    images: list[Any] | None = None
    image_data: list[Any] | None = None
    image_parts: int = 0  # {"type": "image"} content parts in its messages (placeholders the row wrote as parts)

    @property
    def is_conversational(self) -> bool:
        return self.chosen_messages is not None

    @property
    def is_pretokenized(self) -> bool:
        return self.chosen_ids is not None


@dataclass
class TokenizedPair:
    """Final (truncated) token ids of one pair, TRL's convention: completion ids exclude the prompt.

    `*_len_full` are lengths before truncation (for truncation rates in reports).
    `flags` holds token-level flags found while tokenizing (boundary mismatch, truncation, ...).
    """

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    prompt_len_full: int
    chosen_len_full: int
    rejected_len_full: int
    flags: list[str] = field(default_factory=list)
    # With --loss-on answer: leading completion tokens (the reasoning block) kept out of the loss.
    chosen_loss_start: int | None = None
    rejected_loss_start: int | None = None
    # Completions holding turns the model did not write (tool results, user turns): 1 on the tokens of
    # the trained assistant turns, 0 on the rest, aligned with the completion ids. None: all in the loss.
    chosen_loss_mask: list[int] | None = None
    rejected_loss_mask: list[int] | None = None
    # Image pairs through a processor: the tokens each image expanded to, in order (None otherwise).
    image_tokens: list[int] | None = None


@dataclass
class ScoredSummary:
    """What pairing made of one record of scored completions (prefdata.sets.pairing): it rides on the
    record's first row (its first pair, or its one unpaired row) to the report and the accounting."""

    completions: int  # completions in the record
    scored: int  # of them with a score (or rank)
    pairs: int  # pairs made
    used: int  # completions in at least one of its pairs
    ties: int  # unordered pairs of scored completions with equal scores
    scale: str  # "score" (higher is better) or "rank" (lower is better)
    margins: list[float] = field(default_factory=list)  # chosen - rejected of each pair (rank steps for ranks)
    reason: str | None = None  # why no pair: single_completion | ties | below_margin | too_many_pairs
    group_id: str = ""
    # Pairs the strategy makes without the policy's max_pairs_per_record: above `pairs` when the record
    # was capped (or set aside: `reason` too_many_pairs, `detail` the one line dropped.jsonl shows).
    possible: int = 0
    detail: str = ""
    prompt: str = ""  # the prompt's text, for dropped.jsonl and the report's examples (unpaired records only)
    completion_texts: list[str] = field(default_factory=list)  # unpaired records only, for dropped.jsonl
    scores: list[float | None] = field(default_factory=list)  # unpaired records only, as the record gave them


@dataclass
class CheckedRow:
    """One row after every check, with the policy's verdict: a pair, a quarantined record, or a
    record of scored completions that made no pair (`unpaired`, its ScoredSummary in `scored`).
    A record of scored completions gives one row per pair; its first row carries `scored`."""

    raw: RawRecord
    pair: Pair | None  # None when quarantined or unpaired
    tokenized: TokenizedPair | None  # None without a tokenizer or when quarantined
    flags: list[str]  # after policy (ignored flags removed); names as in docs/checks.md
    severity: str | None  # worst severity among flags: "drop" | "error" | "warn" | None
    outcome: str  # "kept" | "dropped" | "quarantined" | "unpaired" (error-severity rows are dropped too)
    error: str | None = None  # one-line quarantine reason
    scored: ScoredSummary | None = None  # on the first row of a record of scored completions
