"""prefdata train: a lean DPO trainer on prepared, reference-scored data.

One recipe, read top to bottom in `train()`:

  1. load OUT/ (refs columns required unless the loss is reference-free), skip non-finite refs rows
  2. load the policy, refuse a tokenizer that differs from the one OUT/ was prepared with
  3. plan batches: a deterministic shuffle per epoch, by pairs or by token budget, sharded by rank
  4. AdamW + linear warmup + cosine decay, gradient accumulation, clipping, bf16 autocast on CUDA
  5. per optimizer step: metrics.jsonl with TRL's names, the stall detector, checkpoints, eval
  6. save the final model with save_pretrained (+ tokenizer) so transformers loads it back

No reference model is in memory: its log-probs were computed once by `prefdata refs`.
Checkpoints hold the trainable weights, optimizer, scheduler, RNG states and step; the batch order
is a pure function of (seed, epoch), so `resume=True` continues exactly where the run stopped.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prefdata import flags as F
from prefdata.errors import PrefdataError
from prefdata.model.logprobs import packing_is_efficient, plan_batches, sequence_logps
from prefdata.model.losses import DEFAULT_SIMPO_GAMMA, LOSS_TYPES, REFERENCE_FREE_LOSSES, LossOutput, dpo_loss
from prefdata.io.manifest import read_manifest, tokenizer_fingerprint
from prefdata.tokenize.masks import build_pair_batch
from prefdata.train.stall import StallDetector, TrainingStalled, format_stall_message

REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
# Settings that shape the trajectory: a resume with any of them changed would not continue the run.
_RESUME_KEYS = (
    "loss", "beta", "label_smoothing", "simpo_gamma", "lr", "epochs", "max_steps", "batch_tokens",
    "batch_pairs", "grad_accum", "seed", "warmup_ratio", "max_grad_norm", "lora", "world_size",
)


@dataclass
class TrainResult:
    output_dir: Path
    steps: int  # optimizer steps completed in total (including those before a resume)
    epochs: float
    metrics_path: Path
    last_metrics: dict[str, float] = field(default_factory=dict)  # the last logged train line
    eval_metrics: dict[str, float] | None = None
    stall_events: list[dict[str, Any]] = field(default_factory=list)
    resumed_from_step: int | None = None

    def summary(self) -> str:
        """What the CLI prints at the end: where the model and metrics are, and how it went."""
        parts = [f"trained {self.steps} steps ({self.epochs:.2f} epochs)"]
        if self.resumed_from_step is not None:
            parts.append(f"resumed from step {self.resumed_from_step}")
        if self.last_metrics:
            parts.append(f"loss {self.last_metrics['loss']:.4f}, reward accuracy {self.last_metrics['rewards/accuracies']:.2f}")
        if self.eval_metrics:
            parts.append(f"eval loss {self.eval_metrics['eval/loss']:.4f}")
        if self.stall_events:
            parts.append(f"{len(self.stall_events)} stall warning(s)")
        return "; ".join(parts) + f"\nmodel: {self.output_dir}\nmetrics: {self.metrics_path}"


@dataclass
class PairData:
    """The rows of one OUT/ that training reads, plus what the planner and stall detector need."""

    dataset: Any  # datasets.Dataset with the id (and ref) columns
    rows: list[int]  # dataset row numbers kept for training
    pair_tokens: list[int]  # tokens both halves of each kept row put through the model
    manifest: dict[str, Any]
    has_refs: bool
    identical_pairs: int  # kept rows whose chosen ids equal their rejected ids
    skipped_non_finite: int


# --------------------------------------------------------------------------------------------
# The recipe
# --------------------------------------------------------------------------------------------


def train(
    out_dir: str | Path,
    *,
    model: str | Path,
    output: str | Path,
    loss: str = "sigmoid",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    simpo_gamma: float = DEFAULT_SIMPO_GAMMA,
    lr: float = 5e-6,
    epochs: int = 1,
    max_steps: int | None = None,
    batch_tokens: int | None = None,
    batch_pairs: int = 8,
    grad_accum: int = 1,
    eval_dir: str | Path | None = None,
    eval_every: int | None = None,
    seed: int = 0,
    resume: bool = False,
    warmup_ratio: float = 0.1,
    max_grad_norm: float | None = 1.0,
    log_every: int = 1,
    save_every: int | None = 500,
    stall_steps: int = 20,
    fail_on_stall: bool = False,
    device: str = "auto",
    lora: bool = False,
    progress: bool = True,
    trust_remote_code: bool = False,
) -> TrainResult:
    """Train a policy with a preference loss on OUT/ and save it to `output`."""
    import transformers

    _check_settings(loss, beta, label_smoothing, lr, epochs, max_steps, batch_tokens, batch_pairs, grad_accum,
                    warmup_ratio, log_every, save_every, stall_steps, eval_every)
    out_dir, output = Path(out_dir), Path(output)

    # -- distributed: one process per GPU under torchrun; every rank plans the same batches --------
    rank, world_size, created_group = _init_distributed(device)
    torch_device = _resolve_device(device)
    is_main = rank == 0

    # -- 1. data --------------------------------------------------------------------------------
    need_refs = loss not in REFERENCE_FREE_LOSSES
    data = _load_pairs(out_dir, need_refs=need_refs)
    eval_data = _load_pairs(Path(eval_dir), need_refs=need_refs) if eval_dir is not None else None

    # -- 2. policy and tokenizer ----------------------------------------------------------------
    tokenizer = _load_checked_tokenizer(model, data.manifest, out_dir, trust_remote_code)
    if eval_data is not None:
        _check_same_tokenizer(data.manifest, eval_data.manifest, out_dir, Path(eval_dir))
    pad_token_id = _pad_token_id(data.manifest, tokenizer)

    _seed_everything(seed)
    policy = transformers.AutoModelForCausalLM.from_pretrained(
        str(model), dtype=torch.float32, trust_remote_code=trust_remote_code
    )  # fp32 master weights; bf16 only inside autocast on CUDA
    policy.config.use_cache = False
    if lora:
        policy = _add_lora(policy)
    policy.to(torch_device)
    policy.train()
    # The forward module calls the decoder body and output head directly, so it gets the plain
    # transformers model (for LoRA: the base model with the adapter layers injected).
    forward_model = policy.get_base_model() if lora else policy
    # Packed rows only pay off with varlen kernels; eager/sdpa attend across the whole packed row.
    layout = "packed" if packing_is_efficient(forward_model) else "right"
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if torch_device.type == "cuda" else nullcontext()
    )

    # -- 3. batch plan -------------------------------------------------------------------------
    def epoch_batches(epoch: int) -> list[list[int]]:
        return _epoch_batches(data, epoch, seed, batch_pairs, batch_tokens, world_size)

    micro_per_step = grad_accum * world_size
    steps_per_epoch = math.ceil(len(epoch_batches(0)) / micro_per_step)
    total_steps = max_steps if max_steps is not None else epochs * steps_per_epoch

    # -- 4. optimizer and schedule ---------------------------------------------------------------
    params = [p for p in policy.parameters() if p.requires_grad]
    if not params:
        raise PrefdataError("the policy has no trainable parameters")
    optimizer = torch.optim.AdamW(
        params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
        fused=torch_device.type == "cuda",
    )
    warmup_steps = math.ceil(warmup_ratio * total_steps)
    scheduler = transformers.get_cosine_schedule_with_warmup(optimizer, warmup_steps, total_steps)

    config = {
        "out_dir": str(out_dir), "model": str(model), "loss": loss, "beta": beta,
        "label_smoothing": label_smoothing, "simpo_gamma": simpo_gamma, "lr": lr, "epochs": epochs,
        "max_steps": max_steps, "batch_tokens": batch_tokens, "batch_pairs": batch_pairs,
        "grad_accum": grad_accum, "seed": seed, "warmup_ratio": warmup_ratio,
        "max_grad_norm": max_grad_norm, "lora": lora, "world_size": world_size, "layout": layout,
        "total_steps": total_steps, "warmup_steps": warmup_steps, "train_pairs": len(data.rows),
        "skipped_non_finite_refs": data.skipped_non_finite, "eval_dir": None if eval_dir is None else str(eval_dir),
    }

    # -- resume, or start clean -----------------------------------------------------------------
    metrics_path = output / METRICS_FILE
    step = 0
    resumed_from: int | None = None
    checkpoint = _latest_checkpoint(output)
    if checkpoint is not None and not resume:
        raise PrefdataError(
            f"{output} already has checkpoints ({checkpoint.name}): pass --resume to continue that run, "
            "or choose an empty --output"
        )
    if resume and checkpoint is not None:
        step = _load_checkpoint(checkpoint, policy, optimizer, scheduler, config, torch_device)
        resumed_from = step
    if is_main:
        output.mkdir(parents=True, exist_ok=True)
        _truncate_metrics(metrics_path, keep_through_step=step)  # drop lines logged after the checkpoint
        (output / "train_config.json").write_text(json.dumps(config, indent=2) + "\n")

    stall = StallDetector(
        steps=stall_steps,
        zero_margin_loss=_zero_margin_loss(loss, beta, label_smoothing, simpo_gamma),
        flag_counts=dict(data.manifest.get("flag_counts") or {}),
        identical_pairs=data.identical_pairs,
        num_pairs=len(data.rows),
    )
    loss_kwargs = dict(loss_type=loss, beta=beta, label_smoothing=label_smoothing, simpo_gamma=simpo_gamma)

    # -- 5. the loop ------------------------------------------------------------------------------
    from tqdm.auto import tqdm

    bar = tqdm(total=total_steps, initial=step, desc="train", unit="step", disable=not (progress and is_main),
               dynamic_ncols=True)
    result = TrainResult(output_dir=output, steps=step, epochs=step / steps_per_epoch, metrics_path=metrics_path,
                         resumed_from_step=resumed_from)
    window = _Window()
    planned_epoch, batches = -1, []
    rng_at_step_start = _rng_state()
    loop_started = time.perf_counter()
    try:
        while step < total_steps:
            epoch, step_in_epoch = divmod(step, steps_per_epoch)
            if epoch != planned_epoch:
                planned_epoch, batches = epoch, epoch_batches(epoch)
            step_batches = batches[step_in_epoch * micro_per_step : (step_in_epoch + 1) * micro_per_step]
            my_batches = step_batches[rank::world_size]  # this rank's share of the step
            step_pairs = sum(len(b) for b in step_batches)  # across ranks: the loss is a global mean
            rng_at_step_start = _rng_state()
            started = time.perf_counter()

            sums = torch.zeros(_Sums.SIZE, dtype=torch.float64)
            for micro in my_batches:
                with autocast:
                    out, logps_c, logps_r, n_tokens = _forward_pairs(
                        forward_model, data, micro, layout, pad_token_id, torch_device, loss_kwargs
                    )
                # Sum over pairs / pairs in the whole step: accumulation and ranks give the global mean.
                (out.losses.sum() / step_pairs).backward()
                sums += _Sums.of(out, logps_c, logps_r, n_tokens)

            if world_size > 1:
                _all_reduce_gradients(params)
                sums = _all_reduce_sum(sums, torch_device)
            grad_norm = _clip_gradients(params, max_grad_norm)
            step_lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1

            elapsed = time.perf_counter() - started
            step_metrics = _Sums.means(sums)
            window.add(sums, grad_norm, step_lr, elapsed)
            bar.update(1)
            bar.set_postfix(loss=f"{step_metrics['loss']:.4f}", acc=f"{step_metrics['rewards/accuracies']:.2f}")

            event = stall.update(step, step_metrics["loss"], step_metrics["abs_margin"], grad_norm, step_lr)
            if event is not None:
                result.stall_events.append(event)
                if is_main:
                    _append_jsonl(metrics_path, {k: v for k, v in event.items() if k != "message"} | {"message": event["message"]})
                    bar.write("warning: " + format_stall_message(event), file=sys.stderr)
                if fail_on_stall:
                    raise TrainingStalled(
                        f"training stalled at step {step}: loss {event['loss']:.4f} stayed at its zero-margin value "
                        f"for {event['stalled_steps']} steps (see {metrics_path})"
                    )

            if step % log_every == 0 or step == total_steps:
                line = window.flush(step, step / steps_per_epoch, time.perf_counter() - loop_started)
                result.last_metrics = line
                if is_main:
                    _append_jsonl(metrics_path, line)

            if eval_data is not None and eval_every and step % eval_every == 0 and step < total_steps:
                _run_eval(forward_model, eval_data, batch_pairs, batch_tokens, layout, pad_token_id, torch_device,
                          loss_kwargs, autocast, rank, world_size, step, step / steps_per_epoch, metrics_path, result)
                policy.train()

            if save_every and step % save_every == 0 and step < total_steps:
                _save_checkpoint(output, step, policy, optimizer, scheduler, config, _rng_state(), is_main)
    except KeyboardInterrupt:
        # The weights and optimizer are those of `step` completed steps; the partial step's gradients
        # are dropped and the RNG goes back to where that step began, so --resume is still exact.
        _save_checkpoint(output, step, policy, optimizer, scheduler, config, rng_at_step_start, is_main)
        bar.close()
        raise
    bar.close()
    result.steps = step
    result.epochs = step / steps_per_epoch

    # -- 6. eval and save ------------------------------------------------------------------------
    if eval_data is not None:
        _run_eval(forward_model, eval_data, batch_pairs, batch_tokens, layout, pad_token_id, torch_device,
                  loss_kwargs, autocast, rank, world_size, step, result.epochs, metrics_path, result)
    if is_main:
        _save_final_model(policy, tokenizer, output, lora)
    if world_size > 1:
        torch.distributed.barrier()
        if created_group:
            torch.distributed.destroy_process_group()
    return result


# --------------------------------------------------------------------------------------------
# Settings, devices, seeding
# --------------------------------------------------------------------------------------------


def _check_settings(loss, beta, label_smoothing, lr, epochs, max_steps, batch_tokens, batch_pairs, grad_accum,
                    warmup_ratio, log_every, save_every, stall_steps, eval_every) -> None:
    if loss not in LOSS_TYPES:
        raise PrefdataError(f"unknown loss {loss!r}: choose one of {', '.join(LOSS_TYPES)}")
    if beta <= 0:
        raise PrefdataError(f"--beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise PrefdataError(f"--label-smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing and loss in ("ipo", "hinge"):
        raise PrefdataError(f"--label-smoothing is not defined for --loss {loss}")
    if lr < 0:
        raise PrefdataError(f"--lr must be >= 0, got {lr}")
    if max_steps is None and epochs < 1:
        raise PrefdataError(f"--epochs must be >= 1, got {epochs}")
    if max_steps is not None and max_steps < 1:
        raise PrefdataError(f"--max-steps must be >= 1, got {max_steps}")
    if batch_tokens is not None and batch_tokens < 1:
        raise PrefdataError(f"--batch-tokens must be >= 1, got {batch_tokens}")
    if batch_pairs < 1 or grad_accum < 1 or log_every < 1 or stall_steps < 1:
        raise PrefdataError("--batch-pairs, --grad-accum, log_every and stall_steps must be >= 1")
    if not 0.0 <= warmup_ratio <= 1.0:
        raise PrefdataError(f"warmup_ratio must be in [0, 1], got {warmup_ratio}")
    if (save_every is not None and save_every < 0) or (eval_every is not None and eval_every < 0):
        raise PrefdataError("save_every and eval_every must be >= 0")


def _init_distributed(device: str) -> tuple[int, int, bool]:
    """Rank and world size from torchrun's environment; joins the process group when WORLD_SIZE > 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1, False
    import torch.distributed as dist

    created = False
    if not dist.is_initialized():
        use_nccl = device != "cpu" and torch.cuda.is_available()
        if use_nccl:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if use_nccl else "gloo")
        created = True
    return dist.get_rank(), dist.get_world_size(), created


def _resolve_device(device: str) -> torch.device:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise PrefdataError(f"--device {device} asked for, but no CUDA device is available")
        return torch.device(device if ":" in device else f"cuda:{local_rank}")
    if device == "cpu":
        return torch.device("cpu")
    raise PrefdataError(f"unknown --device {device!r}: auto, cpu or cuda")


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain lists, so checkpoints load with weights_only=True (no pickle)."""
    version, py_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(py_state), "gauss": gauss},
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], np.array(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"], npy["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def _load_pairs(out_dir: Path, *, need_refs: bool) -> PairData:
    """Open OUT/, check it has what the loss needs, and keep the rows that can be trained on."""
    import datasets
    import polars as pl
    import pyarrow.compute as pc

    if not (out_dir / "manifest.json").is_file():
        raise PrefdataError(f"{out_dir} is not a prepared OUT directory (no manifest.json): run `prefdata prepare` first")
    from prefdata.schema import check_out

    check_out(out_dir, tokens_only=True)  # the part of OUT's contract train reads (prefdata.schema)
    try:
        manifest = read_manifest(out_dir)
        dataset = datasets.load_from_disk(str(out_dir))
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        raise PrefdataError(f"cannot open the prepared data in {out_dir}: {exc}") from None
    if isinstance(dataset, datasets.DatasetDict):
        raise PrefdataError(f"{out_dir} holds several splits; train expects one prepared OUT per split")
    missing = [c for c in ("prompt_ids", "chosen_ids", "rejected_ids") if c not in dataset.column_names]
    if missing:
        raise PrefdataError(f"{out_dir} has no {', '.join(missing)} column: run `prefdata prepare` with a tokenizer first")
    has_refs = all(c in dataset.column_names for c in REF_COLUMNS)
    if need_refs and not has_refs:
        raise PrefdataError(f"{out_dir} has no reference log-probs: run `prefdata refs {out_dir} --model ...` first")

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

    columns = ["prompt_ids", "chosen_ids", "rejected_ids"] + (list(REF_COLUMNS) if has_refs else [])
    return PairData(
        dataset=dataset.select_columns(columns), rows=rows, pair_tokens=pair_tokens, manifest=manifest,
        has_refs=has_refs, identical_pairs=identical, skipped_non_finite=skipped,
    )


def _epoch_batches(data: PairData, epoch: int, seed: int, batch_pairs: int, batch_tokens: int | None,
                   world_size: int) -> list[list[int]]:
    """Micro-batches (lists of dataset rows) for one epoch, a pure function of (seed, epoch).

    By pairs: consecutive chunks of a seeded permutation. By token budget: length-grouped batches
    (less padding) whose order is then shuffled with the same seed. Under DDP the list is cut to a
    multiple of the world size so every rank runs the same number of micro-batches.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(data.rows), generator=generator).tolist()
    if batch_tokens is None:
        positions = [order[i : i + batch_pairs] for i in range(0, len(order), batch_pairs)]
    else:
        planned = plan_batches([data.pair_tokens[i] for i in order], batch_tokens)
        shuffle = torch.randperm(len(planned), generator=generator).tolist()
        positions = [[order[j] for j in planned[k]] for k in shuffle]
    batches = [[data.rows[p] for p in batch] for batch in positions]
    if world_size > 1:
        batches = batches[: len(batches) - len(batches) % world_size]
        if not batches:
            raise PrefdataError(f"fewer micro-batches than ranks ({world_size}): use smaller batches or fewer GPUs")
    return batches


def _forward_pairs(model, data: PairData, rows: list[int], layout: str, pad_token_id: int, device: torch.device,
                   loss_kwargs: dict[str, Any]) -> tuple[LossOutput, torch.Tensor, torch.Tensor, int]:
    """Policy log-probs for both halves of `rows`, and the loss against the stored reference."""
    batch_rows = data.dataset[rows]
    batch = build_pair_batch(batch_rows["prompt_ids"], batch_rows["chosen_ids"], batch_rows["rejected_ids"],
                             layout, pad_token_id)
    logps, counts = sequence_logps(model, batch)  # [chosen..., rejected...]
    n = len(rows)
    ref_c = ref_r = None
    if data.has_refs:
        ref_c = torch.tensor(batch_rows["ref_chosen_logps"], dtype=torch.float32, device=logps.device)
        ref_r = torch.tensor(batch_rows["ref_rejected_logps"], dtype=torch.float32, device=logps.device)
    out = dpo_loss(logps[:n], logps[n:], ref_c, ref_r, chosen_counts=counts[:n], rejected_counts=counts[n:],
                   **loss_kwargs)
    return out, logps[:n].detach(), logps[n:].detach(), batch.num_tokens


def _pad_token_id(manifest: dict[str, Any], tokenizer: Any) -> int:
    pad = (manifest.get("tokenizer") or {}).get("pad_token_id")
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad if pad is not None else 0)  # padded positions are masked out; any id works


def _load_checked_tokenizer(model: str | Path, manifest: dict[str, Any], out_dir: Path, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise PrefdataError(f"cannot load a tokenizer from {model}: {str(exc).splitlines()[0]}") from None
    expected = (manifest.get("tokenizer") or {}).get("fingerprint")
    actual = tokenizer_fingerprint(tokenizer)
    if expected is None:
        print(f"warning: {out_dir}/manifest.json records no tokenizer fingerprint; cannot check {model}'s tokenizer",
              file=sys.stderr)
    elif actual != expected:
        raise PrefdataError(
            f"the tokenizer of {model} ({actual[:19]}…) differs from the one {out_dir} was prepared with "
            f"({expected[:19]}…): prepare the data with this model's tokenizer, or train the matching model"
        )
    return tokenizer


def _check_same_tokenizer(train_manifest: dict, eval_manifest: dict, out_dir: Path, eval_dir: Path) -> None:
    a = (train_manifest.get("tokenizer") or {}).get("fingerprint")
    b = (eval_manifest.get("tokenizer") or {}).get("fingerprint")
    if a and b and a != b:
        raise PrefdataError(f"{eval_dir} was prepared with a different tokenizer than {out_dir}")


def _add_lora(policy):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise PrefdataError("LoRA needs peft: pip install 'prefdata[lora]'") from None
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(policy, config)


def _zero_margin_loss(loss: str, beta: float, label_smoothing: float, simpo_gamma: float) -> float:
    """The loss when chosen and rejected score alike: where a stalled run sits (ln 2 for sigmoid)."""
    zero, one = torch.zeros(1), torch.ones(1)
    return float(dpo_loss(zero, zero, zero, zero, loss_type=loss, beta=beta, label_smoothing=label_smoothing,
                          chosen_counts=one, rejected_counts=one, simpo_gamma=simpo_gamma).losses[0])


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


class _Sums:
    """Per-pair sums that add up across micro-batches and ranks, then turn into TRL's means."""

    NAMES = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
             "logps/chosen", "logps/rejected", "abs_margin", "pairs", "tokens")
    SIZE = len(NAMES)

    @staticmethod
    def of(out: LossOutput, logps_c: torch.Tensor, logps_r: torch.Tensor, n_tokens: int) -> torch.Tensor:
        margins = out.chosen_rewards - out.rejected_rewards
        values = torch.stack([
            out.losses.detach().sum(), out.chosen_rewards.sum(), out.rejected_rewards.sum(),
            (margins > 0).float().sum(), margins.sum(), logps_c.sum(), logps_r.sum(), margins.abs().sum(),
        ]).double().cpu()
        return torch.cat([values, torch.tensor([float(len(logps_c)), float(n_tokens)], dtype=torch.float64)])

    @staticmethod
    def means(sums: torch.Tensor) -> dict[str, float]:
        pairs = max(float(sums[8]), 1.0)
        return {name: float(sums[i]) / pairs for i, name in enumerate(_Sums.NAMES[:8])}


class _Window:
    """What happened since the last metrics line."""

    def __init__(self) -> None:
        self.sums = torch.zeros(_Sums.SIZE, dtype=torch.float64)
        self.seconds = 0.0
        self.grad_norm = 0.0
        self.lr = 0.0

    def add(self, sums: torch.Tensor, grad_norm: float, lr: float, seconds: float) -> None:
        self.sums += sums
        self.seconds += seconds
        self.grad_norm, self.lr = grad_norm, lr

    def flush(self, step: int, epoch: float, elapsed_s: float) -> dict[str, float]:
        line: dict[str, Any] = {"step": step, "epoch": round(epoch, 6)}
        means = _Sums.means(self.sums)
        line.update({k: v for k, v in means.items() if k != "abs_margin"})
        line["grad_norm"] = self.grad_norm
        line["lr"] = self.lr
        line["tokens_per_s"] = float(self.sums[9]) / self.seconds if self.seconds > 0 else 0.0
        line["elapsed_s"] = round(elapsed_s, 4)  # since this process entered the loop (resets on resume)
        self.__init__()
        return line


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=float) + "\n")


def _truncate_metrics(path: Path, keep_through_step: int) -> None:
    """A fresh run starts an empty file; a resumed one drops lines logged after its checkpoint."""
    if keep_through_step == 0 or not path.exists():
        path.write_text("")
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= keep_through_step]
    path.write_text("".join(line + "\n" for line in kept))


# --------------------------------------------------------------------------------------------
# Optimization helpers
# --------------------------------------------------------------------------------------------


def _clip_gradients(params: list[torch.nn.Parameter], max_grad_norm: float | None) -> float:
    """Total gradient norm before clipping (what TRL logs as grad_norm); clips when a max is set."""
    limit = max_grad_norm if max_grad_norm and max_grad_norm > 0 else float("inf")
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(with_grad, limit))


def _all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum gradients over ranks in one flat buffer. Done by hand rather than by wrapping the model in
    DDP because the forward module calls the decoder body and head directly, around DDP's forward."""
    import torch.distributed as dist

    for p in params:
        if p.grad is None:  # a parameter unused on this rank still takes part in the sum
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _all_reduce_sum(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    import torch.distributed as dist

    buffer = values.to(device)
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
    return buffer.cpu()


# --------------------------------------------------------------------------------------------
# Eval
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model, data: PairData, *, batch_pairs: int, batch_tokens: int | None, layout: str, pad_token_id: int,
             device: torch.device, loss_kwargs: dict[str, Any], autocast=nullcontext(), rank: int = 0,
             world_size: int = 1) -> dict[str, float]:
    """Mean loss, rewards and accuracy over every pair of `data` (sharded by rank, summed back)."""
    model.eval()
    if batch_tokens is None:
        batches = [data.rows[i : i + batch_pairs] for i in range(0, len(data.rows), batch_pairs)]
    else:
        planned = plan_batches(data.pair_tokens, batch_tokens)
        batches = [[data.rows[i] for i in b] for b in planned]
    sums = torch.zeros(_Sums.SIZE, dtype=torch.float64)
    for rows in batches[rank::world_size]:
        with autocast:
            out, logps_c, logps_r, n_tokens = _forward_pairs(model, data, rows, layout, pad_token_id, device, loss_kwargs)
        sums += _Sums.of(out, logps_c, logps_r, n_tokens)
    if world_size > 1:
        sums = _all_reduce_sum(sums, device)
    return {f"eval/{k}": v for k, v in _Sums.means(sums).items() if k != "abs_margin"}


def _run_eval(model, eval_data, batch_pairs, batch_tokens, layout, pad_token_id, device, loss_kwargs, autocast,
              rank, world_size, step, epoch, metrics_path, result: TrainResult) -> None:
    metrics = evaluate(model, eval_data, batch_pairs=batch_pairs, batch_tokens=batch_tokens, layout=layout,
                       pad_token_id=pad_token_id, device=device, loss_kwargs=loss_kwargs, autocast=autocast,
                       rank=rank, world_size=world_size)
    result.eval_metrics = metrics
    if rank == 0:
        _append_jsonl(metrics_path, {"step": step, "epoch": round(epoch, 6), **metrics})


# --------------------------------------------------------------------------------------------
# Checkpoints and the final model
# --------------------------------------------------------------------------------------------


def _latest_checkpoint(output: Path) -> Path | None:
    root = output / CHECKPOINT_DIR
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step-*") if (p / "state.json").is_file())
    return done[-1] if done else None


def _save_checkpoint(output: Path, step: int, policy, optimizer, scheduler, config: dict[str, Any],
                     rng: dict[str, Any], is_main: bool) -> None:
    """Trainable weights, optimizer, scheduler, RNG and step, written to a temporary directory and
    renamed, so a checkpoint directory is either complete or absent. Keeps only the newest."""
    if not is_main or step == 0:
        return
    root = output / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # Frozen weights never change (LoRA base), so the trainable ones are the whole state.
    trainable = {name: p.detach().cpu() for name, p in policy.named_parameters() if p.requires_grad}
    torch.save(trainable, tmp / "trainable.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "config": config}, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in root.glob("step-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(path: Path, policy, optimizer, scheduler, config: dict[str, Any], device: torch.device) -> int:
    state = json.loads((path / "state.json").read_text())
    saved = state["config"]
    changed = [k for k in _RESUME_KEYS if saved.get(k) != config.get(k)]
    if changed:
        detail = ", ".join(f"{k}: {saved.get(k)!r} -> {config.get(k)!r}" for k in changed)
        raise PrefdataError(f"cannot resume from {path}: settings changed ({detail})")
    trainable = torch.load(path / "trainable.pt", map_location=device, weights_only=True)
    missing = policy.load_state_dict(trainable, strict=False)
    if missing.unexpected_keys:
        raise PrefdataError(f"checkpoint {path} does not match the model ({missing.unexpected_keys[0]} unexpected)")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    return int(state["step"])


def _save_final_model(policy, tokenizer, output: Path, lora: bool) -> None:
    """save_pretrained + tokenizer in `output`, loadable with AutoModelForCausalLM. LoRA: the adapter
    goes to output/adapter and the merged model to output."""
    if lora:
        policy.save_pretrained(str(output / "adapter"))
        policy = policy.merge_and_unload()
    policy.config.use_cache = True
    policy.save_pretrained(str(output))
    tokenizer.save_pretrained(str(output))
