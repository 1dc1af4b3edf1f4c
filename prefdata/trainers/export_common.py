"""What every `prefdata export --trainer NAME` shares: where it may write, what OUT's text columns hold,
OUT's rows read in batches, JSON lines written the way trainers read them, and the header line that says
which records of OUT are not in the export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from prefdata.core.errors import PrefdataError
from prefdata.io.out_dir import refuse_inputs_inside

REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
TRACE_COLUMNS = ("source_file", "source_line")
BATCH = 1024  # rows read from OUT at a time (memory stays flat)


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


def kept_line(manifest: dict[str, Any], data_name: str) -> str:
    """The header comment saying how many pairs the export holds and which records of OUT it leaves out."""
    accounting = manifest.get("row_accounting") or {}
    return (f"# ({accounting.get('rows_out', '?')} kept; {accounting.get('rows_dropped', 0)} dropped and "
            f"{accounting.get('rows_quarantined', 0)} quarantined records are not in {data_name})")
