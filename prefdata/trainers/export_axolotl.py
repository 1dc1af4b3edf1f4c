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
from prefdata.trainers.axolotl import TESTED_VERSION
from prefdata.trainers.export_common import (
    REF_COLUMNS,
    ExportSource,
    header_lines,
    open_out,
    staged,
    weight_note,
    write_pair_rows,
    write_record,
)

DATA_NAME, CONFIG_NAME = "train.jsonl", "axolotl.yaml"
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
    source = open_out(out, target, overwrite, "prefdata's axolotl export writes text pairs only",
                      "one axolotl dataset entry reads one kind")
    as_messages = source.kind == "messages" or bool(source.config.get("chat_template"))
    keep = source.keep()
    with staged(source, target, overwrite) as staging:
        rows = write_pair_rows(source.table.select(keep), staging / DATA_NAME, as_messages and source.kind == "strings")
        snippet = _snippet(target / DATA_NAME, as_messages, source.config.get("max_length"))
        notes = _notes(source, target / DATA_NAME, as_messages)
        (staging / CONFIG_NAME).write_text(_config_text(source, snippet, notes), encoding="utf-8")
        write_record(staging, source, "axolotl", TESTED_VERSION, rows, keep, {"notes": notes})
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


def _notes(source: ExportSource, data: Path, as_messages: bool) -> list[str]:
    columns, tokenizer = source.columns, source.tokenizer
    refs = [name for name in REF_COLUMNS if name in columns]
    notes = [REFS_NOTE + ("; OUT's reference log-probs are therefore not written" if refs else "; OUT has none")]
    if {"chosen_loss_mask", "rejected_loss_mask"} & columns:
        notes.append("OUT has per-turn loss masks; axolotl trains every token of each response")
    notes += weight_note(columns, "axolotl", made_by="")
    if as_messages:
        notes.append("chat_template.default keeps only the last message of chosen/rejected, cuts each response out "
                     "of its render with str.find and rstrips it")
    if tokenizer:
        notes.append(f"OUT was tokenized with {tokenizer}: train the model whose tokenizer that is (base_model)")
    notes.append(f"axolotl tokenizes, truncates and masks these rows its own way: `prefdata validate {data} "
                 f"--tokenizer {tokenizer or 'TOK'} --trainer axolotl --trainer-arg config=YOUR_AXOLOTL.yaml` (with "
                 "these lines in it) shows what it will train on")
    return notes


def _config_text(source: ExportSource, snippet: str, notes: list[str]) -> str:
    return "\n".join([
        *header_lines(f"axolotl {TESTED_VERSION} config lines", source.out, source.manifest, DATA_NAME),
        "# Paste into your axolotl config (base_model, training settings...), replacing its rl and datasets keys.",
        snippet, "", *(f"# note: {note}" for note in notes), ""])
