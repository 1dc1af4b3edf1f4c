"""Best vs worst: one preference pair per prompt from its scored samples.

The pair is an explicit row `prepare` reads (prompt as given, chosen/rejected completion text) with
pass-through columns that the pair checks turn into flags (`checks.reward`): `reward_chosen`,
`reward_rejected`, `chosen_sample`/`rejected_sample` (which samples; marks the pair as generated),
`chosen_finished`/`rejected_finished`, and the prompt's provenance (`prompt_file`, `prompt_line`).

Samples that carry their sampled ids (`prompt_ids`, `completion_ids`, as `generate` writes them) give
a pre-tokenized pair (`prompt_ids`, `chosen_ids`, `rejected_ids` next to the text): on-policy
training needs the ids the policy sampled, which decoding and tokenizing the text again need not
give back. The text stays for the text-level checks.

`missing_eos_penalty` (TRL's `missing_eos_penalty`) is subtracted from the reward of a sample that
never stopped before the pair is chosen, so a finished sample wins over an unfinished one of a
similar reward; the pair's `reward_chosen`/`reward_rejected` are the penalized rewards it was chosen
on (`tied_reward` compares those).
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


def pair_reward(sample: dict[str, Any], missing_eos_penalty: float | None = None) -> float:
    """The reward a sample is paired on: its reward, less the penalty when it never stopped."""
    unfinished = not sample.get("finished", True)
    return sample["reward"] - (missing_eos_penalty or 0.0) * unfinished


def best_vs_worst(samples: list[dict[str, Any]], missing_eos_penalty: float | None = None) -> dict[str, Any] | None:
    """The pair of the highest- and lowest-reward samples (lowest sample index wins a tie, so equal
    rewards still make a pair: the `tied_reward` check then reports it). None with < 2 rewards."""
    scored = [s for s in samples if isinstance(s.get("reward"), (int, float)) and math.isfinite(s["reward"])]
    if len(scored) < 2:
        return None
    rewards = {id(s): pair_reward(s, missing_eos_penalty) for s in scored}
    best = max(scored, key=lambda s: (rewards[id(s)], -s["sample"]))
    worst = min((s for s in scored if s is not best), key=lambda s: (rewards[id(s)], s["sample"]))
    ids = {}
    if all(isinstance(s.get(key), list) for s in (best, worst) for key in ("prompt_ids", "completion_ids")):
        ids = {"prompt_ids": best["prompt_ids"], "chosen_ids": best["completion_ids"],
               "rejected_ids": worst["completion_ids"]}
    return {
        "prompt": best["prompt"],
        "chosen": best["completion"],
        "rejected": worst["completion"],
        **ids,
        "reward_chosen": rewards[id(best)],
        "reward_rejected": rewards[id(worst)],
        "chosen_sample": best["sample"],
        "rejected_sample": worst["sample"],
        "chosen_finished": bool(best.get("finished", True)),
        "rejected_finished": bool(worst.get("finished", True)),
        "prompt_file": best.get("source_file"),
        "prompt_line": best.get("source_line"),
    }


def make_pairs(generations: list[dict[str, Any]],
               missing_eos_penalty: float | None = None) -> tuple[list[dict[str, Any]], PairStats]:
    """One pair per prompt that has at least two rewarded samples, in prompt order."""
    stats = PairStats()
    pairs: list[dict[str, Any]] = []
    for samples in group_samples(generations):
        stats.prompts += 1
        pair = best_vs_worst(samples, missing_eos_penalty)
        if pair is None:
            stats.unpaired += 1
        else:
            pairs.append(pair)
    stats.pairs = len(pairs)
    return pairs, stats
