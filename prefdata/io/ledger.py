"""Row accounting: every row lands in exactly one of the dataset, dropped.jsonl and quarantine.jsonl,
counted both as rows and as records and pairs.

A row is a pair, a quarantined record, or a record of scored completions that made no pair (an
"unpaired" row, in dropped.jsonl with its reason). A record of scored completions may give several
pair rows, so records and pairs are counted apart (docs/formats.md, "Output (`OUT/`)", and docs/building.md, "From
scored completions to pairs"):

    rows_in     = rows_out + rows_dropped + rows_quarantined          (the three files' lines)
    records_in  = records_paired + records_unpaired + records_quarantined
    pairs_made  = pairs_kept + pairs_dropped
    completions_in = completions_paired + completions_unpaired        (scored records only)

For one-pair-per-record input, records_in = rows_in and pairs_made = rows_out + rows_dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from prefdata.core.errors import PrefdataError
from prefdata.core.records import CheckedRow


@dataclass
class Ledger:
    rows_out: int = 0
    pairs_dropped: int = 0
    records_unpaired: int = 0
    records_quarantined: int = 0
    records_started: int = 0  # rows that begin a record: counted on their own, to check the sums
    records_paired: int = 0
    scored_records: int = 0
    completions_in: int = 0
    completions_paired: int = 0  # completions of scored records that are in at least one pair

    def add(self, row: CheckedRow) -> None:
        outcome = row.outcome
        if outcome == "kept":
            self.rows_out += 1
        elif outcome == "dropped":
            self.pairs_dropped += 1
        elif outcome == "unpaired":
            self.records_unpaired += 1
        else:
            self.records_quarantined += 1
        scored = row.scored
        if scored is not None:
            self.scored_records += 1
            self.completions_in += scored.completions
            self.completions_paired += scored.used
        # A record starts at every row but the second and later pairs of a record of scored completions.
        later_pair = scored is None and row.pair is not None and row.pair.shape == "scored"
        if not later_pair:
            self.records_started += 1
            self.records_paired += row.pair is not None

    def merge(self, other: "Ledger") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def accounting(self) -> dict[str, int]:
        """The manifest's and report's `row_accounting`; asserts that every ledger balances."""
        rows_dropped = self.pairs_dropped + self.records_unpaired
        out = {
            "rows_in": self.rows_out + rows_dropped + self.records_quarantined,
            "rows_out": self.rows_out,
            "rows_dropped": rows_dropped,
            "rows_quarantined": self.records_quarantined,
            "records_in": self.records_started,
            "records_paired": self.records_paired,
            "records_unpaired": self.records_unpaired,
            "records_quarantined": self.records_quarantined,
            "pairs_made": self.rows_out + self.pairs_dropped,
            "pairs_kept": self.rows_out,
            "pairs_dropped": self.pairs_dropped,
            "scored_records": self.scored_records,
            "completions_in": self.completions_in,
            "completions_paired": self.completions_paired,
            "completions_unpaired": self.completions_in - self.completions_paired,
        }
        # Invariant 5: every record, pair and completion is in exactly one place.
        assert out["records_in"] == self.records_paired + self.records_unpaired + self.records_quarantined, out
        return out


def check_files(accounting: dict[str, Any], rows_out: int, dropped_lines: int, quarantine_lines: int) -> None:
    """The ledger against what was written: dataset rows, dropped.jsonl and quarantine.jsonl lines."""
    written = (rows_out, dropped_lines, quarantine_lines)
    expected = (accounting["rows_out"], accounting["rows_dropped"], accounting["rows_quarantined"])
    assert written == expected, (written, accounting)


ROW_KEYS = ("rows_in", "rows_out", "rows_dropped", "rows_quarantined")


def check_against_files(accounting: Mapping[str, Any], out: Any, *, rows: int, dropped_lines: int,
                        quarantine_lines: int) -> None:
    """A handed-over OUT's ledger against its files: rows_out = the dataset's rows, rows_dropped =
    dropped.jsonl's lines, rows_quarantined = quarantine.jsonl's lines, and rows_in their sum (and
    pairs_made = pairs_kept + pairs_dropped where recorded). One line naming the numbers otherwise:
    a command that trusted a wrong ledger would hand it on, with rows unaccounted for."""
    missing = [key for key in ROW_KEYS if key not in accounting]
    if missing:
        raise PrefdataError(f"{out}/manifest.json's row_accounting has no {', '.join(missing)}: "
                            "rerun `prefdata prepare` into a new OUT")
    found = {"rows_out": (rows, "dataset rows"), "rows_dropped": (dropped_lines, "dropped.jsonl lines"),
             "rows_quarantined": (quarantine_lines, "quarantine.jsonl lines")}
    wrong = [f"{key} {accounting[key]:,} but {count:,} {what}" for key, (count, what) in found.items()
             if accounting[key] != count]
    total = accounting["rows_out"] + accounting["rows_dropped"] + accounting["rows_quarantined"]
    if accounting["rows_in"] != total:
        wrong.append(f"rows_in {accounting['rows_in']:,} but rows_out + rows_dropped + rows_quarantined = {total:,}")
    pairs = [accounting.get(key) for key in ("pairs_made", "pairs_kept", "pairs_dropped")]
    if None not in pairs and pairs[0] != pairs[1] + pairs[2]:  # type: ignore[operator]
        wrong.append(f"pairs_made {pairs[0]:,} but pairs_kept + pairs_dropped = {pairs[1] + pairs[2]:,}")  # type: ignore[operator]
    if wrong:
        raise PrefdataError(f"{out}/manifest.json's ledger does not match its files ({'; '.join(wrong)}): "
                            "refusing a damaged or tampered OUT")
