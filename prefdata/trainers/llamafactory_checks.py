"""prefdata's pair checks applied to what LLaMA-Factory trains on (prefdata.trainers.llamafactory's output).

Each finding names the row, what LLaMA-Factory does to it, the setting of its YAML config that causes it and
the one that avoids it (a `cutoff_len` computed with its own infer_seqlen on its untruncated ids).
"""

from __future__ import annotations

from typing import Any

from prefdata.checks.pair import normalize_whitespace, token_flags
from prefdata.core import flags as F
from prefdata.core.records import TokenizedPair
from prefdata.trainers.common import TrainerFinding
from prefdata.trainers.llamafactory import LlamaFactoryOutcome, LlamaFactoryPair, LlamaFactorySettings

SHAPE_FIX = ("chosen and rejected as one message each (sharegpt) or one string each (alpaca), after an odd number "
             "of prompt turns: `prefdata export OUT DIR --trainer llamafactory` writes them so")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def llamafactory_findings(outcome: LlamaFactoryOutcome, settings: LlamaFactorySettings,
                          tokenizer: Any) -> list[TrainerFinding]:
    """Findings for every row LLaMA-Factory dropped or encoded, by the rows' positions."""
    found: list[TrainerFinding] = []
    for row, info in sorted(outcome.dropped.items()):
        found.append(TrainerFinding(
            F.NO_COMPLETION_TOKENS, row,
            f"LLaMA-Factory drops the row with only a logged warning ('Dropped invalid example'): its converter "
            f"gave {info['prompt_messages']} prompt message(s) and {info['responses']} response(s); its DPO stage "
            "needs an odd number of prompt messages and two responses", "the row's shape under the dataset_info "
            "entry (formatting, columns, tags)", SHAPE_FIX))
    for row, pair in sorted(outcome.pairs.items()):
        found += _pair_findings(row, pair, settings, tokenizer)
        if row in outcome.explicit_empty_system and outcome.default_system:
            found.append(TrainerFinding(
                F.SYSTEM_LOST, row, f"the row's system message is empty, and LLaMA-Factory renders its template's "
                f"default instead ({_short(outcome.default_system)!r}): `system or default_system`",
                settings.key("template"), 'default_system: "" (no system message where a row gives none)'))
        if any(pair.thought_added) and outcome.reasoning_template:
            halves = [h for h, added in zip(("chosen", "rejected"), pair.thought_added) if added]
            found.append(TrainerFinding(
                F.REASONING_MISMATCH, row, f"{' and '.join(halves)}: no think block, so LLaMA-Factory's reasoning "
                "template puts an empty one at the start of the trained response (the model learns to skip "
                "thinking)", f"{settings.key('template')} with {settings.key('enable_thinking', True)}",
                "enable_thinking: false (the empty block moves into the prompt), or the template's _nothink variant"))
    return found


def _pair_findings(row: int, pair: LlamaFactoryPair, settings: LlamaFactorySettings,
                   tokenizer: Any) -> list[TrainerFinding]:
    cause = settings.key("cutoff_len")
    found: list[TrainerFinding] = []
    own: list[str] = []
    if pair.prompt_len < len(pair.full_prompt):
        own.append(F.PROMPT_BOUNDARY_MISMATCH)
        lost = tokenizer.decode(pair.full_prompt[pair.prompt_len:])
        lost = lost if len(lost) <= 60 else "..." + lost[-57:]  # its end: the assistant header
        found.append(TrainerFinding(
            F.PROMPT_BOUNDARY_MISMATCH, row,
            f"LLaMA-Factory keeps the prompt's first {pair.prompt_len} of {len(pair.full_prompt)} tokens and cuts "
            f"the rest ({lost!r}), so the response is trained after a prompt cut mid-way, without the assistant "
            "header",
            cause, pair.prompt_whole_at or "a shorter prompt"))
    for half in ("chosen", "rejected"):
        trained, full = getattr(pair, half).trained, getattr(pair, f"full_{half}")
        if len(trained) < len(full):
            own.append(F.COMPLETION_TRUNCATED)
            found.append(TrainerFinding(
                F.COMPLETION_TRUNCATED, row,
                f"{half}: cut from {len(full)} to {len(trained)} tokens, its end {_short(tokenizer.decode(full[len(trained):]))!r} "
                "(EOS included) lost: the model is trained on a response that stops nowhere",
                cause, pair.response_whole_at or "a shorter prompt"))
    view = TokenizedPair(prompt_ids=pair.chosen.ids[:pair.prompt_len], chosen_ids=pair.chosen.trained,
                         rejected_ids=pair.rejected.trained, prompt_len_full=len(pair.full_prompt),
                         chosen_len_full=len(pair.full_chosen), rejected_len_full=len(pair.full_rejected), flags=own)
    flags = token_flags(view, [])  # prefdata's own token checks on LLaMA-Factory's trained ids
    if F.NO_COMPLETION_TOKENS in flags:
        empty = [h for h in ("chosen", "rejected") if not getattr(pair, h).trained]
        found.append(TrainerFinding(F.NO_COMPLETION_TOKENS, row, f"{' and '.join(empty)}: no token in LLaMA-Factory's "
                                    "labels (cutoff_len leaves the response no room)", cause,
                                    pair.trained_at or "a shorter prompt"))
    if F.IDENTICAL_AFTER_TRUNCATION in flags:
        found.append(_identical(row, pair, settings, tokenizer))
    elif pair.chosen.trained != pair.rejected.trained and _same_words(pair, tokenizer):
        found.append(TrainerFinding(F.WHITESPACE_ONLY, row, "the trained tokens differ only in whitespace: "
                                    f"{_short(tokenizer.decode(pair.chosen.trained))!r} vs "
                                    f"{_short(tokenizer.decode(pair.rejected.trained))!r}",
                                    "the row itself", "no LLaMA-Factory setting: fix the row"))
    return found


def _identical(row: int, pair: LlamaFactoryPair, settings: LlamaFactorySettings, tokenizer: Any) -> TrainerFinding:
    text = _short(tokenizer.decode(pair.chosen.trained))
    detail = f"both halves train on the same {len(pair.chosen.trained)} tokens {text!r}: the loss is ln 2 whatever the model"
    if pair.full_chosen == pair.full_rejected:  # the row's own halves encode the same: prefdata's `identical`
        return TrainerFinding(F.IDENTICAL, row, detail, "the row itself: chosen and rejected are the same text",
                              "no LLaMA-Factory setting: fix or remove the row")
    first = next(i for i, (a, b) in enumerate(zip(pair.full_chosen + [None], pair.full_rejected + [None])) if a != b)
    detail += (f" (they first differ at response token {first}; LLaMA-Factory cuts both responses to one shared "
               f"length, {len(pair.chosen.trained)})")
    return TrainerFinding(F.IDENTICAL_AFTER_TRUNCATION, row, detail, settings.key("cutoff_len"),
                          pair.apart_at or "a shorter prompt")


def _same_words(pair: LlamaFactoryPair, tokenizer: Any) -> bool:
    a, b = tokenizer.decode(pair.chosen.trained), tokenizer.decode(pair.rejected.trained)
    return normalize_whitespace(a) == normalize_whitespace(b)
