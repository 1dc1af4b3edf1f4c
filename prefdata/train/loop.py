"""The optimizer-step loop of `prefdata train`: micro-batches, accumulation, clipping, metrics lines,
the stall detector, periodic eval and checkpoints, and an exact checkpoint on Ctrl-C."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prefdata.train.checkpoint import save_checkpoint
from prefdata.train.data import PairData, epoch_batches
from prefdata.train.metrics import Sums, TrainResult, Window, append_jsonl
from prefdata.train.runtime import (
    all_reduce_gradients,
    all_reduce_sum,
    clip_gradients,
    rng_state,
)
from prefdata.train.stall import (StallDetector, TrainingStalled, format_stall_message, require_finite_parameters,
                                  require_finite_step)
from prefdata.train.step import PairForward, forward_pairs, run_eval, weighted_loss_sum


@dataclass
class Schedule:
    """How the data is cut into steps: a pure function of (seed, epoch), the same on every rank."""

    batch_pairs: int
    batch_tokens: int | None
    grad_accum: int
    seed: int
    rank: int
    world_size: int
    max_steps: int | None
    epochs: int
    shuffle: bool = True

    def batches(self, data: PairData, epoch: int) -> list[list[int]]:
        return epoch_batches(data, epoch, self.seed, self.batch_pairs, self.batch_tokens, self.world_size,
                             self.shuffle)

    def tokens_before(self, data: PairData, step: int) -> int:
        """TRL's cumulative token count after `step` steps (so a resumed run continues it)."""
        per_epoch = self.steps_per_epoch(data)
        total = 0
        for epoch in range(step // per_epoch + 1):
            batches = self.batches(data, epoch)[: (min(step - epoch * per_epoch, per_epoch)) * self.micro_per_step]
            total += sum(sum(data.pair_tokens_of(b)) for b in batches)
        return total

    @property
    def micro_per_step(self) -> int:
        return self.grad_accum * self.world_size

    def steps_per_epoch(self, data: PairData) -> int:
        return math.ceil(len(self.batches(data, 0)) / self.micro_per_step)

    def total_steps(self, data: PairData) -> int:
        return self.max_steps if self.max_steps is not None else self.epochs * self.steps_per_epoch(data)


@dataclass
class Loop:
    """Everything the loop reads; built by the recipe."""

    policy: Any
    fwd: PairForward
    optimizer: torch.optim.Optimizer
    scheduler: Any
    params: list[torch.nn.Parameter]
    data: PairData
    eval_data: PairData | None
    schedule: Schedule
    stall: StallDetector
    output: Path
    metrics_path: Path
    config: dict[str, Any]
    max_grad_norm: float | None
    log_every: int
    eval_every: int | None
    save_every: int | None
    fail_on_stall: bool
    progress: bool


def run_steps(loop: Loop, result: TrainResult, step: int) -> int:
    """Run optimizer steps from `step` to the planned total; returns the steps completed."""
    from tqdm.auto import tqdm

    from prefdata.core.quiet import bar_disable

    sched, data = loop.schedule, loop.data
    is_main = sched.rank == 0
    steps_per_epoch = sched.steps_per_epoch(data)
    total_steps = sched.total_steps(data)
    bar = tqdm(total=total_steps, initial=step, desc="train", unit="step", disable=bar_disable(loop.progress and is_main),
               dynamic_ncols=True)
    window = Window(sched.tokens_before(data, step) if step else 0)
    planned_epoch, batches = -1, []
    rng_at_step_start = rng_state()
    loop_started = time.perf_counter()
    first_step = step
    try:
        while step < total_steps:
            epoch, step_in_epoch = divmod(step, steps_per_epoch)
            if epoch != planned_epoch:
                planned_epoch, batches = epoch, sched.batches(data, epoch)
            per = sched.micro_per_step
            step_batches = batches[step_in_epoch * per : (step_in_epoch + 1) * per]
            rng_at_step_start = rng_state()
            started = time.perf_counter()
            non_finite_rows: list[int] = []
            sums = _accumulate(loop, step_batches, non_finite_rows)
            grad_norm = clip_gradients(loop.params, loop.max_grad_norm)
            # Before the optimizer sees them: a NaN or inf here would make every parameter NaN.
            require_finite_step(step + 1, float(sums[Sums.INDEX["loss"]]), grad_norm, loop.data, non_finite_rows)
            step_lr = loop.scheduler.get_last_lr()[0]
            loop.optimizer.step()
            loop.scheduler.step()
            loop.optimizer.zero_grad(set_to_none=True)
            step += 1

            step_metrics = Sums.means(sums)
            window.add(sums, grad_norm, step_lr, time.perf_counter() - started)
            bar.update(1)
            bar.set_postfix(loss=f"{step_metrics['loss']:.4f}", acc=f"{step_metrics['rewards/accuracies']:.2f}")
            _check_stall(loop, result, step, step_metrics, grad_norm, step_lr, bar,
                         rows=[row for micro in step_batches for row in micro])
            if step % loop.log_every == 0 or step == total_steps:
                line = window.flush(step, step / steps_per_epoch, time.perf_counter() - loop_started)
                result.last_metrics = line
                if is_main:
                    append_jsonl(loop.metrics_path, line)
            if loop.eval_data is not None and loop.eval_every and step % loop.eval_every == 0 and step < total_steps:
                result.eval_metrics = run_eval(
                    loop.fwd, loop.eval_data, batch_pairs=sched.batch_pairs, batch_tokens=sched.batch_tokens,
                    rank=sched.rank, world_size=sched.world_size, step=step, epoch=step / steps_per_epoch,
                    metrics_path=loop.metrics_path)
                loop.policy.train()
            if loop.save_every and step % loop.save_every == 0 and step < total_steps:
                require_finite_parameters(loop.params, step)
                save_checkpoint(loop.output, step, loop.policy, loop.optimizer, loop.scheduler, loop.config,
                                rng_state(), is_main)
    except KeyboardInterrupt:
        # The weights and optimizer are those of `step` completed steps; the partial step's gradients
        # are dropped and the RNG goes back to where that step began, so --resume is still exact.
        save_checkpoint(loop.output, step, loop.policy, loop.optimizer, loop.scheduler, loop.config,
                        rng_at_step_start, is_main)
        bar.close()
        raise
    _check_stall(loop, result, step, None, 0.0, 0.0, bar, steps_run=step - first_step)
    bar.close()
    require_finite_parameters(loop.params, step)  # the recipe saves the model next
    return step


def _accumulate(loop: Loop, step_batches: list[list[int]], non_finite_rows: list[int] | None = None) -> torch.Tensor:
    """Forward + backward over this rank's micro-batches of one step; returns the step's sums and
    adds to `non_finite_rows` the dataset rows whose loss is not finite."""
    sched = loop.schedule
    # Across ranks: the loss is a global weighted mean, Σ w·loss / Σ w over the step (w = 1 without a
    # `weight` column: the plain mean over the step's pairs).
    step_weight = sum(sum(loop.data.weights_of(b)) for b in step_batches)
    sums = torch.zeros(Sums.SIZE, dtype=torch.float64)
    for micro in step_batches[sched.rank :: sched.world_size]:  # this rank's share of the step
        out, logps, n_tokens = forward_pairs(loop.fwd, loop.data, micro)
        # This micro-batch's share of the step's weighted mean: accumulation and ranks add up to it.
        weighted_loss_sum(out.losses, loop.data.weights_of(micro), step_weight).backward()
        sums += Sums.of(out, logps, n_tokens)
        if non_finite_rows is not None and not math.isfinite(float(sums[Sums.INDEX["loss"]])):
            bad = (~torch.isfinite(out.losses.detach())).nonzero().flatten().tolist()
            non_finite_rows.extend(micro[i] for i in bad)
    if sched.world_size > 1:
        all_reduce_gradients(loop.params)
        sums = all_reduce_sum(sums, loop.fwd.device)
    return sums


def _check_stall(loop: Loop, result: TrainResult, step: int, step_metrics: dict[str, float] | None, grad_norm: float,
                 step_lr: float, bar: Any, steps_run: int = 0, rows: list[int] | None = None) -> None:
    """After each step (`step_metrics`), and once at the end of the run (None: a short run whose
    every step stalled, fewer than --stall-steps, is reported too)."""
    if step_metrics is None:
        event = loop.stall.finish(step, steps_run)
    else:
        event = loop.stall.update(step, step_metrics["loss"], step_metrics["abs_margin"], grad_norm, step_lr, rows)
    if event is None:
        return
    result.stall_events.append(event)
    if loop.schedule.rank == 0:
        append_jsonl(loop.metrics_path, {k: v for k, v in event.items() if k != "message"} | {"message": event["message"]})
        bar.write("warning: " + format_stall_message(event), file=sys.stderr)
    if loop.fail_on_stall:
        raise TrainingStalled(
            f"training stalled at step {step}: loss {event['loss']:.4f} stayed at its zero-margin value "
            f"for {event['stalled_steps']} steps (see {loop.metrics_path})"
        )
