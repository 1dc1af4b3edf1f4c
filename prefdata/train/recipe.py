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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prefdata.core.errors import PrefdataError
from prefdata.model.losses import REFERENCE_FREE_LOSSES
from prefdata.model.pairs import choose_layout
from prefdata.settings.commands import TrainSettings
from prefdata.settings.declare import settings_command
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


@settings_command(TrainSettings)  # settings=TrainSettings(...) or flat keywords: prefdata.settings
def train(
    out_dir: str | Path,
    settings: TrainSettings,
    *,
    loaded_policy: Any = None,
    loaded_optimizer: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> TrainResult:
    """Train a policy with a preference loss on OUT/ and save it to `output`.

    Each setting is declared once, in `prefdata.settings.commands.TrainSettings` (the same text as
    `prefdata train --help`); pass `settings=TrainSettings(...)`, flat keywords (`lr=1e-5`), or both.

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
    s = settings
    check_settings(s)
    _check_schedule(s.lr_schedule, s.schedule_steps)
    out_dir, output = Path(out_dir), Path(s.output)  # type: ignore[arg-type]
    # Before the ranks meet in init_distributed: no rank has written --output yet when each checks it.
    check_output(output, resume=s.resume, overwrite=s.overwrite,
                 out_dirs=[Path(d) for d in (out_dir, s.eval_dir) if d], inputs=[s.model, s.optimizer_from, s.processor])
    rank, world_size, created_group = init_distributed(s.device)  # torchrun: every rank plans the same batches
    run = _set_up(out_dir, s, rank, world_size, loaded_policy, loaded_optimizer)

    # 5. resume or start clean, then the loop
    metrics_path = output / METRICS_FILE
    step = _resume_step(output, s.resume, s.overwrite, run.policy, run.optimizer, run.scheduler, run.config, run.device)
    result = TrainResult(output_dir=output, steps=step, epochs=step / run.steps_per_epoch, metrics_path=metrics_path,
                         resumed_from_step=step if s.resume and step else None)
    if rank == 0:
        if s.overwrite:
            clear_output(output)  # the earlier run goes only now, once everything above has passed
        _start_output(output, metrics_path, step, run.config)
    stall = _stall_detector(s.stall_steps, s.loss, s.beta, s.label_smoothing, s.simpo_gamma, run.data)
    loop = Loop(policy=run.policy, fwd=run.fwd, optimizer=run.optimizer, scheduler=run.scheduler, params=run.params,
                data=run.data, eval_data=run.eval_data, schedule=run.schedule, stall=stall, output=output,
                metrics_path=metrics_path, config=run.config, max_grad_norm=s.max_grad_norm, log_every=s.log_every,
                eval_every=s.eval_every, save_every=s.save_every, fail_on_stall=s.fail_on_stall, progress=s.progress)
    result.steps = step = run_steps(loop, result, step)
    result.epochs = step / run.steps_per_epoch

    # 6. eval and save
    if run.eval_data is not None:
        result.eval_metrics = run_eval(run.fwd, run.eval_data, batch_pairs=s.batch_pairs, batch_tokens=s.batch_tokens,
                                       rank=rank, world_size=world_size, step=step, epoch=result.epochs,
                                       metrics_path=metrics_path)
    result.model = run.policy
    result.optimizer_state = (run.optimizer.state_dict(), run.scheduler.state_dict())
    if rank == 0 and s.save_model:
        _save(output, run.policy, run.image_processor if run.vision is not None else run.tokenizer, s.lora,
              s.save_optimizer, run.optimizer, run.scheduler)
    if world_size > 1:
        _leave_distributed(created_group)
    return result


@dataclass
class _Run:
    """What `train` sets up before its loop: data, model, forward, batch plan, optimizer, config."""

    device: torch.device
    data: Any
    eval_data: Any
    vision: Any
    image_processor: Any
    tokenizer: Any
    policy: Any
    fwd: PairForward
    schedule: Schedule
    steps_per_epoch: int
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    config: dict[str, Any]


def _set_up(out_dir: Path, s: TrainSettings, rank: int, world_size: int, loaded_policy: Any,
            loaded_optimizer: tuple[dict[str, Any], dict[str, Any]] | None) -> _Run:
    import transformers

    torch_device = resolve_device(s.device)
    # 1. data
    data, eval_data = _load_data(out_dir, s.eval_dir, s.loss, s.ld_alpha)

    # 2. policy and tokenizer (an image OUT: the processor, whose tokenizer made its ids)
    vision, image_processor, tokenizer = _processing(out_dir, Path(s.model), s.processor, data,  # type: ignore[arg-type]
                                                     s.trust_remote_code)
    if eval_data is not None:
        _check_eval_data(data, eval_data, out_dir, Path(s.eval_dir))  # type: ignore[arg-type]
    seed_everything(s.seed)
    policy = _load_policy(transformers, s.model, s.lora, torch_device, s.trust_remote_code, loaded_policy,
                          vision is not None)
    fwd = _pair_forward(policy, s.model, s.lora, s.layout, vision, data, eval_data, tokenizer, torch_device,
                        {"loss_type": s.loss, "beta": s.beta, "label_smoothing": s.label_smoothing,
                         "simpo_gamma": s.simpo_gamma}, s.ld_alpha)

    # 3. batch plan
    schedule = Schedule(batch_pairs=s.batch_pairs, batch_tokens=s.batch_tokens, grad_accum=s.grad_accum, seed=s.seed,
                        rank=rank, world_size=world_size, max_steps=s.max_steps, epochs=s.epochs, shuffle=s.shuffle)
    total_steps = schedule.total_steps(data)

    # 4. optimizer and schedule
    params = [p for p in policy.parameters() if p.requires_grad]
    span = s.schedule_steps if s.schedule_steps is not None else total_steps
    optimizer, scheduler, warmup_steps = _optimizer(params, s.lr, s.lr_schedule, s.warmup_ratio, span,
                                                    s.schedule_steps is not None, s.optimizer_from, torch_device,
                                                    loaded_optimizer)
    given: dict[str, Any] = {k: getattr(s, k) for k in _CONFIG_KEYS if k != "world_size"}
    given["world_size"] = world_size  # recorded last, as train_config.json always had it
    continued = IN_MEMORY if loaded_optimizer is not None else s.optimizer_from
    config = _run_config(given, out_dir, s.model, fwd.layout, data, total_steps, warmup_steps, span,  # type: ignore[arg-type]
                         continued, s.eval_dir)
    return _Run(torch_device, data, eval_data, vision, image_processor, tokenizer, policy, fwd, schedule,
                schedule.steps_per_epoch(data), params, optimizer, scheduler, config)


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
    # Fused: one kernel over all tensors (SmolLM2's 135M parameters on 2 CPU cores: 0.09 s a step
    # against 0.45); TRL's default optimizer (adamw_torch_fused) is the same kernel.
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                  fused=device.type in ("cuda", "cpu"))
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
