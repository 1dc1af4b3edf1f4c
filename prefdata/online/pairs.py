"""Best vs worst: one preference pair per prompt from its scored samples.

The pair is an explicit row `prepare` reads (prompt as given, chosen/rejected completion text) with
pass-through columns that the pair checks turn into flags (`checks.reward`): `reward_chosen`,
`reward_rejected`, `chosen_sample`/`rejected_sample` (which samples; marks the pair as generated),
`chosen_finished`/`rejected_finished`, and the prompt's provenance (`prompt_file`, `prompt_line`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


@dataclass
class PairStats:
    prompts: int = 0
    pairs: int = 0
    unpaired: int = 0  # prompts with fewer than two samples that have a reward


def group_samples(generations: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Samples grouped by prompt (its source file and line, and its text: the records of a one-line
    JSON array share line 1), in first-seen order."""
    groups: dict[tuple[Any, Any, str], list[dict[str, Any]]] = {}
    for row in generations:
        prompt = json.dumps(row.get("prompt"), sort_keys=True, ensure_ascii=False)
        groups.setdefault((row.get("source_file"), row.get("source_line"), prompt), []).append(row)
    return list(groups.values())


def best_vs_worst(samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pair of the highest- and lowest-reward samples (lowest sample index wins a tie, so equal
    rewards still make a pair: the `tied_reward` check then reports it). None with < 2 rewards."""
    scored = [s for s in samples if isinstance(s.get("reward"), (int, float)) and math.isfinite(s["reward"])]
    if len(scored) < 2:
        return None
    best = max(scored, key=lambda s: (s["reward"], -s["sample"]))
    worst = min((s for s in scored if s is not best), key=lambda s: (s["reward"], s["sample"]))
    return {
        "prompt": best["prompt"],
        "chosen": best["completion"],
        "rejected": worst["completion"],
        "reward_chosen": best["reward"],
        "reward_rejected": worst["reward"],
        "chosen_sample": best["sample"],
        "rejected_sample": worst["sample"],
        "chosen_finished": bool(best.get("finished", True)),
        "rejected_finished": bool(worst.get("finished", True)),
        "prompt_file": best.get("source_file"),
        "prompt_line": best.get("source_line"),
    }


def make_pairs(generations: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], PairStats]:
    """One pair per prompt that has at least two rewarded samples, in prompt order."""
    stats = PairStats()
    pairs: list[dict[str, Any]] = []
    for samples in group_samples(generations):
        stats.prompts += 1
        pair = best_vs_worst(samples)
        if pair is None:
            stats.unpaired += 1
        else:
            pairs.append(pair)
    stats.pairs = len(pairs)
    return pairs, stats
