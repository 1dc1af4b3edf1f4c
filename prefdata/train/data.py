"""The pairs `train` reads from a prepared OUT/, its tokenizer check, and the per-epoch batch plan."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.core.ranks import is_main_process
from prefdata.io.manifest import read_manifest, require_pairs
from prefdata.io.out_dir import load_out_dataset
from prefdata.model.bounds import check_pairs_fit_model
from prefdata.model.logprobs import plan_batches, plan_packed_batches
from prefdata.model.pairs import BLOCK_LAYOUTS, pair_tokens, sharing_plan_for_lengths
from prefdata.model.vision_model import is_image_out, refuse_mismatched_rows

REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
PUBLIC_REF_COLUMNS = ("ref_chosen_public_logps", "ref_rejected_public_logps")  # for --ld-alpha


@dataclass
class PairData:
    """The rows of one OUT/ that training reads, plus what the planner and stall detector need."""

    dataset: Any  # datasets.Dataset with the id (and ref) columns
    rows: list[int]  # dataset row numbers kept for training
    pair_tokens: list[int]  # per kept row: prompt twice + both completions (what padded halves hold)
    manifest: dict[str, Any]
    has_refs: bool
    identical_pairs: int  # kept rows whose chosen ids equal their rejected ids
    skipped_non_finite: int
    lengths: dict[str, np.ndarray] = field(default_factory=dict)  # per dataset row: prompt/chosen/rejected ids
    # Set by `use_layout`: what each kept row costs in a batch, and whether batches are padding-free.
    forward_tokens: list[int] = field(default_factory=list)
    padding_free: bool = False
    shared_pairs: int = 0  # kept rows whose prompt goes through the model once
    loss_on_answer: bool = False  # `--loss-on answer`: rows carry per-half loss starts
    has_loss_masks: bool = False  # rows carry per-token loss masks (turns the model did not write)
    has_public_refs: bool = False  # the reference's public-length sums (LD-DPO) are loaded
    # Image OUT: its `images` column (Arrow, memory-mapped; a batch's rows are read and decoded per
    # batch by prefdata.model.vision_inputs), indexed by dataset row like `dataset`.
    images: Any = None
    # Per dataset row (None when OUT has no such column): the pair's loss weight and ODPO offset.
    weights: np.ndarray | None = None
    offsets: np.ndarray | None = None
    # OUT's `source_file` / `source_line` columns (Arrow, memory-mapped), for errors that name a pair.
    sources: tuple[Any, Any] | None = None

    def sources_of(self, rows: list[int]) -> list[str]:
        """`file:line` of dataset rows (`row N` where OUT has no source columns)."""
        if self.sources is None:
            return [f"row {row}" for row in rows]
        files, lines = (column.take(rows).to_pylist() for column in self.sources)
        return [f"{file}:{line}" for file, line in zip(files, lines)]

    def weights_of(self, rows: list[int]) -> list[float]:
        """The loss weights of dataset rows (1 each where OUT has no `weight` column)."""
        return [1.0] * len(rows) if self.weights is None else self.weights[rows].tolist()

    def images_of(self, rows: list[int]) -> list[Any] | None:
        """The images of dataset rows as OUT stores them (``[{bytes, path}, ...]`` or None per row)."""
        return None if self.images is None else self.images.take(rows).to_pylist()

    def pair_tokens_of(self, rows: list[int]) -> list[int]:
        """TRL's token count (prompt twice + both completions) of dataset rows."""
        p, c, r = self.lengths["prompt_ids"], self.lengths["chosen_ids"], self.lengths["rejected_ids"]
        return [int(2 * p[i] + c[i] + r[i]) for i in rows]

    def use_layout(self, model: Any, layout: str) -> None:
        """Batch costs for `layout`: padded layouts count the padded halves, padding-free ones the
        tokens actually put through the model (the prompt once where it is shared). Refuses (one
        line) a pair the model cannot take: an id past its embedding, a half past its positions."""
        table = self.dataset.data.table
        check_pairs_fit_model(model, {name: table.column(name) for name in self.lengths},
                              lambda row: self.sources_of([row])[0])
        self.forward_tokens, self.padding_free, self.shared_pairs = list(self.pair_tokens), False, 0
        if layout not in BLOCK_LAYOUTS:
            return
        p, c, r = (self.lengths[k][self.rows].tolist() for k in ("prompt_ids", "chosen_ids", "rejected_ids"))
        if layout == "shared":
            share = sharing_plan_for_lengths(p, c, r)
        else:
            share = [False] * len(p)
        self.forward_tokens = [pair_tokens(a, b, d, s) for a, b, d, s in zip(p, c, r, share)]
        self.padding_free, self.shared_pairs = True, sum(share)


def load_pairs(out_dir: Path, *, need_refs: bool, need_public_refs: bool = False) -> PairData:
    """Open OUT/, check it has what the loss needs, and keep the rows that can be trained on.
    `need_public_refs` (`--ld-alpha`): also the reference's public-length sums."""
    import polars as pl
    import pyarrow.compute as pc

    require_pairs(out_dir, "train")  # an unfinished or pair-less OUT: one line, before anything is written
    from prefdata.core.schema import (LOSS_MASK_COLUMNS, LOSS_START_COLUMNS, OFFSET_COLUMN, WEIGHT_COLUMN, check_out,
                                      has_loss_masks, has_loss_starts)

    check_out(out_dir, tokens_only=True)  # the part of OUT's contract train reads (prefdata.core.schema)
    try:
        manifest = read_manifest(out_dir)
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        raise PrefdataError(f"cannot open the prepared data in {out_dir}: {exc}") from None
    dataset = load_out_dataset(out_dir, "train")
    missing = [c for c in ("prompt_ids", "chosen_ids", "rejected_ids") if c not in dataset.column_names]
    if missing:
        raise PrefdataError(f"{out_dir} has no {', '.join(missing)} column: run `prefdata prepare` with a tokenizer first")
    has_refs = all(c in dataset.column_names for c in REF_COLUMNS)
    if need_refs and not has_refs:
        raise PrefdataError(f"{out_dir} has no reference log-probs: run `prefdata refs {out_dir} --model ...` first")
    has_public = need_public_refs and has_refs
    if has_public and not all(c in dataset.column_names for c in PUBLIC_REF_COLUMNS):
        raise PrefdataError(
            f"{out_dir}'s reference log-probs predate --ld-alpha (no {PUBLIC_REF_COLUMNS[0]} column): "
            f"run `prefdata refs {out_dir} --model ...` again"
        )
    loss_on_answer = has_loss_starts(dataset.column_names)
    loss_masks = has_loss_masks(dataset.column_names)
    if has_refs:
        check_refs_loss_on(manifest, loss_on_answer, out_dir)
    images = None
    if is_image_out(manifest):
        refuse_mismatched_rows(dataset.data.table, out_dir)
        if "images" in dataset.column_names:
            images = dataset.data.table.column("images")

    table = dataset.data  # Arrow, memory-mapped: column work here never copies the dataset
    keep = np.ones(len(dataset), dtype=bool)
    # refs flags rows whose reference log-probs are not finite; never train on them.
    if "flags" in dataset.column_names:
        flag_col = table.column("flags").combine_chunks()
        flat = pc.list_flatten(flag_col)
        parents = pc.list_parent_indices(flag_col).to_numpy()
        keep[parents[pc.equal(flat, F.NON_FINITE_REF_LOGPS).to_numpy(zero_copy_only=False)]] = False
    if has_refs:
        for name in REF_COLUMNS:
            keep &= np.isfinite(table.column(name).to_numpy().astype(np.float64))
    skipped = int((~keep).sum())
    rows = np.flatnonzero(keep).tolist()
    if not rows:
        raise PrefdataError(f"{out_dir} has no pairs to train on ({skipped} rows skipped for non-finite reference log-probs)")

    lengths = {name: pc.list_value_length(table.column(name)).to_numpy() for name in ("prompt_ids", "chosen_ids", "rejected_ids")}
    pair_tokens = (2 * lengths["prompt_ids"] + lengths["chosen_ids"] + lengths["rejected_ids"])[keep].tolist()
    same = (pl.Series(table.column("chosen_ids").combine_chunks()) == pl.Series(table.column("rejected_ids").combine_chunks()))
    identical = int(same.to_numpy()[keep].sum())

    # `weight` / `offset`: finite (and weights >= 0), as check_out made sure above.
    weights, offsets = (table.column(name).to_numpy().astype(np.float64) if name in dataset.column_names else None
                        for name in (WEIGHT_COLUMN, OFFSET_COLUMN))
    columns = ["prompt_ids", "chosen_ids", "rejected_ids"] + (list(REF_COLUMNS) if has_refs else [])
    columns += list(PUBLIC_REF_COLUMNS) if has_public else []
    columns += list(LOSS_START_COLUMNS) if loss_on_answer else []
    columns += list(LOSS_MASK_COLUMNS) if loss_masks else []
    return PairData(
        dataset=dataset.select_columns(columns), rows=rows, pair_tokens=pair_tokens, manifest=manifest,
        has_refs=has_refs, identical_pairs=identical, skipped_non_finite=skipped, lengths=lengths,
        loss_on_answer=loss_on_answer, has_public_refs=has_public, images=images, has_loss_masks=loss_masks,
        weights=weights, offsets=offsets,
        sources=(table.column("source_file"), table.column("source_line"))
        if {"source_file", "source_line"} <= set(dataset.column_names) else None,
    )


def check_refs_loss_on(manifest: dict[str, Any], loss_on_answer: bool, out_dir: Path) -> None:
    """The stored refs must sum the same tokens as the policy will: refs written before the loss starts
    were added (or after they were removed) would compare answer-only sums with whole-completion ones."""
    settings = (manifest.get("refs") or {}).get("settings") or {}
    if not settings:
        return  # refs from elsewhere: nothing recorded to compare
    refs_on = settings.get("loss_on", "all")  # refs that predate --loss-on summed the whole completion
    data_on = "answer" if loss_on_answer else "all"
    if refs_on != data_on:
        raise PrefdataError(
            f"{out_dir}'s reference log-probs were computed with loss on {refs_on!r} tokens but its rows say "
            f"{data_on!r}: run `prefdata refs {out_dir} --model ...` again"
        )


def plan_token_batches(lengths: list[int], batch_tokens: int, padding_free: bool) -> list[list[int]]:
    """Length-grouped batches under a token budget: padded (rows x widest) or padding-free (sum)."""
    return plan_packed_batches(lengths, batch_tokens) if padding_free else plan_batches(lengths, batch_tokens)


def epoch_batches(data: PairData, epoch: int, seed: int, batch_pairs: int, batch_tokens: int | None,
                  world_size: int, shuffle: bool = True) -> list[list[int]]:
    """Micro-batches (lists of dataset rows) for one epoch, a pure function of (seed, epoch).

    By pairs: consecutive chunks of a seeded permutation (of the data order with shuffle off). By
    token budget: length-grouped batches (less padding) whose order is then shuffled with the same
    seed (kept longest first with shuffle off). Under DDP the list is cut to a multiple of the
    world size so every rank runs the same number of micro-batches.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    n = len(data.rows)
    order = torch.randperm(n, generator=generator).tolist() if shuffle else list(range(n))
    costs = data.forward_tokens or data.pair_tokens
    if batch_tokens is None:
        positions = [order[i : i + batch_pairs] for i in range(0, len(order), batch_pairs)]
    else:
        planned = plan_token_batches([costs[i] for i in order], batch_tokens, data.padding_free)
        batch_order = torch.randperm(len(planned), generator=generator).tolist() if shuffle else range(len(planned))
        positions = [[order[j] for j in planned[k]] for k in batch_order]
    batches = [[data.rows[p] for p in batch] for batch in positions]
    if world_size > 1:
        batches = batches[: len(batches) - len(batches) % world_size]
        if not batches:
            raise PrefdataError(f"fewer micro-batches than ranks ({world_size}): use smaller batches or fewer GPUs")
    return batches


def pad_token_id(manifest: dict[str, Any], tokenizer: Any) -> int:
    pad = (manifest.get("tokenizer") or {}).get("pad_token_id")
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad if pad is not None else 0)  # padded positions are masked out; any id works


def load_checked_tokenizer(model: str | Path, manifest: dict[str, Any], out_dir: Path, trust_remote_code: bool):
    from prefdata.core.tokenizer_cache import load_pretrained_tokenizer
    from prefdata.io.manifest import shared_tokenizer_fingerprint

    try:
        # Read only: fingerprinted, its pad id read, saved with the model.
        tokenizer = load_pretrained_tokenizer(model, trust_remote_code=trust_remote_code, read_only=True)
    except (OSError, ValueError) as exc:
        raise PrefdataError(f"cannot load a tokenizer from {model}: {str(exc).splitlines()[0]}") from None
    expected = (manifest.get("tokenizer") or {}).get("fingerprint")
    actual = shared_tokenizer_fingerprint(tokenizer)
    if expected is None and is_main_process():  # under torchrun: said once
        print(f"warning: {out_dir}/manifest.json records no tokenizer fingerprint; cannot check {model}'s tokenizer",
              file=sys.stderr)
    elif actual != expected:
        raise PrefdataError(
            f"the tokenizer of {model} ({actual[:19]}…) differs from the one {out_dir} was prepared with "
            f"({expected[:19]}…): prepare the data with this model's tokenizer, or train the matching model"
        )
    return tokenizer


def check_same_tokenizer(train_manifest: dict, eval_manifest: dict, out_dir: Path, eval_dir: Path) -> None:
    a = (train_manifest.get("tokenizer") or {}).get("fingerprint")
    b = (eval_manifest.get("tokenizer") or {}).get("fingerprint")
    if a and b and a != b:
        raise PrefdataError(f"{eval_dir} was prepared with a different tokenizer than {out_dir}")
