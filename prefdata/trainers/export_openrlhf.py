"""`prefdata export OUT DIR --trainer openrlhf` (export.py dispatches here): OUT's kept pairs in the trainer's own input format.

DIR gets `train.jsonl` (one line per dataset row of OUT, in order: prompt/chosen/rejected as strings, or
as message lists that `--data.apply_chat_template` renders), `openrlhf_args.txt` (the `--data.*` flags
train_dpo.py needs to read it as prefdata checked it, and what it cannot read) and `export.json` (where
it came from). Dropped and quarantined records are never written: only OUT's dataset rows are read.
Writing needs no OpenRLHF install; tests/trainers/test_export_openrlhf.py loads DIR with OpenRLHF's loader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.core.schema import OFFSET_COLUMN, WEIGHT_COLUMN
from prefdata.io.manifest import require_pairs
from prefdata.io.out_dir import abandon, load_out_dataset, prepare_output_dir, publish
from prefdata.trainers.export_common import (
    REF_COLUMNS,
    TRACE_COLUMNS,
    check_places,
    kept_line,
    text_kind,
    write_pair_rows,
)
from prefdata.trainers.openrlhf import TESTED_VERSION, OpenRLHFSettings, parse_openrlhf_args

DATA_NAME, ARGS_NAME, RECORD_NAME = "train.jsonl", "openrlhf_args.txt", "export.json"
TEMPLATE_NAME = "chat_template.jinja"  # --trainer-arg data.tokenizer_chat_template, for OpenRLHF's flag
OPENRLHF_MAX_SAMPLES = 1_000_000  # train_dpo.py's --data.max_samples default: rows past it are never read
REFS_NOTE = ("reference log-probs: OpenRLHF 0.11.2's DPO cannot read precomputed ones; its DPOTrainer runs a live "
             "reference model (--ref.model_name_or_path, default the policy) on every batch")


@dataclass
class ExportResult:
    dir: Path
    rows: int
    conversational: bool
    flags: list[str]  # the train_dpo.py flags, one per item
    notes: list[str] = field(default_factory=list)  # what OpenRLHF will not read or do as prefdata did

    def summary(self) -> str:
        shape = "message lists for --data.apply_chat_template" if self.conversational else "strings"
        lines = [f"wrote {self.rows:,} pairs to {self.dir / DATA_NAME} ({shape}), for OpenRLHF's train_dpo:",
                 "  " + " \\\n    ".join(self.flags), *(f"  note: {note}" for note in self.notes),
                 f"flags and notes: {self.dir / ARGS_NAME}"]
        return "\n".join(lines)


def export(out_dir: str | Path, export_dir: str | Path, trainer_args: list[str] | None,
           overwrite: bool) -> ExportResult:
    """Write OUT's kept pairs into DIR in OpenRLHF's input format, with the train_dpo.py flags to read them."""
    out, target = Path(out_dir), Path(export_dir)
    check_places(out, target, overwrite)
    manifest = require_pairs(out, "export")  # finished, ledger matches its files, no symlink out of it
    given = _export_settings(trainer_args)
    dataset = load_out_dataset(out, "export")
    table = dataset.data.table
    columns = set(table.column_names)
    if "images" in columns:
        raise PrefdataError(f"{out} holds image pairs; OpenRLHF's DPO trainer (train_dpo.py) reads text only")
    kind = text_kind(table)
    if kind == "mixed":
        raise PrefdataError(f"{out} mixes string and conversational rows; OpenRLHF applies --data.apply_chat_template "
                            "to every row or to none: prepare the two kinds into separate OUTs and export each")
    config = manifest.get("config") or {}
    # prefdata rendered plain strings through the chat template (prepare --chat-template): as messages,
    # OpenRLHF renders them through it too (one user + one assistant turn, as prefdata did).
    as_messages = kind == "messages" or bool(config.get("chat_template"))
    settings = replace(given, prompt_key="prompt", chosen_key="chosen", rejected_key="rejected",
                       apply_chat_template=as_messages)
    if given.max_len == OpenRLHFSettings().max_len and not _max_len_given(trainer_args) and config.get("max_length"):
        settings = replace(settings, max_len=int(config["max_length"]))  # OUT's own limit, unless told otherwise
    keep = [name for name in ("prompt", "chosen", "rejected", *TRACE_COLUMNS, *REF_COLUMNS) if name in columns]
    staging = prepare_output_dir(target, overwrite, inputs=[out])
    try:
        rows = write_pair_rows(table.select(keep), staging / DATA_NAME, as_messages and kind == "strings")
        if settings.tokenizer_chat_template:
            (staging / TEMPLATE_NAME).write_text(settings.tokenizer_chat_template, encoding="utf-8")
        flags = _flags(target / DATA_NAME, settings, rows)
        notes = _notes(manifest, columns, settings, target / DATA_NAME)
        (staging / ARGS_NAME).write_text(_args_text(out, flags, notes, manifest), encoding="utf-8")
        record = {"trainer": "openrlhf", "tested_version": TESTED_VERSION, "source": str(out.resolve()),
                  "content_hash": manifest.get("content_hash"), "rows": rows, "columns": keep,
                  "flags": flags, "notes": notes}
        (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        publish(staging, target)
    except BaseException:
        abandon(staging, target)
        raise
    return ExportResult(target, rows, as_messages, flags, notes)


def _max_len_given(items: list[str] | None) -> bool:
    return any(item.strip().removeprefix("--").startswith("data.max_len") for item in items or [])


def _export_settings(items: list[str] | None) -> OpenRLHFSettings:
    """The --trainer-arg settings export takes: data.max_len and data.tokenizer_chat_template (they go
    into the flags). The keys and the template switch follow from OUT, so giving them is an error."""
    settings = parse_openrlhf_args(items)
    decided = [name for name in ("prompt_key", "chosen_key", "rejected_key", "apply_chat_template", "input_template")
               if getattr(settings, name) != getattr(OpenRLHFSettings(), name)]
    if decided:
        raise PrefdataError(f"--trainer-arg data.{decided[0]}: export decides it from OUT (keys prompt/chosen/rejected, "
                            "the chat template where OUT's rows are conversations); give only data.max_len or "
                            "data.tokenizer_chat_template")
    return settings


def _flags(data: Path, settings: OpenRLHFSettings, rows: int) -> list[str]:
    """train_dpo.py's dataset flags for DIR's file (its 0.11.2 names)."""
    flags = [f"--data.dataset {data}", "--data.prompt_key prompt", "--data.chosen_key chosen",
             "--data.rejected_key rejected"]
    if settings.apply_chat_template:
        flags.append("--data.apply_chat_template")
    if settings.tokenizer_chat_template:  # a Jinja template is no shell word: read from its file
        flags.append(f'--data.tokenizer_chat_template "$(cat {data.parent / TEMPLATE_NAME})"')
    flags.append(f"--data.max_len {settings.max_len}")
    if rows > OPENRLHF_MAX_SAMPLES:
        flags.append(f"--data.max_samples {rows}")  # its default would leave the rest unread
    return flags


def _notes(manifest: dict[str, Any], columns: set[str], settings: OpenRLHFSettings, data: Path) -> list[str]:
    """What OpenRLHF will not read, or will do otherwise than prefdata did, said plainly."""
    config = manifest.get("config") or {}
    refs = [name for name in REF_COLUMNS if name in columns]
    notes = [REFS_NOTE + (f"; OUT's {' and '.join(refs)} are written as columns for other tools and are not used "
                          "by OpenRLHF" if refs else "; OUT has none")]
    if {"chosen_loss_mask", "rejected_loss_mask"} & columns:
        notes.append("OUT has per-turn loss masks (tool results, user turns out of the loss); OpenRLHF trains every "
                     "token after the prompt, those turns included")
    if {WEIGHT_COLUMN, OFFSET_COLUMN} & columns:
        notes.append(f"OUT's {WEIGHT_COLUMN}/{OFFSET_COLUMN} columns (prefdata select) are not written: OpenRLHF's "
                     "DPO loss reads neither")
    if config.get("chat_template_file") and not settings.tokenizer_chat_template:
        notes.append(f"OUT was rendered with --chat-template-file {config['chat_template_file']}; give OpenRLHF "
                     "the same template: --trainer-arg data.tokenizer_chat_template=... (or its "
                     "--data.tokenizer_chat_template)")
    if config.get("template_kwargs"):
        notes.append(f"OUT was rendered with --template-kwargs {config['template_kwargs']}; OpenRLHF's "
                     "apply_chat_template takes no template variables, so it renders without them")
    tokenizer = (manifest.get("tokenizer") or {}).get("path") or config.get("tokenizer")
    if tokenizer:
        notes.append(f"OUT was tokenized with {tokenizer}: train the model whose tokenizer that is "
                     "(--model.model_name_or_path)")
    notes.append("OpenRLHF tokenizes, truncates and masks these rows its own way: `prefdata validate "
                 f"{data} --tokenizer {tokenizer or 'TOK'} --trainer openrlhf --trainer-arg data.max_len={settings.max_len} "
                 "--trainer-arg data.prompt_key=prompt"
                 + (" --trainer-arg data.apply_chat_template" if settings.apply_chat_template else "")
                 + "` shows what it will train on")
    return notes


def _args_text(out: Path, flags: list[str], notes: list[str], manifest: dict[str, Any]) -> str:
    return "\n".join([
        f"# OpenRLHF {TESTED_VERSION} train_dpo.py flags for the pairs prefdata kept in {out}",
        kept_line(manifest, DATA_NAME),
        "# Add your model, ref and train flags: python -m openrlhf.cli.train_dpo <these> --model.model_name_or_path ...",
        "",
        " \\\n".join(flags),
        "",
        *(f"# note: {note}" for note in notes),
        "",
    ])
