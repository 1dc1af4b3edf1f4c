"""OpenRLHF's DPO preprocessing, run with its own code: `RewardDataset(..., is_dpo=True)` for the ids,
then its `collate_fn` and `DPOTrainer.concatenated_inputs` / `_get_batch_logps` for the loss masks.

Nothing here re-implements OpenRLHF: the settings are handed to its classes as its CLI would
(`--data.max_len`, `--data.prompt_key`, ...), and every id and mask comes out of its methods.
Tested with openrlhf 0.11.2 (`pip install --no-deps openrlhf==0.11.2`, docs/trainers.md).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field, fields, replace
from typing import Any

from prefdata.core.errors import PrefdataError

TESTED_VERSION = "0.11.2"
INSTALL = 'pip install "prefdata[openrlhf]" && pip install --no-deps openrlhf==0.11.2'
UNLIMITED = 1 << 30  # data.max_len that truncates nothing: what a row would be without the limit
_MASK_CHUNK = 1 << 24  # elements per probe of _get_batch_logps (bounds its memory on long rows)


@dataclass(frozen=True)
class OpenRLHFSettings:
    """OpenRLHF's `--data.*` flags that decide what train_dpo.py trains on, with its defaults."""

    max_len: int = 512
    prompt_key: str | None = None
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    input_template: str | None = None
    apply_chat_template: bool = False
    tokenizer_chat_template: str | None = None

    def flag(self, name: str, value: Any = None) -> str:
        """The setting as a user types it to OpenRLHF, e.g. `--data.max_len 64`."""
        value = getattr(self, name) if value is None else value
        if value is True:
            return f"--data.{name}"
        return f"--data.{name} {value!r}" if isinstance(value, str) else f"--data.{name} {value}"

    def given(self) -> list[str]:
        """Every setting that differs from OpenRLHF's default, as flags, plus max_len always."""
        default = OpenRLHFSettings()
        return [self.flag(f.name) for f in fields(self)
                if f.name == "max_len" or getattr(self, f.name) != getattr(default, f.name)]


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_openrlhf_args(items: list[str] | None) -> OpenRLHFSettings:
    """`--trainer-arg data.max_len=1024` (repeatable; a leading `--` and a bare boolean are fine):
    OpenRLHF's own flag names. A name OpenRLHF's preprocessing does not read is one line, exit 2."""
    known = {f.name: f for f in fields(OpenRLHFSettings)}
    values: dict[str, Any] = {}
    for item in items or []:
        name, eq, text = item.strip().removeprefix("--").partition("=")
        key = name.strip().removeprefix("data.")
        if not name.strip().startswith("data.") or key not in known:
            raise PrefdataError(f"--trainer-arg {item!r}: OpenRLHF's preprocessing reads "
                                f"{', '.join('data.' + k for k in known)}")
        if key == "apply_chat_template":
            if eq and text.strip().lower() not in _BOOLS:
                raise PrefdataError(f"--trainer-arg {item!r}: expected true or false")
            values[key] = _BOOLS[text.strip().lower()] if eq else True
        elif not eq:
            raise PrefdataError(f"--trainer-arg {item!r}: expected data.{key}=VALUE")
        elif key == "max_len":
            if not text.strip().isdigit() or int(text) < 1:
                raise PrefdataError(f"--trainer-arg {item!r}: expected a positive integer")
            values[key] = int(text)
        else:
            values[key] = text
    settings = OpenRLHFSettings(**values)
    # train_dpo.py's own rule: a template without {} is ignored (it prints a warning and goes on).
    if settings.input_template is not None and "{}" not in settings.input_template:
        settings = replace(settings, input_template=None)
    return settings


@dataclass
class OpenRLHFHalf:
    """One half as OpenRLHF trains it: the ids and attention mask RewardDataset gives, and the loss
    mask _get_batch_logps builds (over the labels, ids[1:])."""

    ids: list[int]
    attention_mask: list[int]
    loss_mask: list[int]

    @property
    def trained(self) -> list[int]:
        """The ids in the loss: each label ids[j + 1] whose loss_mask[j] is 1."""
        return [token for token, on in zip(self.ids[1:], self.loss_mask) if on]


@dataclass
class OpenRLHFPair:
    prompt_len: int  # RewardDataset's `extra`: the prompt tokenized on its own
    prompt: str  # the strings preprocess_data made (before __getitem__ joins and strips them)
    chosen_text: str
    rejected_text: str
    chosen: OpenRLHFHalf
    rejected: OpenRLHFHalf


@dataclass
class OpenRLHFOutcome:
    """Per input row (by position): its pair, or the prompt tokens that made RewardDataset drop it."""

    pairs: dict[int, OpenRLHFPair] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)  # row -> prompt tokens (RewardDataset's filter)


def openrlhf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openrlhf")
    except PackageNotFoundError:
        return "unknown"


def load_openrlhf() -> tuple[type, type]:
    """(RewardDataset, DPOTrainer), OpenRLHF's own classes; a one-line error when it is not installed."""
    try:
        from openrlhf.datasets import RewardDataset
    except ImportError as error:
        raise PrefdataError(f"--trainer openrlhf runs OpenRLHF's own preprocessing, which is not importable "
                            f"({error}); install it: {INSTALL}") from None
    return RewardDataset, _dpo_trainer()


def _dpo_trainer() -> type:
    """DPOTrainer, whose module imports `openrlhf.models` for DPOLoss only (used in __init__, which never
    runs here). openrlhf.models imports deepspeed, flash-attn and peft at module level; where they are
    missing (a CPU install) a stand-in `openrlhf.models` holding a DPOLoss placeholder is in place for
    that one import. It has no effect on concatenated_inputs or _get_batch_logps, the methods called."""
    try:
        from openrlhf.trainer.dpo_trainer import DPOTrainer

        return DPOTrainer
    except ImportError:
        pass
    real = sys.modules.get("openrlhf.models")
    stand_in = types.ModuleType("openrlhf.models")

    class DPOLoss:  # never constructed: DPOTrainer.__init__ is not called
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("prefdata's stand-in for openrlhf.models: no model here")

    stand_in.DPOLoss = DPOLoss  # type: ignore[attr-defined]
    sys.modules["openrlhf.models"] = stand_in
    try:
        from openrlhf.trainer.dpo_trainer import DPOTrainer
    except ImportError as error:
        raise PrefdataError(f"--trainer openrlhf: OpenRLHF's DPOTrainer does not import ({error}); "
                            f"install it: {INSTALL}") from None
    finally:
        if real is None:
            sys.modules.pop("openrlhf.models", None)
        else:
            sys.modules["openrlhf.models"] = real
    return DPOTrainer


def _strategy(settings: OpenRLHFSettings) -> Any:
    """The part of OpenRLHF's strategy RewardDataset reads: `strategy.args.data`, as train_dpo.py sets it."""
    data = types.SimpleNamespace(
        prompt_key=settings.prompt_key, chosen_key=settings.chosen_key, rejected_key=settings.rejected_key,
        apply_chat_template=settings.apply_chat_template, tokenizer_chat_template=settings.tokenizer_chat_template,
    )
    return types.SimpleNamespace(args=types.SimpleNamespace(data=data))


def run_openrlhf(rows: list[dict[str, Any]], tokenizer: Any, settings: OpenRLHFSettings,
                 batch_pairs: int = 32) -> OpenRLHFOutcome:
    """Every row through OpenRLHF's DPO preprocessing with `settings`. `tokenizer` is OpenRLHF's
    (prefdata.trainers.run.openrlhf_tokenizer); RewardDataset may set its chat template. Where OpenRLHF
    stops on the input (so would its training), one line with its exception and the settings."""
    import datasets

    classes = load_openrlhf()
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # its map and filter would print bars for every run
    try:
        return _run(rows, tokenizer, settings, batch_pairs, classes)
    except PrefdataError:
        raise
    except Exception as error:  # OpenRLHF's own failure: its training would stop here too
        first = str(error).splitlines()[0] if str(error) else ""
        raise PrefdataError(f"under openrlhf: OpenRLHF's RewardDataset stops on this input with "
                            f"{type(error).__name__}: {first} (settings: {' '.join(settings.given())})") from None
    finally:
        if bars:
            datasets.enable_progress_bars()


def _run(rows: list[dict[str, Any]], tokenizer: Any, settings: OpenRLHFSettings, batch_pairs: int,
         classes: tuple[type, type]) -> OpenRLHFOutcome:
    RewardDataset, DPOTrainer = classes
    outcome = OpenRLHFOutcome()
    table = _rows_table(rows)
    # num_processors=None: its map runs in this process (1 would still start a pool); the rows are the same.
    dataset = RewardDataset(table, tokenizer, settings.max_len, _strategy(settings),
                            input_template=settings.input_template, is_dpo=True, num_processors=None)
    kept: list[int] = []
    for index in range(len(rows)):
        # The same call its dataset.map made, to learn which rows its filter took out.
        processed = dataset.process_data(table[index])
        if processed["prompt"] is None:
            outcome.dropped[index] = int(processed["extra"])
        else:
            kept.append(index)
    if len(kept) != len(dataset):  # a different OpenRLHF than the one this was written against
        raise PrefdataError(f"--trainer openrlhf: OpenRLHF {openrlhf_version()} kept {len(dataset)} rows where its "
                            f"filter keeps {len(kept)}; prefdata is tested with {TESTED_VERSION}")
    trainer = DPOTrainer.__new__(DPOTrainer)  # no model, no strategy: only its tensor methods run
    trainer.tokenizer = tokenizer
    for start in range(0, len(kept), batch_pairs):
        positions = list(range(start, min(start + batch_pairs, len(kept))))
        items = [dataset[k] for k in positions]
        for k, item, (chosen_loss, rejected_loss) in zip(positions, items, _loss_masks(trainer, dataset, items)):
            c_ids, c_mask, r_ids, r_mask, prompt_len = item
            outcome.pairs[kept[k]] = OpenRLHFPair(
                prompt_len=int(prompt_len), prompt=dataset.prompts[k], chosen_text=dataset.chosens[k],
                rejected_text=dataset.rejects[k],
                chosen=OpenRLHFHalf(c_ids[0].tolist(), c_mask[0].int().tolist(), chosen_loss),
                rejected=OpenRLHFHalf(r_ids[0].tolist(), r_mask[0].int().tolist(), rejected_loss),
            )
    return outcome


def _rows_table(rows: list[dict[str, Any]]) -> Any:
    """The rows as the datasets.Dataset OpenRLHF's loader gives RewardDataset. Its map would name its
    cache by hashing the transform, which pickles the whole tokenizer (seconds per run for some); a
    fresh name instead changes nothing RewardDataset computes."""
    import uuid

    import datasets

    class Rows(datasets.Dataset):
        def map(self, function: Any = None, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("new_fingerprint", uuid.uuid4().hex)
            return super().map(function, *args, **kwargs)

    return Rows.from_list(rows)


def _loss_masks(trainer: Any, dataset: Any, items: list[Any]) -> list[tuple[list[int], list[int]]]:
    """Each item's loss masks as DPOTrainer builds them: the batch collated by RewardDataset.collate_fn,
    squeezed as fit() does, concatenated, then _get_batch_logps. That method returns only sums over the
    mask, so it is handed rows of an identity matrix as `per_token_logps`: the sum against row j is the
    mask at position j (in chunks of positions, to bound memory)."""
    import torch

    c_ids, c_mask, r_ids, r_mask, prompt_lens = dataset.collate_fn(items)
    _, att_masks, lens = trainer.concatenated_inputs(c_ids.squeeze(1), c_mask.squeeze(1), r_ids.squeeze(1),
                                                     r_mask.squeeze(1), prompt_lens)
    rows, width = att_masks.shape[0], att_masks.shape[1] - 1
    step = max(1, _MASK_CHUNK // max(1, rows * width))
    parts = []
    for first in range(0, width, step):
        probe = torch.eye(width, dtype=torch.uint8)[first:first + step, None, :]
        sums, _ = trainer._get_batch_logps(probe, att_masks, lens)
        parts.append(sums.T)
    mask = torch.cat(parts, dim=1).to(torch.int64) if parts else torch.zeros((rows, 0), dtype=torch.int64)
    out = []
    for b, item in enumerate(items):
        c_len, r_len = item[0].shape[1], item[2].shape[1]
        out.append((mask[b, :c_len - 1].tolist(), mask[len(items) + b, :r_len - 1].tolist()))
    return out
