"""Checkpoints (trainable weights, optimizer, scheduler, RNG, step) and the final saved model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from prefdata.core.errors import PrefdataError
from prefdata.train.runtime import set_rng_state

CHECKPOINT_DIR = "checkpoints"
OPTIMIZER_DIR = "optimizer"  # a finished run's optimizer and schedule, for a run that continues it
# Settings that shape the trajectory: a resume with any of them changed would not continue the run.
RESUME_KEYS = (
    "loss", "beta", "label_smoothing", "simpo_gamma", "lr", "epochs", "max_steps", "batch_tokens",
    "batch_pairs", "grad_accum", "seed", "warmup_ratio", "max_grad_norm", "lora", "world_size", "layout", "shuffle",
    "lr_schedule", "schedule_steps", "optimizer_from", "ld_alpha",
)


def latest_checkpoint(output: Path) -> Path | None:
    root = output / CHECKPOINT_DIR
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step-*") if (p / "state.json").is_file())
    return done[-1] if done else None


def save_checkpoint(output: Path, step: int, policy, optimizer, scheduler, config: dict[str, Any],
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


def load_checkpoint(path: Path, policy, optimizer, scheduler, config: dict[str, Any], device: torch.device) -> int:
    state = json.loads((path / "state.json").read_text())
    saved = state["config"]
    changed = [k for k in RESUME_KEYS if saved.get(k) != config.get(k)]
    if changed:
        detail = ", ".join(f"{k}: {saved.get(k)!r} -> {config.get(k)!r}" for k in changed)
        raise PrefdataError(f"cannot resume from {path}: settings changed ({detail})")
    trainable = torch.load(path / "trainable.pt", map_location=device, weights_only=True)
    missing = policy.load_state_dict(trainable, strict=False)
    if missing.unexpected_keys:
        raise PrefdataError(f"checkpoint {path} does not match the model ({missing.unexpected_keys[0]} unexpected)")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    return int(state["step"])


def save_final_model(policy, tokenizer, output: Path, lora: bool) -> None:
    """save_pretrained + tokenizer in `output`, loadable with AutoModelForCausalLM (an image OUT's
    policy: AutoModelForImageTextToText, `tokenizer` being its processor). LoRA: the adapter goes to
    output/adapter and the merged model to output."""
    if lora:
        policy.save_pretrained(str(output / "adapter"))
        policy = policy.merge_and_unload()
    policy.config.use_cache = True
    policy.save_pretrained(str(output))
    tokenizer.save_pretrained(str(output))


def save_optimizer_state(output: Path, optimizer, scheduler) -> None:
    """The optimizer and schedule at the end of a run, to `output/optimizer/` (temporary dir + rename)."""
    save_optimizer_states(output, optimizer.state_dict(), scheduler.state_dict())


def save_optimizer_states(output: Path, optimizer_state: dict, scheduler_state: dict) -> None:
    """`save_optimizer_state` from the state dicts (an online run's optimizer kept in memory)."""
    final = output / OPTIMIZER_DIR
    tmp = output / f".tmp-{OPTIMIZER_DIR}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(scheduler_state, tmp / "scheduler.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


def load_optimizer_state(run_dir: Path, optimizer, scheduler, device: torch.device) -> None:
    """Continue the optimizer and schedule an earlier run saved with `save_optimizer_state`."""
    state = run_dir / OPTIMIZER_DIR
    if not (state / "optimizer.pt").is_file() or not (state / "scheduler.pt").is_file():
        raise PrefdataError(f"{run_dir} has no saved optimizer state ({OPTIMIZER_DIR}/optimizer.pt, scheduler.pt)")
    try:
        optimizer.load_state_dict(torch.load(state / "optimizer.pt", map_location=device, weights_only=True))
    except (ValueError, KeyError) as exc:
        raise PrefdataError(f"the optimizer state in {state} does not fit this model: {exc}") from None
    scheduler.load_state_dict(torch.load(state / "scheduler.pt", weights_only=True))


RUN_CONFIG = "train_config.json"  # written at the start of every run: what marks a directory as a run's output


def check_output(output: Path, *, resume: bool, overwrite: bool, out_dirs: list[Path], inputs: list[Any]) -> None:
    """Before anything is loaded: --output may be written. A new or empty directory always; one that
    holds a run only with --resume (which needs a checkpoint there) or --overwrite (which replaces
    the run, and only a run: a directory train did not write is never emptied). `out_dirs` (the data
    read) may not hold the output, and no input (`inputs`: data, model, optimizer state) may lie inside it."""
    from prefdata.io.out_dir import refuse_inputs_inside

    if resume and overwrite:
        raise PrefdataError("--resume continues the run in --output and --overwrite replaces it: pass one of them")
    if output.exists() and not output.is_dir():
        raise PrefdataError(f"--output {output} exists and is not a directory")
    for out in out_dirs:
        if out.resolve() == output.resolve() or out.resolve() in output.resolve().parents:
            raise PrefdataError(f"--output {output} lies inside the prepared data {out}: train writes nothing into its input")
    refuse_inputs_inside(output, [*out_dirs, *inputs], "writes into")
    if resume:
        if latest_checkpoint(output) is None:
            raise PrefdataError(f"no checkpoint found in {output} ({CHECKPOINT_DIR}/step-*): nothing to resume; "
                                "drop --resume to start a new run")
        return
    held = sorted(entry.name for entry in output.iterdir()) if output.is_dir() else []
    if not held:
        return
    checkpoint = latest_checkpoint(output)
    if not overwrite:
        names = f"{', '.join(held[:3])}{', ...' if len(held) > 3 else ''}"
        has = (f"has checkpoints ({checkpoint.name})" if checkpoint is not None
               else f"holds a run ({names})" if (output / RUN_CONFIG).is_file() else f"is not empty ({names})")
        raise PrefdataError(f"{output} already {has}: pass --resume to continue that run, --overwrite to "
                            "replace it, or choose an empty --output")
    if not (output / RUN_CONFIG).is_file():
        raise PrefdataError(f"{output} holds files that prefdata train did not write ({', '.join(held[:3])}); "
                            "refusing to replace them even with --overwrite: choose an empty --output")


def clear_output(output: Path) -> None:
    """--overwrite: the earlier run's files go (checkpoints, metrics, model), so none of them mixes
    with the new run's. Called once every check has passed, just before the new run writes."""
    if not (output / RUN_CONFIG).is_file():  # re-checked: never empty a directory train did not write
        return
    for entry in output.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
