"""`prefdata refs OUT --model PATH`: reference-model log-probs into Arrow columns.

Flow (`compute_refs`, top to bottom): check the model's tokenizer against the manifest -> plan
length-sorted batches under a token budget -> compute them in shards (each saved to
OUT/.refs-work/, so a killed run resumes) -> merge -> flag non-finite rows -> write the new dataset
beside the old one and swap it in with renames -> update the manifest last. Under torchrun, rank r
computes shards r, r+k, ...; rank 0 merges. Steps live in setup.py, shards.py, compute.py, swap.py;
`--engine ray` runs the same shards on Ray actors (ray.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.io.lock import holding_out_lock, is_rank_zero
from prefdata.io.manifest import read_manifest, require_pairs, write_manifest
from prefdata.model.bounds import check_pairs_fit_model, source_of
from prefdata.refs.compute import KILL_AFTER_SHARDS_ENV, batch_costs, compute_shards
from prefdata.refs.setup import (
    checked_vision,
    choose_layout,
    distributed_env,
    early_fingerprint,
    held_refs,
    ids_digest,
    load_reference_model,
    load_tokenizer_checked,
    model_fingerprint,
    open_ids,
    resolve_device,
    resolve_dtype,
)
from prefdata.refs.shards import (
    SHARD_BATCHES,
    ShardValues,
    init_process_group,
    load_shard,
    merge_shards,
    pair_costs,
    plan_shards,
    save_shard,
    shard_path,
    shards_for_rank,
    wait_for_all,
)
from prefdata.refs.swap import (
    REF_COLUMNS,
    SWAP_JOURNAL,
    WORK_DIR,
    _data_files,
    _finish_swap,
    data_shards,
    swap_dataset,
    with_ref_columns,
)
from prefdata.settings.commands import RefsSettings
from prefdata.settings.declare import settings_command

__all__ = [
    "KILL_AFTER_SHARDS_ENV", "REF_COLUMNS", "SHARD_BATCHES", "SWAP_JOURNAL", "WORK_DIR", "RefsResult", "ShardValues",
    "_data_files", "_finish_swap", "compute_refs", "load_shard", "merge_shards", "model_fingerprint", "pair_costs",
    "plan_shards", "save_shard", "shard_path", "shards_for_rank",
]
WORK_FORMAT = 1


@dataclass
class RefsResult:
    out_dir: str
    rows: int
    tokens: int  # real tokens forwarded by this process (resumed shards not counted)
    seconds: float  # wall time of the forward passes in this process
    tokens_per_second: float
    non_finite_rows: int
    shards_total: int
    shards_resumed: int
    layout: str
    device: str
    dtype: str
    rank: int = 0
    merged: bool = True  # False on ranks other than 0, which only compute shards
    shared_pairs: int = 0  # pairs whose prompt went through the model once (shared layout)
    already_computed_at: str = ""  # set when OUT already held these refs and nothing was computed

    def summary(self) -> str:
        if self.already_computed_at:
            return (
                f"refs: {self.out_dir} already holds reference log-probs from this model ({self.dtype} on "
                f"{self.device}, computed {self.already_computed_at}); nothing to do (--recompute computes them again)"
            )
        if not self.merged:
            return f"rank {self.rank}: computed its shards ({self.tokens} tokens, {self.tokens_per_second:.0f} tokens/s)"
        line = (
            f"refs: {self.rows:,} pairs, {self.tokens:,} tokens in {self.seconds:.1f}s "
            f"({self.tokens_per_second:,.0f} tokens/s, {self.layout} batches, {self.dtype} on {self.device})"
        )
        if self.shared_pairs:
            line += f"; prompt shared in {self.shared_pairs:,}/{self.rows:,} pairs"
        if self.shards_resumed:
            line += f"; resumed {self.shards_resumed}/{self.shards_total} shards"
        if self.non_finite_rows:
            line += f"; {self.non_finite_rows} rows flagged {F.NON_FINITE_REF_LOGPS}"
        return line + f"; wrote {self.out_dir}/"


@settings_command(RefsSettings, positional=("model",))  # settings=RefsSettings(...) or flat keywords
@holding_out_lock("refs", when=is_rank_zero)  # one writer per OUT (rank 0 writes for all ranks)
def compute_refs(
    out_dir: str | Path,
    settings: RefsSettings,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    loaded_model: Any = None,
) -> RefsResult:
    """Add reference log-probs and completion token counts to the prepared dataset in `out_dir`.

    Each setting is declared once, in `prefdata.settings.commands.RefsSettings` (`prefdata refs --help`);
    pass `settings=RefsSettings(...)`, flat keywords, or both; `model` may also come second by position.

    `layout` (auto|right|left|packed|blocks|shared) and `shard_batches` are for tests and
    benchmarks; auto runs padding-free rows of pairs with the prompt shared where that pays when the
    model supports block attention, else packs where varlen kernels pay, else pads sorted rows.
    `rank`/`world_size` default to torchrun's environment. When OUT already holds refs from this
    model (same weights, dtype and device type) nothing is computed unless `recompute`.
    `loaded_model` is `model` already in memory (online runs keep the reference across rounds; see
    `load_reference_model`), in eval mode with the dtype and device resolved here.
    An image OUT (prepared with `--processor`) runs a vision-language model with `processor` (default:
    the model directory when it holds processor files, else the one the manifest records), which must
    be the processor OUT was prepared with; see prefdata.model.vision_model.
    """
    import torch

    from prefdata.model.logprobs import plan_batches, plan_packed_batches

    s = settings
    out, model_dir = Path(out_dir), Path(s.model)  # type: ignore[arg-type]
    manifest = _checked_arguments(out, s.model, s.batch_tokens)
    rank, world_size, local_rank = _ranks(rank, world_size)

    # 1. check the tokenizer (an image OUT: the processor), load the model, open the ids
    if rank == 0:
        _finish_swap(out)  # a previous run killed mid-swap
    from prefdata.core.schema import LOSS_START_COLUMNS, check_out

    check_out(out, tokens_only=True)  # the part of OUT's contract refs reads, before loading a model
    vision, tok_fp = checked_vision(out, model_dir, s.processor, manifest, s.trust_remote_code)
    if vision is None:
        tok_fp = load_tokenizer_checked(model_dir, manifest, s.trust_remote_code)
    pad_token_id = int((manifest.get("tokenizer") or {}).get("pad_token_id") or 0)
    device_name = resolve_device(s.device, local_rank)
    dtype_name = resolve_dtype(s.dtype, device_name)
    fingerprint = early_fingerprint(model_dir, dtype_name, s.trust_remote_code)
    held = None if s.recompute or fingerprint is None else held_refs(manifest, fingerprint, device_name.split(":")[0])
    if held is not None:  # a rerun would compute the same values again
        return _already_held(out, held, device_name, dtype_name, rank)
    net, vision = _reference_model(loaded_model, model_dir, dtype_name, device_name, s.trust_remote_code, vision)
    layout = choose_layout(net, s.layout, vision)
    dataset, ids, lens = open_ids(out, images=vision is not None)
    check_pairs_fit_model(net, ids, source_of(dataset.data.table))  # ids inside its embedding, lengths inside its positions

    # 2. plan batches and shards; the work directory is keyed by everything that decides the values
    costs, padding_free, shared_pairs = batch_costs(net, layout, lens)
    batches = (plan_packed_batches if padding_free else plan_batches)(costs, s.batch_tokens)
    shards = plan_shards(batches, s.shard_batches)
    num_rows = len(dataset)
    fingerprint = fingerprint or model_fingerprint(model_dir, net.config, dtype_name)
    work_key = _work_key(s, fingerprint, device_name, layout, pad_token_id, ids_digest(dataset.data.table),
                         (tok_fp, manifest.get("content_hash")) if vision is not None else None)
    settings_hash, work = _work_dir(out, work_key, rank, s.resume)

    # 3. compute this rank's shards that are not done yet
    mine = shards_for_rank(len(shards), rank, world_size)
    todo = [shard for shard in mine if not (s.resume and shard_path(work, shard).is_file())]
    bar = _progress_bar(costs, padding_free, lens, shards, mine, todo, disable=not s.progress or rank != 0)
    start = time.perf_counter()
    tokens, _ = compute_shards(net, shards, todo, work, ids, layout, pad_token_id, bar, vision)
    if device_name.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    bar.close()
    result = RefsResult(
        out_dir=str(out), rows=num_rows, tokens=tokens, seconds=seconds,
        tokens_per_second=tokens / seconds if seconds > 0 else 0.0, non_finite_rows=0,
        shards_total=len(shards), shards_resumed=len(mine) - len(todo), layout=layout,
        device=device_name, dtype=dtype_name, rank=rank, merged=rank == 0, shared_pairs=shared_pairs,
    )
    if world_size > 1:
        wait_for_all(work, len(shards), rank)
    if rank != 0:
        return result

    # 4. merge, flag non-finite rows, swap the dataset in, then the manifest
    merged = merge_shards(work, len(shards), num_rows)
    non_finite = ~(np.isfinite(merged.chosen) & np.isfinite(merged.rejected))
    result.non_finite_rows = int(non_finite.sum())
    swap_dataset(out, with_ref_columns(dataset, merged, non_finite), dataset.info.description or "")
    manifest = read_manifest(out)  # fresh copy: keep every key other stages wrote
    manifest["refs"] = _refs_record(
        model_dir, fingerprint, tok_fp, vision is not None, result, s.batch_tokens, world_size, settings_hash,
        loss_on="answer" if LOSS_START_COLUMNS[0] in ids else "all",
    )
    manifest["shards"] = data_shards(out)  # the swap renamed (and may have re-cut) the data files
    write_manifest(out, manifest)
    shutil.rmtree(out / WORK_DIR, ignore_errors=True)
    return result


def _work_key(s: RefsSettings, fingerprint: dict[str, Any], device_name: str, layout: str, pad_token_id: int,
              ids_sha256: str, images: tuple[Any, Any] | None) -> dict[str, Any]:
    """Everything that decides the values, which keys the work directory (a resumed run reuses only
    shards computed under the same); `images`: an image OUT's (processor fingerprint, content hash)."""
    key = {
        "work_format": WORK_FORMAT, "model": fingerprint, "device_type": device_name.split(":")[0],
        "batch_tokens": s.batch_tokens, "layout": layout, "shard_batches": s.shard_batches,
        "pad_token_id": pad_token_id, "ids_sha256": ids_sha256,
    }
    if images is not None:  # the pixel values: the processor, and the images (OUT's content hash covers them)
        key.update(processor=images[0], content_hash=images[1])
    return key


def _checked_arguments(out: Path, model: str, batch_tokens: int) -> dict[str, Any]:
    """OUT's manifest; an unfinished or pair-less OUT is refused before anything is written."""
    manifest = require_pairs(out, "refs")
    if not Path(model).is_dir():
        raise PrefdataError(f"--model {model} is not a local model directory")
    if batch_tokens <= 0:
        raise PrefdataError("--batch-tokens must be positive")
    return manifest


def _ranks(rank: int | None, world_size: int | None) -> tuple[int, int, int]:
    """(rank, world size, local rank): torchrun's unless given; its process group joined."""
    env_rank, env_world, local_rank = distributed_env()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if world_size > 1 and "MASTER_ADDR" in os.environ:
        init_process_group()
    return rank, world_size, local_rank


def _reference_model(loaded_model: Any, model_dir: Path, dtype_name: str, device_name: str, trust_remote_code: bool,
                     vision: Any) -> tuple[Any, Any]:
    """The reference model (`loaded_model` when given, in the dtype refs run in), and for an image
    OUT its pixel-input settings checked against it."""
    if loaded_model is not None and str(next(loaded_model.parameters()).dtype) != f"torch.{dtype_name}":
        raise PrefdataError(f"loaded_model is {next(loaded_model.parameters()).dtype}, refs here run in {dtype_name}")
    net = loaded_model if loaded_model is not None else load_reference_model(model_dir, dtype_name, device_name,
                                                                             trust_remote_code, vision is not None)
    if vision is not None:
        from prefdata.model.vision_model import check_loaded_model

        vision = check_loaded_model(net, vision, model_dir)
    return net, vision


def _progress_bar(costs: Any, padding_free: bool, lens: dict[str, np.ndarray], shards: list[list[list[int]]],
                  mine: list[int], todo: list[int], disable: bool) -> Any:
    """The bar counts what the summary counts, tokens put through the model: a shared prompt once,
    padding never (padding-free costs are exactly that; padded halves each carry the prompt). Rank 0
    speaks for all."""
    from tqdm.auto import tqdm

    from prefdata.core.quiet import bar_disable

    row_tokens = np.asarray(costs, dtype=np.int64) if padding_free else (
        2 * lens["prompt_ids"] + lens["chosen_ids"] + lens["rejected_ids"])
    total_tokens = _shard_tokens(shards, mine, row_tokens)
    return tqdm(total=total_tokens, initial=total_tokens - _shard_tokens(shards, todo, row_tokens), unit="tok",
                unit_scale=True, desc="refs", disable=bar_disable(not disable), smoothing=0.1)


def _refs_record(model_dir: Path, fingerprint: dict[str, Any], tok_fp: str, images: bool, result: RefsResult,
                 batch_tokens: int, world_size: int, settings_hash: str, loss_on: str) -> dict[str, Any]:
    """The manifest's `refs` section: the model, the settings that decided the values, what was checked."""
    return {
        "model": {"path": str(model_dir.resolve()), **fingerprint},
        "settings": {"device": result.device, "dtype": result.dtype, "batch_tokens": batch_tokens,
                     "layout": result.layout, "loss_on": loss_on, "world_size": world_size,
                     "settings_hash": settings_hash,
                     "prefix_sharing": {"shared_pairs": result.shared_pairs, "pairs": result.rows}},
        "tokenizer_fingerprint_checked": tok_fp,
        **({"processor_fingerprint_checked": tok_fp} if images else {}),
        "computed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": result.rows,
        "non_finite_rows": result.non_finite_rows,
        "columns": list(REF_COLUMNS),
    }


def _already_held(out: Path, held: dict[str, Any], device: str, dtype: str, rank: int) -> RefsResult:
    rows = int(held.get("rows") or 0)
    return RefsResult(
        out_dir=str(out), rows=rows, tokens=0, seconds=0.0, tokens_per_second=0.0,
        non_finite_rows=int(held.get("non_finite_rows") or 0), shards_total=0, shards_resumed=0,
        layout=str((held.get("settings") or {}).get("layout", "")), device=device, dtype=dtype, rank=rank,
        merged=rank == 0, already_computed_at=str(held.get("computed_at") or "earlier"),
    )


def _work_dir(out: Path, settings: dict[str, Any], rank: int, resume: bool) -> tuple[str, Path]:
    """(settings hash, OUT/.refs-work/<settings hash>/): the work directory is keyed by everything that
    decides the values; shards computed under other settings are removed (rank 0)."""
    settings_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    work = out / WORK_DIR / settings_hash
    if rank == 0:
        for stale in (out / WORK_DIR).glob("*") if (out / WORK_DIR).is_dir() else []:
            if stale.is_dir() and stale.name != settings_hash and not stale.name.startswith("dataset-"):
                shutil.rmtree(stale, ignore_errors=True)
        if not resume:
            shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    (work / "settings.json").write_text(json.dumps(settings, indent=2, sort_keys=True), encoding="utf-8")
    return settings_hash, work


def _shard_tokens(shards: list[list[list[int]]], shard_ids: list[int], row_tokens: np.ndarray) -> int:
    rows = [r for s in shard_ids for b in shards[s] for r in b]
    return int(row_tokens[rows].sum()) if rows else 0
