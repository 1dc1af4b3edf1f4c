"""Per-pair learning signals as columns of numbers, computed from what OUT already holds.

Each signal is one float per pair (NaN where its inputs are missing for that pair or not finite);
docs/select.md gives each formula. A signal whose input columns OUT lacks is a `PrefdataError` naming
the command that writes them. Everything is a vectorized column expression over OUT's Arrow table
(memory-mapped): no Python loop over rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from prefdata.core.errors import PrefdataError
from prefdata.sets.sampling import keys_of, sample_base

# How a pair carries its rewards: `prefdata score` / online pairs / scored completions (reward_*),
# UltraFeedback-binarized style pass-through columns (score_*), or ranks (rank_*: lower is better).
REWARD_SOURCES = (("reward_chosen", "reward_rejected", 1.0), ("score_chosen", "score_rejected", 1.0),
                  ("rank_chosen", "rank_rejected", -1.0))
REWARDS_HINT = ("reward_chosen/reward_rejected (or score_*, rank_*) columns: add them with `prefdata score RAW "
                "--reward-model RM` (or `--reward-fn`) and run `prefdata prepare` again")
REFS_HINT = "ref_chosen_logps/ref_rejected_logps columns: run `prefdata refs OUT --model REF` first"


@dataclass(frozen=True)
class Signal:
    """One signal: its formula (as docs/select.md writes it) and how it is computed from OUT's table."""

    name: str
    formula: str
    compute: Callable[["Columns"], np.ndarray]


class Columns:
    """OUT's table as the signals read it: numeric columns as float64 (NaN for nulls), list lengths."""

    def __init__(self, table: Any, out: str, seed: int = 0,
                 policy: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.table, self.out, self.seed = table, out, seed
        self.rows = table.num_rows
        self.names = set(table.column_names)
        self._policy, self._policy_means = policy, None  # the on_policy model pass, run once when asked for

    def policy_means(self) -> tuple[np.ndarray, np.ndarray]:
        """(chosen, rejected) mean per-token log-probs under --policy-model (prefdata.select.policy)."""
        if self._policy is None:
            raise PrefdataError("signal on_policy needs a policy model: pass --policy-model PATH (the policy the pairs "
                                "should be likely under; its tokenizer must be OUT's)")
        if self._policy_means is None:
            self._policy_means = self._policy()
        return self._policy_means

    def number(self, name: str) -> np.ndarray:
        import pyarrow as pa

        column = self.table.column(name)
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            return np.asarray(column.cast("float64").to_numpy(zero_copy_only=False), dtype=np.float64)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise PrefdataError(f"{self.out}: column {name} is {column.type}, not numbers")
        # Numbers stored as text ("4.5"), as some scored data does (a raw file mixing types keeps them as
        # JSON text): nulls are NaN, a value that is no number is one line naming its row.
        import polars as pl

        text = pl.Series(values=column)
        values = text.str.strip_chars().cast(pl.Float64, strict=False)
        bad = (values.is_null() & text.is_not_null()).arg_true()
        if len(bad):
            row = int(bad[0])
            raise PrefdataError(f"{self.out}: column {name} holds {text[row]!r:.40} at {self.where(row)}, not a number "
                                f"({len(bad)} such row(s))")
        return values.fill_null(np.nan).to_numpy().astype(np.float64)

    def where(self, row: int) -> str:
        """`file:line` of a row (`row N` where OUT has no source columns)."""
        if not {"source_file", "source_line"} <= self.names:
            return f"row {row + 1}"
        return f"{self.table.column('source_file')[row].as_py()}:{self.table.column('source_line')[row].as_py()}"

    def length(self, name: str) -> np.ndarray:
        import pyarrow.compute as pc

        return pc.list_value_length(self.table.column(name)).to_numpy(zero_copy_only=False).astype(np.float64)

    def require(self, names: tuple[str, ...], signal: str, hint: str) -> None:
        missing = [name for name in names if name not in self.names]
        if missing:
            raise PrefdataError(f"signal {signal} needs {hint} ({self.out} has no {', '.join(missing)})")

    def rewards(self, signal: str) -> tuple[np.ndarray, np.ndarray]:
        """(chosen, rejected) rewards, higher is better, from the first reward source OUT has."""
        for chosen, rejected, sign in REWARD_SOURCES:
            if chosen in self.names and rejected in self.names:
                return sign * self.number(chosen), sign * self.number(rejected)
        raise PrefdataError(f"signal {signal} needs {REWARDS_HINT} ({self.out} has none of them)")


def _finite_or_nan(values: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(values), values, np.nan)


def reward_margin(c: Columns) -> np.ndarray:
    chosen, rejected = c.rewards("reward_margin")
    return chosen - rejected


def reward_rejected(c: Columns) -> np.ndarray:
    return c.rewards("reward_rejected")[1]


def implicit_margin(c: Columns) -> np.ndarray:
    c.require(("ref_chosen_logps", "ref_rejected_logps"), "implicit_margin", REFS_HINT)
    return c.number("ref_chosen_logps") - c.number("ref_rejected_logps")


def implicit_margin_per_token(c: Columns) -> np.ndarray:
    c.require(("ref_chosen_logps", "ref_rejected_logps", "chosen_token_count", "rejected_token_count"),
              "implicit_margin_per_token", REFS_HINT)
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero-token half gives NaN/inf: never selected
        return (c.number("ref_chosen_logps") / c.number("chosen_token_count")
                - c.number("ref_rejected_logps") / c.number("rejected_token_count"))


def rejected_length(c: Columns) -> np.ndarray:
    return c.length("rejected_ids")


def length_difference(c: Columns) -> np.ndarray:
    return c.length("chosen_ids") - c.length("rejected_ids")


def on_policy(c: Columns) -> np.ndarray:
    chosen, rejected = c.policy_means()
    return (chosen + rejected) / 2.0


def percentile(values: np.ndarray) -> np.ndarray:
    """Each finite value's mid-rank percentile in (0, 1) among the finite values (ties share one); NaN elsewhere."""
    out = np.full(len(values), np.nan)
    finite = np.isfinite(values)
    if not finite.any():
        return out
    sorted_values = np.sort(values[finite])
    below = np.searchsorted(sorted_values, values[finite], side="left")
    at_or_below = np.searchsorted(sorted_values, values[finite], side="right")
    out[finite] = (below + at_or_below) / (2.0 * finite.sum())
    return out


def rip(c: Columns) -> np.ndarray:
    """RIP (arXiv 2501.18578) as one number: the pair's worst percentile over its three filters, each
    oriented so that higher passes (rejected reward high, rejected long, reward gap small)."""
    chosen, rejected = c.rewards("rip")
    ranks = np.vstack([percentile(rejected), percentile(rejected_length(c)), 1.0 - percentile(chosen - rejected)])
    return ranks.min(axis=0)  # NaN wherever one of them is NaN


def random_key(c: Columns) -> np.ndarray:
    """A seeded uniform number in [0, 1) per row position (SplitMix64 keys, prefdata.sets.sampling)."""
    keys = keys_of(sample_base(c.seed, "select"), np.arange(c.rows, dtype=np.int64))
    return (keys >> np.uint64(11)).astype(np.float64) / float(1 << 53)


SIGNALS: dict[str, Signal] = {s.name: s for s in (
    Signal("reward_margin", "reward_chosen - reward_rejected (score_chosen - score_rejected; rank_rejected - "
           "rank_chosen for ranks)", reward_margin),
    Signal("reward_rejected", "reward_rejected (score_rejected; -rank_rejected for ranks)", reward_rejected),
    Signal("implicit_margin", "ref_chosen_logps - ref_rejected_logps (the reference's log-ratio, summed over "
           "completion tokens)", implicit_margin),
    Signal("implicit_margin_per_token", "ref_chosen_logps / chosen_token_count - ref_rejected_logps / "
           "rejected_token_count", implicit_margin_per_token),
    Signal("rejected_length", "len(rejected_ids) (completion tokens)", rejected_length),
    Signal("length_difference", "len(chosen_ids) - len(rejected_ids) (completion tokens)", length_difference),
    Signal("rip", "min(pct(reward_rejected), pct(rejected_length), 1 - pct(reward_margin)); pct = mid-rank "
           "percentile among the pairs", rip),
    Signal("random", "a seeded uniform number in [0, 1) per pair (--seed)", random_key),
    Signal("on_policy", "(policy_chosen_logps / chosen_token_count + policy_rejected_logps / rejected_token_count) / 2 "
           "under --policy-model (WPO's weight is exp(2 x on_policy))", on_policy),
)}


def compute_signal(name: str, columns: Columns) -> np.ndarray:
    """The signal's values, one per row, non-finite values as NaN."""
    if name not in SIGNALS:
        raise PrefdataError(f"unknown signal {name!r}; choose one of {', '.join(SIGNALS)}")
    with np.errstate(all="ignore"):  # inf - inf, overflow: a non-finite signal is NaN here, never a warning
        return _finite_or_nan(np.asarray(SIGNALS[name].compute(columns), dtype=np.float64))


def available_signals(columns: Columns) -> dict[str, np.ndarray]:
    """Every signal OUT's columns allow (for the report), by name; `random` left out (it says nothing), and
    `on_policy` unless it was asked for (it costs a model pass)."""
    found = {}
    for name in SIGNALS:
        if name in ("random", "on_policy"):
            continue
        try:
            found[name] = compute_signal(name, columns)
        except PrefdataError:
            continue
    return found
