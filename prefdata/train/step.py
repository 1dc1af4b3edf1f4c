"""One forward over a micro-batch of pairs: policy log-probs, the loss against the stored
reference, and evaluation over a whole split."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from prefdata.model.losses import LossOutput, dpo_loss, length_desensitized
from prefdata.model.pairs import PairLogps, pair_logps
from prefdata.model.vision_inputs import VisionInputs
from prefdata.train.data import PairData, plan_token_batches
from prefdata.train.metrics import Sums, append_jsonl
from prefdata.train.runtime import all_reduce_sum


@dataclass
class PairForward:
    """How micro-batches go through the policy: the same for training and eval."""

    model: Any  # the plain transformers model (for LoRA: the base model with adapters injected)
    layout: str
    pad_token_id: int
    device: torch.device
    loss_kwargs: dict[str, Any]
    autocast: Any = field(default_factory=nullcontext)
    ld_alpha: float | None = None  # LD-DPO: weight of the tokens past the shorter half's length
    vision: VisionInputs | None = None  # image OUT: how the images of a batch become pixel inputs


def forward_pairs(fwd: PairForward, data: PairData, rows: list[int]) -> tuple[LossOutput, PairLogps, int]:
    """Policy log-probs for both halves of `rows`, the loss against the stored reference, and the
    rows' token count (prompt twice + both completions: TRL's count, whatever the layout).

    With `ld_alpha` (LD-DPO, as TRL), policy and reference sums alike become public + α·(rest) before
    the loss, and the returned log-probs are those weighted sums (TRL logs them as logps/*)."""
    batch_rows = data.dataset[rows]
    # `--loss-on answer`: the policy sums the same answer tokens as the stored refs.
    starts = (None, None)
    if data.loss_on_answer:
        starts = (batch_rows["chosen_loss_start"], batch_rows["rejected_loss_start"])
    # Agent trajectories: the policy sums the same model turns as the stored refs (mask 1).
    masks = {}
    if data.has_loss_masks:
        masks = {"chosen_loss_masks": batch_rows["chosen_loss_mask"], "rejected_loss_masks": batch_rows["rejected_loss_mask"]}
    with fwd.autocast:
        ld = fwd.ld_alpha is not None
        # Image pairs: the batch's images, read here and decoded per batch (model/vision_inputs).
        pixels = {"pixels": (data.images_of(rows), fwd.vision)} if fwd.vision is not None else {}
        logps = pair_logps(fwd.model, batch_rows["prompt_ids"], batch_rows["chosen_ids"], batch_rows["rejected_ids"],
                           fwd.layout, fwd.pad_token_id, *starts, **({"public": True} if ld else {}), **pixels,
                           **masks)
        ref_c = ref_r = None
        if data.has_refs:
            ref_c, ref_r = (torch.tensor(batch_rows[f"ref_{half}_logps"], dtype=torch.float32, device=logps.chosen.device)
                            for half in ("chosen", "rejected"))
        if ld:
            alpha = float(fwd.ld_alpha)  # type: ignore[arg-type]
            logps = replace(logps, chosen=length_desensitized(logps.chosen, logps.chosen_public, alpha),
                            rejected=length_desensitized(logps.rejected, logps.rejected_public, alpha))
            if data.has_refs:
                ref_c, ref_r = (
                    length_desensitized(ref, torch.tensor(batch_rows[f"ref_{half}_public_logps"], dtype=torch.float32,
                                                          device=ref.device), alpha)
                    for ref, half in ((ref_c, "chosen"), (ref_r, "rejected"))
                )
        offsets = None if data.offsets is None else torch.tensor(data.offsets[rows], dtype=torch.float32)
        out = dpo_loss(logps.chosen, logps.rejected, ref_c, ref_r, chosen_counts=logps.chosen_counts,
                       rejected_counts=logps.rejected_counts, offsets=offsets, **fwd.loss_kwargs)
    return out, logps, sum(data.pair_tokens_of(rows))


def weighted_loss_sum(losses: torch.Tensor, weights: list[float], step_weight: float) -> torch.Tensor:
    """This micro-batch's part of the step loss  Σ w_i·loss_i / Σ w_i  (sums over the whole step).

    Normalizing by the step's weight sum, not its pair count, keeps the loss's scale (and so the
    learning rate that suits it) independent of the weights' overall scale: weights 1 give the plain
    mean exactly, weights c·w train as w does, and 0/1 weights train as if the 0-weight pairs were
    not there (as `prefdata select` would leave them out). A step whose weights are all 0 adds nothing."""
    # Each w_i / Σ w in float64 first: the ratio is in [0, 1] whatever the weights' scale, so float32
    # never sees a weight that overflows or underflows (nor 1 / Σ w in the backward pass).
    scale = step_weight if step_weight > 0 else 1.0
    w = torch.tensor([float(weight) / scale for weight in weights], dtype=losses.dtype, device=losses.device)
    return (w * losses).sum()


def zero_margin_loss(loss: str, beta: float, label_smoothing: float, simpo_gamma: float) -> float:
    """The loss when chosen and rejected score alike: where a stalled run sits (ln 2 for sigmoid)."""
    zero, one = torch.zeros(1), torch.ones(1)
    return float(dpo_loss(zero, zero, zero, zero, loss_type=loss, beta=beta, label_smoothing=label_smoothing,
                          chosen_counts=one, rejected_counts=one, simpo_gamma=simpo_gamma).losses[0])


def zero_margin_losses(loss: str, beta: float, label_smoothing: float, simpo_gamma: float,
                       offsets: Any) -> Any:
    """Each pair's loss when chosen and rejected score alike, given its ODPO offset δ (numpy, by
    row): -logσ(-δ) for sigmoid. A stalled run with offsets sits at their mean, not at ln 2."""
    import numpy as np

    with np.errstate(over="ignore"):  # an offset past float32 (only through the Python API) is inf: the run stops
        shift = torch.as_tensor(np.asarray(offsets, dtype=np.float32))
    zero, one = torch.zeros_like(shift), torch.ones_like(shift)
    out = dpo_loss(zero, zero, zero, zero, loss_type=loss, beta=beta, label_smoothing=label_smoothing,
                   chosen_counts=one, rejected_counts=one, simpo_gamma=simpo_gamma, offsets=shift)
    return out.losses.numpy().astype(np.float64)


@torch.no_grad()
def evaluate(fwd: PairForward, data: PairData, *, batch_pairs: int, batch_tokens: int | None, rank: int = 0,
             world_size: int = 1) -> dict[str, float]:
    """Mean loss, rewards and accuracy over every pair of `data` (sharded by rank, summed back)."""
    fwd.model.eval()
    if batch_tokens is None:
        batches = [data.rows[i : i + batch_pairs] for i in range(0, len(data.rows), batch_pairs)]
    else:
        planned = plan_token_batches(data.forward_tokens, batch_tokens, data.padding_free)
        batches = [[data.rows[i] for i in b] for b in planned]
    sums = torch.zeros(Sums.SIZE, dtype=torch.float64)
    for rows in batches[rank::world_size]:
        out, logps, n_tokens = forward_pairs(fwd, data, rows)
        sums += Sums.of(out, logps, n_tokens)
    if world_size > 1:
        sums = all_reduce_sum(sums, fwd.device)
    return {f"eval/{k}": v for k, v in Sums.means(sums).items() if k != "abs_margin"}


def run_eval(fwd: PairForward, data: PairData, *, batch_pairs: int, batch_tokens: int | None, rank: int,
             world_size: int, step: int, epoch: float, metrics_path: Path) -> dict[str, float]:
    """Evaluate, log the line (rank 0) and return the metrics."""
    metrics = evaluate(fwd, data, batch_pairs=batch_pairs, batch_tokens=batch_tokens, rank=rank, world_size=world_size)
    if rank == 0:
        append_jsonl(metrics_path, {"step": step, "epoch": round(epoch, 6), **metrics})
    return metrics
