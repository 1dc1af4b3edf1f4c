"""prefdata train: a lean DPO trainer on prepared, reference-scored data.

One recipe, read top to bottom in `train()`:

  1. load OUT/ (refs columns required unless the loss is reference-free), skip non-finite refs rows
  2. load the policy, refuse a tokenizer that differs from the one OUT/ was prepared with
  3. plan batches: a deterministic shuffle per epoch, by pairs or by token budget, sharded by rank
  4. AdamW + linear warmup + cosine (or linear, constant) decay, gradient accumulation, clipping, bf16 autocast on CUDA
  5. per optimizer step: metrics.jsonl with TRL's names, the stall detector, checkpoints, eval
  6. save the final model with save_pretrained (+ tokenizer) so transformers loads it back

No reference model is in memory: its log-probs were computed once by `prefdata refs`.
Checkpoints hold the trainable weights, optimizer, scheduler, RNG states and step; the batch order
is a pure function of (seed, epoch), so `resume=True` continues exactly where the run stopped.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from prefdata.core.errors import PrefdataError
from prefdata.model.losses import DEFAULT_SIMPO_GAMMA, REFERENCE_FREE_LOSSES
from prefdata.model.pairs import choose_layout
from prefdata.settings.commands import TrainSettings
from prefdata.settings.declare import takes_settings
from prefdata.train.checkpoint import (
    check_output,
    clear_output,
    latest_checkpoint,
    load_checkpoint,
    load_optimizer_state,
    save_final_model,
    save_optimizer_state,
)
from prefdata.train.data import (
    check_same_tokenizer,
    load_checked_tokenizer,
    load_pairs,
    pad_token_id,
)
from prefdata.train.loop import Loop, Schedule, run_steps
from prefdata.train.lr_schedule import LR_SCHEDULES, make_scheduler
from prefdata.train.metrics import METRICS_FILE, TrainResult, truncate_metrics
from prefdata.train.runtime import (
    check_settings,
    init_distributed,
    resolve_device,
    seed_everything,
)
from prefdata.train.stall import StallDetector
from prefdata.train.step import PairForward, run_eval, zero_margin_loss, zero_margin_losses

__all__ = ["TrainResult", "train"]


@takes_settings(TrainSettings)  # or settings=TrainSettings(...): prefdata.settings
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
    overwrite: bool = False,
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
    shuffle: bool = True,
    layout: str = "auto",
    lr_schedule: str = "cosine",
    schedule_steps: int | None = None,
    optimizer_from: str | Path | None = None,
    save_optimizer: bool = False,
    ld_alpha: float | None = None,
    loaded_policy: Any = None,
    loaded_optimizer: tuple[dict[str, Any], dict[str, Any]] | None = None,
    save_model: bool = True,
    processor: str | Path | None = None,
) -> TrainResult:
    """Train a policy with a preference loss on OUT/ and save it to `output`.

    `shuffle=False` keeps the data order (batches by token budget: longest first). `layout` (auto,
    right, left, packed, blocks, shared) is for tests and benchmarks: auto runs padding-free rows of
    pairs with the prompt shared where that pays, when the model supports it (see model/pairs.py);
    a model whose image tokens attend each other both ways (Gemma 3) runs right or left padding only.

    Runs that continue one another (online rounds): `schedule_steps` is the length the learning-rate
    schedule spans (default: this run's steps), `save_optimizer` writes the optimizer and schedule
    state to `output/optimizer/`, and `optimizer_from` (such a directory's parent) continues them, so
    several calls train as one run with one optimizer and one schedule. `loaded_policy` is the model
    at `model` already in memory (an earlier call's `TrainResult.model`): it is trained in place;
    `loaded_optimizer` (an earlier call's `TrainResult.optimizer_state`) continues its optimizer and
    schedule without a trip through disk, and `save_model=False` leaves the model in memory only (an
    online round between checkpoints).
    `ld_alpha` (LD-DPO, TRL's `ld_alpha`, in [0, 1]): the log-probs of each half's tokens beyond the
    shorter half's length are weighted by it, in the policy's and the reference's sums alike (needs
    refs from this prefdata: they store the reference's public-length sums). None: plain DPO.
    An image OUT (prepared with `--processor`) trains a vision-language model with `processor`
    (default: the model directory when it holds processor files, else the one the manifest
    records), which must be the processor OUT was prepared with; the final model is saved with it.
    """
    import transformers

    check_settings(loss, beta, label_smoothing, lr, epochs, max_steps, batch_tokens, batch_pairs, grad_accum,
                   warmup_ratio, log_every, save_every, stall_steps, eval_every, ld_alpha)
    _check_schedule(lr_schedule, schedule_steps)
    out_dir, output = Path(out_dir), Path(output)
    # Before the ranks meet in init_distributed: no rank has written --output yet when each checks it.
    check_output(output, resume=resume, overwrite=overwrite, out_dirs=[Path(d) for d in (out_dir, eval_dir) if d],
                 inputs=[model, optimizer_from, processor])
    rank, world_size, created_group = init_distributed(device)  # torchrun: every rank plans the same batches
    torch_device = resolve_device(device)

    # 1. data
    data, eval_data = _load_data(out_dir, eval_dir, loss, ld_alpha)

    # 2. policy and tokenizer (an image OUT: the processor, whose tokenizer made its ids)
    vision, image_processor, tokenizer = _processing(out_dir, Path(model), processor, data, trust_remote_code)
    if eval_data is not None:
        _check_eval_data(data, eval_data, out_dir, Path(eval_dir))  # type: ignore[arg-type]
    seed_everything(seed)
    policy = _load_policy(transformers, model, lora, torch_device, trust_remote_code, loaded_policy, vision is not None)
    fwd = _pair_forward(policy, model, lora, layout, vision, data, eval_data, tokenizer, torch_device,
                        {"loss_type": loss, "beta": beta, "label_smoothing": label_smoothing, "simpo_gamma": simpo_gamma},
                        ld_alpha)

    # 3. batch plan
    schedule = Schedule(batch_pairs=batch_pairs, batch_tokens=batch_tokens, grad_accum=grad_accum, seed=seed,
                        rank=rank, world_size=world_size, max_steps=max_steps, epochs=epochs, shuffle=shuffle)
    steps_per_epoch = schedule.steps_per_epoch(data)
    total_steps = schedule.total_steps(data)

    # 4. optimizer and schedule
    params = [p for p in policy.parameters() if p.requires_grad]
    span = schedule_steps if schedule_steps is not None else total_steps
    optimizer, scheduler, warmup_steps = _optimizer(params, lr, lr_schedule, warmup_ratio, span, schedule_steps is not None,
                                                    optimizer_from, torch_device, loaded_optimizer)
    settings = {k: v for k, v in locals().items() if k in _CONFIG_KEYS}
    continued = IN_MEMORY if loaded_optimizer is not None else optimizer_from
    config = _run_config(settings, out_dir, model, fwd.layout, data, total_steps, warmup_steps, span, continued, eval_dir)

    # 5. resume or start clean, then the loop
    metrics_path = output / METRICS_FILE
    step = _resume_step(output, resume, overwrite, policy, optimizer, scheduler, config, torch_device)
    result = TrainResult(output_dir=output, steps=step, epochs=step / steps_per_epoch, metrics_path=metrics_path,
                         resumed_from_step=step if resume and step else None)
    if rank == 0:
        if overwrite:
            clear_output(output)  # the earlier run goes only now, once everything above has passed
        _start_output(output, metrics_path, step, config)
    stall = _stall_detector(stall_steps, loss, beta, label_smoothing, simpo_gamma, data)
    loop = Loop(policy=policy, fwd=fwd, optimizer=optimizer, scheduler=scheduler, params=params, data=data,
                eval_data=eval_data, schedule=schedule, stall=stall, output=output, metrics_path=metrics_path,
                config=config, max_grad_norm=max_grad_norm, log_every=log_every, eval_every=eval_every,
                save_every=save_every, fail_on_stall=fail_on_stall, progress=progress)
    result.steps = step = run_steps(loop, result, step)
    result.epochs = step / steps_per_epoch

    # 6. eval and save
    if eval_data is not None:
        result.eval_metrics = run_eval(fwd, eval_data, batch_pairs=batch_pairs, batch_tokens=batch_tokens, rank=rank,
                                       world_size=world_size, step=step, epoch=result.epochs, metrics_path=metrics_path)
    result.model = policy
    result.optimizer_state = (optimizer.state_dict(), scheduler.state_dict())
    if rank == 0 and save_model:
        _save(output, policy, image_processor if vision is not None else tokenizer, lora, save_optimizer, optimizer, scheduler)
    if world_size > 1:
        _leave_distributed(created_group)
    return result


def _check_schedule(lr_schedule: str, schedule_steps: int | None) -> None:
    if lr_schedule not in LR_SCHEDULES:
        raise PrefdataError(f"--lr-schedule must be one of {', '.join(LR_SCHEDULES)}, not {lr_schedule!r}")
    if schedule_steps is not None and schedule_steps < 1:
        raise PrefdataError(f"schedule_steps must be >= 1, got {schedule_steps}")


def _load_data(out_dir: Path, eval_dir: str | Path | None, loss: str, ld_alpha: float | None) -> tuple[Any, Any]:
    """OUT's pairs and the eval OUT's (None without one), with the refs the loss reads."""
    need_refs = loss not in REFERENCE_FREE_LOSSES
    need_public = ld_alpha is not None
    data = load_pairs(out_dir, need_refs=need_refs, need_public_refs=need_public)
    eval_data = (load_pairs(Path(eval_dir), need_refs=need_refs, need_public_refs=need_public)
                 if eval_dir is not None else None)
    if loss == "ipo" and any(part is not None and part.offsets is not None for part in (data, eval_data)):
        raise PrefdataError("--loss ipo takes no per-pair offsets (the data has an `offset` column): use sigmoid, "
                            "robust or hinge, or drop the column")
    return data, eval_data


def _check_eval_data(data: Any, eval_data: Any, out_dir: Path, eval_dir: Path) -> None:
    """The eval OUT was prepared as OUT was: the same tokenizer, the same --loss-on."""
    check_same_tokenizer(data.manifest, eval_data.manifest, out_dir, eval_dir)
    if eval_data.loss_on_answer != data.loss_on_answer:
        raise PrefdataError(f"{out_dir} and {eval_dir} were prepared with different --loss-on: prepare both alike")


def _pair_forward(policy: Any, model: str | Path, lora: bool, layout: str, vision: Any, data: Any, eval_data: Any,
                  tokenizer: Any, device: torch.device, loss_kwargs: dict[str, Any],
                  ld_alpha: float | None) -> PairForward:
    """The pair forward over the policy: its layout chosen for the model (and set on the data), an
    image OUT's pixel-input settings checked against the loaded model."""
    # The forward calls the decoder body and output head directly, so it gets the plain transformers
    # model (for LoRA: the base model with the adapter layers injected).
    forward_model = policy.get_base_model() if lora else policy
    if vision is not None:
        from prefdata.model.vision_model import check_loaded_model

        vision = check_loaded_model(forward_model, vision, model)
    layout = _pair_layout(forward_model, layout, vision)
    for part in (data, eval_data):
        if part is not None:
            part.use_layout(forward_model, layout)
    return PairForward(
        model=forward_model, layout=layout, pad_token_id=pad_token_id(data.manifest, tokenizer), device=device,
        loss_kwargs=loss_kwargs,
        autocast=torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext(),
        ld_alpha=ld_alpha, vision=vision,
    )


def _run_config(settings: dict[str, Any], out_dir: Path, model: str | Path, layout: str, data: Any, total_steps: int,
                warmup_steps: int, span: int, optimizer_from: str | Path | None,
                eval_dir: str | Path | None) -> dict[str, Any]:
    """train_config.json: the settings as given, and what the run made of them."""
    return {
        **settings, "out_dir": str(out_dir), "model": str(model), "layout": layout,
        "prefix_sharing": {"shared_pairs": data.shared_pairs, "pairs": len(data.rows)},
        "total_steps": total_steps, "warmup_steps": warmup_steps, "schedule_steps": span,
        "optimizer_from": None if optimizer_from is None else str(optimizer_from), "train_pairs": len(data.rows),
        "loss_on": "answer" if data.loss_on_answer else "all",
        "skipped_non_finite_refs": data.skipped_non_finite, "eval_dir": None if eval_dir is None else str(eval_dir),
    }


def _stall_detector(stall_steps: int, loss: str, beta: float, label_smoothing: float, simpo_gamma: float,
                    data: Any) -> StallDetector:
    by_row = None
    if data.offsets is not None and loss != "ipo":  # ipo refuses offsets when the loss first runs
        by_row = zero_margin_losses(loss, beta, label_smoothing, simpo_gamma, data.offsets)
    return StallDetector(
        steps=stall_steps, zero_margin_loss=zero_margin_loss(loss, beta, label_smoothing, simpo_gamma),
        flag_counts=dict(data.manifest.get("flag_counts") or {}), identical_pairs=data.identical_pairs,
        num_pairs=len(data.rows), zero_margin_by_row=by_row,
    )


# train_config.json's `optimizer_from` for a run that continued an optimizer handed over in memory.
IN_MEMORY = "memory"

# Settings recorded as given in train_config.json (and compared on resume, see checkpoint.py).
_CONFIG_KEYS = (
    "loss", "beta", "label_smoothing", "simpo_gamma", "lr", "epochs", "max_steps", "batch_tokens", "batch_pairs",
    "grad_accum", "seed", "warmup_ratio", "max_grad_norm", "lora", "world_size", "shuffle", "lr_schedule", "ld_alpha",
)


def warmup_steps_for(warmup_ratio: float, span: int) -> int:
    """Warmup steps of a `train` run of `span` steps. Warmup starts at a rate of 0, so its first step
    trains nothing: TRL's `ceil(ratio * steps)` gives a 4-step run one warmup step, a quarter of the
    run at lr 0. Rounded down instead, and none where it would be a single step (that step alone,
    at lr 0): short runs train at the full rate from their first step."""
    steps = math.floor(warmup_ratio * span + 1e-9)
    return steps if steps >= 2 else 0


def _optimizer(params: list[torch.nn.Parameter], lr: float, lr_schedule: str, warmup_ratio: float, span: int,
               continued: bool, optimizer_from: str | Path | None, device: torch.device,
               loaded: tuple[dict[str, Any], dict[str, Any]] | None = None) -> tuple[torch.optim.Optimizer, Any, int]:
    """AdamW (no weight decay) with linear warmup, then the schedule over `span` steps; the state of
    `optimizer_from` continued where given. `continued` (an online run's schedule, schedule_steps
    given) keeps TRL's warmup; see warmup_steps_for."""
    if not params:
        raise PrefdataError("the policy has no trainable parameters")
    warmup_steps = math.ceil(warmup_ratio * span) if continued else warmup_steps_for(warmup_ratio, span)
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                  fused=device.type == "cuda")
    scheduler = make_scheduler(optimizer, lr_schedule, warmup_steps, span)
    if loaded is not None:
        optimizer.load_state_dict(loaded[0])
        scheduler.load_state_dict(loaded[1])
    elif optimizer_from is not None:
        load_optimizer_state(Path(optimizer_from), optimizer, scheduler, device)
    return optimizer, scheduler, warmup_steps


def _load_policy(transformers: Any, model: str | Path, lora: bool, device: torch.device, trust_remote_code: bool,
                 loaded: Any = None, vision: bool = False):
    """fp32 master weights (bf16 only inside autocast on CUDA), no KV cache, in train mode (`vision`:
    a vision-language model, for an image OUT)."""
    if loaded is not None and lora:
        raise PrefdataError("loaded_policy and lora do not go together: pass the model directory")
    if loaded is not None:
        policy = loaded
    elif vision:
        from prefdata.model.vision_model import load_vision_language_model

        policy = load_vision_language_model(model, torch.float32, trust_remote_code)
    else:
        policy = transformers.AutoModelForCausalLM.from_pretrained(
            str(model), dtype=torch.float32, trust_remote_code=trust_remote_code
        )
    if loaded is not None and next(policy.parameters()).dtype != torch.float32:
        raise PrefdataError("loaded_policy must hold fp32 weights (the trainer's master weights)")
    policy.config.use_cache = False
    if lora:
        policy = _add_lora(policy)
    policy.to(device)
    policy.train()
    return policy


def _processing(out_dir: Path, model: Path, processor: str | Path | None, data: Any,
                trust_remote_code: bool) -> tuple[Any, Any, Any]:
    """(pixel-input settings, processor, tokenizer): for an image OUT the processor it was prepared
    with (prefdata.model.vision_model.checked_processor) and its tokenizer; for a text OUT (None,
    None, the model's tokenizer, which must be the one OUT was prepared with)."""
    from prefdata.model.vision_model import checked_processor

    checked = checked_processor(out_dir, model, processor, data.manifest, trust_remote_code)
    if checked is None:
        return None, None, load_checked_tokenizer(model, data.manifest, out_dir, trust_remote_code)
    return checked[0], checked[1], checked[1].tokenizer


def _pair_layout(model: Any, layout: str, vision: Any = None) -> str:
    try:
        return choose_layout(model, layout, vision)
    except ValueError as exc:
        raise PrefdataError(str(exc)) from None


def _add_lora(policy):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise PrefdataError("LoRA needs peft: pip install 'prefdata[lora]'") from None
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(policy, config)


def _save(output: Path, policy: Any, processing_class: Any, lora: bool, save_optimizer: bool, optimizer: Any,
          scheduler: Any) -> None:
    """The final model with its tokenizer (or processor); the optimizer state for a next run on request."""
    save_final_model(policy, processing_class, output, lora)
    if save_optimizer:
        save_optimizer_state(output, optimizer, scheduler)


def _start_output(output: Path, metrics_path: Path, step: int, config: dict[str, Any]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    truncate_metrics(metrics_path, keep_through_step=step)  # drop lines logged after the checkpoint
    (output / "train_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _leave_distributed(created_group: bool) -> None:
    torch.distributed.barrier()
    if created_group:
        torch.distributed.destroy_process_group()


def _resume_step(output: Path, resume: bool, overwrite: bool, policy, optimizer, scheduler, config: dict[str, Any],
                 device: torch.device) -> int:
    """The step to start from: 0 for a fresh run (--overwrite: the earlier run's checkpoints are
    replaced), the checkpoint's step with --resume."""
    checkpoint = latest_checkpoint(output)
    if checkpoint is not None and not resume and not overwrite:
        raise PrefdataError(
            f"{output} already has checkpoints ({checkpoint.name}): pass --resume to continue that run, "
            "or choose an empty --output"
        )
    if resume and checkpoint is not None:
        return load_checkpoint(checkpoint, policy, optimizer, scheduler, config, device)
    return 0
