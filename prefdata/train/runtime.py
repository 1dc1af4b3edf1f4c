"""Settings checks, devices, distributed setup, seeding/RNG state and gradient helpers for `train`."""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prefdata.core.errors import PrefdataError
from prefdata.model.losses import LOSS_TYPES

if TYPE_CHECKING:
    from prefdata.settings.commands import TrainSettings


def check_settings(s: TrainSettings) -> None:
    """The loss and optimizer settings' ranges: one line naming the flag, before anything loads."""
    if s.loss not in LOSS_TYPES:
        raise PrefdataError(f"unknown loss {s.loss!r}: choose one of {', '.join(LOSS_TYPES)}")
    if s.beta <= 0:
        raise PrefdataError(f"--beta must be > 0, got {s.beta}")
    if not 0.0 <= s.label_smoothing < 0.5:
        raise PrefdataError(f"--label-smoothing must be in [0, 0.5), got {s.label_smoothing}")
    if s.label_smoothing and s.loss in ("ipo", "hinge"):
        raise PrefdataError(f"--label-smoothing is not defined for --loss {s.loss}")
    if s.ld_alpha is not None and not 0.0 <= s.ld_alpha <= 1.0:
        raise PrefdataError(f"--ld-alpha must be in [0, 1], got {s.ld_alpha}")
    if s.ld_alpha is not None and s.loss == "simpo":
        raise PrefdataError("--ld-alpha weighs log-prob ratios against the reference (LD-DPO); it is not defined for --loss simpo")
    if s.lr < 0:
        raise PrefdataError(f"--lr must be >= 0, got {s.lr}")
    if s.max_steps is None and s.epochs < 1:
        raise PrefdataError(f"--epochs must be >= 1, got {s.epochs}")
    if s.max_steps is not None and s.max_steps < 1:
        raise PrefdataError(f"--max-steps must be >= 1, got {s.max_steps}")
    if s.batch_tokens is not None and s.batch_tokens < 1:
        raise PrefdataError(f"--batch-tokens must be >= 1, got {s.batch_tokens}")
    if s.batch_pairs < 1 or s.grad_accum < 1 or s.log_every < 1 or s.stall_steps < 1:
        raise PrefdataError("--batch-pairs, --grad-accum, log_every and stall_steps must be >= 1")
    if not 0.0 <= s.warmup_ratio <= 1.0:
        raise PrefdataError(f"warmup_ratio must be in [0, 1], got {s.warmup_ratio}")
    if (s.save_every is not None and s.save_every < 0) or (s.eval_every is not None and s.eval_every < 0):
        raise PrefdataError("save_every and eval_every must be >= 0")


def init_distributed(device: str) -> tuple[int, int, bool]:
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


def resolve_device(device: str) -> torch.device:
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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state() -> dict[str, Any]:
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


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], np.array(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"], npy["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def clip_gradients(params: list[torch.nn.Parameter], max_grad_norm: float | None) -> float:
    """Total gradient norm before clipping (what TRL logs as grad_norm); clips when a max is set."""
    limit = max_grad_norm if max_grad_norm and max_grad_norm > 0 else float("inf")
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(with_grad, limit))


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
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


def all_reduce_sum(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    import torch.distributed as dist

    buffer = values.to(device)
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
    return buffer.cpu()
