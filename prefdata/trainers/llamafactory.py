"""LLaMA-Factory's DPO preprocessing, run with its own code in its own environment.

LLaMA-Factory 0.9.5 pins transformers <= 5.6, datasets <= 4.0 and trl <= 0.24, which prefdata cannot import,
so its code runs in a child process with the Python of its venv (worker_process.py, workers/llamafactory_worker.py):
its dataset_info parser and converter read the rows, its template (by name, not the tokenizer's chat template)
and PairwiseDatasetProcessor (stage "rm", which DPO uses) make the ids and labels. Nothing here re-implements it:
the settings are the keys of its YAML config (`template`, `cutoff_len`, ...), as the user gives them to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.trainers.common import TrainerHalf
from prefdata.trainers.worker_process import run_worker, trainer_python

TESTED_VERSION = "0.9.5"
INSTALL = "pip install --no-deps llamafactory==0.9.5 in a venv of its own (docs/trainers.md: bash scripts/trainer-venv.sh llamafactory)"
IGNORE_INDEX = -100  # LLaMA-Factory's label for a position out of the loss


@dataclass(frozen=True)
class LlamaFactorySettings:
    """The keys of LLaMA-Factory's YAML config that decide what its DPO stage trains on, with its defaults
    (hparams/data_args.py); `dataset_info` + `dataset`: the user's own entry for the rows."""

    template: str | None = None
    cutoff_len: int = 2048
    default_system: str | None = None
    enable_thinking: bool = True
    preserve_thinking: bool = False
    tool_format: str | None = None
    dataset_info: str | None = None  # dataset_info.json, or the folder (dataset_dir) holding it
    dataset: str | None = None

    def key(self, name: str, value: Any = None) -> str:
        """The setting as a user writes it in LLaMA-Factory's YAML, e.g. `cutoff_len: 1024`."""
        value = getattr(self, name) if value is None else value
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, str) and (not value or value != value.strip() or ":" in value):
            value = json.dumps(value)
        return f"{name}: {value}"

    def given(self) -> list[str]:
        """Every setting that differs from LLaMA-Factory's default, plus template and cutoff_len always."""
        default = LlamaFactorySettings()
        return [self.key(f.name) for f in fields(self)
                if f.name in ("template", "cutoff_len") or getattr(self, f.name) != getattr(default, f.name)]

    def data_args(self) -> dict[str, Any]:
        """LLaMA-Factory's DataArguments fields, as its YAML sets them."""
        names = ("template", "cutoff_len", "default_system", "enable_thinking", "preserve_thinking", "tool_format")
        return {name: getattr(self, name) for name in names}


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_NOT_READ = {"mask_history": "its DPO stage encodes every earlier turn into the prompt, never into the loss",
             "train_on_prompt": "its DPO stage never trains the prompt",
             "packing": "its DPO stage does not pack"}


def parse_llamafactory_args(items: list[str] | None) -> LlamaFactorySettings:
    """`--trainer-arg template=qwen --trainer-arg cutoff_len=1024` (repeatable): LLaMA-Factory's YAML keys.
    A key its DPO preprocessing does not read is one line, exit 2; `template` is required."""
    known = {f.name for f in fields(LlamaFactorySettings)}
    values: dict[str, Any] = {}
    for item in items or []:
        name, eq, text = item.strip().removeprefix("--").partition("=")
        name = name.strip()
        if name in _NOT_READ:
            raise PrefdataError(f"--trainer-arg {item!r}: LLaMA-Factory's DPO preprocessing does not read {name} "
                                f"({_NOT_READ[name]})")
        if name not in known:
            raise PrefdataError(f"--trainer-arg {item!r}: LLaMA-Factory's DPO preprocessing reads "
                                f"{', '.join(sorted(known))}")
        if name in ("enable_thinking", "preserve_thinking"):
            if eq and text.strip().lower() not in _BOOLS:
                raise PrefdataError(f"--trainer-arg {item!r}: expected true or false")
            values[name] = _BOOLS[text.strip().lower()] if eq else True
        elif not eq:
            raise PrefdataError(f"--trainer-arg {item!r}: expected {name}=VALUE")
        elif name == "cutoff_len":
            if not text.strip().isdigit() or int(text) < 1:
                raise PrefdataError(f"--trainer-arg {item!r}: expected a positive integer")
            values[name] = int(text)
        else:
            values[name] = text
    settings = LlamaFactorySettings(**values)
    if not settings.template:
        raise PrefdataError("--trainer llamafactory needs --trainer-arg template=NAME: LLaMA-Factory renders with its "
                            "own templates by name (qwen, llama3, mistral, ...), the `template:` of your config")
    if (settings.dataset_info is None) != (settings.dataset is None):
        raise PrefdataError("--trainer-arg dataset_info=FILE and dataset=NAME go together (the entry of your "
                            "dataset_info.json that describes these rows)")
    return settings


def dataset_entry(settings: LlamaFactorySettings, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The dataset_info.json entry LLaMA-Factory reads the rows with: the user's (dataset_info + dataset),
    else the one a user writes for rows of this shape (ranking: true)."""
    if settings.dataset_info is not None:
        return _user_entry(Path(settings.dataset_info), str(settings.dataset))
    first = rows[0] if rows else {}
    columns = {"chosen": "chosen", "rejected": "rejected"}
    columns.update({name: name for name in ("system", "tools") if name in first})
    if "conversations" in first:  # LLaMA-Factory's own sharegpt shape (its dpo_en_demo.json)
        return {"formatting": "sharegpt", "ranking": True, "columns": {"messages": "conversations", **columns}}
    if isinstance(first.get("instruction"), str):
        extra = {name: name for name in ("input", "history") if name in first}
        return {"formatting": "alpaca", "ranking": True,
                "columns": {"prompt": "instruction", **({"query": "input"} if "input" in extra else {}),
                            **({"history": "history"} if "history" in extra else {}), **columns}}
    if isinstance(first.get("prompt"), str):
        return {"formatting": "alpaca", "ranking": True, "columns": {"prompt": "prompt", **columns}}
    if isinstance(first.get("prompt"), list):  # TRL's conversational shape, read as sharegpt with role/content
        return {"formatting": "sharegpt", "ranking": True, "columns": {"messages": "prompt", **columns},
                "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                         "assistant_tag": "assistant", "system_tag": "system"}}
    raise PrefdataError(f"LLaMA-Factory reads alpaca or sharegpt rows (instruction/prompt or conversations, with "
                        f"chosen and rejected); these rows have {', '.join(sorted(first)) or 'no keys'}: give your "
                        "entry with --trainer-arg dataset_info=FILE --trainer-arg dataset=NAME, or prepare them "
                        "and use `prefdata export OUT DIR --trainer llamafactory`")


def _user_entry(path: Path, name: str) -> dict[str, Any]:
    file = path / "dataset_info.json" if path.is_dir() else path
    try:
        info = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PrefdataError(f"--trainer-arg dataset_info={path}: cannot read it ({error})") from None
    entry = info.get(name) if isinstance(info, dict) else None
    if not isinstance(entry, dict):
        raise PrefdataError(f"--trainer-arg dataset={name}: no such entry in {file}")
    if not entry.get("ranking"):
        raise PrefdataError(f"{file} entry {name!r} has no `ranking: true`: LLaMA-Factory's DPO stage reads it as "
                            "unpaired rows")
    return {key: value for key, value in entry.items() if key not in ("file_name", "hf_hub_url", "ms_hub_url")}


@dataclass
class LlamaFactoryPair:
    """A pair as LLaMA-Factory trains it: input ids and labels (IGNORE_INDEX out of the loss), and the same
    row with no cutoff_len (what truncation took, and the cutoff_len that avoids it)."""

    prompt_len: int
    chosen: TrainerHalf
    rejected: TrainerHalf
    full_prompt: list[int]
    full_chosen: list[int]
    full_rejected: list[int]
    apart_at: int | None  # smallest cutoff_len at which the trained halves differ
    response_whole_at: int | None
    prompt_whole_at: int | None
    trained_at: int | None  # smallest cutoff_len at which each response keeps a token
    system: str  # the system message its converter gave the template ("" = none: the template's default)
    thought_added: list[bool] = field(default_factory=list)


@dataclass
class LlamaFactoryOutcome:
    version: str
    default_system: str
    reasoning_template: bool
    pairs: dict[int, LlamaFactoryPair] = field(default_factory=dict)
    dropped: dict[int, dict[str, Any]] = field(default_factory=dict)  # row -> what its converter gave
    explicit_empty_system: set[int] = field(default_factory=set)


def _half(ids: list[int], labels: list[int]) -> TrainerHalf:
    return TrainerHalf(list(ids), [int(label != IGNORE_INDEX) for label in labels])


def run_llamafactory(rows: list[dict[str, Any]], tokenizer_path: str, trust_remote_code: bool,
                     settings: LlamaFactorySettings, python: str | None, entry: dict[str, Any]) -> LlamaFactoryOutcome:
    """Every row through LLaMA-Factory's converter and pairwise processor, in its environment."""
    interpreter = trainer_python(python, "llamafactory-cli", "llamafactory", INSTALL)
    request = {"tokenizer": str(Path(tokenizer_path).resolve()) if Path(tokenizer_path).exists() else tokenizer_path,
               "trust_remote_code": trust_remote_code, "data_args": settings.data_args(), "dataset_info": entry,
               "rows": rows}
    answer = run_worker("llamafactory_worker.py", interpreter, request, "llamafactory")
    outcome = LlamaFactoryOutcome(answer["version"], answer["default_system"],
                                  answer["template_class"] == "ReasoningTemplate")
    for index, row in enumerate(answer["rows"]):
        if row.get("explicit_empty_system"):
            outcome.explicit_empty_system.add(index)
        if row.get("dropped"):
            outcome.dropped[index] = row
            continue
        prompt_len = sum(1 for label in row["chosen_labels"] if label == IGNORE_INDEX)
        outcome.pairs[index] = LlamaFactoryPair(
            prompt_len=prompt_len, chosen=_half(row["chosen_input_ids"], row["chosen_labels"]),
            rejected=_half(row["rejected_input_ids"], row["rejected_labels"]), full_prompt=row["full_prompt_ids"],
            full_chosen=row["full_chosen_ids"], full_rejected=row["full_rejected_ids"], apart_at=row["apart_at"],
            response_whole_at=row["response_whole_at"], prompt_whole_at=row["prompt_whole_at"],
            trained_at=row["trained_at"],
            system=row["system"], thought_added=row.get("thought_added", []))
    return outcome
