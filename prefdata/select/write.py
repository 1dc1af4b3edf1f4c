"""NEW/ as a full OUT: the kept pairs (with every column, refs included), OUT's dropped and quarantine
lines plus one `not_selected` line per pair left out, a manifest whose ledger still holds and that
names where NEW came from, and the report. Staged inside NEW and published manifest last, as prepare
publishes OUT (prefdata.io.out_dir)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import xxhash

from prefdata.core import flags as F
from prefdata.io.handoff import describe, read_settings
from prefdata.io.manifest import write_manifest
from prefdata.io.out_paths import out_file

TEXT_OF_DROPPED = ("prompt", "chosen", "rejected")
# Pass-through columns a dropped line carries besides the text (what identifies the pair).
CONTEXT_COLUMNS = ("group_id", "chosen_sample", "rejected_sample")


def content_hash(parent_hash: str | None, kept: np.ndarray, added: Mapping[str, np.ndarray]) -> str:
    """NEW's content hash: OUT's, the rows kept, and any column values selection added."""
    digest = xxhash.xxh3_128()
    digest.update(str(parent_hash).encode("utf-8"))
    digest.update(np.asarray(kept, dtype=np.int64).tobytes())
    for name in sorted(added):
        digest.update(name.encode("utf-8"))
        digest.update(np.asarray(added[name], dtype=np.float64).tobytes())
    return digest.hexdigest()


def write_dataset(dataset: Any, kept: np.ndarray, added: Mapping[str, np.ndarray], staging: Path,
                  new_hash: str) -> list[str]:
    """The kept rows of `dataset` (all columns), plus `added` columns, saved into `staging`; the
    DatasetInfo keeps prepare's settings with NEW's content hash, so the TRL hand-off reads NEW too.

    Nothing is written next to OUT's files: `datasets` caches a selection's indices and a flattened
    copy beside the dataset it came from, so the indices stay in memory and the flattened copy (needed
    before add_column) goes to a scratch directory inside NEW's staging, removed once NEW is saved."""
    import datasets

    subset = dataset.select(kept.tolist(), keep_in_memory=True)
    scratch = staging / ".select-scratch"
    if added and subset._indices is not None:  # add_column would flatten into OUT's directory
        scratch.mkdir()
        subset = subset.flatten_indices(cache_file_name=str(scratch / "kept.arrow"))
    for name, values in added.items():
        if name in subset.column_names:
            subset = subset.remove_columns([name])
        subset = subset.add_column(name, values.astype(np.float32).tolist(), feature=datasets.Value("float32"))
    settings = read_settings(subset.info.description)
    if settings is not None:
        subset.info.description = describe({**settings, "content_hash": new_hash})
    subset.save_to_disk(str(staging))  # applies the in-memory indices as it writes
    shutil.rmtree(scratch, ignore_errors=True)
    return list(subset.column_names)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def write_dropped(out: Path, staging: Path, table: Any, reasons: np.ndarray, values: np.ndarray, signal: str) -> int:
    """OUT's dropped.jsonl, then one line per pair not selected (OUT's order): its source, flags plus
    `not_selected`, why, the signal's value (null when not finite) and its text. Returns lines added."""
    target = staging / "dropped.jsonl"
    source = out_file(out, "dropped.jsonl")  # never a symlink, never outside OUT
    if source.is_file():
        shutil.copyfile(source, target)
    rows = np.flatnonzero(reasons != "")
    names = set(table.column_names)
    columns = [c for c in ("source_file", "source_line", "flags", *TEXT_OF_DROPPED, *CONTEXT_COLUMNS) if c in names]
    with open(target, "a", encoding="utf-8") as handle:
        for start in range(0, len(rows), 4096):
            chunk = rows[start : start + 4096]
            part = table.select(columns).take(chunk).to_pylist()
            for row, record in zip(chunk, part):
                line = {
                    "source_file": record.get("source_file"), "source_line": record.get("source_line"),
                    "flags": [*(record.get("flags") or []), F.NOT_SELECTED], "severity": "drop",
                    "reason": F.NOT_SELECTED, "why": str(reasons[row]), "signal": signal,
                    "value": _json_value(float(values[row])),
                }
                line.update({c: record[c] for c in (*TEXT_OF_DROPPED, *CONTEXT_COLUMNS) if c in record})
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    return len(rows)


def copy_quarantine(out: Path, staging: Path) -> None:
    source = out_file(out, "quarantine.jsonl")  # never a symlink, never outside OUT
    if source.is_file():
        shutil.copyfile(source, staging / "quarantine.jsonl")
    else:
        (staging / "quarantine.jsonl").write_text("", encoding="utf-8")


def new_accounting(parent: Mapping[str, Any], kept: int, not_selected: int) -> dict[str, Any]:
    """OUT's ledger with the pairs not selected moved from kept to dropped: rows_in = rows_out +
    rows_dropped + rows_quarantined still holds, and so does pairs_made = pairs_kept + pairs_dropped.
    The records' ledger (how records became pairs) is the one from before selection."""
    acc = dict(parent)
    acc["rows_out"] = kept
    acc["rows_dropped"] = int(acc.get("rows_dropped", 0)) + not_selected
    if "pairs_kept" in acc:
        acc["pairs_kept"] = kept
        acc["pairs_dropped"] = int(acc.get("pairs_dropped", 0)) + not_selected
    acc["rows_not_selected"] = not_selected
    if "rows_in" not in acc:  # an OUT from elsewhere: the ledger starts at its pairs
        acc["rows_in"] = kept + acc["rows_dropped"] + int(acc.get("rows_quarantined", 0))
    acc.setdefault("rows_quarantined", 0)
    return acc


def write_new_manifest(staging: Path, parent: Mapping[str, Any], *, accounting: Mapping[str, Any],
                       new_hash: str, columns: list[str], not_selected: int,
                       lineage: Mapping[str, Any], selection: Mapping[str, Any]) -> None:
    manifest = dict(parent)
    flag_counts = dict(parent.get("flag_counts") or {})
    if not_selected:
        flag_counts[F.NOT_SELECTED] = flag_counts.get(F.NOT_SELECTED, 0) + not_selected
    data_files = json.loads((staging / "state.json").read_text(encoding="utf-8"))["_data_files"]
    manifest.update(
        row_accounting=dict(accounting), content_hash=new_hash, columns=columns, flag_counts=flag_counts,
        shards=[{"file": entry["filename"], "rows": _rows_in(staging / entry["filename"])} for entry in data_files],
        files=["dropped.jsonl", "quarantine.jsonl", "report.json", "report.md", "report.html"],
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        selected_from=dict(lineage), selection=dict(selection),
    )
    write_manifest(staging, manifest)


def _rows_in(path: Path) -> int:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:  # mapped: counting reads no column data
        return sum(batch.num_rows for batch in pa.ipc.open_stream(source))
