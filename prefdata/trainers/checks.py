"""prefdata's pair checks applied to what OpenRLHF trains on (prefdata.trainers.openrlhf's output).

Each finding names the row, what OpenRLHF does to it, the OpenRLHF setting that causes it and the one
that avoids it (a `--data.max_len` long enough, computed from OpenRLHF's own untruncated run).
"""

from __future__ import annotations

from typing import Any

from prefdata.checks.pair import normalize_whitespace, token_flags
from prefdata.core import flags as F
from prefdata.core.records import TokenizedPair
from prefdata.trainers.common import TrainerFinding
from prefdata.trainers.openrlhf import OpenRLHFOutcome, OpenRLHFPair, OpenRLHFSettings


def needs_untruncated(pair: OpenRLHFPair, settings: OpenRLHFSettings) -> bool:
    """A half at exactly data.max_len may have been cut: its untruncated run says."""
    return max(len(pair.chosen.ids), len(pair.rejected.ids)) >= settings.max_len


def openrlhf_findings(outcome: OpenRLHFOutcome, full: OpenRLHFOutcome, settings: OpenRLHFSettings,
                      tokenizer: Any, rows: list[dict[str, Any]]) -> list[TrainerFinding]:
    """Findings for every row (`rows`: the rows as handed to OpenRLHF). `full`: OpenRLHF's run with no length limit on the rows it dropped and
    those it may have cut (needs_untruncated), by the same row positions."""
    cause = settings.flag("max_len")
    found: list[TrainerFinding] = []
    for row, prompt_tokens in sorted(outcome.dropped.items()):
        whole = full.pairs.get(row)  # the prompt's length untruncated, and the longer half's
        size = f"{whole.prompt_len} tokens" if whole else f"at least {prompt_tokens} tokens"
        fix = max(whole.prompt_len + 3, len(whole.chosen.ids), len(whole.rejected.ids)) if whole else prompt_tokens + 3
        found.append(TrainerFinding(
            F.NO_COMPLETION_TOKENS, row,
            f"OpenRLHF drops the row without a message: its prompt is {size}, "
            f">= data.max_len - 2 (RewardDataset's filter)", cause, fix))
    for row, pair in sorted(outcome.pairs.items()):
        found += _pair_findings(row, pair, full.pairs.get(row), settings, tokenizer)
        history = _other_history(rows[row], pair, settings, tokenizer)
        if history:
            found.append(TrainerFinding(F.PROMPT_BOUNDARY_MISMATCH, row, history,
                                        "no --data.prompt_key (the prompt is rendered from the chosen conversation)",
                                        "a prompt column both halves share, given as --data.prompt_key"))
    return found


def _other_history(row: dict[str, Any], pair: OpenRLHFPair, settings: OpenRLHFSettings, tokenizer: Any) -> str:
    """Without a prompt key, OpenRLHF renders the prompt from chosen[:-1] and cuts rejected's rendering at
    that prompt's length; where rejected's earlier turns differ, the cut falls anywhere."""
    if settings.prompt_key or not settings.apply_chat_template:
        return ""
    chosen, rejected = row.get(settings.chosen_key), row.get(settings.rejected_key)
    if not isinstance(chosen, list) or not isinstance(rejected, list) or chosen[:-1] == rejected[:-1]:
        return ""
    text = tokenizer.decode(pair.rejected.trained)
    short = text if len(text) <= 80 else text[:77] + "..."
    return (f"rejected's turns before its last differ from chosen's, but OpenRLHF cuts rejected's rendering at "
            f"the length of the prompt rendered from chosen's: it trains rejected as {short!r}")


def _pair_findings(row: int, pair: OpenRLHFPair, full: OpenRLHFPair | None, settings: OpenRLHFSettings,
                   tokenizer: Any) -> list[TrainerFinding]:
    cause = settings.flag("max_len")
    found: list[TrainerFinding] = []
    own: list[str] = []
    boundary = _boundary_problem(pair, tokenizer)
    if boundary:
        own.append(F.PROMPT_BOUNDARY_MISMATCH)
        if settings.apply_chat_template:
            fix = "no OpenRLHF setting: the chat template's prompt does not end where a token ends"
            why = "--data.apply_chat_template with this tokenizer's template"
        else:
            fix = "--data.apply_chat_template (the prompt then ends with the template's assistant header)"
            why = "prompt and response joined as plain strings (no --data.apply_chat_template)"
        found.append(TrainerFinding(F.PROMPT_BOUNDARY_MISMATCH, row, boundary, why, fix))
    for half in ("chosen", "rejected"):
        cut = _cut(getattr(pair, half), getattr(full, half) if full else None, settings, tokenizer)
        if cut:
            own.append(F.COMPLETION_TRUNCATED)
            found.append(TrainerFinding(F.COMPLETION_TRUNCATED, row, f"{half}: {cut[0]}", cause, cut[1]))
    view = TokenizedPair(prompt_ids=pair.chosen.ids[:pair.prompt_len], chosen_ids=pair.chosen.trained,
                         rejected_ids=pair.rejected.trained, prompt_len_full=pair.prompt_len,
                         chosen_len_full=len(pair.chosen.ids), rejected_len_full=len(pair.rejected.ids), flags=own)
    flags = token_flags(view, [])  # prefdata's own token checks on OpenRLHF's trained ids
    if F.NO_COMPLETION_TOKENS in flags:
        empty = [h for h in ("chosen", "rejected") if not getattr(pair, h).trained]
        found.append(TrainerFinding(F.NO_COMPLETION_TOKENS, row, f"{' and '.join(empty)}: no token in OpenRLHF's "
                                    "loss mask", cause, "a shorter prompt or a longer --data.max_len"))
    if F.IDENTICAL_AFTER_TRUNCATION in flags and pair.chosen_text == pair.rejected_text:
        # the row's own halves are the same text: prefdata's `identical`, whatever OpenRLHF does
        found.append(TrainerFinding(F.IDENTICAL, row, _identical_detail(pair, tokenizer),
                                    "the row itself: chosen and rejected are the same text",
                                    "no OpenRLHF setting: fix or remove the row"))
    elif F.IDENTICAL_AFTER_TRUNCATION in flags:
        found.append(TrainerFinding(F.IDENTICAL_AFTER_TRUNCATION, row, _identical_detail(pair, tokenizer),
                                    *_identical_fix(pair, full, settings)))
    elif pair.chosen.trained != pair.rejected.trained and _same_words(pair, tokenizer):
        found.append(TrainerFinding(F.WHITESPACE_ONLY, row, "the trained tokens differ only in whitespace: "
                                    f"{tokenizer.decode(pair.chosen.trained)!r} vs {tokenizer.decode(pair.rejected.trained)!r}",
                                    "OpenRLHF's processing (it strips trailing newlines, then adds ' ' + EOS)",
                                    "no OpenRLHF setting: fix the row"))
    return found


def _boundary_problem(pair: OpenRLHFPair, tokenizer: Any) -> str:
    """OpenRLHF counts the prompt's tokens alone (prompt_len) and masks that many tokens of prompt+response;
    where the joined text tokenizes differently at the seam, the mask's edge is off."""
    alone = tokenizer(pair.prompt, add_special_tokens=False)["input_ids"]
    n = pair.prompt_len
    for half in ("chosen", "rejected"):
        ids = getattr(pair, half).ids
        if ids[:n] != alone[:n]:
            seam = next((i for i in range(min(n, len(ids), len(alone))) if ids[i] != alone[i]), min(n, len(ids)) - 1)
            merged = tokenizer.decode(ids[seam:seam + 1])
            return (f"{half}: the prompt alone is {n} tokens but prompt+{half} tokenizes differently at its end "
                    f"(token {seam}: {merged!r} joins the prompt's end to the response's start), so OpenRLHF's "
                    f"mask starts at the wrong token")
    return ""


def _cut(half: Any, full: Any, settings: OpenRLHFSettings, tokenizer: Any) -> tuple[str, int] | None:
    if full is None or len(full.ids) <= len(half.ids):
        return None
    lost = tokenizer.decode(full.ids[settings.max_len - 1:settings.max_len])
    return (f"cut from {len(full.ids)} to {len(half.ids)} tokens and its last kept token {lost!r} overwritten "
            f"with EOS (the model learns to stop there)", len(full.ids))


def _identical_detail(pair: OpenRLHFPair, tokenizer: Any) -> str:
    text = tokenizer.decode(pair.chosen.trained)
    short = text if len(text) <= 80 else text[:77] + "..."
    return f"both halves train on the same {len(pair.chosen.trained)} tokens {short!r}: the loss is ln 2 whatever the model"


def _identical_fix(pair: OpenRLHFPair, full: OpenRLHFPair | None, settings: OpenRLHFSettings) -> tuple[str, int | str]:
    """The smallest max_len at which the untruncated halves still differ before the EOS OpenRLHF writes
    over the last kept token."""
    if full is not None:
        a, b = full.chosen.ids, full.rejected.ids
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if a != b:
            return settings.flag("max_len"), first + 2
    return "OpenRLHF's processing (it strips trailing newlines, then adds ' ' + EOS)", "no OpenRLHF setting: fix the row"


def _same_words(pair: OpenRLHFPair, tokenizer: Any) -> bool:
    a, b = tokenizer.decode(pair.chosen.trained), tokenizer.decode(pair.rejected.trained)
    return normalize_whitespace(a) == normalize_whitespace(b)
