"""prefdata's pair checks applied to what TRL's DPOTrainer trains on (prefdata.trainers.trl_run's output).

Each finding names the row, what TRL does to it, the DPOConfig setting that causes it and the one that
avoids it; a max_length that avoids it is checked by running TRL's collator at that length.
"""

from __future__ import annotations

from typing import Any

from prefdata.checks.pair import token_flags
from prefdata.core import flags as F
from prefdata.core.records import TokenizedPair
from prefdata.trainers.common import TrainerFinding
from prefdata.trainers.trl_run import TRLOutcome, TRLPair, collate_untruncated
from prefdata.trainers.trl_settings import TRLSettings

STARTS_WITH_COMPLETION = ("the sequence starts with the completion (no prompt token before it), and TRL's loss never "
                          "reads position 0 (its labels are ids[1:])")
NEEDS_PROMPT = "no DPOConfig setting: a prompt before the completion (or a tokenizer that adds BOS)"


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def trl_findings(outcome: TRLOutcome, settings: TRLSettings, tokenizer: Any) -> list[TrainerFinding]:
    found: list[TrainerFinding] = []
    for row, pair in sorted(outcome.dropped.items()):
        longest = max(len(pair.full("chosen")), len(pair.full("rejected")))
        found.append(TrainerFinding(
            F.NO_COMPLETION_TOKENS, row,
            f"TRL drops the row before training: its prompt is {pair.prompt_len} tokens, >= max_length "
            f"(_prepare_dataset's filter under keep_start; max_length={longest} keeps it whole)",
            settings.cause(), pair.prompt_len + 1))
    for row, pair in sorted(outcome.pairs.items()):
        found += _pair_findings(row, pair, settings, tokenizer)
    return found


def _pair_findings(row: int, pair: TRLPair, settings: TRLSettings, tokenizer: Any) -> list[TrainerFinding]:
    found: list[TrainerFinding] = []
    boundary = _boundary(pair, tokenizer)
    if boundary:
        found.append(TrainerFinding(F.PROMPT_BOUNDARY_MISMATCH, row, *boundary))
    found += _truncation(row, pair, settings)
    view = TokenizedPair(prompt_ids=pair.chosen.ids[:pair.prompt_len], chosen_ids=pair.chosen.trained,
                         rejected_ids=pair.rejected.trained, prompt_len_full=pair.prompt_len,
                         chosen_len_full=len(pair.full("chosen")), rejected_len_full=len(pair.full("rejected")),
                         flags=[])
    flags = token_flags(view, [])  # prefdata's own token checks on TRL's trained ids
    example = pair.example
    if F.NO_COMPLETION_TOKENS in flags:
        empty = [h for h in ("chosen", "rejected") if not getattr(pair, h).trained]
        found.append(TrainerFinding(F.NO_COMPLETION_TOKENS, row, f"{' and '.join(empty)}: no token in TRL's loss "
                                    f"({STARTS_WITH_COMPLETION})", "the row: no prompt tokens", NEEDS_PROMPT))
    elif F.IDENTICAL_AFTER_TRUNCATION in flags and example["chosen"] == example["rejected"]:
        found.append(TrainerFinding(F.IDENTICAL, row, _identical_detail(pair, tokenizer),
                                    "the row itself: chosen and rejected are the same text",
                                    "no DPOConfig setting: fix or remove the row"))
    elif F.IDENTICAL_AFTER_TRUNCATION in flags:
        found.append(TrainerFinding(F.IDENTICAL_AFTER_TRUNCATION, row, _identical_detail(pair, tokenizer),
                                    *_identical_cause(pair, settings, tokenizer)))
    elif _same_words(pair.chosen.trained, pair.rejected.trained, tokenizer):
        texts_alike = _same_words_text(example["chosen"], example["rejected"])
        found.append(TrainerFinding(
            F.WHITESPACE_ONLY, row, "the trained tokens differ only in whitespace: "
            f"{_short(tokenizer.decode(pair.chosen.trained))} vs {_short(tokenizer.decode(pair.rejected.trained))}",
            "the row itself: chosen and rejected differ only in whitespace" if texts_alike else settings.cause(),
            "no DPOConfig setting: fix the row" if texts_alike else "max_length=None (no truncation)"))
    return found


def _boundary(pair: TRLPair, tokenizer: Any) -> tuple[str, str, str] | None:
    """TRL's completion starts where the prompt alone and prompt + completion diverge; where that is before
    the prompt's end, the prompt's last tokens are left out of the training sequence."""
    alone, n = pair.prompt_alone, pair.prompt_len
    if n >= len(alone):
        return None
    first = next(h for h in ("chosen", "rejected") if pair.full(h)[n:n + 1] != alone[n:n + 1])
    starts = tokenizer.decode(pair.full(first)[n:n + 3])
    detail = (f"the prompt alone is {len(alone)} tokens, but prompt+{first} tokenizes differently from token {n}: "
              f"TRL leaves the prompt's end {_short(tokenizer.decode(alone[n:]))} out of the training sequence and "
              f"starts the completion with {_short(starts)}, so the model is trained on a context it does not see "
              f"at inference")
    if isinstance(pair.example["prompt"], str):
        return (detail, "string rows: TRL tokenizes prompt + completion as one string",
                "conversational rows (message lists, rendered by the chat template), or a prompt that ends where a "
                "token ends")
    return (detail, "the chat template renders the prompt alone (add_generation_prompt=True) otherwise than "
                    "followed by the completion",
            "no DPOConfig setting: a chat template that renders the prompt alike in both")


def _truncation(row: int, pair: TRLPair, settings: TRLSettings) -> list[TrainerFinding]:
    """What max_length / truncation_mode cut: a completion's end (keep_start), its start (keep_end), or a
    different part of the prompt in each half (keep_end)."""
    limit = settings.max_length
    if limit is None:
        return []
    found = []
    kept_prompt = {}
    for half in ("chosen", "rejected"):
        whole = len(pair.full(half))
        cut = whole - limit
        if cut <= 0:
            kept_prompt[half] = pair.prompt_len
            continue
        if settings.truncation_mode == "keep_start":
            detail = (f"{half}: cut from {whole} to {limit} tokens (keep_start): its last {cut} tokens, its end "
                      "included, are never trained (the model does not learn where it stops)")
        elif cut > pair.prompt_len:
            detail = (f"{half}: cut from {whole} to {limit} tokens (keep_end): the whole prompt and the "
                      f"completion's first {cut - pair.prompt_len} tokens are gone, so it is trained with no prompt")
        else:
            kept_prompt[half] = pair.prompt_len - cut
            continue
        found.append(TrainerFinding(F.COMPLETION_TRUNCATED, row, detail, settings.cause(), whole))
    if len(kept_prompt) == 2 and kept_prompt["chosen"] != kept_prompt["rejected"]:
        found.append(TrainerFinding(
            F.PROMPT_BOUNDARY_MISMATCH, row,
            f"keep_end cut the prompt's start by a different amount in each half: chosen keeps its last "
            f"{kept_prompt['chosen']} of {pair.prompt_len} prompt tokens, rejected its last {kept_prompt['rejected']}: "
            "the halves are scored after different contexts",
            settings.cause(), max(len(pair.full("chosen")), len(pair.full("rejected")))))
    return found


def _identical_detail(pair: TRLPair, tokenizer: Any) -> str:
    return (f"both halves train on the same {len(pair.chosen.trained)} tokens "
            f"{_short(tokenizer.decode(pair.chosen.trained))}: the loss is ln 2 whatever the model")


def _identical_cause(pair: TRLPair, settings: TRLSettings, tokenizer: Any) -> tuple[str, int | str]:
    """Truncation (and the shortest max_length at which TRL's collator keeps a difference), position 0, or
    the chat template rendering both halves alike."""
    full = collate_untruncated(pair, tokenizer, settings, None)
    if full.chosen.trained != full.rejected.trained:
        for length in _candidates(pair, settings):
            again = collate_untruncated(pair, tokenizer, settings, length)
            if again.chosen.trained != again.rejected.trained:
                return settings.cause(), length
        return settings.cause(), "max_length=None (no truncation)"
    if pair.example["chosen_ids"] != pair.example["rejected_ids"]:
        return STARTS_WITH_COMPLETION, NEEDS_PROMPT
    return ("the chat template renders both completions as the same tokens (it drops what tells them apart)",
            "no DPOConfig setting: a chat template that renders the difference, or fix the row")


def _candidates(pair: TRLPair, settings: TRLSettings) -> list[int]:
    """Where the difference enters the kept window: after the common prefix (keep_start) or before the
    common suffix (keep_end); one more for the position TRL's loss never reads."""
    a, b = pair.full("chosen"), pair.full("rejected")
    if settings.truncation_mode == "keep_start":
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    else:
        shared = next((i for i, (x, y) in enumerate(zip(reversed(a), reversed(b))) if x != y), min(len(a), len(b)))
    return [shared + 1, shared + 2]


def _same_words(a: list[int], b: list[int], tokenizer: Any) -> bool:
    return a != b and _same_words_text(tokenizer.decode(a), tokenizer.decode(b))


def _same_words_text(a: Any, b: Any) -> bool:
    """Equal once every whitespace character is removed (the decoded halves end in EOS text, so a trailing
    space sits inside them, not at an end)."""
    return "".join(_text(a).split()) == "".join(_text(b).split())


def _text(value: Any) -> str:
    """A half's text: a string row's, or its messages' contents (conversational rows)."""
    if isinstance(value, str):
        return value
    return "\n".join(str(m.get("content") or "") for m in value or [] if isinstance(m, dict))
