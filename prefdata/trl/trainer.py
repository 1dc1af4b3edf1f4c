"""Hand-off to TRL: `from prefdata.trl import DPOTrainer` trains on a prepared OUT exactly as written.

TRL's own `DPOTrainer` re-tokenizes the text columns (losing prefdata's truncation, chat rendering
and EOS handling), recomputes or ignores stored reference log-probs, and trains silently against a
`max_length` other than the one the refs were computed for. This subclass keeps TRL's constructor
and training loop and changes only what the data needs:

- `_prepare_dataset` returns OUT's rows untouched: no re-tokenizing, no `map`, no cache files in OUT.
- With `ref_chosen_logps`/`ref_rejected_logps` in OUT, `precompute_ref_log_probs` is switched on and
  `_precompute_ref_logps` returns them as stored: no reference model is loaded or run. With
  `DPOConfig(ld_alpha=α)` (LD-DPO) the refs handed to TRL are public + α·(all - public), from the
  public-length sums `prefdata refs` stores: what TRL's own precompute path computes with ld_alpha.
- Before anything is loaded, it refuses (one line naming both values) a tokenizer whose fingerprint
  differs from OUT's, a `max_length` that disagrees with OUT's, and refs missing where the loss needs
  them; and data prepared with `--loss-on answer` (TRL's collator would put the reasoning tokens back
  in the loss). The settings come from OUT's DatasetInfo (prefdata.io.handoff), so `load_from_disk` is enough.
- Per-token loss masks (`chosen_loss_mask`/`rejected_loss_mask`: agent trajectories, multi-turn
  completions): `LossMaskCollator` (prefdata.trl.collator) ANDs them into TRL's `completion_mask`, so
  TRL sums the policy's log-probs over the model's turns only, as the stored refs were summed; a custom
  `data_collator` with such data is refused (it would put tool results and user turns in the loss).
- Per-pair ODPO offsets (OUT's `offset` column, δ): TRL 1.16 has no offset input (TRL #5613), but its
  sigmoid, hinge and robust losses read the policy/reference log-ratios only through βΔ, so the hand-off
  gives TRL `ref_chosen_logps + δ/β`, which makes βΔ exactly βΔ - δ (TRL then logs rewards/chosen
  shifted by -δ). Other losses, f-divergences or no stored refs: refused in one line. Per-pair weights
  (a `weight` column whose values differ): TRL has no input for them and no data shift gives them, so
  they are refused in one line (`prefdata train` honours them); a constant weight changes nothing.
- Image OUTs (`prepare --processor`, an `images` column): TRL would call them vision datasets, re-render
  their text per batch with `DataCollatorForVisionPreference` and refuse stored refs. OUT is already
  tokenized, with the image tokens expanded, so TRL's tokenized path applies as for text, and
  `ImagePairCollator` (prefdata.trl.collator) adds the images' pixel values (and image sizes or grids)
  through the processor. The processor given must be the one OUT was prepared with (its fingerprint).

TRL internals relied on (tests/trl_handoff/test_trl.py::test_trl_internals_the_hand_off_relies_on and
tests/vision/test_trl_vision_handoff.py::test_trl_vision_internals_the_hand_off_relies_on fail on a TRL
that changes them): `DPOTrainer._prepare_dataset(dataset, processing_class, args, dataset_name)`,
`DPOTrainer._precompute_ref_logps(dataset, name, batch_size)`, `trl.trainer.dpo_trainer.hash_module`,
the collator passing `ref_*_logps` through, `_compute_loss` reading them when
`precompute_ref_log_probs` is set, and for image OUTs the `_is_vision_dataset` attribute and
`_set_signature_columns_if_needed`; for per-token loss masks, `DataCollatorForPreference`'s layout
(rows [chosen..., rejected...], each prompt + completion, right-padded) and `_compute_loss` summing
where `completion_mask` is 1 (tests/tokenize/test_trajectories.py::test_trl_hand_off_trains_on_the_masked_tokens_only).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

try:
    import trl as _trl
    from trl import DPOConfig
    from trl.trainer import dpo_trainer as _dpo_module
except ImportError:  # one line, not a traceback through TRL's imports
    raise ImportError('prefdata.trl needs TRL: pip install "prefdata[trl]"') from None

import datasets
from packaging.specifiers import SpecifierSet

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.core.schema import (LOSS_MASK_COLUMNS, LOSS_START_COLUMNS, OFFSET_COLUMN, PUBLIC_REF_COLUMNS,
                                  WEIGHT_COLUMN, check_table)
from prefdata.io.handoff import read_settings
from prefdata.io.manifest import tokenizer_fingerprint
from prefdata.tokenize.processor import load_processor
from prefdata.tokenize.vision import processor_fingerprint
from prefdata.trl.collator import ImagePairCollator, LossMaskCollator

__all__ = ["DPOConfig", "DPOTrainer", "load_out", "out_settings", "TESTED_TRL"]

TESTED_TRL = ">=1.16,<1.17"  # the `[trl]` extra pins the same range
if _trl.__version__ not in SpecifierSet(TESTED_TRL):
    warnings.warn(f"prefdata.trl is tested with trl{TESTED_TRL}, found {_trl.__version__}", stacklevel=2)
ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
IMAGE_COLUMN = "images"
REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
# TRL 1.16 losses that never read the reference log-probs.
REFERENCE_FREE_LOSSES = frozenset({"sft"})
# TRL 1.16 losses that read the log-ratios only through beta * (chosen - rejected): an offset moves that logit.
OFFSET_LOSSES = frozenset({"sigmoid", "hinge", "robust"})


def load_out(path: str | Path) -> datasets.Dataset:
    """OUT's dataset, loaded as `datasets.load_from_disk` does; a one-line error otherwise."""
    from prefdata.io.out_dir import load_out_dataset

    return load_out_dataset(path, "the TRL hand-off")


def out_settings(dataset: datasets.Dataset, name: str = "train_dataset") -> dict[str, Any]:
    """The settings `prefdata prepare` wrote into the dataset's DatasetInfo."""
    settings = read_settings(dataset.info.description)
    if settings is None:
        raise PrefdataError(
            f"{name} was not written by `prefdata prepare` (no prefdata settings in its DatasetInfo); "
            "use trl.DPOTrainer for other data, or prepare it first"
        )
    missing = [column for column in ID_COLUMNS if column not in dataset.column_names]
    if missing:
        raise PrefdataError(f"{name} has no {', '.join(missing)} column: prepare it with a tokenizer")
    return settings


def has_refs(dataset: datasets.Dataset) -> bool:
    return all(column in dataset.column_names for column in REF_COLUMNS)


def longest_sequence(dataset: datasets.Dataset) -> int:
    """Longest prompt + completion of either half, from the Arrow list lengths (no row decoding)."""
    import pyarrow.compute as pc

    table = dataset.data.table
    if dataset.num_rows == 0:
        return 0
    prompt, chosen, rejected = (pc.list_value_length(table.column(c)) for c in ID_COLUMNS)
    longest = pc.max(pc.add(prompt, pc.max_element_wise(chosen, rejected))).as_py()
    return int(longest or 0)


def check_max_length(max_length: int | None, settings: dict[str, Any], dataset: datasets.Dataset, name: str) -> None:
    """TRL's collator cuts sequences longer than `max_length`; the stored ids and refs assume they are not."""
    if max_length is None:
        return  # the collator cuts nothing: OUT's sequences are already within OUT's own limit
    prepared = settings.get("max_length")
    if prepared is None:
        longest = longest_sequence(dataset)
        if longest > max_length:
            raise PrefdataError(
                f"DPOConfig(max_length={max_length}) but {name} was prepared with max_length=None and holds "
                f"sequences of {longest} tokens, which TRL would cut: pass max_length=None, or prepare with "
                f"--max-length {max_length}"
            )
        return
    if max_length != prepared:
        raise PrefdataError(
            f"DPOConfig(max_length={max_length}) disagrees with {name}'s max_length={prepared} (prepared and "
            f"scored at that length): pass max_length={prepared} or None, or prepare again with --max-length {max_length}"
        )


def has_loss_masks(dataset: datasets.Dataset) -> bool:
    """Whether some row carries per-token loss masks (turns the model did not write)."""
    present = [c for c in LOSS_MASK_COLUMNS if c in dataset.column_names]
    return bool(present) and dataset.data.table.column(present[0]).null_count < dataset.num_rows


def check_loss_on(settings: dict[str, Any], dataset: datasets.Dataset, name: str) -> None:
    """TRL 1.16's collator builds the completion masks itself, over every completion token: it would
    train on the reasoning tokens that `--loss-on answer` keeps out of the loss (and against refs
    summed over the answer only)."""
    if settings.get("loss_on", "all") == "answer" or any(c in dataset.column_names for c in LOSS_START_COLUMNS):
        raise PrefdataError(
            f"{name} was prepared with --loss-on answer, which TRL's DPOTrainer cannot honour (its collator puts "
            "the whole completion in the loss): train it with `prefdata train`, or prepare it with --loss-on all"
        )


def check_tokenizer(fingerprints: tuple[str, ...], settings: dict[str, Any], name: str, what: str = "tokenizer") -> None:
    """OUT's recorded fingerprint must be one of `fingerprints` (a processor's own, then its tokenizer's)."""
    prepared = settings.get("tokenizer_fingerprint")
    if prepared not in fingerprints:
        raise PrefdataError(
            f"the {what} ({fingerprints[0]}) is not the one {name} was prepared with ({prepared}, "
            f"{settings.get('tokenizer_path')}): pass that {what} as processing_class, or prepare with this one"
        )


def has_images(dataset: datasets.Dataset) -> bool:
    return IMAGE_COLUMN in dataset.column_names


def finite_rows(dataset: datasets.Dataset) -> datasets.Dataset:
    """Rows `prefdata refs` flagged for non-finite reference log-probs would make the loss NaN: left out,
    as `prefdata train` does. The rows kept are copied into memory (not an indices mapping): the column
    readers below see only them, and a later add_column has no mapping to flatten into a cache file in OUT."""
    import numpy as np
    import pyarrow.compute as pc

    table = dataset.data.table
    keep = np.ones(dataset.num_rows, dtype=bool)
    for column in REF_COLUMNS:
        keep &= np.isfinite(table.column(column).to_numpy().astype(np.float64))
    if "flags" in dataset.column_names:
        flags = table.column("flags").combine_chunks()
        flagged = pc.list_parent_indices(flags).to_numpy()[
            pc.equal(pc.list_flatten(flags), F.NON_FINITE_REF_LOGPS).to_numpy(zero_copy_only=False)
        ]
        keep[flagged] = False
    if keep.all():
        return dataset
    return dataset.select(np.flatnonzero(keep), keep_in_memory=True).flatten_indices(keep_in_memory=True)


def length_desensitized_refs(dataset: datasets.Dataset, alpha: float, name: str = "train_dataset") -> datasets.Dataset:
    """The dataset with its ref columns as TRL's precompute path computes them under `ld_alpha`
    (shared + α·tail), from the stored sums; in memory, so nothing is written inside OUT."""
    import numpy as np

    if not all(column in dataset.column_names for column in PUBLIC_REF_COLUMNS):
        raise PrefdataError(
            f"DPOConfig(ld_alpha={alpha}) needs the reference's public-length sums, which {name}'s refs predate: "
            "run `prefdata refs OUT --model REF` again"
        )
    table = dataset.data.table
    weighted = {}
    for full_name, public_name in zip(REF_COLUMNS, PUBLIC_REF_COLUMNS):
        full = table.column(full_name).to_numpy().astype(np.float32)
        public = table.column(public_name).to_numpy().astype(np.float32)
        weighted[full_name] = public + np.float32(alpha) * (full - public)
    out = dataset.remove_columns(list(REF_COLUMNS))
    for column, values in weighted.items():
        out = out.add_column(column, values.tolist(), feature=datasets.Value("float32"))
    return out


def check_weights(dataset: datasets.Dataset, name: str) -> None:
    """TRL averages per-pair losses with equal weight: a `weight` column whose values differ is refused."""
    import numpy as np

    if WEIGHT_COLUMN not in dataset.column_names or dataset.num_rows == 0:
        return
    weights = dataset.data.table.column(WEIGHT_COLUMN).to_numpy().astype(np.float64)
    if weights.min() != weights.max():
        raise PrefdataError(
            f"{name} has per-pair weights (a `weight` column), which TRL 1.16's DPOTrainer cannot apply (TRL #5613): "
            "train it with `prefdata train`, or drop the column"
        )


def check_offsets(args: DPOConfig, dataset: datasets.Dataset, name: str, stored_refs: bool) -> None:
    """An `offset` column reaches TRL's loss only as shifted stored refs, under a loss that reads βΔ alone."""
    if OFFSET_COLUMN not in dataset.column_names:
        return
    losses = args.loss_type if isinstance(args.loss_type, list) else [args.loss_type]
    why = None
    if not stored_refs:
        why = "it needs the stored reference log-probs (run `prefdata refs OUT --model REF`)"
    elif not set(losses) <= OFFSET_LOSSES:
        why = f"loss_type={losses} does not read the log-ratios through beta * margin alone (sigmoid, hinge, robust do)"
    elif getattr(args, "f_divergence_type", "reverse_kl") not in ("reverse_kl", None):
        why = f"f_divergence_type={args.f_divergence_type!r} changes the margin (reverse_kl keeps it)"
    if why is not None:
        raise PrefdataError(f"{name} has per-pair offsets (an `offset` column) that TRL cannot apply here: {why}")


def offset_refs(dataset: datasets.Dataset, beta: float) -> datasets.Dataset:
    """The dataset with `ref_chosen_logps + offset/beta`: TRL's βΔ becomes βΔ - offset (ODPO); in memory."""
    import numpy as np

    if OFFSET_COLUMN not in dataset.column_names:
        return dataset
    table = dataset.data.table
    shifted = (table.column("ref_chosen_logps").to_numpy().astype(np.float64)
               + table.column(OFFSET_COLUMN).to_numpy().astype(np.float64) / beta)
    out = dataset.remove_columns(["ref_chosen_logps"])
    return out.add_column("ref_chosen_logps", shifted.astype(np.float32).tolist(), feature=datasets.Value("float32"))


@contextmanager
def _no_model_hash(content_hash: str) -> Iterator[None]:
    """TRL hashes every weight of the policy to key its precompute cache file; the hand-off never
    writes that file (the refs are OUT's), so the hash would only cost a pass over the weights."""
    original = _dpo_module.hash_module
    _dpo_module.hash_module = lambda module: f"prefdata:{content_hash}"
    try:
        yield
    finally:
        _dpo_module.hash_module = original


def _as_dataset(value: Any) -> Any:
    return load_out(value) if isinstance(value, (str, Path)) else value


def _tokenizer_of(processing_class: Any) -> Any:
    return getattr(processing_class, "tokenizer", None) or processing_class


def _is_processor(processing_class: Any) -> bool:
    """A vision-language processor: a tokenizer, an image processor and an image token."""
    return all(getattr(processing_class, name, None) is not None for name in ("tokenizer", "image_processor", "image_token"))


def _load_processing_class(model: Any, args: DPOConfig, images: bool) -> Any:
    """The tokenizer next to the model, or its processor for image OUTs (what TRL itself would load;
    from a local directory the way prepare loads it, so Qwen2-VL's needs no torchvision)."""
    from transformers import AutoProcessor, AutoTokenizer

    source = model if isinstance(model, str) else _dpo_module.get_config_model_id(model.config)
    if images and Path(source).is_dir():
        return load_processor(str(source), args.trust_remote_code)
    loader = AutoProcessor if images else AutoTokenizer
    return loader.from_pretrained(source, trust_remote_code=args.trust_remote_code)


def _fingerprints(processing_class: Any, images: bool) -> tuple[str, ...]:
    """The fingerprints OUT may have been prepared with: `--processor` records the processor's, `--tokenizer`
    its tokenizer's (text OUTs only: image OUTs' ids need the processor's image token counts)."""
    if not _is_processor(processing_class):
        return (tokenizer_fingerprint(processing_class),)
    own = processor_fingerprint(processing_class)
    return (own,) if images else (own, tokenizer_fingerprint(processing_class.tokenizer))


def _pad_token_id(tokenizer: Any, args: DPOConfig) -> int:
    """TRL's choice of padding token: `args.pad_token`, else the tokenizer's, else its EOS."""
    token = args.pad_token or tokenizer.pad_token or tokenizer.eos_token
    return int(tokenizer.convert_tokens_to_ids(token))


class DPOTrainer(_trl.DPOTrainer):
    """TRL's `DPOTrainer` with the same constructor, training on OUT's token ids and reference
    log-probs exactly as `prefdata prepare`/`prefdata refs` wrote them.

    `train_dataset`/`eval_dataset` may be prepared datasets (`datasets.load_from_disk(OUT)`) or OUT
    paths. When OUT holds reference log-probs, `args.precompute_ref_log_probs` is set to True and no
    reference model is created. Without them the loss needs a `ref_model` (computed on the fly) or
    a `peft_config` (the adapter-free base is the reference); otherwise it refuses.
    """

    def __init__(
        self,
        model: Any,
        ref_model: Any = None,
        args: DPOConfig | None = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        compute_metrics: Any = None,
        callbacks: Any = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
    ) -> None:
        if args is None:
            model_name = model if isinstance(model, str) else _dpo_module.get_config_model_id(model.config)
            args = DPOConfig(f"{model_name.split('/')[-1]}-DPO")
        if train_dataset is None:
            raise PrefdataError("train_dataset is required (a prepared OUT or its path)")
        train_dataset = _as_dataset(train_dataset)
        if isinstance(eval_dataset, dict):
            eval_dataset = {key: _as_dataset(value) for key, value in eval_dataset.items()}
        elif eval_dataset is not None:
            eval_dataset = _as_dataset(eval_dataset)
        named = [("train_dataset", train_dataset)]
        if isinstance(eval_dataset, dict):
            named += [(f"eval_dataset[{key!r}]", value) for key, value in eval_dataset.items()]
        elif eval_dataset is not None:
            named.append(("eval_dataset", eval_dataset))

        # Every check runs before TRL loads a model: a refusal costs nothing.
        images = any(has_images(dataset) for _, dataset in named if isinstance(dataset, datasets.Dataset))
        if processing_class is None:
            processing_class = _load_processing_class(model, args, images)
        if images and not _is_processor(processing_class):
            raise PrefdataError(
                f"the data holds images (prepared with --processor) and processing_class is a "
                f"{type(processing_class).__name__}: pass the processor it was prepared with (AutoProcessor)"
            )
        self._prefdata_images = images
        self._prefdata_fingerprints = _fingerprints(processing_class, images)
        self._prefdata_kind = "processor" if _is_processor(processing_class) else "tokenizer"
        stored = [has_refs(dataset) for _, dataset in named]
        for name, dataset in named:
            self._check_out(dataset, name, args)
        if any(stored) and not all(stored):
            without = [name for (name, _), refs in zip(named, stored) if not refs]
            raise PrefdataError(f"{', '.join(without)} has no reference log-probs while train/eval data has: run `prefdata refs` on it")
        self._prefdata_uses_stored_refs = all(stored)
        self._check_reference(args, ref_model, peft_config)
        for name, dataset in named:
            check_weights(dataset, name)
            check_offsets(args, dataset, name, self._prefdata_uses_stored_refs)
        if self._prefdata_uses_stored_refs:
            args.precompute_ref_log_probs = True  # TRL then reads the refs from each batch and builds no ref model
            alpha = getattr(args, "ld_alpha", None)

            def stored(dataset: Any, name: str) -> Any:
                dataset = finite_rows(dataset)
                dataset = dataset if alpha is None else length_desensitized_refs(dataset, alpha, name)
                return offset_refs(dataset, args.beta)  # after LD-DPO's sums: the shift is on the final margin

            train_dataset = stored(train_dataset, "train_dataset")
            if isinstance(eval_dataset, dict):
                eval_dataset = {key: stored(value, f"eval_dataset[{key!r}]") for key, value in eval_dataset.items()}
            elif eval_dataset is not None:
                eval_dataset = stored(eval_dataset, "eval_dataset")

        template = getattr(self, "_prefdata_template", None)
        if template:  # OUT was rendered with --chat-template-file: the saved tokenizer carries that template
            _tokenizer_of(processing_class).chat_template = template
        masked = any(has_loss_masks(dataset) for _, dataset in named)
        if masked and data_collator is not None:
            raise PrefdataError(
                "the data has per-token loss masks (chosen_loss_mask: turns the model did not write) and a custom "
                "data_collator was passed, which would put those turns in the loss: pass no data_collator"
            )
        if images and data_collator is None:  # OUT's ids as written, plus the images' pixel values
            data_collator = ImagePairCollator(
                processor=processing_class, pad_token_id=_pad_token_id(_tokenizer_of(processing_class), args),
                max_length=args.max_length, pad_to_multiple_of=args.pad_to_multiple_of,
            )
        if masked:  # TRL's completion mask ANDed with OUT's: the model's turns only, as the refs were summed
            data_collator = LossMaskCollator(data_collator or _dpo_module.DataCollatorForPreference(
                pad_token_id=_pad_token_id(_tokenizer_of(processing_class), args), max_length=args.max_length,
                truncation_mode=args.truncation_mode, pad_to_multiple_of=args.pad_to_multiple_of,
            ))
        content_hash = str(out_settings(train_dataset).get("content_hash"))
        with _no_model_hash(content_hash):
            super().__init__(
                model=model, ref_model=ref_model, args=args, data_collator=data_collator,
                train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=processing_class,
                compute_metrics=compute_metrics, callbacks=callbacks, optimizers=optimizers,
                quantization_config=quantization_config, peft_config=peft_config,
            )

    def _check_out(self, dataset: Any, name: str, args: DPOConfig) -> dict[str, Any]:
        if not isinstance(dataset, datasets.Dataset):
            raise PrefdataError(f"{name} must be a prepared dataset or OUT path, got {type(dataset).__name__}")
        settings = out_settings(dataset, name)
        checked = self.__dict__.setdefault("_prefdata_checked", set())
        if dataset._fingerprint not in checked:  # each dataset once (TRL's hooks see them again)
            check_table(dataset.data.table, name, tokens_only=True)  # the part of OUT's contract training reads
            checked.add(dataset._fingerprint)
        check_loss_on(settings, dataset, name)
        if has_images(dataset) and not self._prefdata_images:
            raise PrefdataError(f"{name} holds images but the trainer was built on text-only data: pass it as eval_dataset at construction")
        check_tokenizer(self._prefdata_fingerprints, settings, name, self._prefdata_kind)
        check_max_length(args.max_length, settings, dataset, name)
        self._prefdata_template = settings.get("chat_template_text") or getattr(self, "_prefdata_template", None)
        return settings

    def _check_reference(self, args: DPOConfig, ref_model: Any, peft_config: Any) -> None:
        losses = args.loss_type if isinstance(args.loss_type, list) else [args.loss_type]
        if self._prefdata_uses_stored_refs:
            if ref_model is not None:
                raise PrefdataError(
                    "the data carries reference log-probs (prefdata refs) and a ref_model was passed too: "
                    "pass no ref_model to train on the stored refs"
                )
            return
        if set(losses) <= REFERENCE_FREE_LOSSES or ref_model is not None or peft_config is not None:
            if args.precompute_ref_log_probs:
                raise PrefdataError(
                    "precompute_ref_log_probs=True would make TRL cache reference log-probs inside OUT: "
                    "run `prefdata refs OUT --model REF` instead"
                )
            return
        raise PrefdataError(
            f"loss_type={losses} needs reference log-probs and the data has none: run `prefdata refs OUT "
            "--model REF`, or pass ref_model= (computed during training) or peft_config="
        )

    # -- TRL hooks ------------------------------------------------------------------------------

    # TRL 1.16 calls a dataset whose first row has `images` a vision dataset: it then skips
    # `_prepare_dataset`, renders the text again per batch (DataCollatorForVisionPreference) and refuses
    # precomputed refs, because its rows are untokenized. OUT's rows are tokenized, image tokens
    # included, so TRL's tokenized path is the right one for them, images or not; the collator adds the
    # pixel values. TRL assigns the attribute from the first row's keys: the assignment is ignored.
    @property
    def _is_vision_dataset(self) -> bool:
        return False

    @_is_vision_dataset.setter
    def _is_vision_dataset(self, value: bool) -> None:
        pass

    def _set_signature_columns_if_needed(self) -> None:
        """The columns the collator reads (TRL's tokenized ones, plus the images), which
        `remove_unused_columns` keeps."""
        if self._signature_columns is None:
            self._signature_columns = [*ID_COLUMNS, *REF_COLUMNS, IMAGE_COLUMN, *LOSS_MASK_COLUMNS]

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: DPOConfig, dataset_name: str) -> Any:
        """OUT's rows as written: TRL would re-tokenize the text columns here and overwrite the ids."""
        self._check_out(dataset, f"{dataset_name} dataset", args)  # also for datasets given to evaluate()
        return dataset

    def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int) -> Any:
        """The stored refs; TRL would run the reference model and cache a file next to OUT's data."""
        if not has_refs(dataset):
            raise PrefdataError(f"the {name} dataset has no reference log-probs: run `prefdata refs` on it")
        return finite_rows(dataset)

