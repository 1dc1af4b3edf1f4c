"""`prepare --balance-length [TARGET]`: subsample the kept pairs to a target share of chosen-longer pairs.

A dataset-wide decision: how many pairs to remove depends on the counts of the whole output. It runs
in the two-pass write (prefdata.pipeline.shards). The first pass tells, per pair, whether its own
flags drop it and which half is longer (tokens before truncation, as the report's length bias);
between the passes, with the dataset-wide flags known, this module counts the pairs the policy
keeps -- C with chosen longer, R with rejected longer or equal -- and picks the pairs to remove from
the over-represented side so that the share C'/(C'+R') is the closest an integer count gets to the
target. Which pairs go is seeded and coordination-free (prefdata.sets.sampling: the ones whose keys,
from the seed and the pair's row ordinal, are largest), so every engine removes the same pairs. The
second pass flags them `length_balance` (drop in the default policy): they land in dropped.jsonl
with that flag, in input order, and in the report like any dropped pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.sets.sampling import keys_of, sample_base, threshold_for

# Per-pair classes the first pass reports (ChunkCounts.classes; prefdata.pipeline.shard_stages.pair_classes).
OWN_DROP, CHOSEN_LONGER, NOT_CHOSEN_LONGER = 0, 1, 2
DEFAULT_TARGET = 0.5


def check_target(target: float) -> float:
    """The target share, or a one-line error."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0.0 <= float(target) <= 1.0:
        raise PrefdataError(f"--balance-length {target!r}: the target share of chosen-longer pairs must be in [0, 1]")
    return float(target)


def balanced_counts(chosen_longer: int, others: int, target: float) -> tuple[int, int, bool]:
    """(chosen-longer pairs to keep, other pairs to keep, whether the target can be approached):
    only the over-represented side shrinks, to the integer count whose share is nearest the target
    (on a tie, the larger count)."""
    total = chosen_longer + others
    if total == 0:
        return chosen_longer, others, True
    share = chosen_longer / total
    if share > target:
        if others == 0:
            return chosen_longer, others, False  # every pair has chosen longer: removing some changes nothing
        ideal = target * others / (1 - target)
        keep = _nearest(ideal, chosen_longer, lambda c: c / (c + others), target)
        return keep, others, True
    if share < target:
        if chosen_longer == 0:
            return chosen_longer, others, False
        ideal = chosen_longer * (1 - target) / target
        keep = _nearest(ideal, others, lambda r: chosen_longer / (chosen_longer + r), target)
        return chosen_longer, keep, True
    return chosen_longer, others, True


def _nearest(ideal: float, most: int, share_of: Any, target: float) -> int:
    candidates = {min(most, max(0, math.floor(ideal))), min(most, max(0, math.ceil(ideal)))}
    return min(candidates, key=lambda n: (abs(share_of(n) - target), -n))


@dataclass
class BalancePlan:
    """Which pairs `length_balance` flags (row ordinals, ascending), and the report's summary."""

    drop_rows: np.ndarray
    summary: dict[str, Any] = field(default_factory=dict)


def plan_balance(
    ordinals: np.ndarray, classes: np.ndarray, duplicate_rows: np.ndarray, conflicting_rows: np.ndarray,
    severity: Callable[[str], str | None], target: float, seed: int,
) -> BalancePlan:
    """The pairs to remove so the kept pairs reach `target` (see the module doc). `ordinals` and
    `classes`: every pair's row ordinal and first-pass class; `duplicate_rows`/`conflicting_rows`:
    the rows the dataset-wide checks flag; `severity`: the policy's severity of a flag (it decides
    whether those pairs stay, and whether `length_balance` removes)."""
    kept = classes != OWN_DROP
    for rows, flag in ((duplicate_rows, F.DUPLICATE_PAIR), (conflicting_rows, F.CONFLICTING_PAIR)):
        if severity(flag) in ("drop", "error") and len(rows):
            kept &= ~np.isin(ordinals, rows)
    longer = kept & (classes == CHOSEN_LONGER)
    other = kept & (classes == NOT_CHOSEN_LONGER)
    c, r = int(longer.sum()), int(other.sum())
    keep_c, keep_r, reached = balanced_counts(c, r, target)
    side, keep = (longer, keep_c) if keep_c < c else (other, keep_r)
    candidates = ordinals[side]
    base = sample_base(seed, F.LENGTH_BALANCE)
    keys = keys_of(base, candidates)
    threshold = threshold_for(keys, keep)
    drop = np.sort(candidates[keys > np.uint64(threshold)]) if threshold >= 0 else np.sort(candidates)
    after = keep_c + keep_r
    removes = severity(F.LENGTH_BALANCE) in ("drop", "error")
    summary = {
        "target": target,
        "seed": seed,
        "unit": "tokens",
        "measured": "before truncation",
        "pairs_before": c + r,
        "chosen_longer_before": round(c / (c + r), 6) if c + r else 0.0,
        "chosen_longer_count_before": c,
        "flagged": int(len(drop)),
        "dropped": int(len(drop)) if removes else 0,
        "pairs_after": after if removes else c + r,
        "chosen_longer_after": (round(keep_c / after, 6) if after else 0.0) if removes else (round(c / (c + r), 6) if c + r else 0.0),
        "chosen_longer_count_after": keep_c if removes else c,
        "reached": reached,
    }
    if not reached:
        summary["note"] = "no pair on the under-represented side: removing pairs cannot move the share"
    return BalancePlan(drop, summary)
