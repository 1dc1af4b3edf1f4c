"""What every `prefdata export --trainer NAME` shares: the opening (where it may write, OUT read and refused
when it holds image pairs or both text kinds, the columns kept), OUT's rows read in batches, JSON lines
written the way trainers read them, and the closing (DIR published whole or not at all, export.json, the
header line that says which records of OUT are not in the export, the notes every trainer adds)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from prefdata.core.errors import PrefdataError
from prefdata.core.schema import OFFSET_COLUMN, WEIGHT_COLUMN
from prefdata.io.manifest import require_pairs
from prefdata.io.out_dir import abandon, load_out_dataset, prepare_output_dir, publish, refuse_inputs_inside

REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
TRACE_COLUMNS = ("source_file", "source_line")
BATCH = 1024  # rows read from OUT at a time (memory stays flat)
RECORD_NAME = "export.json"  # where DIR came from


@dataclass(frozen=True)
class ExportSource:
    """OUT as an export reads it: its manifest, its dataset rows, their columns and their one text kind."""

    out: Path
    manifest: dict[str, Any]
    table: Any  # pyarrow.Table of OUT's kept pairs
    columns: set[str]
    kind: str  # "strings" or "messages"

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest.get("config") or {}

    @property
    def tokenizer(self) -> str | None:
        """The tokenizer OUT was tokenized with, if any."""
        return (self.manifest.get("tokenizer") or {}).get("path") or self.config.get("tokenizer")

    def keep(self, *extra: tuple[str, ...]) -> list[str]:
        """prompt/chosen/rejected, the trace columns and the given extra column groups that OUT has, in that order."""
        names = ("prompt", "chosen", "rejected", *TRACE_COLUMNS, *(name for group in extra for name in group))
        return [name for name in names if name in self.columns]


def open_out(out: Path, target: Path, overwrite: bool, no_images: str, one_kind: str) -> ExportSource:
    """Check where DIR goes, then read OUT's kept pairs; refuse image pairs ("{out} holds image pairs;
    {no_images}") and string rows beside conversational ones ("{out} mixes ...; {one_kind}: prepare ...")."""
    check_places(out, target, overwrite)
    manifest = require_pairs(out, "export")  # finished, ledger matches its files, no symlink out of it
    table = load_out_dataset(out, "export").data.table
    columns = set(table.column_names)
    if "images" in columns:
        raise PrefdataError(f"{out} holds image pairs; {no_images}")
    kind = text_kind(table)
    if kind == "mixed":
        raise PrefdataError(f"{out} mixes string and conversational rows; {one_kind}: "
                            "prepare the two kinds into separate OUTs and export each")
    return ExportSource(out, manifest, table, columns, kind)


@contextmanager
def staged(source: ExportSource, target: Path, overwrite: bool) -> Iterator[Path]:
    """A staging folder to write DIR's files into: published as DIR when the block ends, removed on any error."""
    staging = prepare_output_dir(target, overwrite, inputs=[source.out])
    try:
        yield staging
        publish(staging, target)
    except BaseException:
        abandon(staging, target)
        raise


def write_record(staging: Path, source: ExportSource, trainer: str, version: str, rows: int,
                 columns: list[str], extra: dict[str, Any]) -> None:
    """export.json: the trainer, the version tested, OUT and its content hash, then the trainer's own keys."""
    record = {"trainer": trainer, "tested_version": version, "source": str(source.out.resolve()),
              "content_hash": source.manifest.get("content_hash"), "rows": rows, "columns": columns, **extra}
    (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def weight_note(columns: set[str], reader: str, made_by: str = " (prefdata select)") -> list[str]:
    """The note that OUT's weight/offset columns are left out (no trainer's DPO loss reads them), if OUT has them."""
    if not {WEIGHT_COLUMN, OFFSET_COLUMN} & columns:
        return []
    return [f"OUT's {WEIGHT_COLUMN}/{OFFSET_COLUMN} columns{made_by} are not written: {reader}'s DPO loss reads neither"]


def check_places(out: Path, target: Path, overwrite: bool) -> None:
    """DIR is neither OUT, inside it, nor holding it; an existing DIR only with --overwrite."""
    if out.resolve() == target.resolve() or out.resolve() in target.resolve().parents:
        raise PrefdataError(f"DIR ({target}) is or lies inside OUT ({out}): export writes nothing into its input")
    refuse_inputs_inside(target, [out])  # replacing DIR must not delete the OUT it reads
    if target.exists() and not overwrite and (not target.is_dir() or any(target.iterdir())):
        raise PrefdataError(f"{target} already exists; pass --overwrite to replace it")


def text_kind(table: Any) -> str:
    """strings, messages, or mixed (string text columns beside *_messages ones), from OUT's schema
    (prefdata.io.writer.DatasetWriter), which every OUT has whatever wrote its manifest."""
    import pyarrow as pa

    if "prompt_messages" in table.column_names:
        return "mixed"
    kind = table.schema.field("prompt").type
    return "messages" if pa.types.is_list(kind) or pa.types.is_large_list(kind) else "strings"


def iter_rows(table: Any) -> Iterator[dict[str, Any]]:
    for batch in table.to_batches(max_chunksize=BATCH):
        yield from batch.to_pylist()


def without_nulls(value: Any) -> Any:
    """Messages without the null fields Arrow's struct gives the fields a message lacks (a template must
    see them absent, as in the raw rows)."""
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    return value


def write_pair_rows(table: Any, path: Path, strings_to_messages: bool) -> int:
    """Each dataset row as one JSON line, in OUT's order; string halves as one-message lists where asked."""
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for row in iter_rows(table):
            for name in ("prompt", "chosen", "rejected"):
                value = row[name]
                if strings_to_messages:
                    value = [{"role": "user" if name == "prompt" else "assistant", "content": value}]
                row[name] = without_nulls(value)
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def header_lines(what: str, out: Path, manifest: dict[str, Any], data_name: str) -> list[str]:
    """The opening comments of DIR's config file: what it holds for which OUT, and what of OUT it leaves out."""
    return [f"# {what} for the pairs prefdata kept in {out}", kept_line(manifest, data_name)]


def kept_line(manifest: dict[str, Any], data_name: str) -> str:
    """The header comment saying how many pairs the export holds and which records of OUT it leaves out."""
    accounting = manifest.get("row_accounting") or {}
    return (f"# ({accounting.get('rows_out', '?')} kept; {accounting.get('rows_dropped', 0)} dropped and "
            f"{accounting.get('rows_quarantined', 0)} quarantined records are not in {data_name})")
