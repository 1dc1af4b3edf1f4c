"""Scored completions: one record with a prompt and several completions, each with a score or a
rank, turned into preference pairs by a pairing strategy (prefdata.sets.pairing).

Shapes, detected per row (no `chosen`/`rejected`; a list under `completions`, `generations` or
`candidates_completions`):
- UltraFeedback (raw): `instruction`, `completions: [{response, annotations: {aspect: {Rating}},
  fine-grained_score, overall_score, model, ...}]`.
- NeMo-RL: `context` (messages), `completions: [{rank, completion: [messages]}]`.
- generic: a prompt (`prompt` string or messages, `instruction` [+ `input`], `messages`, `context`),
  `completions` (strings, messages, or objects with the text under `response`/`text`/`completion`/
  `content`/`output`/`generation`) with `scores`/`rewards`/`ratings` or `ranks` beside them (or
  `score`/`reward`/`rating`/`rank` inside each object).
- distilabel: `generations` + `ratings` (a rating may be null: that completion is unscored; a null
  generation, a failed one, is never paired either).

Scores: higher is better. Ranks: lower is better (rank 1 beats rank 2); pairs from ranks carry
`rank_chosen`/`rank_rejected`, pairs from scores `reward_chosen`/`reward_rejected` (so the reward
checks apply). A score may be a number, numeric text ("4"), or several named ratings (an
`annotations`/`scores` object): `--rating mean` averages them, `--rating NAME` takes one (a
completion with one plain score keeps it whatever NAME is). "N/A" or null: unscored, and so is a
score no float can hold (NaN, Infinity, an integer or text beyond +-1.8e308, such as a 400-digit
number), as the pairing has nothing to compare it with.

Every pair keeps `group_id` (a stable hash of the record's content: the same record gets the same
id wherever it sits) and `chosen_sample`/`rejected_sample` (the completions' positions in the
record; they mark the pair as generated, as online DPO's pairs are).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import xxhash

from prefdata.core.errors import RecordError
from prefdata.core.numbers import finite_float, loss_input_problem
from prefdata.core.records import Message, Pair, RawRecord, ScoredSummary
from prefdata.io.formats import normalize_record
from prefdata.io.messages import (
    completion_text,
    read_messages,
    read_tools,
    render_messages,
    require_assistant,
    type_error,
    type_name,
)
from prefdata.sets.pairing import PairingSettings, choose_pairs

COMPLETION_LISTS = ("completions", "generations", "candidates_completions")
SCORE_LISTS = ("scores", "rewards", "ratings")
RANK_LISTS = ("ranks",)
TEXT_KEYS = ("response", "text", "completion", "content", "output", "generation")
SCORE_KEYS = ("score", "reward", "rating")
FALLBACK_SCORES = ("fine-grained_score", "overall_score")  # UltraFeedback, when a completion has no annotations
PROMPT_KEYS = ("prompt", "instruction", "messages", "context")


@dataclass
class RecordPairs:
    """A record's pairs: one for the pair shapes (`scored` None), any number for scored completions."""

    pairs: list[Pair]
    scored: ScoredSummary | None = None


@dataclass
class _Completion:
    text: str
    messages: list[Message] | None
    score: float | None
    model: str | None


def is_scored(row: Any) -> bool:
    """A row of scored completions: no chosen/rejected, a list of completions."""
    if type(row) is not dict or "chosen" in row or "rejected" in row:
        return False
    return any(type(row.get(key)) is list for key in COMPLETION_LISTS)


def record_pairs(raw: RawRecord, pairing: PairingSettings) -> RecordPairs:
    """The pairs of one record, whatever its shape; RecordError/UnknownShapeError as normalize_record."""
    if raw.error is None and is_scored(raw.value):
        return _scored_pairs(raw, raw.value, pairing)
    return RecordPairs([normalize_record(raw)])


def _scored_pairs(raw: RawRecord, row: dict[str, Any], pairing: PairingSettings) -> RecordPairs:
    list_key = next(key for key in COMPLETION_LISTS if type(row.get(key)) is list)
    prompt_key, prompt_text, prompt_messages = _prompt(row)
    completions, scale, scores_key = _completions(row, list_key, pairing.rating)
    if prompt_messages is not None or any(c.messages is not None for c in completions):
        prompt_messages = prompt_messages or [{"role": "user", "content": prompt_text}]
        for i, c in enumerate(completions):
            if c.messages is None:
                c.messages = [{"role": "assistant", "content": c.text}]
            require_assistant(c.messages, f"{list_key}[{i}]")
    # Higher is better inside pairing: a rank counts as its negative.
    scores = [None if c.score is None else (-c.score if scale == "rank" else c.score) for c in completions]
    group_id = _group_id(prompt_text, completions, scale)
    choice = choose_pairs(scores, pairing, group_id)
    summary = ScoredSummary(
        completions=len(completions), scored=choice.scored, pairs=len(choice.pairs),
        used=len({i for pair in choice.pairs for i in pair}), ties=choice.ties, scale=scale,
        margins=[scores[c] - scores[r] for c, r in choice.pairs],  # type: ignore[operator]
        reason=choice.reason, group_id=group_id, possible=choice.possible,
    )
    if choice.reason == "too_many_pairs":
        summary.detail = (f"{pairing.strategy} would make {choice.possible:,} pairs from {choice.scored:,} scored "
                          f"completions, above max_pairs_per_record {pairing.max_pairs:,} (policy [thresholds]; "
                          f"above_max_pairs = \"set_aside\")")
    if not choice.pairs:  # what dropped.jsonl shows of an unpaired record
        summary.prompt = prompt_text
        summary.completion_texts = [c.text for c in completions]
        summary.scores = [c.score for c in completions]
        return RecordPairs([], summary)
    consumed = {prompt_key, list_key, scores_key, "tools"} | ({"input"} if prompt_key == "instruction" else set())
    extra = {key: value for key, value in row.items() if key not in consumed}
    for key in ("weight", "offset"):  # they reach the loss: what float32 training cannot hold costs the record
        if key in extra and (problem := loss_input_problem(key, extra[key])):
            raise RecordError(problem)
    tools = read_tools(row.get("tools"))
    names = ("rank_chosen", "rank_rejected") if scale == "rank" else ("reward_chosen", "reward_rejected")
    pairs = []
    for c, r in choice.pairs:
        chosen, rejected = completions[c], completions[r]
        ours: dict[str, Any] = {"group_id": group_id, names[0]: _as_given(chosen.score, scale),
                                names[1]: _as_given(rejected.score, scale),
                                "chosen_sample": c, "rejected_sample": r}
        if chosen.model is not None or rejected.model is not None:
            ours["chosen_model"], ours["rejected_model"] = chosen.model, rejected.model
        pair_extra = {(f"raw_{k}" if k in ours else k): v for k, v in extra.items()}
        pair_extra.update(ours)
        pairs.append(Pair(
            source_file=raw.source_file, source_line=raw.source_line, prompt=prompt_text,
            chosen=chosen.text, rejected=rejected.text, prompt_messages=prompt_messages,
            chosen_messages=chosen.messages, rejected_messages=rejected.messages,
            tools=tools, extra=pair_extra, shape="scored",
        ))
    return RecordPairs(pairs, summary)


def _as_given(value: float | None, scale: str) -> float | int | None:
    """Scores stay floats (one column type); ranks are whole numbers where they are and where a
    64-bit integer column holds them (a rank of 1e308 stays a float, not a 309-digit integer)."""
    if scale == "rank" and value is not None and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _prompt(row: dict[str, Any]) -> tuple[str, str, list[Message] | None]:
    """(the key it came from, its text, its messages when it is a conversation)."""
    for key in PROMPT_KEYS:
        if key not in row:
            continue
        value = row[key]
        if type(value) is str:
            if key == "instruction" and type(row.get("input")) is str and row["input"]:
                return key, f"{value}\n{row['input']}", None  # alpaca's instruction + input, as formats does
            return key, value, None
        if type(value) is list:
            messages = read_messages(value, key)
            return key, render_messages(messages), messages
        raise RecordError(type_error(key, value, "a string or a list of messages"))
    raise RecordError("scored completions without a prompt (expected 'prompt', 'instruction', 'messages' or 'context')")


def _completions(row: dict[str, Any], list_key: str, rating: str) -> tuple[list[_Completion], str, str | None]:
    """The completions with their scores, the scale ("score" or "rank"), and the key of the
    score list beside them (None when each completion holds its own)."""
    items = row[list_key]
    if not items:
        raise RecordError(f"field {list_key!r} is an empty list")
    side_key = next((key for key in (*RANK_LISTS, *SCORE_LISTS) if key in row), None)
    side: list[Any] | None = None
    if side_key is not None:
        side = row[side_key]
        if type(side) is not list or len(side) != len(items):
            what = "a list" if type(side) is not list else f"{len(side)} values for {len(items)} completions"
            raise RecordError(f"field {side_key!r} must give one value per completion in {list_key!r}, got {what}")
    scale = "rank" if side_key in RANK_LISTS else "score"
    if side is None and any(type(item) is dict and "rank" in item for item in items):
        scale = "rank"
    completions: list[_Completion] = []
    aspect_seen = rating == "mean"
    for i, item in enumerate(items):
        where = f"{list_key}[{i}]"
        if item is None:  # a failed generation (distilabel keeps them as null): no text, never paired
            completions.append(_Completion("", None, None, None))
            continue
        text, messages = _completion_body(item, where)
        if side is not None:
            value, found = _rating(side[i], rating, f"{side_key}[{i}]")
        elif type(item) is dict:
            value, found = _inline_score(item, scale, rating, where)
        else:
            raise RecordError(f"field {where!r} has no score: give '{list_key}' objects with a score or a 'scores'/'ranks' list")
        aspect_seen = aspect_seen or found
        model = item.get("model") if type(item) is dict and type(item.get("model")) is str else None
        completions.append(_Completion(text, messages, value, model))
    if not aspect_seen:
        raise RecordError(f"no completion has a rating named {rating!r} (--rating)")
    return completions, scale, side_key


def _completion_body(item: Any, where: str) -> tuple[str, list[Message] | None]:
    if type(item) is str:
        return item, None
    if type(item) is list:
        messages = read_messages(item, where)
        return completion_text(messages), messages
    if type(item) is not dict:
        raise RecordError(type_error(where, item, "a string, a list of messages or an object"))
    if "role" in item:  # one message
        messages = read_messages([item], where)
        return completion_text(messages), messages
    for key in TEXT_KEYS:
        if key in item:
            body = item[key]
            return _completion_body([body] if type(body) is dict else body, f"{where}.{key}")  # dict: one message
    raise RecordError(f"field {where!r} has no text (expected one of {', '.join(TEXT_KEYS)})")


def _inline_score(item: dict[str, Any], scale: str, rating: str, where: str) -> tuple[float | None, bool]:
    """A completion object's own score: its rank, its annotations (UltraFeedback), a score field,
    or UltraFeedback's summary scores."""
    if scale == "rank":
        return _rating(item.get("rank"), rating, f"{where}.rank")
    annotations = item.get("annotations")
    if type(annotations) is dict and annotations:
        value, found = _rating(annotations, rating, f"{where}.annotations")
        if found or rating == "mean":
            return value, found
    for key in SCORE_KEYS:
        if key in item:
            value, found = _rating(item[key], rating, f"{where}.{key}")
            if found or rating == "mean":
                return value, found
    if rating != "mean":
        return (_number(item[rating], f"{where}.{rating}"), True) if rating in item else (None, False)
    for key in FALLBACK_SCORES:
        if key in item:
            return _number(item[key], f"{where}.{key}"), True
    raise RecordError(f"field {where!r} has no score (expected {', '.join(SCORE_KEYS)}, 'rank' or 'annotations')")


def _rating(value: Any, rating: str, where: str) -> tuple[float | None, bool]:
    """(score, whether the rating asked for exists) of a score value: a number, numeric text, or
    named ratings {aspect: number | {"Rating": ...}} combined by `rating`."""
    if type(value) is not dict:
        return _number(value, where), True
    if rating != "mean":
        if rating not in value:
            return None, False
        return _number(_aspect_value(value[rating]), f"{where}.{rating}"), True
    numbers = [_number(_aspect_value(v), f"{where}.{k}") for k, v in value.items()]
    rated = [n for n in numbers if n is not None]
    return (math.fsum(rated) / len(rated) if rated else None), True  # fsum: the same mean in any order


def _aspect_value(value: Any) -> Any:
    """UltraFeedback keeps an aspect's rating as {"Rating": "4", "Rationale": ...}."""
    if type(value) is dict:
        return value.get("Rating", value.get("rating", value.get("score")))
    return value


def _number(value: Any, where: str) -> float | None:
    """A finite score, or None for an unscored completion (null, "N/A", empty text)."""
    if value is None or type(value) is bool:
        if value is None:
            return None
        raise RecordError(type_error(where, value, "a number"))
    if type(value) in (int, float):
        return finite_float(value)  # NaN, Infinity, a 400-digit integer: no score
    if type(value) is str:
        text = value.strip()
        if not text or text.upper() in ("N/A", "NA", "NONE", "NULL", "-"):
            return None
        try:
            number = float(text)
        except ValueError:
            raise RecordError(f"field {where!r} is not a number: {value[:40]!r}") from None
        return number if math.isfinite(number) else None
    raise RecordError(f"field {where!r} must be a number, got {type_name(value)}")


def _group_id(prompt: str, completions: list[_Completion], scale: str) -> str:
    """16 hex digits of the record's content: the same record gets the same id (and the same
    random picks) wherever it sits in the input and whichever worker pairs it."""
    content = json.dumps([prompt, scale, [[c.text, c.score] for c in completions]], ensure_ascii=False)
    return f"{xxhash.xxh3_64_intdigest(content.encode('utf-8', 'surrogatepass')):016x}"
