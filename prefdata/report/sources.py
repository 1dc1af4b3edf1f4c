"""The report's per-source section for a mixture (prefdata.sets.mix): each source's rows in, kept,
dropped and quarantined, its flags, the length bias of chosen vs rejected, and its lengths. A source
of scored completions (prefdata.sets.scored) also counts its records apart from its rows (a record may
make several pair rows, or one `unpaired` row): `records_in` is what the mixture sampled.

`SourceTally` counts one source, row by row (`add_row`) or a run of rows in bulk (`add_arrays`,
from report.compact.CompactRows); both give the same numbers. Bounded memory: counters and
IntDistributions only.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from prefdata.report.distributions import IntDistribution
from prefdata.report.length_bias import bias_dict, compare, count_bias, share

if TYPE_CHECKING:
    import numpy as np

    from prefdata.core.records import CheckedRow

_PARTS = ("prompt", "chosen", "rejected")


class SourceTally:
    """What the report says of one source."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter({"kept": 0, "dropped": 0, "quarantined": 0, "unpaired": 0})
        self.records = 0  # rows that begin a record (io.ledger.Ledger's rule)
        self.flags: Counter[str] = Counter()
        # Which half is longer, over every checked pair and over the kept ones (what training sees).
        self.bias = {"tokens": Counter(), "characters": Counter()}
        self.bias_kept = {"tokens": Counter(), "characters": Counter()}
        self.tokens = {part: IntDistribution() for part in _PARTS}  # before truncation
        self.chars = {part: IntDistribution() for part in _PARTS}

    def add_row(self, row: "CheckedRow") -> None:
        self.outcomes[row.outcome] += 1
        pair = row.pair
        # The second and later pairs of a record of scored completions begin no record.
        self.records += not (row.scored is None and pair is not None and pair.shape == "scored")
        if pair is None:
            return
        self.flags.update(dict.fromkeys(row.flags, 1))
        kept = row.outcome == "kept"
        lengths = (len(pair.prompt), len(pair.chosen), len(pair.rejected))
        for part, value in zip(_PARTS, lengths):
            self.chars[part].add(value)
        side = compare(lengths[1], lengths[2])
        self.bias["characters"][side] += 1
        if kept:
            self.bias_kept["characters"][side] += 1
        tok = row.tokenized
        if tok is not None:
            full = (tok.prompt_len_full, tok.chosen_len_full, tok.rejected_len_full)
            for part, value in zip(_PARTS, full):
                self.tokens[part].add(value)
            side = compare(full[1], full[2])
            self.bias["tokens"][side] += 1
            if kept:
                self.bias_kept["tokens"][side] += 1

    def add_arrays(
        self, outcomes: Iterable[str], pair_kept: "np.ndarray", lengths: "np.ndarray", tokens: "np.ndarray | None",
        flags: Iterable[list[str]], later_pairs: int = 0,
    ) -> None:
        """`add_row` for a run of rows: every row's outcome; per pair whether it was kept, its
        (prompt, chosen, rejected) characters, and (when every pair is tokenized) its token row
        (report.compact.token_row); the flag list of each flagged pair; `later_pairs`: rows that
        are a second or later pair of a record of scored completions (they begin no record)."""
        outcomes = list(outcomes)
        self.outcomes.update(outcomes)
        self.records += len(outcomes) - later_pairs
        for row_flags in flags:
            self.flags.update(dict.fromkeys(row_flags, 1))
        for column, part in enumerate(_PARTS):
            self.chars[part].add_many(lengths[:, column])
        count_bias(self.bias["characters"], lengths[:, 1], lengths[:, 2])
        count_bias(self.bias_kept["characters"], lengths[pair_kept, 1], lengths[pair_kept, 2])
        if tokens is not None and len(tokens):
            for column, part in enumerate(_PARTS):
                self.tokens[part].add_many(tokens[:, column])
            count_bias(self.bias["tokens"], tokens[:, 1], tokens[:, 2])
            count_bias(self.bias_kept["tokens"], tokens[pair_kept, 1], tokens[pair_kept, 2])

    def to_dict(self, name: str, rows_in_total: int, kept_total: int, plan: Mapping[str, Any] | None) -> dict[str, Any]:
        rows_in = sum(self.outcomes.values())
        # Token numbers only when every pair of the source is tokenized (see sections' length_bias.kept).
        tokenized = 0 < self.tokens["chosen"].n == self.outcomes["kept"] + self.outcomes["dropped"]
        entry: dict[str, Any] = {
            "name": name,
            "rows_in": rows_in,
            "kept": self.outcomes["kept"],
            "dropped": self.outcomes["dropped"],
            "quarantined": self.outcomes["quarantined"],
            # Records of scored completions: records_in = records with a pair + unpaired + quarantined.
            "records_in": self.records,
            "unpaired": self.outcomes["unpaired"],
            "share_of_rows_in": share(rows_in, rows_in_total),
            "share_of_kept": share(self.outcomes["kept"], kept_total),
            "flags": dict(sorted(self.flags.items(), key=lambda kv: (-kv[1], kv[0]))),
            "length_bias": {
                "tokens": bias_dict(self.bias["tokens"]) if tokenized else None,
                "characters": bias_dict(self.bias["characters"]),
                "kept": {
                    "tokens": bias_dict(self.bias_kept["tokens"]) if tokenized else None,
                    "characters": bias_dict(self.bias_kept["characters"]),
                },
            },
            "tokens": {part: self.tokens[part].summary() for part in _PARTS} if tokenized else None,
            "characters": {part: self.chars[part].summary() for part in _PARTS},
        }
        if plan:  # the mixture's own numbers: what the source had, what it was asked for, what it gave
            entry["mix"] = {key: plan.get(key) for key in ("path", "weight", "rows", "share", "available", "sampled", "not_sampled")}
        return entry


def sources_section(
    tallies: Mapping[str, SourceTally], order: list[str], rows_in_total: int, kept_total: int,
    plans: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """report.json's `sources`: one entry per source, in the mix file's order."""
    names = order + sorted(name for name in tallies if name not in order)
    return [
        (tallies.get(name) or SourceTally()).to_dict(name, rows_in_total, kept_total, plans.get(name))
        for name in names
    ]
