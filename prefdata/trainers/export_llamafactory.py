"""`prefdata export OUT DIR --trainer llamafactory` (export.py dispatches here): OUT's kept pairs as a LLaMA-Factory
dataset_dir.

DIR gets `prefdata_dpo.jsonl` (one line per dataset row of OUT, in order: alpaca rows `prompt`/`chosen`/`rejected`
for string pairs; for conversations, sharegpt rows as LLaMA-Factory's dpo_en_demo.json has them: `conversations`
of from/value messages, a system message first where OUT has one, and `chosen`/`rejected` one gpt message each),
`dataset_info.json` (the entry, with `ranking: true` and the columns that read the file), `llamafactory.yaml` (the lines a user adds to their
LLaMA-Factory config, and what it cannot read) and `export.json` (where it came from). Dropped and quarantined
records are never written: only OUT's dataset rows are read. Writing needs no LLaMA-Factory install;
tests/trainers/test_llamafactory_export.py loads DIR with its own get_dataset(stage="rm").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.trainers.export_common import (
    REF_COLUMNS,
    ExportSource,
    header_lines,
    iter_rows,
    open_out,
    staged,
    weight_note,
    without_nulls,
    write_record,
)
from prefdata.trainers.llamafactory import TESTED_VERSION

DATA_NAME, INFO_NAME, YAML_NAME = "prefdata_dpo.jsonl", "dataset_info.json", "llamafactory.yaml"
DATASET = "prefdata_dpo"  # the entry's name in dataset_info.json: the `dataset:` of the config
REFS_NOTE = ("reference log-probs: LLaMA-Factory cannot read precomputed ones (its DPO trainer sets "
             "precompute_ref_log_probs = False; a request to read them is wontfix, #4810): it runs a reference model "
             "(ref_model, default the policy) on every batch")
# sharegpt as LLaMA-Factory's own dpo_en_demo.json writes it (its default tags: from/value, human/gpt/system),
# which prefdata's ShareGPT reader also reads
ROLE_TAGS = {"system": "system", "user": "human", "assistant": "gpt"}


@dataclass
class ExportResult:
    dir: Path
    rows: int
    conversational: bool
    config: list[str]  # the YAML lines for the user's LLaMA-Factory config
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        shape = "sharegpt conversations" if self.conversational else "alpaca strings"
        return "\n".join([f"wrote {self.rows:,} pairs to {self.dir / DATA_NAME} ({shape}) and its entry "
                          f"{DATASET!r} in {self.dir / INFO_NAME}; add to your LLaMA-Factory config:",
                          *(f"  {line}" for line in self.config), *(f"  note: {note}" for note in self.notes),
                          f"config lines and notes: {self.dir / YAML_NAME}"])


def _export_settings(items: list[str] | None) -> dict[str, Any]:
    """template=NAME and cutoff_len=N (they go into the config lines); LLaMA-Factory's other keys stay the user's."""
    values: dict[str, Any] = {}
    for item in items or []:
        name, eq, text = item.strip().removeprefix("--").partition("=")
        name = name.strip()
        if name not in ("template", "cutoff_len") or not eq or not text.strip():
            raise PrefdataError(f"--trainer-arg {item!r}: export writes template=NAME and cutoff_len=N into the "
                                "config lines; set LLaMA-Factory's other keys in your config")
        if name == "cutoff_len" and (not text.strip().isdigit() or int(text) < 1):
            raise PrefdataError(f"--trainer-arg {item!r}: expected a positive integer")
        values[name] = int(text) if name == "cutoff_len" else text.strip()
    return values


def export(out_dir: str | Path, export_dir: str | Path, trainer_args: list[str] | None,
           overwrite: bool) -> ExportResult:
    """Write OUT's kept pairs into DIR as a LLaMA-Factory dataset_dir, with the config lines to read them."""
    out, target = Path(out_dir), Path(export_dir)
    given = _export_settings(trainer_args)
    source = open_out(out, target, overwrite, "export --trainer llamafactory writes text pairs only",
                      "one LLaMA-Factory dataset has one format")
    conversational = source.kind == "messages"
    keep = source.keep(REF_COLUMNS)
    with staged(source, target, overwrite) as staging:
        rows = _write_rows(source.table.select(keep), staging / DATA_NAME, conversational)
        entry = _entry(conversational)
        (staging / INFO_NAME).write_text(json.dumps({DATASET: entry}, indent=2) + "\n", encoding="utf-8")
        config = _config(target, source, given)
        notes = _notes(source, given, target, conversational)
        (staging / YAML_NAME).write_text(_yaml_text(source, config, notes), encoding="utf-8")
        write_record(staging, source, "llamafactory", TESTED_VERSION, rows, keep,
                     {"dataset_info": entry, "config": config, "notes": notes})
    return ExportResult(target, rows, conversational, config, notes)


def _entry(conversational: bool) -> dict[str, Any]:
    if conversational:
        return {"file_name": DATA_NAME, "formatting": "sharegpt", "ranking": True,
                "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}
    return {"file_name": DATA_NAME, "formatting": "alpaca", "ranking": True,
            "columns": {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"}}


def _write_rows(table: Any, path: Path, conversational: bool) -> int:
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for row in iter_rows(table):
            if conversational:
                row = _sharegpt_row(row)
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def _where(row: dict[str, Any]) -> str:
    return f"{row.get('source_file', 'OUT')}:{row.get('source_line', '?')}"


def _plain(message: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A message as sharegpt reads it: role and string content, nothing else (it reads no other field)."""
    message = without_nulls(message)
    extra = sorted(set(message) - {"role", "content"})
    if extra or not isinstance(message.get("content"), str):
        what = f"its {', '.join(extra)}" if extra else "non-text content"
        raise PrefdataError(f"{_where(row)}: a {message.get('role')} message carries {what}, which LLaMA-Factory's "
                            "sharegpt format does not read (only role and text content; reasoning inline as "
                            "<think>...</think>): it would be lost, so nothing is written")
    return {"from": ROLE_TAGS.get(message["role"], message["role"]), "value": message["content"]}


def _sharegpt_row(row: dict[str, Any]) -> dict[str, Any]:
    """prompt messages -> conversations (system first, then user/assistant turns ending with user);
    chosen/rejected -> one assistant message each, as LLaMA-Factory's pairwise sharegpt reads them."""
    prompt = [_plain(m, row) for m in row["prompt"]]
    turns = prompt[1:] if prompt and prompt[0]["from"] == "system" else prompt
    wanted = ["human" if i % 2 == 0 else "gpt" for i in range(len(turns))]
    if [m["from"] for m in turns] != wanted or len(turns) % 2 == 0:
        raise PrefdataError(f"{_where(row)}: LLaMA-Factory's sharegpt reads prompts of alternating user/assistant "
                            f"turns ending with user (after an optional system message); this one has roles "
                            f"{[m.get('role') for m in row['prompt']]}")
    out = {"conversations": prompt, **{key: value for key, value in row.items() if key != "prompt"}}
    for half in ("chosen", "rejected"):
        messages = row[half]
        if len(messages) != 1 or messages[0].get("role") != "assistant":
            raise PrefdataError(f"{_where(row)}: {half} is {len(messages)} message(s); LLaMA-Factory's pairwise "
                                "sharegpt reads one assistant message per half (a multi-turn completion cannot go)")
        out[half] = _plain(messages[0], row)
    return out


def _config(target: Path, source: ExportSource, given: dict[str, Any]) -> list[str]:
    cutoff = given.get("cutoff_len") or source.config.get("max_length")
    lines = ["stage: dpo", f"dataset: {DATASET}", f"dataset_dir: {target.resolve()}",
             f"template: {given['template']}" if given.get("template") else
             "template: TEMPLATE  # your model's LLaMA-Factory template name (qwen, llama3, mistral, ...)"]
    if cutoff:
        lines.append(f"cutoff_len: {cutoff}")
    return lines


def _notes(source: ExportSource, given: dict[str, Any], target: Path, conversational: bool) -> list[str]:
    """What LLaMA-Factory will not read, or will do otherwise than prefdata did, said plainly."""
    columns, tokenizer = source.columns, source.tokenizer
    refs = [name for name in REF_COLUMNS if name in columns]
    notes = [REFS_NOTE + (f"; OUT's {' and '.join(refs)} are in {DATA_NAME} for other tools and are not used by "
                          "LLaMA-Factory" if refs else "; OUT has none")]
    notes.append("LLaMA-Factory renders every row through its own template (by name, not the tokenizer's chat "
                 "template) and cuts prompt and responses by its own rule at cutoff_len"
                 + ("" if conversational else "; OUT's rows are plain strings, which it wraps in that template"))
    if {"chosen_loss_mask", "rejected_loss_mask"} & columns:
        notes.append("OUT has per-turn loss masks; LLaMA-Factory trains every token of the one response")
    notes += weight_note(columns, "LLaMA-Factory")
    template = given.get("template", "TEMPLATE")
    cutoff = given.get("cutoff_len") or source.config.get("max_length") or 2048
    notes.append(f"what it will train on: `prefdata validate {target / DATA_NAME} --tokenizer {tokenizer or 'TOK'} "
                 f"--trainer llamafactory --trainer-arg template={template} --trainer-arg cutoff_len={cutoff} "
                 f"--trainer-arg dataset_info={target / INFO_NAME} --trainer-arg dataset={DATASET}`")
    return notes


def _yaml_text(source: ExportSource, config: list[str], notes: list[str]) -> str:
    return "\n".join([
        *header_lines(f"LLaMA-Factory {TESTED_VERSION} config lines", source.out, source.manifest, DATA_NAME),
        "# Add them to your training YAML (model_name_or_path, finetuning_type, output_dir, ... are yours),",
        "# then: llamafactory-cli train your_config.yaml",
        "", *config, "", *(f"# note: {note}" for note in notes), "",
    ])
