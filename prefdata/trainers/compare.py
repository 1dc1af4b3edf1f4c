"""OpenRLHF's ids beside prefdata's for the same rows: how many pairs are equal, and where the others
first differ, decoded."""

from __future__ import annotations

from typing import Any

from prefdata.core.records import TokenizedPair
from prefdata.trainers.openrlhf import OpenRLHFPair

EXAMPLES = 5
CONTEXT = 6  # tokens shown on each side of the first difference


def compare_ids(prefdata: dict[int, TokenizedPair], trainer: dict[int, OpenRLHFPair], tokenizer: Any,
                where: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Rows both tokenized: `equal` where both halves' full ids (prompt + completion) are the same,
    `trained_equal` where the tokens in the loss are; for the first rows that differ, the first
    differing position, in which part, and both sides decoded from there."""
    rows = sorted(set(prefdata) & set(trainer))
    equal = trained_equal = 0
    parts: dict[str, int] = {}
    examples: list[dict[str, Any]] = []
    for row in rows:
        ours, theirs = prefdata[row], trainer[row]
        diffs = []
        for half in ("chosen", "rejected"):
            mine = list(ours.prompt_ids) + list(getattr(ours, f"{half}_ids"))
            other = getattr(theirs, half).ids
            if mine != other:
                diffs.append((half, mine, other))
        if all(list(getattr(ours, f"{h}_ids")) == getattr(theirs, h).trained for h in ("chosen", "rejected")):
            trained_equal += 1
        if not diffs:
            equal += 1
            continue
        half, mine, other = diffs[0]
        at = next((i for i, (a, b) in enumerate(zip(mine, other)) if a != b), min(len(mine), len(other)))
        part = "prompt" if at < len(ours.prompt_ids) else "completion"
        if at == min(len(mine), len(other)):
            part = "length"  # one is the other cut short (or extended)
        parts[part] = parts.get(part, 0) + 1
        if len(examples) < EXAMPLES:
            examples.append({
                **where[row], "half": half, "position": at, "part": part,
                "before": tokenizer.decode(mine[max(0, at - CONTEXT):at]),
                # token by token: the same text may be cut into different tokens
                "prefdata": [tokenizer.decode([t]) for t in mine[at:at + CONTEXT]],
                "trainer": [tokenizer.decode([t]) for t in other[at:at + CONTEXT]],
                "prefdata_tokens": len(mine), "trainer_tokens": len(other),
            })
    return {"pairs": len(rows), "equal": equal, "differ": len(rows) - equal, "trained_equal": trained_equal,
            "first_difference_in": parts, "examples": examples}
