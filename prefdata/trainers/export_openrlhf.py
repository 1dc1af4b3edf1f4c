"""`prefdata export OUT DIR --trainer openrlhf` (export.py dispatches here): OUT's kept pairs in the trainer's own input format.

DIR gets `train.jsonl` (one line per dataset row of OUT, in order: prompt/chosen/rejected as strings, or
as message lists that `--data.apply_chat_template` renders), `openrlhf_args.txt` (the `--data.*` flags
train_dpo.py needs to read it as prefdata checked it, and what it cannot read) and `export.json` (where
it came from). Dropped and quarantined records are never written: only OUT's dataset rows are read.
Writing needs no OpenRLHF install; tests/trainers/test_export_openrlhf.py loads DIR with OpenRLHF's loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from prefdata.core.errors import PrefdataError
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
from prefdata.trainers.openrlhf import TESTED_VERSION, OpenRLHFSettings, parse_openrlhf_args

DATA_NAME, ARGS_NAME = "train.jsonl", "openrlhf_args.txt"
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
    given = _export_settings(trainer_args)
    source = open_out(out, target, overwrite, "OpenRLHF's DPO trainer (train_dpo.py) reads text only",
                      "OpenRLHF applies --data.apply_chat_template to every row or to none")
    config = source.config
    # prefdata rendered plain strings through the chat template (prepare --chat-template): as messages,
    # OpenRLHF renders them through it too (one user + one assistant turn, as prefdata did).
    as_messages = source.kind == "messages" or bool(config.get("chat_template"))
    settings = replace(given, prompt_key="prompt", chosen_key="chosen", rejected_key="rejected",
                       apply_chat_template=as_messages)
    if given.max_len == OpenRLHFSettings().max_len and not _max_len_given(trainer_args) and config.get("max_length"):
        settings = replace(settings, max_len=int(config["max_length"]))  # OUT's own limit, unless told otherwise
    keep = source.keep(REF_COLUMNS)
    with staged(source, target, overwrite) as staging:
        rows = write_pair_rows(source.table.select(keep), staging / DATA_NAME, as_messages and source.kind == "strings")
        if settings.tokenizer_chat_template:
            (staging / TEMPLATE_NAME).write_text(settings.tokenizer_chat_template, encoding="utf-8")
        flags = _flags(target / DATA_NAME, settings, rows)
        notes = _notes(source, settings, target / DATA_NAME)
        (staging / ARGS_NAME).write_text(_args_text(source, flags, notes), encoding="utf-8")
        write_record(staging, source, "openrlhf", TESTED_VERSION, rows, keep, {"flags": flags, "notes": notes})
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


def _notes(source: ExportSource, settings: OpenRLHFSettings, data: Path) -> list[str]:
    """What OpenRLHF will not read, or will do otherwise than prefdata did, said plainly."""
    config, columns, tokenizer = source.config, source.columns, source.tokenizer
    refs = [name for name in REF_COLUMNS if name in columns]
    notes = [REFS_NOTE + (f"; OUT's {' and '.join(refs)} are written as columns for other tools and are not used "
                          "by OpenRLHF" if refs else "; OUT has none")]
    if {"chosen_loss_mask", "rejected_loss_mask"} & columns:
        notes.append("OUT has per-turn loss masks (tool results, user turns out of the loss); OpenRLHF trains every "
                     "token after the prompt, those turns included")
    notes += weight_note(columns, "OpenRLHF")
    if config.get("chat_template_file") and not settings.tokenizer_chat_template:
        notes.append(f"OUT was rendered with --chat-template-file {config['chat_template_file']}; give OpenRLHF "
                     "the same template: --trainer-arg data.tokenizer_chat_template=... (or its "
                     "--data.tokenizer_chat_template)")
    if config.get("template_kwargs"):
        notes.append(f"OUT was rendered with --template-kwargs {config['template_kwargs']}; OpenRLHF's "
                     "apply_chat_template takes no template variables, so it renders without them")
    if tokenizer:
        notes.append(f"OUT was tokenized with {tokenizer}: train the model whose tokenizer that is "
                     "(--model.model_name_or_path)")
    notes.append("OpenRLHF tokenizes, truncates and masks these rows its own way: `prefdata validate "
                 f"{data} --tokenizer {tokenizer or 'TOK'} --trainer openrlhf --trainer-arg data.max_len={settings.max_len} "
                 "--trainer-arg data.prompt_key=prompt"
                 + (" --trainer-arg data.apply_chat_template" if settings.apply_chat_template else "")
                 + "` shows what it will train on")
    return notes


def _args_text(source: ExportSource, flags: list[str], notes: list[str]) -> str:
    return "\n".join([
        *header_lines(f"OpenRLHF {TESTED_VERSION} train_dpo.py flags", source.out, source.manifest, DATA_NAME),
        "# Add your model, ref and train flags: python -m openrlhf.cli.train_dpo <these> --model.model_name_or_path ...",
        "",
        " \\\n".join(flags),
        "",
        *(f"# note: {note}" for note in notes),
        "",
    ])
