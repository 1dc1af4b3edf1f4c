"""prefdata's pair checks applied to what axolotl trains on (prefdata.trainers.axolotl's output).

Each finding names the row, what axolotl does to it, the config key that causes it (as it reads in the
YAML) and what avoids it: a `sequence_len` long enough (from axolotl's own run with no limit), or in
words where no axolotl setting does.
"""

from __future__ import annotations

from typing import Any

from prefdata.checks.pair import normalize_whitespace, token_flags
from prefdata.core import flags as F
from prefdata.core.records import TokenizedPair
from prefdata.trainers.axolotl import AxolotlPair, AxolotlRuns, AxolotlSettings
from prefdata.trainers.common import TrainerFinding

DUMMY = "[[dummy_message]]"  # the user turn axolotl's chat_template strategy renders before each response


def axolotl_findings(runs: AxolotlRuns, settings: AxolotlSettings, tokenizer: Any,
                     rows: list[dict[str, Any]]) -> list[TrainerFinding]:
    found: list[TrainerFinding] = []
    cause = _length_cause(settings)
    for row in runs.main.dropped:
        whole = runs.full.pairs.get(row)
        if whole is None:
            continue  # dropped with no limit too: not a length matter (reported in the run's notes)
        need = max(len(whole.chosen.ids), len(whole.rejected.ids))
        found.append(TrainerFinding(
            F.NO_COMPLETION_TOKENS, row,
            f"axolotl drops the row without an error: prompt + longer half is {need} tokens, over "
            f"sequence_len {settings.sequence_len}", cause, need + 1))
    for row, pair in sorted(runs.main.pairs.items()):
        found += _pair_findings(row, pair, runs.full.pairs.get(row), settings, tokenizer, rows[row])
    return found


def _length_cause(settings: AxolotlSettings) -> str:
    return f"{settings.key('sequence_len', settings.sequence_len)} (excess_length_strategy: {settings.excess})"


def _pair_findings(row: int, pair: AxolotlPair, full: AxolotlPair | None, settings: AxolotlSettings,
                   tokenizer: Any, raw: dict[str, Any]) -> list[TrainerFinding]:
    found: list[TrainerFinding] = []
    own: list[str] = []
    for half in ("chosen", "rejected"):
        found += _located(row, half, pair, full or pair, settings, _response(raw, settings, half))
        cut = _cut(half, pair, full, settings, tokenizer)
        if cut:
            own.append(F.COMPLETION_TRUNCATED)
            found.append(TrainerFinding(F.COMPLETION_TRUNCATED, row, cut[0], _length_cause(settings), cut[1]))
    own += [f.flag for f in found if f.flag == F.PROMPT_BOUNDARY_MISMATCH]
    view = TokenizedPair(prompt_ids=pair.chosen.ids[:pair.prompt_len], chosen_ids=pair.chosen.trained,
                         rejected_ids=pair.rejected.trained, prompt_len_full=pair.prompt_len,
                         chosen_len_full=len(pair.chosen.ids), rejected_len_full=len(pair.rejected.ids), flags=own)
    flags = token_flags(view, [])
    if F.NO_COMPLETION_TOKENS in flags:
        empty = [h for h in ("chosen", "rejected") if not getattr(pair, h).trained]
        found.append(TrainerFinding(F.NO_COMPLETION_TOKENS, row, f"{' and '.join(empty)}: no token in the "
                                    "completion mask TRL builds under axolotl", _length_cause(settings),
                                    "a shorter prompt or a longer sequence_len"))
    if F.IDENTICAL_AFTER_TRUNCATION in flags:
        found.append(_identical(row, pair, full, settings, tokenizer, raw))
    elif _whitespace_only(pair, tokenizer):
        found.append(TrainerFinding(
            F.WHITESPACE_ONLY, row, "the trained tokens differ only in whitespace: "
            f"{tokenizer.decode(pair.chosen.trained)!r} vs {tokenizer.decode(pair.rejected.trained)!r}",
            f"{settings.dataset_key('type')}", "no axolotl setting: fix the row"))
    return found


def _located(row: int, half: str, pair: AxolotlPair, whole: AxolotlPair, settings: AxolotlSettings,
             content: str | None) -> list[TrainerFinding]:
    """Where chat_template.default's str.find put the response's start (read on the untruncated run's text:
    a cut response may have lost the sign)."""
    misplaced = _misplaced(half, pair, whole)
    if misplaced:
        return [TrainerFinding(
            F.PROMPT_BOUNDARY_MISMATCH, row, misplaced,
            f"{settings.dataset_key('type')} (it finds the response with str.find in a render that starts "
            "with the template's system prompt)",
            "no axolotl setting while the template's default system prompt contains the response: give the "
            "row a system message, or a chat_template_jinja without a default system prompt")]
    missing = _not_found(half, whole, content)
    if missing:
        return [TrainerFinding(
            F.PROMPT_BOUNDARY_MISMATCH, row, missing,
            f"{settings.dataset_key('type')} (it finds the response with str.find in the template's render)",
            "no axolotl setting: strip the responses' leading and trailing whitespace, or a chat template that "
            "renders them unchanged")]
    return []


def _misplaced(half: str, pair: AxolotlPair, whole: AxolotlPair) -> str:
    """axolotl's chat_template strategy cuts each response out of a render of [dummy user turn, response]
    at str.find(response): where the response's text first occurs earlier (in a default system prompt),
    the trained text starts there and takes in the rest of the system prompt and the dummy turn."""
    text = getattr(whole, f"{half}_text")
    if not isinstance(text, str) or DUMMY not in text:
        return ""
    trained = getattr(pair, half).trained
    shown = text if len(text) <= 80 else text[:77] + "..."
    return (f"{half}: axolotl trains {len(trained)} tokens {shown!r}: str.find met the response's text inside "
            "the template's default system prompt, so the system prompt's end and its placeholder user turn "
            f"{DUMMY!r} are trained as the response")


def _response(raw: dict[str, Any], settings: AxolotlSettings, half: str) -> str | None:
    """The row's response text as the dataset entry's field_chosen/field_rejected names it (a string, a message,
    or a message list whose last message is the response)."""
    value = raw.get(settings.entry.get(f"field_{half}") or half)
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        value = value[-1]
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _not_found(half: str, whole: AxolotlPair, content: str | None) -> str:
    """str.find returns -1 where the template changes the response (trims it): axolotl then keeps the render's
    last character, and trains that (or nothing) as the response."""
    text = getattr(whole, f"{half}_text")
    if not isinstance(text, str) or not content or not content.strip() or content.strip() in text:
        return ""
    return (f"{half}: str.find did not find the response in the template's render (the template changes it, "
            f"e.g. trims it), so axolotl keeps the render's last character: it trains {text!r} as the response")


def _cut(half: str, pair: AxolotlPair, full: AxolotlPair | None, settings: AxolotlSettings,
         tokenizer: Any) -> tuple[str, int] | None:
    if full is None:
        return None
    mine, whole = getattr(pair, half), getattr(full, half)
    if mine.ids == whole.ids:
        return None
    how = ("decoded ids[:n] as text and re-tokenized (excess_length_strategy: truncate); TRL then appends EOS "
           "where the cut fell, so the model learns to stop mid-response" if settings.excess == "truncate"
           else "TRL's collator keeps the first max_length tokens (truncation_mode keep_start): its end and EOS are lost")
    lost = tokenizer.decode(whole.ids[len(mine.ids) - 1:][:8]) if len(mine.ids) <= len(whole.ids) else ""
    return (f"{half}: cut from {len(whole.ids)} to {len(mine.ids)} tokens ({how}); lost from {lost!r}",
            len(whole.ids))


def _identical(row: int, pair: AxolotlPair, full: AxolotlPair | None, settings: AxolotlSettings, tokenizer: Any,
               raw: dict[str, Any]) -> TrainerFinding:
    text = tokenizer.decode(pair.chosen.trained)
    short = text if len(text) <= 80 else text[:77] + "..."
    detail = f"both halves train on the same {len(pair.chosen.trained)} tokens {short!r}: the loss is ln 2 whatever the model"
    if full is not None and full.chosen.trained != full.rejected.trained:
        a, b = full.chosen.ids, full.rejected.ids
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return TrainerFinding(F.IDENTICAL_AFTER_TRUNCATION, row, detail, _length_cause(settings), first + 2)
    field_c, field_r = settings.entry.get("field_chosen") or "chosen", settings.entry.get("field_rejected") or "rejected"
    if raw.get(field_c) == raw.get(field_r):
        return TrainerFinding(F.IDENTICAL, row, detail, "the row itself: chosen and rejected are the same",
                              "no axolotl setting: fix or remove the row")
    return TrainerFinding(F.IDENTICAL, row, detail + " (the row's halves differ only where axolotl strips them)",
                          f"{settings.dataset_key('type')} (it rstrips each response, axolotl #3824)",
                          "no axolotl setting: make the halves differ in more than trailing whitespace, or drop the row")


def _whitespace_only(pair: AxolotlPair, tokenizer: Any) -> bool:
    if pair.chosen.trained == pair.rejected.trained:
        return False
    a, b = tokenizer.decode(pair.chosen.trained), tokenizer.decode(pair.rejected.trained)
    return normalize_whitespace(a) == normalize_whitespace(b)


def double_bos_rows(runs: AxolotlRuns, bos: int | None) -> list[int]:
    """Rows whose ids start with two BOS tokens: the chat template writes one and TRL 1.9's tokenizer call
    adds another (AxolotlDPOTrainer._tokenize, which would remove it, is not what TRL 1.9 calls)."""
    if bos is None:
        return []
    return [row for row, pair in sorted(runs.main.pairs.items()) if pair.chosen.ids[:2] == [bos, bos]]
