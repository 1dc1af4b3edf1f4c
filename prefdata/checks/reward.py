"""Flags that come from a pair's scoring columns (pass-through columns written by `prefdata score`).

- `reward_chosen` / `reward_rejected` (numbers): on generated pairs (they carry `chosen_sample`, the
  sample a pair was picked from), rewards within the policy's tie threshold are `tied_reward`: the
  reward could not tell the two samples apart, so the pair holds no preference. On any scored pair,
  a rejected half that out-scores the chosen one by more than the policy's margin is
  `reward_disagrees` (likely label noise in offline data).
- `chosen_finished` / `rejected_finished` (booleans, generated pairs): a sample that stopped at the
  token limit instead of EOS is `completion_truncated`, the flag truncation in `prepare` sets.
"""

from __future__ import annotations

from typing import Any

from prefdata.checks.policy import Policy
from prefdata.core import flags as F
from prefdata.core.numbers import finite_float

REWARD_COLUMNS = ("reward_chosen", "reward_rejected")
GENERATED_MARKER = "chosen_sample"  # provenance column only generated pairs have




def column_flags(extra: dict[str, Any], policy: Policy) -> list[str]:
    """The flags a pair's scoring columns carry (see the module doc); [] when it has none."""
    found: list[str] = []
    if extra.get("chosen_finished") is False or extra.get("rejected_finished") is False:
        found.append(F.COMPLETION_TRUNCATED)
    if "reward_chosen" not in extra:
        return found
    chosen, rejected = finite_float(extra.get("reward_chosen")), finite_float(extra.get("reward_rejected"))
    if chosen is None or rejected is None:
        return found
    if GENERATED_MARKER in extra and abs(chosen - rejected) <= policy.tie_threshold:
        found.append(F.TIED_REWARD)
    if rejected - chosen > policy.reward_margin:
        found.append(F.REWARD_DISAGREES)
    return found
