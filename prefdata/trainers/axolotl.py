"""axolotl's DPO preprocessing, run with its own code in its own environment (workers/axolotl_worker.py).

axolotl 0.19.0 pins transformers 5.16.1 and TRL 1.9.0, which prefdata cannot import beside its own
(transformers >= 5.22), so its code runs in a child process with the Python of axolotl's venv
(worker_process.py). The user's own axolotl YAML config is read as axolotl reads it; `--trainer-arg KEY=VALUE`
overrides one key of it (dotted for nested ones: `datasets.0.type=chat_template.default`). The rows
go through `load_cfg`, `load_tokenizer`, `prepare_preference_datasets` and TRL's `_prepare_dataset` and
`DataCollatorForPreference` there; every id and mask comes from their output.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.trainers.common import TrainerHalf, TrainerPair

TESTED_VERSION = "0.19.0"
INSTALL = "bash scripts/trainer-venv.sh axolotl (docs/trainers.md: axolotl)"
UNLIMITED = 1 << 20  # a sequence_len that cuts and drops nothing: what a row would be without the limit
DPO_KINDS = ("dpo", "ipo")  # rl values whose data path is prepare_preference_datasets + TRL's DPOTrainer


@dataclass(frozen=True)
class AxolotlSettings:
    """The user's axolotl config (`config=PATH`) with `KEY=VALUE` overrides applied, as one dict."""

    config: dict[str, Any]
    config_path: str | None = None
    overrides: tuple[str, ...] = ()
    dataset: int = 0  # which `datasets:` entry the rows are read through (`dataset=N`)

    @property
    def entry(self) -> dict[str, Any]:
        return self.config["datasets"][self.dataset]

    def key(self, name: str, value: Any = None) -> str:
        """A top-level setting as it reads in the YAML, e.g. `sequence_len: 64`."""
        return f"{name}: {self.config.get(name) if value is None else value}"

    def dataset_key(self, name: str) -> str:
        return f"datasets[{self.dataset}].{name}: {self.entry.get(name)}"

    @property
    def sequence_len(self) -> int:
        return int(self.config.get("sequence_len") or 512)  # axolotl's schema default

    @property
    def excess(self) -> str:
        return str(self.config.get("excess_length_strategy") or "drop").lower()

    def given(self) -> list[str]:
        shown = [f"config={self.config_path}"] if self.config_path else []
        fixed = ("rl", "sequence_len", "excess_length_strategy", f"datasets.{self.dataset}.type")
        extra = [item for item in self.overrides if item.split("=", 1)[0] not in fixed]
        return [*shown, *extra, self.key("rl"), self.key("sequence_len", self.sequence_len),
                self.key("excess_length_strategy", self.excess), self.dataset_key("type")]


def parse_axolotl_args(items: list[str] | None) -> AxolotlSettings:
    """`config=axolotl.yaml` (the user's own file) and `KEY=VALUE` overrides (YAML values; dotted keys
    with list indices, `datasets.0.type=chat_template.default`); `dataset=N` picks the datasets entry."""
    import yaml

    config: dict[str, Any] = {}
    path: str | None = None
    overrides: list[tuple[str, str]] = []
    dataset = 0
    for item in items or []:
        name, eq, text = item.strip().removeprefix("--").partition("=")
        name = name.strip()
        if not eq or not name:
            raise PrefdataError(f"--trainer-arg {item!r}: expected config=PATH or KEY=VALUE (an axolotl config key)")
        if name == "config":
            path = text.strip()
            config = _read_config(path)
        elif name == "dataset":
            if not text.strip().isdigit():
                raise PrefdataError(f"--trainer-arg {item!r}: expected the index of a `datasets:` entry")
            dataset = int(text)
        else:
            overrides.append((name, text))
    config = copy.deepcopy(config)
    config.setdefault("rl", "dpo")
    config.setdefault("datasets", [{}])
    for name, text in overrides:
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        _set(config, name, value)
    if str(config.get("rl")).lower() not in DPO_KINDS:
        raise PrefdataError(f"--trainer axolotl checks axolotl's DPO data path (rl: dpo or ipo), got rl: {config.get('rl')}")
    entries = config.get("datasets")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise PrefdataError("--trainer axolotl: the config's `datasets:` must be a list of entries")
    if dataset >= len(entries):
        raise PrefdataError(f"--trainer-arg dataset={dataset}: the config has {len(entries)} `datasets:` entries")
    return AxolotlSettings(config, path, tuple(f"{n}={t}" for n, t in overrides), dataset)


def _read_config(path: str) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise PrefdataError(f"--trainer-arg config={path}: cannot read it ({error.strerror or error})") from None
    except yaml.YAMLError as error:
        raise PrefdataError(f"--trainer-arg config={path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise PrefdataError(f"--trainer-arg config={path}: an axolotl config is a YAML mapping")
    return loaded


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    """config[a][0][b] = value for `a.0.b`, making mappings (and one-entry lists) on the way."""
    parts = dotted.split(".")
    node: Any = config
    for part, after in zip(parts, parts[1:]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) > len(node):
                raise PrefdataError(f"--trainer-arg {dotted}: no entry {part} in that list")
            if int(part) == len(node):
                node.append({})
            node = node[int(part)]
            continue
        if not isinstance(node.get(part), (dict, list)):
            node[part] = [] if after.isdigit() else {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) > len(node):
            raise PrefdataError(f"--trainer-arg {dotted}: no entry {last} in that list")
        node[int(last):int(last) + 1] = [value]
    else:
        node[last] = value


@dataclass
class AxolotlPair(TrainerPair):
    """A pair as axolotl trains on it, with the strings its dataset strategy made."""

    prompt_text: Any = ""  # strings, or message lists where a dataset has no `type` (TRL renders them)
    chosen_text: Any = ""
    rejected_text: Any = ""


@dataclass
class AxolotlOutcome:
    pairs: dict[int, AxolotlPair] = field(default_factory=dict)
    dropped: list[int] = field(default_factory=list)  # rows axolotl (or TRL under it) leaves out, silently


@dataclass
class AxolotlRuns:
    version: str
    trl_version: str
    main: AxolotlOutcome  # with the user's settings
    full: AxolotlOutcome  # with sequence_len unlimited: what the limit took


def run_axolotl(rows: list[dict[str, Any]], tokenizer_path: str, trust_remote_code: bool,
                settings: AxolotlSettings, python: str) -> AxolotlRuns:
    """The rows through axolotl's preprocessing twice in one child process: with the settings, and with no
    length limit (the findings' fixes come from the second)."""
    from prefdata.trainers.worker_process import run_worker

    with tempfile.TemporaryDirectory(prefix="prefdata-axolotl-") as work:
        request = {"config": settings.config, "dataset": settings.dataset, "rows": rows,
                   "tokenizer": str(Path(tokenizer_path).resolve()) if Path(tokenizer_path).exists() else tokenizer_path,
                   "trust_remote_code": trust_remote_code, "workdir": work, "cwd": work,
                   "runs": {"main": {}, "full": {"changes": {"sequence_len": UNLIMITED}}}}
        answer = run_worker("axolotl_worker.py", python, request, "axolotl")
    runs = answer["runs"]
    return AxolotlRuns(answer.get("axolotl", "unknown"), answer.get("trl", "unknown"),
                       outcome_from_answer(runs["main"]), outcome_from_answer(runs["full"]))


def outcome_from_answer(run: dict[str, Any]) -> AxolotlOutcome:
    out = AxolotlOutcome(dropped=[int(r) for r in run["dropped"]])
    for row, item in run["pairs"].items():
        out.pairs[int(row)] = AxolotlPair(
            prompt_len=len(item["prompt_ids"]),
            chosen=TrainerHalf(item["chosen"]["ids"], item["chosen"]["mask"]),
            rejected=TrainerHalf(item["rejected"]["ids"], item["rejected"]["mask"]),
            prompt_text=item.get("prompt_text") or "", chosen_text=item.get("chosen_text") or "",
            rejected_text=item.get("rejected_text") or "")
    return out
