"""Hints: for a run that lost many pairs, or flagged many, the main cause and the setting that helps.

Two hints exist (report.json's `hints`, docs/report-schema.md):
- `dropped_share`: the policy's `max_dropped_share` was exceeded; names the most common drop flag and
  the flag or setting that would keep those pairs (e.g. `--max-prompt-length` when prompts fill the
  `--max-length` budget).
- `chat_template`: many plain-string rows got `prompt_boundary_mismatch` although the tokenizer has a
  chat template and `--chat-template` was not given (an instruct tokenizer reading raw text).

Pure functions of counts and settings, so every renderer shows the same words.
"""

from __future__ import annotations

from typing import Any, Mapping

# Share of checked pairs: plain-string rows with prompt_boundary_mismatch above which --chat-template is hinted.
CHAT_TEMPLATE_HINT_SHARE = 0.1
# Below this --max-length, halving it for the prompt leaves too little room: raising it is the advice.
MIN_SPLIT_LENGTH = 32

# Flags a length setting causes; the others describe the pair itself.
_LENGTH_FLAGS = ("no_completion_tokens", "identical_after_truncation", "image_truncated")


def main_drop_cause(flags: Mapping[str, Mapping[str, Any]]) -> tuple[str, int] | None:
    """(flag, rows) of the most common flag that removes rows (drop or error severity), or None."""
    # Most rows first. A pair with no completion tokens left also has identical (empty) halves after
    # truncation, so on a tie no_completion_tokens is the cause and the other its consequence.
    removing = sorted(
        (-info["count"], name != "no_completion_tokens", name)
        for name, info in flags.items()
        if info.get("severity") in ("drop", "error")
    )
    if not removing:
        return None
    count, _, name = removing[0]
    return name, -count


def keep_setting(flag: str, settings: Mapping[str, Any]) -> tuple[str, str]:
    """(setting, why) for the pairs `flag` removed: what the user could change to keep them."""
    max_length = settings.get("max_length")
    max_prompt = settings.get("max_prompt_length")
    if flag in _LENGTH_FLAGS and max_length:
        if flag == "no_completion_tokens" and max_prompt is None and max_length >= MIN_SPLIT_LENGTH:
            return (
                f"--max-prompt-length {max_length // 2}",
                f"prompts fill the --max-length {max_length:,} budget; --max-prompt-length {max_length // 2:,} "
                "cuts prompts from the left and keeps the completions",
            )
        return (
            "--max-length",
            f"--max-length {max_length:,} leaves too little room for the completions; raise --max-length",
        )
    if flag == "tied_reward":
        return "tie_threshold", "samples got equal rewards; sample more per prompt or lower the policy's tie_threshold"
    # No setting makes such a pair trainable: the data needs fixing, or the loss accepting.
    return (
        "max_dropped_share",
        f"the pairs themselves are {flag}: fix the data (see dropped.jsonl), or raise max_dropped_share in a "
        "policy if losing them is expected",
    )


def dropped_share_hint(
    flags: Mapping[str, Mapping[str, Any]], dropped: int, pairs: int, limit: float, settings: Mapping[str, Any]
) -> dict[str, Any]:
    """The `dropped_share` hint for a run that dropped `dropped` of `pairs` (share above `limit`)."""
    cause = main_drop_cause(flags)
    share = dropped / pairs
    head = f"dropped {dropped:,} of {pairs:,} pairs ({share:.1%}), above max_dropped_share {limit:.0%}"
    if cause is None:
        return {
            "kind": "dropped_share", "flag": None, "count": dropped, "share": share, "setting": None, "cause": "",
            "message": head,
        }
    flag, count = cause
    setting, why = keep_setting(flag, settings)
    cause_text = f"main cause {flag} ({count:,} {plural(count, 'pair')}): {why}"
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
