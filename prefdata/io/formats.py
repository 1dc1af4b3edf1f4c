"""Turn one raw record into a canonical `Pair`, detecting its input shape per row.

Shapes (docs/formats.md, "Input formats"): explicit strings, conversational (TRL), implicit-prompt HH transcripts,
conversational implicit prompt (UltraFeedback-binarized), ShareGPT (LLaMA-Factory), OpenAI/Azure
DPO, pre-tokenized, and LLaMA-Factory's alpaca preference rows (`instruction`/`input`).

A row that cannot be used raises RecordError with a one-line reason naming the field; a valid
object that is no preference data at all (KTO, SFT, prompt-only rows) raises UnknownShapeError.
This runs per row, so it uses plain type checks and dict lookups.
"""

from __future__ import annotations

from typing import Any

from prefdata.core import flags
from prefdata.core.errors import RecordError, UnknownShapeError
from prefdata.core.numbers import loss_input_problem
from prefdata.core.records import Message, Pair, RawRecord
from prefdata.io.images import IMAGE_COLUMNS, image_refs
from prefdata.io.messages import (
    completion_messages,
    completion_text,
    read_messages,
    read_tools,
    render_messages,
    require_assistant,
    text_of,
    type_error,
)
from prefdata.io.trajectory import (
    check_completion_length,
    check_tool_results,
    divergence_flags,
    shared_lead,
    split_point,
)

HH_ASSISTANT = "\n\nAssistant:"
HH_HUMAN = "\n\nHuman:"
MAX_TOKEN_ID = 2**31 - 1  # token ids are stored as int32/int64; larger values are garbage

_PREFERENCE_KEYS = ("chosen", "rejected", "preferred_output", "non_preferred_output", "rejected_messages")
# Fields each shape turns into the pair; the rest pass through. `tools` is read on every shape.
_CONSUMED = {
    "explicit": frozenset({"prompt", "chosen", "rejected", "tools"}),
    "alpaca": frozenset({"instruction", "input", "chosen", "rejected", "tools"}),
    "sharegpt": frozenset({"conversations", "chosen", "rejected", "system", "tools"}),
    "openai": frozenset({"input", "preferred_output", "non_preferred_output", "tools"}),
    "llamafactory_v1": frozenset({"chosen_messages", "rejected_messages", "tools"}),
    "pretokenized": frozenset(
        {"prompt_ids", "chosen_ids", "rejected_ids", "prompt", "chosen", "rejected", "chosen_loss_mask",
         "rejected_loss_mask"}
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
            raise RecordError(type_error(key, value, "a string or a list of messages"))
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


def _string(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if type(value) is not str:
        if key not in row:
            raise RecordError(_missing_field(row, key))
        raise RecordError(type_error(key, value, "a string"))
    return value


def _extra(row: dict[str, Any], consumed: frozenset[str]) -> dict[str, Any]:
    # `weight` / `offset` reach the loss: a value float32 training cannot hold costs its record here.
    for key in ("weight", "offset"):
        if key in row and key not in consumed and (problem := loss_input_problem(key, row[key])):
            raise RecordError(problem)
    return {key: value for key, value in row.items() if key not in consumed}


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
    require_assistant(chosen, fields[0])
    require_assistant(rejected, fields[1])
    # Tool results must answer a call. Shapes whose chosen/rejected hold the whole conversation name
    # each message by its place there; the others by its place in the prompt or the completion.
    whole = shape in ("conversational_implicit", "llamafactory_v1")
    for name, messages in zip(fields, (chosen, rejected)):
        check_tool_results(prompt + messages, name, name if whole else "prompt", 0 if whole else len(prompt))
    # Completions that share their leading messages split where they differ (the shared ones join the prompt).
    lead = shared_lead(chosen, rejected)
    if lead:
        prompt, chosen, rejected = prompt + chosen[:lead], chosen[lead:], rejected[lead:]
        require_assistant(chosen, fields[0])
        require_assistant(rejected, fields[1])
    check_completion_length(chosen, fields[0])
    check_completion_length(rejected, fields[1])
    pair = Pair(
        tools=tools if tools is not None else read_tools(row.get("tools")),
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=render_messages(prompt),
        chosen=completion_text(chosen),
        rejected=completion_text(rejected),
        prompt_messages=prompt,
        chosen_messages=chosen,
        rejected_messages=rejected,
        extra=_extra(row, consumed),
        shape=shape,
    )
    # Several assistant turns in a message-list completion are an agent trajectory by design: the loss
    # masks train exactly the model's turns, so no multi_turn_completion (that flag is HH transcripts').
    pair.flags += divergence_flags(prompt, chosen, rejected)
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
        raise RecordError(type_error("prompt", prompt, "a string or a list of messages"))
    return _take_images(Pair(
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=prompt,
        chosen=row["chosen"],
        rejected=row["rejected"],
        extra=_extra(row, _CONSUMED["explicit"]),
        shape="explicit",
        tools=read_tools(row.get("tools")),
    ))


def _alpaca(raw: RawRecord, row: dict[str, Any]) -> Pair:
    instruction = _string(row, "instruction")
    extra_input = row.get("input", "")
    if extra_input is None:
        extra_input = ""
    if type(extra_input) is not str:
        raise RecordError(type_error("input", extra_input, "a string"))
    prompt = f"{instruction}\n{extra_input}" if extra_input else instruction
    return Pair(
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=prompt,
        chosen=row["chosen"],
        rejected=row["rejected"],
        extra=_extra(row, _CONSUMED["alpaca"]),
        shape="alpaca",
        tools=read_tools(row.get("tools")),
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
        tools=read_tools(row.get("tools")),
    )
    if multi_turn:
        pair.flags.append(flags.MULTI_TURN_COMPLETION)
        # The same Assistant text, then different Human turns: the halves differ by what the user said.
        first = [part.split(HH_HUMAN, 1) for part in (chosen_part, rejected_part)]
        if all(len(parts) == 2 for parts in first) and first[0][0] == first[1][0]:
            pair.flags.append(flags.DIVERGES_AT_NON_MODEL_TURN)
    return pair


def _conversational(raw: RawRecord, row: dict[str, Any]) -> Pair:
    prompt = read_messages(row["prompt"], "prompt")
    chosen = completion_messages(row["chosen"], "chosen")
    rejected = completion_messages(row["rejected"], "rejected")
    # Some exports repeat the prompt at the start of each completion list: keep it once.
    n = len(prompt)
    if len(chosen) > n and len(rejected) > n and chosen[:n] == prompt and rejected[:n] == prompt:
        chosen, rejected = chosen[n:], rejected[n:]
    return _message_pair(
        raw, row, "conversational", _CONSUMED["explicit"], prompt, chosen, rejected
    )


def _conversational_implicit(raw: RawRecord, row: dict[str, Any]) -> Pair:
    """Full conversations in chosen/rejected: the prompt is their shared leading messages.

    The split is at the first differing message (a pair that differs first at a tool result or a
    user turn is flagged: io.trajectory); a `prompt` string column (UltraFeedback-binarized) is not
    used for splitting, only as the user turn when the two lists hold nothing but completions.
    """
    chosen = read_messages(row["chosen"], "chosen")
    rejected = read_messages(row["rejected"], "rejected")
    shared = split_point(chosen, rejected)  # the prompt: every message up to the first that differs
    prompt_text = row.get("prompt")
    if shared == 0:
        if type(prompt_text) is str and prompt_text:
            prompt = [{"role": "user", "content": prompt_text}]
            return _message_pair(
                raw, row, "conversational", _CONSUMED["explicit"], prompt, chosen, rejected
            )
        raise RecordError(
            "fields 'chosen' and 'rejected' share no leading prompt messages to split at"
        )
    if prompt_text is not None and type(prompt_text) is not str:
        raise RecordError(type_error("prompt", prompt_text, "a string or a list of messages"))
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
    chosen = read_messages(row["chosen_messages"], "chosen_messages", tools_out=tools)
    rejected = read_messages(row["rejected_messages"], "rejected_messages", tools_out=[])
    shared = split_point(chosen, rejected)  # the prompt: every message up to the first that differs
    if shared == 0:
        raise RecordError(
            "fields 'chosen_messages' and 'rejected_messages' share no leading prompt messages to split at"
        )
    pair = _message_pair(
        raw, row, "llamafactory_v1", _CONSUMED["llamafactory_v1"], chosen[:shared], chosen[shared:],
        rejected[shared:], fields=("chosen_messages", "rejected_messages"),
        tools=(read_tools(row.get("tools")) or []) + tools or None,
    )
    weights = {
        half: [item.get("loss_weight") if type(item) is dict else None for item in row[f"{half}_messages"]]
        for half in ("chosen", "rejected")
    }
    if any(w is not None for values in weights.values() for w in values):
        pair.extra["loss_weight"] = weights
    return pair


def _sharegpt(raw: RawRecord, row: dict[str, Any]) -> Pair:
    prompt = read_messages(row["conversations"], "conversations")
    system = row.get("system")
    if system is not None and type(system) is not str:
        raise RecordError(type_error("system", system, "a string"))
    if system:
        prompt = [{"role": "system", "content": system}, *prompt]
    for key in ("chosen", "rejected"):
        if key not in row:
            raise RecordError(_missing_field(row, key))
    chosen = read_messages(row["chosen"], "chosen", single_ok=True)
    rejected = read_messages(row["rejected"], "rejected", single_ok=True)
    return _message_pair(raw, row, "sharegpt", _CONSUMED["sharegpt"], prompt, chosen, rejected)


def _openai(raw: RawRecord, row: dict[str, Any]) -> Pair:
    for key in ("input", "preferred_output", "non_preferred_output"):
        if key not in row:
            raise RecordError(_missing_field(row, key))
    source = row["input"]
    if type(source) is not dict:
        raise RecordError(type_error("input", source, "an object with 'messages'"))
    if "messages" not in source:
        raise RecordError("missing field 'input.messages'")
    prompt = read_messages(source["messages"], "input.messages")
    chosen = read_messages(row["preferred_output"], "preferred_output", single_ok=True)
    rejected = read_messages(row["non_preferred_output"], "non_preferred_output", single_ok=True)
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
        raise RecordError(type_error(key, value, "a list of token ids"))
    for i, token in enumerate(value):
        if type(token) is not int or not 0 <= token <= MAX_TOKEN_ID:
            raise RecordError(f"field '{key}[{i}]' is not a token id (non-negative int): {token!r:.40}")
    return value


def check_vocabulary(pair: Pair, vocabulary: int) -> None:
    """RecordError naming the first id of a pre-tokenized pair that the tokenizer's vocabulary
    (`len(tokenizer)` ids) does not hold: the model's embedding would fail on it, or learn noise."""
    for key in ("prompt_ids", "chosen_ids", "rejected_ids"):
        ids = getattr(pair, key) or ()
        if ids and max(ids) >= vocabulary:
            i, token = next((i, t) for i, t in enumerate(ids) if t >= vocabulary)
            raise RecordError(f"field '{key}[{i}]' holds token id {token}, outside the tokenizer's vocabulary of "
                              f"{vocabulary} ids (0-{vocabulary - 1})")


def _pretokenized(raw: RawRecord, row: dict[str, Any]) -> Pair:
    ids = {key: _ids(row, key) for key in ("prompt_ids", "chosen_ids", "rejected_ids")}
    # Text next to the ids (TRL keeps it, as strings or message lists) is used for text-level checks.
    texts = {key: text_of(row.get(key, ""), completion=key != "prompt") for key in ("prompt", "chosen", "rejected")}
    masks = _loss_masks(row, ids)
    return Pair(
        source_file=raw.source_file,
        source_line=raw.source_line,
        prompt=texts["prompt"],
        chosen=texts["chosen"],
        rejected=texts["rejected"],
        prompt_ids=ids["prompt_ids"],
        chosen_ids=ids["chosen_ids"],
        rejected_ids=ids["rejected_ids"],
        chosen_loss_mask=masks["chosen"],
        rejected_loss_mask=masks["rejected"],
        extra=_extra(row, _CONSUMED["pretokenized"]),
        shape="pretokenized",
    )


def _loss_masks(row: dict[str, Any], ids: dict[str, list[int]]) -> dict[str, list[int] | None]:
    """A pre-tokenized row's `chosen_loss_mask`/`rejected_loss_mask`: both or neither, each one 0 or
    1 per completion id (1: the token is trained), as OUT stores them."""
    given = [half for half in ("chosen", "rejected") if row.get(f"{half}_loss_mask") is not None]
    if not given:
        return {"chosen": None, "rejected": None}
    if len(given) == 1:
        other = "rejected" if given == ["chosen"] else "chosen"
        raise RecordError(f"field '{given[0]}_loss_mask' is given without '{other}_loss_mask': give both or neither")
    masks: dict[str, list[int] | None] = {}
    for half in ("chosen", "rejected"):
        key, value = f"{half}_loss_mask", row[f"{half}_loss_mask"]
        if type(value) is not list:
            raise RecordError(type_error(key, value, "a list of 0/1, one per completion id"))
        for v in value:
            if type(v) not in (int, bool) or v not in (0, 1):
                raise RecordError(f"field '{key}' holds {v!r:.40}: a loss mask holds 0 or 1 per completion id")
        if len(value) != len(ids[f"{half}_ids"]):
            raise RecordError(f"field '{key}' has {len(value)} entries for {len(ids[f'{half}_ids'])} {half}_ids: "
                              "a loss mask holds one 0/1 per completion id")
        masks[half] = [int(v) for v in value]
    return masks
