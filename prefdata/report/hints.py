"""Hints: for a run that lost many pairs, or flagged many, the main cause and the setting that helps.

Three hints exist (report.json's `hints`, docs/report-schema.md):
- `dropped_share`: the policy's `max_dropped_share` was exceeded; names the most common drop flag and
  the flag or setting that would keep those pairs (e.g. `--max-prompt-length` when prompts fill the
  `--max-length` budget).
- `template`: rows flagged `reasoning_lost`: the chat template (the tokenizer's, or the one given with
  `--chat-template-file`) drops what they carry; names the fix that fits the settings given, and a
  bundled template only to a tokenizer whose template it was made for.
  Which setting keeps a flag's pairs is its check's (prefdata.checks.units): `system_lost` and
  `turn_renders_differently` name `--chat-template-file`, `tied_reward` the policy's `tie_threshold`.
- `chat_template`: many plain-string rows got `prompt_boundary_mismatch` although the tokenizer has a
  chat template and `--chat-template` was not given (an instruct tokenizer reading raw text).

Pure functions of counts and settings, so every renderer shows the same words.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from prefdata.checks.units import BY_NAME, CHECKS, data_advice

# Share of checked pairs: plain-string rows with prompt_boundary_mismatch above which --chat-template is hinted.
CHAT_TEMPLATE_HINT_SHARE = 0.1
# Below this --max-length, halving it for the prompt leaves too little room: raising it is the advice.
MIN_SPLIT_LENGTH = 32

# What keeps a flag's pairs is said by its check (prefdata.checks.units: cause, setting, hint): a length
# setting, the chat template, a setting of its own, or nothing but the data.
_LENGTH_FLAGS = tuple(check.name for check in CHECKS if check.cause == "length")
_TEMPLATE_FLAGS = tuple(check.name for check in CHECKS if check.cause == "template")
# On a tie in rows, the flag that causes others wins (the check's rank): a template that drops a tool call
# leaves both halves equal (identical_after_truncation follows reasoning_lost); a completion with no tokens
# left is an empty half, so identical_after_truncation follows no_completion_tokens too.
_CAUSE_ORDER = {check.name: check.rank for check in CHECKS}


def main_drop_cause(flags: Mapping[str, Mapping[str, Any]]) -> tuple[str, int] | None:
    """(flag, rows) of the most common flag that removes rows (drop or error severity), or None."""
    removing = sorted(
        (-info["count"], _CAUSE_ORDER.get(name, 5), name)
        for name, info in flags.items()
        if info.get("severity") in ("drop", "error")
    )
    if not removing:
        return None
    count, _, name = removing[0]
    return name, -count


def keep_setting(flag: str, settings: Mapping[str, Any], prompts_fill: bool = True,
                 fitting: Sequence[str] = ()) -> tuple[str, str]:
    """(setting, why) for the pairs `flag` removed: what the user could change to keep them, never a
    setting the user already gave. `prompts_fill`: some prompts took the whole --max-length budget
    (pairs with no completion tokens left), so cutting prompts keeps completions within the budget.
    `fitting`: the bundled templates made for the tokenizer's own template (template_advice)."""
    max_length = settings.get("max_length")
    max_prompt = settings.get("max_prompt_length")
    if flag in _TEMPLATE_FLAGS:
        return "--chat-template-file", template_advice(settings, fitting)
    if flag in _LENGTH_FLAGS and max_length:
        if max_prompt is None and prompts_fill and max_length >= MIN_SPLIT_LENGTH:
            # Both help; the one that keeps the user's length budget comes first.
            half = max_length // 2
            return (
                f"--max-prompt-length {half}",
                f"prompts fill the --max-length {max_length:,} budget; --max-prompt-length {half:,} cuts prompts "
                "from the left and keeps the completions (or raise --max-length)",
            )
        if max_prompt is not None:
            return (
                "--max-length",
                f"--max-length {max_length:,} with --max-prompt-length {max_prompt:,} leaves too little room for the "
                "completions; raise --max-length or lower --max-prompt-length",
            )
        return (
            "--max-length",
            f"--max-length {max_length:,} leaves too little room for the completions; raise --max-length",
        )
    # A setting of the check's own (tied_reward: tie_threshold), or, where no setting makes such a pair
    # trainable, the data needs fixing (or the loss accepting): max_dropped_share.
    check = BY_NAME.get(flag)
    return (check.setting, check.advice()) if check else ("max_dropped_share", data_advice(flag))


def template_advice(settings: Mapping[str, Any], fitting: Sequence[str] = ()) -> str:
    """Why reasoning_lost pairs were lost and what keeps them: the template is at fault, not the data.
    `fitting`: bundled templates made for the tokenizer's own template (prefdata.templates.MADE_FOR,
    e.g. deepseek-r1-keep-reasoning for DeepSeek-R1's): named only then, as another tokenizer's turns
    would not match them."""
    given = settings.get("chat_template_file")
    if given:
        return (
            f"the chat template from --chat-template-file {given} does not render the rows' reasoning, tool calls "
            "or tools; change that template to render them (docs/reasoning.md), or remove those fields from the data"
        )
    if fitting:
        return (
            "the tokenizer's chat template does not render the rows' reasoning, tool calls or tools; prepare with "
            f"--chat-template-file {fitting[0]} (bundled, made for this tokenizer's template: it renders the last "
            "turn's reasoning; docs/reasoning.md)"
        )
    return (
        "the tokenizer's chat template does not render the rows' reasoning, tool calls or tools: it drops them; "
        "prepare with --chat-template-file and a template that renders them (docs/reasoning.md), or remove those "
        "fields from the data"
    )


def template_hint(flags: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any],
                  fitting: Sequence[str] = ()) -> dict[str, Any] | None:
    """The `template` hint: rows flagged reasoning_lost, and what keeps their content in the tokens."""
    info = flags.get("reasoning_lost")
    if not info or not info.get("count"):
        return None
    rows = info["count"]
    return {
        "kind": "template",
        "flag": "reasoning_lost",
        "count": rows,
        "setting": "--chat-template-file",
        "message": f"reasoning_lost on {rows:,} {plural(rows, 'row')}: {template_advice(settings, fitting)}",
    }


def dropped_share_hint(
    flags: Mapping[str, Mapping[str, Any]], dropped: int, pairs: int, limit: float, settings: Mapping[str, Any],
    fitting: Sequence[str] = (),
) -> dict[str, Any]:
    """The `dropped_share` hint for a run that dropped `dropped` of `pairs` (share above `limit`);
    `fitting` as in template_advice."""
    cause = main_drop_cause(flags)
    share = dropped / pairs
    head = f"dropped {dropped:,} of {pairs:,} pairs ({share:.1%}), above max_dropped_share {limit:.0%}"
    if cause is None:
        return {
            "kind": "dropped_share", "flag": None, "count": dropped, "share": share, "setting": None, "cause": "",
            "message": head,
        }
    flag, count = cause
    no_tokens = (flags.get("no_completion_tokens") or {}).get("count", 0)
    setting, why = keep_setting(flag, settings, prompts_fill=no_tokens > 0, fitting=fitting)
    also = ""
    if flag == "identical_after_truncation" and no_tokens:  # the same cause: halves left empty are equal
        also = f", with no_completion_tokens ({no_tokens:,} {plural(no_tokens, 'pair')})"
    cause_text = f"main cause {flag} ({count:,} {plural(count, 'pair')}{also}): {why}"
    return {
        "kind": "dropped_share",
        "flag": flag,
        "count": count,
        "share": share,
        "setting": setting,
        "cause": cause_text,
        "message": f"{head}: {cause_text}",
    }


def chat_template_hint(string_mismatches: int, pairs: int, meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `chat_template` hint, when plain-string rows read with a chat tokenizer often mismatch."""
    settings = meta.get("settings") or {}
    if not pairs or not meta.get("tokenizer_chat_template") or settings.get("chat_template"):
        return None
    share = string_mismatches / pairs
    if share < CHAT_TEMPLATE_HINT_SHARE:
        return None
    return {
        "kind": "chat_template",
        "flag": "prompt_boundary_mismatch",
        "count": string_mismatches,
        "share": share,
        "setting": "--chat-template",
        "message": (
            f"prompt_boundary_mismatch on {string_mismatches:,} plain-string {plural(string_mismatches, 'row')} "
            f"({share:.1%}): the tokenizer has a chat template; --chat-template renders them through it"
        ),
    }


def plural(count: int, word: str) -> str:
    """`word` or its plural for `count` ("1 pair", "2 pairs")."""
    return word if count == 1 else word + "s"


def dropped_share_problem(report: Mapping[str, Any], no_pair_line: str = "") -> str:
    """The one failure line of a report whose max_dropped_share was exceeded ("" when it was not).

    `no_pair_line`: the run kept no pair; that line leads, with the main cause after it."""
    for hint in report.get("hints", []):
        if hint.get("kind") == "dropped_share":
            if no_pair_line:
                return f"{no_pair_line}; {hint['cause']}" if hint["cause"] else no_pair_line
            return hint["message"]
    return no_pair_line


def nothing_read_problem(report: Mapping[str, Any], input: Any, reasons_in: str) -> str:
    """The one failure line when no record of the input could be read ("" when one could): every record
    quarantined is an input error (exit 2) in `prepare` and `validate` alike, since the input, not its
    pairs, is at fault. `reasons_in`: where the user finds every reason."""
    accounting = report.get("accounting") or {}
    rows_in = int(accounting.get("rows_in") or 0)
    if not rows_in or accounting.get("rows_quarantined") != rows_in:
        return ""
    reasons = (report.get("quarantine") or {}).get("reasons") or [{"reason": "unreadable"}]
    return (f"no record of {input} could be read: all {rows_in:,} were quarantined, e.g. {reasons[0]['reason']} "
            f"(every reason in {reasons_in})")
