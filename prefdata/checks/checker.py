"""The per-pair check sequence that `prepare` and `validate` share, and the leak index they use."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from prefdata import flags as F
from prefdata.checks.dataset import DatasetWideChecks, PromptLeakIndex
from prefdata.checks.pair import apply_policy, text_flags, token_flags
from prefdata.checks.policy import Policy
from prefdata.errors import RecordError
from prefdata.io.formats import normalize_record
from prefdata.io.readers import iter_raw_records
from prefdata.records import Pair, TokenizedPair


def build_leak_index(against: str | Path) -> PromptLeakIndex:
    """Prompts of another dataset (e.g. the eval split), for the `prompt_leak` check."""
    prompts: list[str | list[int]] = []
    for raw in iter_raw_records(against):
        if raw.error is not None:
            continue
        try:
            pair = normalize_record(raw)
        except RecordError:
            continue
        prompts.append(pair.prompt if pair.prompt or not pair.is_pretokenized else (pair.prompt_ids or []))
    return PromptLeakIndex(prompts)



class PairChecker:
    """The per-pair check sequence that `prepare` and `validate` share, in one place.

    Holds the dataset-wide hash tables, so one instance must see the rows in input order.
    """

    def __init__(self, policy: Policy, leak_index: PromptLeakIndex | None = None):
        self.policy = policy
        self.leak_index = leak_index
        self.dataset_checks = DatasetWideChecks()

    def check(
        self, pair: Pair, tokenized: TokenizedPair | None, extra_flags: Iterable[str] = ()
    ) -> tuple[list[str], str | None, str]:
        """(flags kept by the policy, worst severity, outcome "kept" | "dropped")."""
        found = list(pair.flags) + text_flags(pair, self.policy)
        if tokenized is not None:
            found = token_flags(tokenized, found)
        found += self.dataset_checks.observe(pair)
        if self.leak_index is not None and self.leak_index.contains_pair(pair):
            found.append(F.PROMPT_LEAK)
        found.extend(extra_flags)
        kept, severity = apply_policy(found, self.policy)
        return kept, severity, "dropped" if severity in ("drop", "error") else "kept"
