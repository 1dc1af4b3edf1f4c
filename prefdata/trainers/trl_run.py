"""TRL's DPO data preparation, run with its own code and no model: `DPOTrainer._prepare_dataset` (prompt
extraction, EOS for string rows, the chat template, tokenization, the completion split at the common prefix,
the filter that drops rows whose prompt fills max_length), then `DataCollatorForPreference` (truncation,
the completion mask), exactly as `DPOTrainer.__init__` builds it.

`_prepare_dataset` is called on a DPOTrainer made without `__init__` (it reads only `self._tokenizer`);
the DPOConfig is TRL's own (trl_settings). The loss sums the model's log-probs over labels `ids[1:]`
where `completion_mask[1:]` is 1 (`_compute_loss`: `shift_completion_mask`, TRL's fused head shifting the
labels), so the first position is never trained.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from prefdata.core.errors import PrefdataError
from prefdata.trainers.trl_settings import INSTALL, TRLSettings

ROW_COLUMN = "__prefdata_row__"  # carries each row's position through TRL's map and filter
# The columns TRL's text preparation reads from a row (`tools` and `chat_template_kwargs` go to the template).
READ_COLUMNS = ("prompt", "chosen", "rejected", "tools", "chat_template_kwargs")
BATCH = 32


@dataclass
class TRLHalf:
    """One half as TRL's collator gives it (padding removed): the ids and TRL's completion mask."""

    ids: list[int]
    completion_mask: list[int]  # aligned with ids; TRL's loss reads it shifted, from position 1

    @property
    def loss_mask(self) -> list[int]:
        """1 where the token's log-prob is in TRL's loss (position 0 has no label)."""
        return [0, *self.completion_mask[1:]][:len(self.ids)]

    @property
    def trained(self) -> list[int]:
        return [t for t, m in zip(self.ids, self.loss_mask) if m]


@dataclass
class TRLPair:
    prompt_len: int  # TRL's prompt ids: the common prefix of the prompt alone and prompt + each half
    prompt_alone: list[int]  # the prompt tokenized alone, as tokenize_fn does
    example: dict[str, Any]  # TRL's prepared row (text after extract_prompt / add_eos, and its ids)
    chosen: TRLHalf
    rejected: TRLHalf

    def full(self, half: str) -> list[int]:
        """The half untruncated: TRL's prompt ids + its completion ids."""
        return list(self.example["prompt_ids"]) + list(self.example[f"{half}_ids"])


@dataclass
class TRLOutcome:
    pairs: dict[int, TRLPair] = field(default_factory=dict)
    dropped: dict[int, TRLPair] = field(default_factory=dict)  # TRL's filter; untruncated, to say why
    notes: list[str] = field(default_factory=list)


def load_trl() -> tuple[type, type, Any]:
    """(DPOTrainer, DataCollatorForPreference, trl.data_utils._tokenize): TRL's own."""
    try:
        from trl.data_utils import _tokenize
        from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer
    except ImportError as error:
        raise PrefdataError(f"--trainer trl runs TRL's own data preparation, which is not importable ({error}); "
                            f"install it: {INSTALL}") from None
    return DPOTrainer, DataCollatorForPreference, _tokenize


def trl_tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The tokenizer as DPOTrainer holds it: its pad token set to EOS where it has none."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@contextmanager
def _quiet_trl() -> Iterator[None]:
    """TRL's map/filter bars and its warning_once (the boundary warning becomes a finding here)."""
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    logger = logging.getLogger("trl.trainer.dpo_trainer")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def _rows_dataset(rows: list[dict[str, Any]], positions: list[int]) -> Any:
    """The rows as the datasets.Dataset TRL's users hand it (the columns TRL reads). Each map and filter gets
    a fresh fingerprint: hashing the transform would pickle the tokenizer, and nothing is cached."""
    import datasets

    class Rows(datasets.Dataset):
        def map(self, function: Any = None, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("new_fingerprint", uuid.uuid4().hex)
            return _as_rows(super().map(function, *args, **kwargs))

        def filter(self, function: Any = None, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("new_fingerprint", uuid.uuid4().hex)
            return _as_rows(super().filter(function, *args, **kwargs))

    def _as_rows(dataset: Any) -> Any:
        dataset.__class__ = Rows  # the same dataset (indices mapping included), still with these methods
        return dataset

    columns = [c for c in READ_COLUMNS if any(c in rows[i] for i in positions)]
    table = [{**{c: rows[i].get(c) for c in columns}, ROW_COLUMN: i} for i in positions]
    try:
        return Rows.from_list(table)
    except Exception as error:  # Arrow cannot hold the rows as one table: neither can TRL's datasets
        raise PrefdataError(f"under trl: the rows do not make one datasets.Dataset, which TRL's DPOTrainer "
                            f"takes ({type(error).__name__}: {str(error).splitlines()[0][:200]})") from None


def _prepare(rows: list[dict[str, Any]], positions: list[int], tokenizer: Any, config: Any) -> dict[int, dict]:
    """TRL's `_prepare_dataset` on the rows: row position -> its prepared example (rows it drops absent)."""
    DPOTrainer, _, _ = load_trl()
    trainer = DPOTrainer.__new__(DPOTrainer)  # no model: _prepare_dataset reads only _tokenizer
    trainer._tokenizer = tokenizer
    prepared = trainer._prepare_dataset(_rows_dataset(rows, positions), tokenizer, config, "train")
    return {int(example.pop(ROW_COLUMN)): example for example in prepared}


def _collate(examples: list[dict[str, Any]], tokenizer: Any, config: Any) -> list[tuple[TRLHalf, TRLHalf]]:
    """DataCollatorForPreference as DPOTrainer.__init__ builds it, over batches; each row's halves unpadded."""
    _, Collator, _ = load_trl()
    pad = config.pad_token or tokenizer.pad_token or tokenizer.eos_token
    if config.pad_token and pad not in tokenizer.get_vocab():  # DPOTrainer.__init__'s own refusal
        raise PrefdataError(f"under trl: DPOTrainer refuses pad_token={pad!r}: it is not in the tokenizer's vocabulary")
    collator = Collator(pad_token_id=tokenizer.convert_tokens_to_ids(pad), max_length=config.max_length,
                        truncation_mode=config.truncation_mode, pad_to_multiple_of=config.pad_to_multiple_of)
    out = []
    for start in range(0, len(examples), BATCH):
        batch = [{k: e[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for e in examples[start:start + BATCH]]
        made = collator(batch)
        ids, attention, completion = (made[k].tolist() for k in ("input_ids", "attention_mask", "completion_mask"))
        n = len(batch)
        for b in range(n):
            halves = []
            for row in (b, n + b):  # the chosen rows, then the rejected rows
                width = sum(attention[row])  # right padding
                halves.append(TRLHalf(ids[row][:width], completion[row][:width]))
            out.append((halves[0], halves[1]))
    return out


def _prompt_alone(example: dict[str, Any], tokenizer: Any) -> list[int]:
    """The prompt tokenized alone, with the arguments TRL's tokenize_fn gives `_tokenize`."""
    import json

    _, _, tokenize = load_trl()
    from trl.data_utils import is_conversational

    if not is_conversational(example):
        return list(tokenize(tokenizer, example["prompt"])["input_ids"])
    tools = example.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    kwargs = {"tools": tools, **(example.get("chat_template_kwargs") or {})}
    return list(tokenize(tokenizer, example["prompt"], add_generation_prompt=True, **kwargs)["input_ids"])


def run_trl(rows: list[dict[str, Any]], tokenizer: Any, settings: TRLSettings) -> TRLOutcome:
    """Every row through TRL's data preparation and collator with `settings`. Where TRL stops on the input
    (so would its DPOTrainer), one line with its exception."""
    outcome = TRLOutcome()
    config, warned = settings.dpo_config()
    config.dataset_num_proc = None  # in this process: the same map, the same ids
    outcome.notes += warned
    outcome.notes += [f"{settings.flag(name)}: {effect}" for name, effect in _effects(settings).items()]
    if not rows:
        return outcome
    if any("image" in row or "images" in row for row in rows):
        raise PrefdataError("under trl: rows with images go through TRL's DataCollatorForVisionPreference and a "
                            "processor, per batch, which --trainer trl does not run (text rows only)")
    try:
        with _quiet_trl():
            everything = list(range(len(rows)))
            prepared = _prepare(rows, everything, tokenizer, config)
            dropped = [i for i in everything if i not in prepared]
            if dropped:  # TRL once more without a limit on the rows its filter dropped: their lengths
                whole = _prepare(rows, dropped, tokenizer, _unlimited(settings))
                untruncated = _collate([whole[i] for i in dropped], tokenizer, _unlimited(settings))
                for i, (chosen, rejected) in zip(dropped, untruncated):
                    outcome.dropped[i] = _pair(whole[i], chosen, rejected, tokenizer)
            kept = sorted(prepared)
            for i, (chosen, rejected) in zip(kept, _collate([prepared[i] for i in kept], tokenizer, config)):
                outcome.pairs[i] = _pair(prepared[i], chosen, rejected, tokenizer)
    except PrefdataError:
        raise
    except Exception as error:  # TRL's own failure: its DPOTrainer would stop here too
        first = str(error).splitlines()[0][:300] if str(error) else ""
        raise PrefdataError(f"under trl: TRL's DPOTrainer stops on this input in its data preparation with "
                            f"{type(error).__name__}: {first} ({' '.join(settings.given())})") from None
    return outcome


def _pair(example: dict[str, Any], chosen: TRLHalf, rejected: TRLHalf, tokenizer: Any) -> TRLPair:
    return TRLPair(len(example["prompt_ids"]), _prompt_alone(example, tokenizer), example, chosen, rejected)


def _unlimited(settings: TRLSettings) -> Any:
    config, _ = settings.with_values(max_length=None).dpo_config()
    config.dataset_num_proc = None
    return config


def _effects(settings: TRLSettings) -> dict[str, str]:
    from prefdata.trainers.trl_settings import EFFECT

    return {name: effect for name, effect in EFFECT.items()
            if name in settings.given_values and (name != "padding_free" or settings.given_values[name])}


def collate_untruncated(pair: TRLPair, tokenizer: Any, settings: TRLSettings, max_length: int | None) -> TRLPair:
    """The pair through TRL's collator at another max_length (what a setting would change)."""
    config, _ = settings.with_values(max_length=max_length).dpo_config()
    chosen, rejected = _collate([pair.example], tokenizer, config)[0]
    return TRLPair(pair.prompt_len, pair.prompt_alone, pair.example, chosen, rejected)
