"""`prefdata export OUT DIR --trainer axolotl` (export.py dispatches here): OUT's kept pairs in a form axolotl's
DPO loader reads.

DIR gets `train.jsonl` (one line per dataset row of OUT, in order), `axolotl.yaml` (the `rl: dpo` line and the
`datasets:` block a user pastes into their axolotl config, plus what axolotl cannot read, as comments) and
`export.json`. Strings go to axolotl with no dataset `type`: axolotl hands prompt/chosen/rejected to TRL as they
are. Message lists go through `type: chat_template.default` (field_messages: prompt), which renders them with
the tokenizer's chat template. Writing needs no axolotl install; tests/trainers/test_axolotl_export.py loads
DIR with axolotl's own loader in its venv.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.core.schema import OFFSET_COLUMN, WEIGHT_COLUMN
from prefdata.io.manifest import require_pairs
from prefdata.io.out_dir import abandon, load_out_dataset, prepare_output_dir, publish
from prefdata.trainers.axolotl import TESTED_VERSION
from prefdata.trainers.export_common import (
    REF_COLUMNS,
    TRACE_COLUMNS,
    check_places,
    kept_line,
    text_kind,
    write_pair_rows,
)

DATA_NAME, CONFIG_NAME, RECORD_NAME = "train.jsonl", "axolotl.yaml", "export.json"
REFS_NOTE = ("reference log-probs: axolotl 0.19.0 trains DPO with TRL 1.9's DPOTrainer, which cannot take precomputed "
             "ones from the data: with precompute_ref_log_probs: true it computes its own with the reference model "
             "before training, otherwise it runs the reference model on every batch")


@dataclass
class ExportResult:
    dir: Path
    rows: int
    conversational: bool
    snippet: str  # the YAML lines to paste into the axolotl config
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        shape = "message lists (type: chat_template.default)" if self.conversational else "strings (no type)"
        return "\n".join([f"wrote {self.rows:,} pairs to {self.dir / DATA_NAME} ({shape}); add to your axolotl config:",
                          *("  " + line for line in self.snippet.splitlines()),
                          *(f"  note: {note}" for note in self.notes), f"snippet and notes: {self.dir / CONFIG_NAME}"])


def export(out_dir: str | Path, export_dir: str | Path, trainer_args: list[str] | None,
           overwrite: bool) -> ExportResult:
    """Write OUT's kept pairs into DIR in a form axolotl's DPO loader reads, with the config lines to read them."""
    out, target = Path(out_dir), Path(export_dir)
    if trainer_args:
        raise PrefdataError("--trainer-arg: export --trainer axolotl takes none (the config lines follow from OUT)")
    check_places(out, target, overwrite)
    manifest = require_pairs(out, "export")
    table = load_out_dataset(out, "export").data.table
    columns = set(table.column_names)
    if "images" in columns:
        raise PrefdataError(f"{out} holds image pairs; prefdata's axolotl export writes text pairs only")
    kind = text_kind(table)
    if kind == "mixed":
        raise PrefdataError(f"{out} mixes string and conversational rows; one axolotl dataset entry reads one kind: "
                            "prepare the two kinds into separate OUTs and export each")
    config = manifest.get("config") or {}
    as_messages = kind == "messages" or bool(config.get("chat_template"))
    keep = [name for name in ("prompt", "chosen", "rejected", *TRACE_COLUMNS) if name in columns]
    staging = prepare_output_dir(target, overwrite, inputs=[out])
    try:
        rows = write_pair_rows(table.select(keep), staging / DATA_NAME, as_messages and kind == "strings")
        snippet = _snippet(target / DATA_NAME, as_messages, config.get("max_length"))
        notes = _notes(manifest, columns, target / DATA_NAME, as_messages)
        (staging / CONFIG_NAME).write_text(_config_text(out, snippet, notes, manifest), encoding="utf-8")
        record = {"trainer": "axolotl", "tested_version": TESTED_VERSION, "source": str(out.resolve()),
                  "content_hash": manifest.get("content_hash"), "rows": rows, "columns": keep, "notes": notes}
        (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        publish(staging, target)
    except BaseException:
        abandon(staging, target)
        raise
    return ExportResult(target, rows, as_messages, snippet, notes)


def _snippet(data: Path, as_messages: bool, max_length: Any) -> str:
    lines = ["rl: dpo"]
    if as_messages:
        lines.append("chat_template: tokenizer_default")
    if max_length:
        lines.append(f"sequence_len: {int(max_length)}")
    lines += ["datasets:", f"  - path: {json.dumps(str(data))}", "    ds_type: json", "    split: train"]
    if as_messages:
        lines += ["    type: chat_template.default", "    field_messages: prompt", "    field_chosen: chosen",
                  "    field_rejected: rejected"]
    return "\n".join(lines)


def _notes(manifest: dict[str, Any], columns: set[str], data: Path, as_messages: bool) -> list[str]:
    refs = [name for name in REF_COLUMNS if name in columns]
    notes = [REFS_NOTE + ("; OUT's reference log-probs are therefore not written" if refs else "; OUT has none")]
    if {"chosen_loss_mask", "rejected_loss_mask"} & columns:
        notes.append("OUT has per-turn loss masks; axolotl trains every token of each response")
    if {WEIGHT_COLUMN, OFFSET_COLUMN} & columns:
        notes.append(f"OUT's {WEIGHT_COLUMN}/{OFFSET_COLUMN} columns are not written: axolotl's DPO loss reads neither")
    if as_messages:
        notes.append("chat_template.default keeps only the last message of chosen/rejected, cuts each response out "
                     "of its render with str.find and rstrips it")
    config = manifest.get("config") or {}
    tokenizer = (manifest.get("tokenizer") or {}).get("path") or config.get("tokenizer")
    if tokenizer:
        notes.append(f"OUT was tokenized with {tokenizer}: train the model whose tokenizer that is (base_model)")
    notes.append(f"axolotl tokenizes, truncates and masks these rows its own way: `prefdata validate {data} "
                 f"--tokenizer {tokenizer or 'TOK'} --trainer axolotl --trainer-arg config=YOUR_AXOLOTL.yaml` (with "
                 "these lines in it) shows what it will train on")
    return notes


def _config_text(out: Path, snippet: str, notes: list[str], manifest: dict[str, Any]) -> str:
    return "\n".join([
        f"# axolotl {TESTED_VERSION} config lines for the pairs prefdata kept in {out}",
        kept_line(manifest, DATA_NAME),
        "# Paste into your axolotl config (base_model, training settings...), replacing its rl and datasets keys.",
        snippet, "", *(f"# note: {note}" for note in notes), ""])
