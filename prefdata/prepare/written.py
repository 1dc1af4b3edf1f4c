"""The main process writes every row: the local engine's write path (and `--no-worker-writes`).

Rows come checked and in input order (prefdata.checks.stream.iter_checked_rows); each goes to exactly
one of the dataset, dropped.jsonl and quarantine.jsonl, and to the report.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from prefdata.checks.policy import Policy
from prefdata.core.records import CheckedRow
from prefdata.io import writer as W
from prefdata.io.ledger import Ledger, check_files
from prefdata.io.rows import dropped_record, output_row, quarantine_record, row_digest
from prefdata.report.builder import ReportBuilder


@dataclass
class Written:
    """What writing the rows left behind: the report so far, the counts, the content hash."""

    report: ReportBuilder
    accounting: dict[str, int]  # io.ledger.Ledger.accounting: rows, records, pairs, completions
    flag_counts: Counter[str]
    errors: int  # rows with a flag at error severity
    content_hash: str
    columns: list[str]
    json_columns: list[str]
    text_columns: Any  # how the text columns are stored (strings, messages, or both): io.writer
    shards: list[dict[str, Any]]  # the Arrow data files in order: {"file", "rows"}


# Kept rows are written every `batch_size` rows, or sooner once their images reach this many bytes:
# image rows carry their encoded images (RLAIF-V's ~100 KB-1 MB), so 1,000 of them could be a GB.
WRITE_BATCH_BYTES = 64 << 20


class PendingRows:
    """Kept rows waiting for `writer.write_rows`, flushed by count or by image bytes (the rows and
    their order are the same either way; only where Arrow batches break moves)."""

    def __init__(self, writer: Any, batch_size: int):
        self.writer, self.batch_size = writer, batch_size
        self.rows: list[dict[str, Any]] = []
        self.image_bytes = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.image_bytes += sum(len(image["bytes"] or b"") for image in row.get("images") or ())
        if len(self.rows) >= self.batch_size or self.image_bytes >= WRITE_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        self.writer.write_rows(self.rows)
        self.rows, self.image_bytes = [], 0


def write_rows(
    rows: Iterable[CheckedRow], tmp: Path, policy: Policy, batch_size: int, handoff: dict[str, Any],
    report: ReportBuilder | None = None,
) -> Written:
    """Every row to exactly one of the dataset, dropped.jsonl and quarantine.jsonl, and to the
    report (`report`: the builder to fill, default a plain one)."""
    dataset = W.DatasetWriter(tmp)
    dropped = W.JsonlWriter(tmp / "dropped.jsonl")
    quarantine = W.JsonlWriter(tmp / "quarantine.jsonl")
    report = report or ReportBuilder(policy)
    flag_counts: Counter[str] = Counter()
    content = hashlib.blake2b(digest_size=16)
    errors = 0
    ledger = Ledger()
    pending = PendingRows(dataset, batch_size)
    for row in rows:
        ledger.add(row)
        report.add(row)
        flag_counts.update(row.flags)
        errors += row.severity == "error"
        if row.outcome == "quarantined":
            quarantine.write(quarantine_record(row))
        elif row.outcome in ("dropped", "unpaired"):  # unpaired: scored completions that made no pair
            dropped.write(dropped_record(row))
        else:
            out_row = output_row(row)
            content.update(row_digest(out_row))
            pending.add(out_row)
    pending.flush()
    dropped.close()
    quarantine.close()
    fingerprint = content.hexdigest()
    schema = dataset.finish(fingerprint, {**handoff, "content_hash": fingerprint})
    accounting = ledger.accounting()
    check_files(accounting, dataset.rows, dropped.count, quarantine.count)  # invariant 5
    return Written(
        report, accounting, flag_counts, errors, fingerprint, schema.names, sorted(dataset.json_columns),
        dataset.text_columns, dataset.shards,
    )
