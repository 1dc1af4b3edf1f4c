"""Preference losses over per-sequence log-probs.

Every loss takes the summed completion log-probs of the policy (and, except SimPO, of the
reference) for the chosen and the rejected half of each pair, and returns per-pair losses plus the
implicit rewards TRL logs. Formulas follow TRL 1.16 (`DPOTrainer._compute_loss`, and
`experimental/cpo` for SimPO) so metrics are comparable:

  Δ = (πc - rc) - (πr - rr)                    log-ratio margin (sums over completion tokens)
  sigmoid  -(1-ε)·logσ(βΔ) - ε·logσ(-βΔ)       DPO; ε > 0 is conservative DPO (cDPO)
  ipo      (Δc/|yc| - Δr/|yr| - 1/(2β))²        IPO eq. 17, log-ratios averaged per completion
                                                token as TRL does (confirmed with the IPO authors)
  hinge    relu(1 - βΔ)                         SLiC
  robust   (-(1-ε)·logσ(βΔ) + ε·logσ(-βΔ)) / (1-2ε)   rDPO, unbiased under label noise ε < 0.5
  simpo    -(1-ε)·logσ(β·m) - ε·logσ(-β·m),  m = πc/|yc| - πr/|yr| - γ/β
           reference-free, length-normalized, target margin γ (TRL's `simpo_gamma`)

Rewards: β·(π - r) per half (β·π/|y| for SimPO), detached, as TRL logs them.

LD-DPO (length-desensitized, TRL's `ld_alpha`): before any loss, each half's log-prob sum, of the
policy and of the reference alike, becomes  public + α·(all - public), where `public` sums the half's
first min(|yc|, |yr|) completion tokens (`length_desensitized`). α = 1 is plain DPO; α = 0 ignores
the tokens the longer half has beyond the shorter one.

Offsets (ODPO, arXiv 2402.10571; OUT's `offset` column): a per-pair margin δ the chosen half must win
by. The logit each loss reads, z = βΔ (β·m for SimPO), becomes z - δ: sigmoid -logσ(βΔ - δ), robust
likewise, hinge relu(1 - (βΔ - δ)). δ = 0 is the plain loss. IPO has no logit (a squared distance to
its own target 1/(2β)), so it takes no offsets. Per-pair weights are not a loss's business: the
trainer weighs the per-pair losses this returns (prefdata.train.step.weighted_loss_sum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

LossType = Literal["sigmoid", "ipo", "hinge", "robust", "simpo"]
LOSS_TYPES: tuple[str, ...] = ("sigmoid", "ipo", "hinge", "robust", "simpo")
REFERENCE_FREE_LOSSES = frozenset({"simpo"})
DEFAULT_SIMPO_GAMMA = 0.5  # TRL's CPOConfig default


@dataclass
class LossOutput:
    losses: torch.Tensor  # [num_pairs], differentiable; the training loss is its mean
    chosen_rewards: torch.Tensor  # [num_pairs], detached
    rejected_rewards: torch.Tensor  # [num_pairs], detached


def length_desensitized(logps: torch.Tensor, public_logps: torch.Tensor, alpha: float) -> torch.Tensor:
    """LD-DPO's sum: the public part in full, the rest weighted by `alpha` (TRL: shared + α·tail)."""
    return public_logps + alpha * (logps - public_logps)


def _require_counts(name: str, chosen_counts: torch.Tensor | None, rejected_counts: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if chosen_counts is None or rejected_counts is None:
        raise ValueError(f"loss {name!r} is length-normalized: pass chosen_counts and rejected_counts")
    # clamp(min=1) as TRL does: a zero-token half cannot divide by zero (prepare drops those anyway)
    return chosen_counts.to(torch.float32).clamp(min=1.0), rejected_counts.to(torch.float32).clamp(min=1.0)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    *,
    loss_type: str,
    beta: float,
    label_smoothing: float = 0.0,
    chosen_counts: torch.Tensor | None = None,
    rejected_counts: torch.Tensor | None = None,
    simpo_gamma: float = DEFAULT_SIMPO_GAMMA,
    offsets: torch.Tensor | None = None,
) -> LossOutput:
    """Per-pair preference losses and rewards; all arithmetic in fp32. `offsets`: ODPO's per-pair δ."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss {loss_type!r}; choose one of {', '.join(LOSS_TYPES)}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing and loss_type in ("ipo", "hinge"):
        raise ValueError(f"label_smoothing is not defined for loss {loss_type!r}")

    if offsets is not None and loss_type == "ipo":
        raise ValueError("loss 'ipo' takes no per-pair offsets (it has no logit to shift); use sigmoid, robust or hinge")
    pc = policy_chosen.float()
    pr = policy_rejected.float()
    eps = label_smoothing
    shift = 0.0 if offsets is None else offsets.float().to(pc.device)  # ODPO: the logit minus δ

    if loss_type == "simpo":
        nc, nr = _require_counts("simpo", chosen_counts, rejected_counts)
        avg_c, avg_r = pc / nc.to(pc.device), pr / nr.to(pr.device)
        logit = beta * (avg_c - avg_r - simpo_gamma / beta) - shift
        losses = -(1 - eps) * F.logsigmoid(logit) - eps * F.logsigmoid(-logit)
        return LossOutput(losses, (beta * avg_c).detach(), (beta * avg_r).detach())

    if ref_chosen is None or ref_rejected is None:
        raise ValueError(f"loss {loss_type!r} needs reference log-probs")
    chosen_logratios = pc - ref_chosen.float().to(pc.device)
    rejected_logratios = pr - ref_rejected.float().to(pr.device)
    delta = chosen_logratios - rejected_logratios
    logit = beta * delta - shift

    if loss_type == "sigmoid":
        losses = -(1 - eps) * F.logsigmoid(logit) - eps * F.logsigmoid(-logit)
    elif loss_type == "robust":
        losses = (-(1 - eps) * F.logsigmoid(logit) + eps * F.logsigmoid(-logit)) / (1 - 2 * eps)
    elif loss_type == "hinge":
        losses = torch.relu(1 - logit)
    else:  # ipo
        nc, nr = _require_counts("ipo", chosen_counts, rejected_counts)
        ipo_delta = chosen_logratios / nc.to(pc.device) - rejected_logratios / nr.to(pr.device)
        losses = (ipo_delta - 1 / (2 * beta)) ** 2

    return LossOutput(losses, (beta * chosen_logratios).detach(), (beta * rejected_logratios).detach())
