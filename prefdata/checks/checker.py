"""The per-pair check sequence that `prepare` and `validate` share, and the leak index they use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from prefdata.checks.dataset import PromptLeakIndex
from prefdata.checks.units import PAIR_TESTS
from prefdata.checks.pair import apply_policy, text_flags, token_flags
from prefdata.checks.policy import Policy
from prefdata.core import flags as F
from prefdata.core.errors import RecordError
from prefdata.core.records import Pair, TokenizedPair
from prefdata.io.readers import iter_raw_records
from prefdata.sets.pairing import PairingSettings
from prefdata.sets.scored import record_pairs

if TYPE_CHECKING:
    from prefdata.sets.decontaminate import BenchmarkIndex


def build_leak_index(against: str | Path) -> PromptLeakIndex:
    """Prompts of another dataset (e.g. the eval split), for the `prompt_leak` check."""
    prompts: list[str | list[int]] = []
    for raw in iter_raw_records(against):
        if raw.error is not None:
            continue
        try:
            made = record_pairs(raw, PairingSettings())  # scored completions: their prompt, paired or not
        except RecordError:
            continue
        if not made.pairs:
            prompts.append(made.scored.prompt if made.scored is not None else "")
            continue
        pair = made.pairs[0]
        prompts.append(pair.prompt if pair.prompt or not pair.is_pretokenized else (pair.prompt_ids or []))
    return PromptLeakIndex(prompts)


def pair_flags(
    pair: Pair, tokenized: TokenizedPair | None, policy: Policy, leak_index: PromptLeakIndex | None,
    benchmarks: "BenchmarkIndex | None" = None,
) -> list[str]:
    """The pair's own flags: found while normalizing, text checks, token checks on the final ids,
    prompt leak, benchmark overlap (which also sets `pair.benchmark_match`). Everything but the
    dataset-wide flags, before the policy."""
    found = list(pair.flags) + text_flags(pair, policy)
    for flag, test in PAIR_TESTS:  # the checks that are one function (prefdata.checks.units)
        if test(pair, tokenized):
            found.append(flag)
    if tokenized is not None:
        found = token_flags(tokenized, found)
    if leak_index is not None and leak_index.contains_pair(pair):
        found.append(F.PROMPT_LEAK)
    if benchmarks is not None:
        pair.benchmark_match = benchmarks.match(pair)
        if pair.benchmark_match is not None:
            found.append(F.BENCHMARK_OVERLAP)
    return found


def verdict(found: list[str], policy: Policy) -> tuple[list[str], str | None, str]:
    """(flags the policy keeps, worst severity, outcome "kept" | "dropped") of a pair's flags."""
    kept, severity = apply_policy(found, policy)
    return kept, severity, "dropped" if severity in ("drop", "error") else "kept"


class PairChecker:
    """Every per-pair check of a pair, one pair at a time in this process; the dataset-wide flags
    (prefdata.checks.partitioned, answered before the rows come through) are the caller's."""

    def __init__(self, policy: Policy, leak_index: PromptLeakIndex | None = None,
                 benchmarks: "BenchmarkIndex | None" = None):
        self.policy = policy
        self.leak_index = leak_index
        self.benchmarks = benchmarks

    def check(
        self, pair: Pair, tokenized: TokenizedPair | None, extra_flags: Iterable[str] = ()
    ) -> tuple[list[str], str | None, str]:
        """(flags kept by the policy, worst severity, outcome) of the pair with `extra_flags`
        (its dataset-wide flags, and those found outside the checks)."""
        found = pair_flags(pair, tokenized, self.policy, self.leak_index, self.benchmarks)
        found.extend(extra_flags)
        return verdict(found, self.policy)
