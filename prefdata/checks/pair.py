"""Pair-level checks: which flags one pair carries (docs/checks.md, "Flags and policies"), and what the
policy makes of them.

Text checks (`text_flags`) run on every row, so they stay cheap: string equality first, whitespace
normalization only when the halves differ, and the edit-distance ratio through
`prefdata.checks.similarity`, which rules most pairs out from their lengths alone and bounds the
time of the rest (exact up to a documented size, token windows beyond it).

What a half's "content" is, precisely:
- Plain-text pairs: the `chosen`/`rejected` strings.
- Conversational pairs whose completion is one assistant message: that message's text (the same as
  the `chosen`/`rejected` strings).
- Multi-message completions (several turns, or a non-assistant role such as a tool turn): the turns
  rendered as a transcript with a role marker before each content. Two completions that hold the
  same words but differ in who said them are therefore not `identical`; `whitespace_only` still
  applies (markers are the same on both sides), and `near_duplicate` compares the transcripts.
  A multi-message half is empty when every turn's content is empty or whitespace.
- Pre-tokenized pairs with no text (`pair.is_pretokenized` and empty `chosen`/`rejected` strings):
  the id lists. Empty means no ids; `identical` is id-list equality; `whitespace_only` cannot be
  judged without a tokenizer and is never set; `near_duplicate` is the same ratio on the id sequences.
  Pre-tokenized pairs that also carry text are checked on the text (token-level checks cover the ids).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefdata.checks.policy import SEVERITY_RANK, Policy, Severity
from prefdata.checks.reasoning import has_reasoning_or_tools, reasoning_flags
from prefdata.checks.reward import column_flags
from prefdata.checks.similarity import at_least, similarity  # noqa: F401 (re-exported for callers)
from prefdata.core import flags as F
from prefdata.core.records import Message, Pair, TokenizedPair
from prefdata.io.messages import message_text

_ORDER = {flag: i for i, flag in enumerate(F.ALL_FLAGS)}


def normalize_whitespace(text: str) -> str:
    """Collapse every run of (Unicode) whitespace to one space and strip both ends."""
    return " ".join(text.split())


# ASCII bytes that str.split() treats as whitespace, and every other character it splits on.
_ASCII_WS = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
_OTHER_WS = tuple("\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") + tuple(map(chr, range(0x2000, 0x200B)))


def squeeze_whitespace(text: str) -> bytes:
    """UTF-8 of `text` with every whitespace character (as str.split sees it) removed.

    Deleting ASCII whitespace bytes runs at C speed; only text holding a possible non-ASCII
    whitespace character takes the slower split path.
    """
    # The pair checks and the dataset-wide digests squeeze the same string objects back to back;
    # a tiny identity-keyed cache (holding the strings, so ids cannot be reused) halves the work.
    hit = _SQUEEZED.get(id(text))
    if hit is not None and hit[0] is text:
        return hit[1]
    # isascii() is O(1); single-char `in` is a C scan, so the common cases never split.
    if not text.isascii() and any(c in text for c in _OTHER_WS):
        squeezed = "".join(text.split()).encode("utf-8", "surrogatepass")
    else:
        squeezed = text.encode("utf-8", "surrogatepass").translate(None, _ASCII_WS)
    if len(_SQUEEZED) >= 16:
        _SQUEEZED.clear()
    _SQUEEZED[id(text)] = (text, squeezed)
    return squeezed


_SQUEEZED: dict[int, tuple[str, bytes]] = {}


def _whitespace_only(a: str, b: str) -> bool:
    """normalize_whitespace(a) == normalize_whitespace(b), without splitting every row.

    Equal squeezed bytes is a cheap necessary condition; only then are the words compared.
    """
    return squeeze_whitespace(a) == squeeze_whitespace(b) and a.split() == b.split()


def _is_blank(text: str) -> bool:
    return not text or text.isspace()


def _multi_message(messages: list[Message] | None) -> bool:
    return messages is not None and (
        len(messages) != 1 or messages[0].get("role", "assistant") != "assistant"
    )


def _transcript(messages: list[Message]) -> str:
    # \x02/\x03 (start/end of text) do not occur in chat text by accident and are not whitespace;
    # they keep role markers apart from content that happens to look like "assistant:".
    return "".join(f"\n\x02{m.get('role', '')}\x03\n{message_text(m)}" for m in messages)


def completion_content(pair: Pair, which: str) -> tuple[str, bool]:
    """(content compared by the text checks, is blank) for the chosen or rejected half."""
    messages = pair.chosen_messages if which == "chosen" else pair.rejected_messages
    if _multi_message(messages):
        assert messages is not None
        blank = all(_is_blank(message_text(m)) for m in messages)
        return _transcript(messages), blank
    text = pair.chosen if which == "chosen" else pair.rejected
    return text, _is_blank(text)


def ids_mode(pair: Pair) -> bool:
    """Whether the checks compare id lists (pre-tokenized pair without text) instead of text."""
    return pair.is_pretokenized and not pair.chosen and not pair.rejected


def text_flags(pair: Pair, policy: Policy) -> list[str]:
    """`content_flags`, plus the flags of the pair's scoring columns (`checks.reward`), in
    flags.ALL_FLAGS order."""
    found = content_flags(pair, policy)
    if has_reasoning_or_tools(pair):
        extra = reasoning_flags(pair)
        if extra:
            found = sorted(set(found).union(extra), key=_ORDER.__getitem__)
    if pair.extra and ("reward_chosen" in pair.extra or "chosen_finished" in pair.extra):
        scored = column_flags(pair.extra, policy)
        if scored:
            found = sorted(set(found).union(scored), key=_ORDER.__getitem__)
    return found


def content_flags(pair: Pair, policy: Policy) -> list[str]:
    """Text-level flags of one pair, in flags.ALL_FLAGS order (see the module doc for "content").

    - empty_prompt / empty_chosen / empty_rejected: empty or whitespace-only (no ids when ids mode).
    - identical: the two completions are exactly equal.
    - whitespace_only: not identical, but equal after `normalize_whitespace` (this includes a
      leading/trailing space difference and tabs/newlines vs spaces).
    - near_duplicate: neither of the above, and `similarity` >= policy.near_duplicate_threshold
      (checks.similarity: exact up to EXACT_LIMIT elements, token windows beyond).
    Ignored flags are still reported here; `apply_policy` removes them.
    """
    ids = pair.chosen_ids is not None and not pair.chosen and not pair.rejected  # ids_mode, inlined
    chosen: str | Sequence[int]
    rejected: str | Sequence[int]
    if ids:
        chosen, rejected = list(pair.chosen_ids or []), list(pair.rejected_ids or [])
        prompt_blank, chosen_blank, rejected_blank = not pair.prompt_ids, not chosen, not rejected
    else:
        if pair.chosen_messages is None and pair.rejected_messages is None:  # plain text: inline
            chosen, rejected = pair.chosen, pair.rejected
            chosen_blank = not chosen or chosen.isspace()
            rejected_blank = not rejected or rejected.isspace()
        else:
            chosen, chosen_blank = completion_content(pair, "chosen")
            rejected, rejected_blank = completion_content(pair, "rejected")
        prompt_blank = not pair.prompt or pair.prompt.isspace()
    found: list[str] = []
    if prompt_blank:
        found.append(F.EMPTY_PROMPT)
    if chosen_blank:
        found.append(F.EMPTY_CHOSEN)
    if rejected_blank:
        found.append(F.EMPTY_REJECTED)
    if chosen == rejected:
        found.insert(0, F.IDENTICAL)
        return found
    if not ids and _whitespace_only(chosen, rejected):  # whitespace has no meaning for ids
        found.insert(0, F.WHITESPACE_ONLY)
        return found
    # Bounded in time whatever the lengths (see prefdata.checks.similarity).
    if at_least(chosen, rejected, policy.near_duplicate_threshold):
        found.insert(0, F.NEAR_DUPLICATE)
    return found


def token_flags(tokenized: TokenizedPair, text_flags: list[str]) -> list[str]:
    """`text_flags` plus the token-level flags of the final (truncated) ids, without repeats.

    Adds TokenizedPair.flags (set by the tokenizer: completion_truncated, prompt_boundary_mismatch,
    ...), `no_completion_tokens` when either half has zero completion ids, and
    `identical_after_truncation` when both halves have the same non-empty completion ids and the pair
    is not already `identical` (that flag already says it; an empty-vs-empty pair is reported as
    `no_completion_tokens`).
    """
    merged = list(text_flags)
    for flag in tokenized.flags:
        if flag not in merged:
            merged.append(flag)
    chosen, rejected = tokenized.chosen_ids, tokenized.rejected_ids
    if (not chosen or not rejected) and F.NO_COMPLETION_TOKENS not in merged:
        merged.append(F.NO_COMPLETION_TOKENS)
    if (
        chosen
        and len(chosen) == len(rejected)
        and list(chosen) == list(rejected)
        and F.IDENTICAL not in merged
        and F.IDENTICAL_AFTER_TRUNCATION not in merged
    ):
        merged.append(F.IDENTICAL_AFTER_TRUNCATION)
    return merged


def apply_policy(flags: list[str], policy: Policy) -> tuple[list[str], Severity | None]:
    """(flags the policy keeps, worst severity among them) — ignored flags are removed entirely.

    Kept flags are unique and in flags.ALL_FLAGS order. Worst severity: error > drop > warn; None when
    no flag is kept. Unknown flag names raise ValueError (a bug, not a data problem).
    """
    if not flags:
        return [], None
    severities = policy.severities
    kept: set[str] = set()
    worst_rank = 0
    worst: Severity | None = None
    for flag in flags:
        try:
            severity = severities[flag]
        except KeyError:
            raise ValueError(f"unknown flag {flag!r}") from None
        if severity == "ignore":
            continue
        kept.add(flag)
        rank = SEVERITY_RANK[severity]
        if rank > worst_rank:
            worst_rank, worst = rank, severity
    return sorted(kept, key=_ORDER.__getitem__), worst
