"""Both halves of a batch of pairs through one model: the layout, where prefix sharing pays, and
per-pair log-probs. Used by `refs` (reference model, no grad) and `train` (policy, with grad).

Layouts: ``right``/``left`` pad each half to the batch's widest; ``packed`` relies on
transformers' packed-sequence detection; ``blocks`` and ``shared`` are padding-free rows of
attention blocks (prefdata.model.attention). In ``shared`` a pair's prompt goes through the model
once for both halves wherever that saves work (`share_pays`: whenever there is a prompt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from prefdata.model.attention import supports_blocks
from prefdata.model.logprobs import (
    completion_logps,
    packing_is_efficient,
    plan_batches,
    plan_packed_batches,
    supports_packing,
)
from prefdata.model.vision_inputs import VisionInputs
from prefdata.tokenize.masks import build_block_pair_batch, build_pair_batch

PAIR_LAYOUTS: tuple[str, ...] = ("right", "left", "packed", "blocks", "shared")
BLOCK_LAYOUTS = frozenset({"blocks", "shared"})


@dataclass
class PairLogps:
    """Per-pair sums over completion tokens, on the model's device."""

    chosen: torch.Tensor  # float32 [n], differentiable under grad
    rejected: torch.Tensor
    chosen_counts: torch.Tensor  # long [n]
    rejected_counts: torch.Tensor
    chosen_logit_sums: torch.Tensor  # float32 [n], detached (TRL's logits/chosen numerator)
    rejected_logit_sums: torch.Tensor
    tokens: int  # tokens put through the model (no padding counted)
    shared_pairs: int  # pairs whose prompt went through once
    # Sums over each half's first min(|yc|, |yr|) tokens (LD-DPO's public length), when asked for.
    chosen_public: torch.Tensor | None = None
    rejected_public: torch.Tensor | None = None


# Layouts where the model builds its own mask from the token types (an image's tokens attending each
# other both ways): one padded row per sequence. Packed rows are out: transformers' sliding-window
# mask reads the image-block ids at each token's position in its sequence, not in the row.
TYPE_ID_LAYOUTS = frozenset({"right", "left"})


def choose_layout(model: Any, layout: str, vision: VisionInputs | None = None) -> str:
    """``auto``: shared blocks where the model runs block attention, else packed where varlen
    kernels make it pay, else right padding. An explicit layout the model cannot run falls back to
    right padding (correctness first); so does any layout but right/left for a model whose image
    tokens attend each other both ways (`vision.type_ids_key`, Gemma 3)."""
    if layout not in PAIR_LAYOUTS and layout != "auto":
        raise ValueError(f"unknown layout {layout!r} (one of auto, {', '.join(PAIR_LAYOUTS)})")
    if vision is not None and vision.type_ids_key and layout not in TYPE_ID_LAYOUTS:
        return "right"
    if layout == "auto":
        if supports_blocks(model):
            return "shared"
        return "packed" if packing_is_efficient(model) else "right"
    if (layout in BLOCK_LAYOUTS and not supports_blocks(model)) or (layout == "packed" and not supports_packing(model)):
        return "right"
    return layout


def share_pays(prompt_len: int, chosen_len: int, rejected_len: int) -> bool:
    """Whether one shared-prompt block costs less than two separate halves.

    The shared block runs prompt + chosen causally, then rejected against the prompt's keys and its
    own, so its attention scores are (P+C)²/2 + R·P + R²/2 against (P+C)²/2 + (P+R)²/2 for two
    halves, and its projections and MLP see P fewer tokens, for the same number of attention calls.
    That is less work whenever there is a prompt to share and both halves have tokens.
    """
    return prompt_len > 0 and chosen_len > 0 and rejected_len > 0


def sharing_plan(prompts: list[list[int]], chosens: list[list[int]], rejecteds: list[list[int]]) -> list[bool]:
    """For each pair: share its prompt or not (`share_pays`)."""
    return sharing_plan_for_lengths(map(len, prompts), map(len, chosens), map(len, rejecteds))


def sharing_plan_for_lengths(prompt_lens: Any, chosen_lens: Any, rejected_lens: Any) -> list[bool]:
    """`sharing_plan` from lengths alone (for planning batches before any ids are read)."""
    return [share_pays(int(p), int(c), int(r)) for p, c, r in zip(prompt_lens, chosen_lens, rejected_lens)]


def pair_tokens(prompt_len: int, chosen_len: int, rejected_len: int, shared: bool) -> int:
    """Tokens one pair puts through the model in a padding-free layout."""
    return prompt_len * (1 if shared else 2) + chosen_len + rejected_len


def batch_costs(net: Any, layout: str, lens: dict[str, Any]) -> tuple[list[int], bool, int]:
    """What each pair costs in a batch under `layout`, whether batches are padding-free (sum of
    costs) or padded (rows x widest), and how many pairs share their prompt."""
    import numpy as np

    p, c, r = lens["prompt_ids"], lens["chosen_ids"], lens["rejected_ids"]
    if layout not in BLOCK_LAYOUTS:
        return (2 * (p + np.maximum(c, r))).astype(np.int64).tolist(), False, 0  # halves padded to the longer
    share = np.asarray(sharing_plan_for_lengths(p, c, r) if layout == "shared" else [False] * len(p), dtype=bool)
    return (p * np.where(share, 1, 2) + c + r).astype(np.int64).tolist(), True, int(share.sum())


def plan_pair_batches(net: Any, layout: str, lens: dict[str, Any], batch_tokens: int) -> tuple[list[list[int]], int]:
    """Row batches under a token budget, length-sorted, as every pair forward plans them (refs, the
    on_policy signal), and how many pairs share their prompt. `lens`: the id lists' lengths per row."""
    costs, padding_free, shared_pairs = batch_costs(net, layout, lens)
    return (plan_packed_batches if padding_free else plan_batches)(costs, batch_tokens), shared_pairs


def pair_logps(model: Any, prompts: list[list[int]], chosens: list[list[int]], rejecteds: list[list[int]],
               layout: str, pad_token_id: int, chosen_loss_starts: list[int] | None = None,
               rejected_loss_starts: list[int] | None = None, public: bool = False,
               pixels: tuple[Sequence[Sequence[Any] | None] | None, VisionInputs] | None = None,
               chosen_loss_masks: Sequence[Sequence[int] | None] | None = None,
               rejected_loss_masks: Sequence[Sequence[int] | None] | None = None) -> PairLogps:
    """Summed completion log-probs of both halves of every pair (``layout`` from `choose_layout`).

    With loss starts (`--loss-on answer`), each half sums (and counts) only its completion tokens
    from its loss start on; the tokens before stay in the sequence as context. `public`: also the
    sums over each half's public length (LD-DPO; `refs` stores them, `train --ld-alpha` weighs).
    Image pairs: `pixels` = (images, vision), the images (per pair, its prompt's images as OUT stores
    them) and the model's VisionInputs, feed the pixel inputs in the order the layout puts the image
    tokens (prefdata.model.vision_inputs), and a model with 3-D positions gets each sequence's own,
    placed in the layout (prefdata.model.mrope).
    Loss masks (OUT's `*_loss_mask`, None per row where absent): only the tokens marked 1 are summed
    and counted; tool results and user turns stay in the sequence as context."""
    n = len(prompts)
    shared = 0
    if layout in BLOCK_LAYOUTS:
        share = sharing_plan(prompts, chosens, rejecteds) if layout == "shared" else [False] * n
        shared = sum(share)
        batch = build_block_pair_batch(prompts, chosens, rejecteds, share, chosen_loss_starts, rejected_loss_starts,
                                       chosen_loss_masks, rejected_loss_masks)
    else:
        batch = build_pair_batch(prompts, chosens, rejecteds, layout, pad_token_id, chosen_loss_starts,
                                 rejected_loss_starts, chosen_loss_masks, rejected_loss_masks)
    images, vision = pixels if pixels is not None else (None, None)
    if vision is not None and images is not None:
        if vision.type_ids_key and layout not in TYPE_ID_LAYOUTS:
            raise ValueError(f"layout {layout!r} cannot give this model's image tokens their two-way attention; "
                             "use right or left padding")
        found = vision.for_batch(batch, images)
        batch.pixel_inputs = found.inputs
        if vision.rope is not None:  # text-only batches too: packed rows need the 4-row form
            batch.model_position_ids = vision.rope.for_batch(batch, prompts, list(chosens) + list(rejecteds),
                                                             found.grids)
    out = completion_logps(model, batch, public_pairs=public)  # sequences [chosen..., rejected...]
    return PairLogps(
        chosen=out.logps[:n], rejected=out.logps[n:], chosen_counts=out.counts[:n], rejected_counts=out.counts[n:],
        chosen_logit_sums=out.logit_sums[:n], rejected_logit_sums=out.logit_sums[n:], tokens=batch.num_tokens,
        shared_pairs=shared,
        chosen_public=out.public_logps[:n] if out.public_logps is not None else None,
        rejected_public=out.public_logps[n:] if out.public_logps is not None else None,
    )
