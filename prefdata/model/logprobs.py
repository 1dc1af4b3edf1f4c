"""Per-sequence completion log-probs: the forward code shared by `refs` and `train`.

The model body runs once over the batch; only the hidden states that predict a loss token go
through the output head, a chunk of rows at a time, so fp32 logits over the whole vocabulary are
never materialized for the whole batch. Sums are accumulated per sequence in fp32.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from prefdata.model.attention import block_attention, model_body, supports_blocks, text_body
from prefdata.model.mrope import computes_3d_positions, reads_text_positions
from prefdata.tokenize.masks import SequenceBatch

# Attention implementations whose transformers integration honours packed position ids: eager, sdpa
# and flex get a block-diagonal mask from `create_causal_mask` (when attention_mask is None), the
# flash kernels use the position ids for varlen attention.
_PACKING_ATTENTION = {"eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"}
# Of those, the kernels that skip the masked-out blocks; eager/sdpa attend over the whole packed row
# (quadratic in the row length), so padding sorted rows is cheaper for them.
_VARLEN_ATTENTION = {"flash_attention_2", "flash_attention_3"}

DEFAULT_CHUNK_ROWS = 1024
# Under grad the output head's fp32 logits are recomputed in backward (checkpointed) only when
# keeping them for the whole batch would take more than this: a 151k vocabulary needs 0.6 MB per
# token. Below it they are kept, as TRL keeps them, and backward skips a second head pass (a small
# model's fully online round spent about 10% of its step on that recompute).
KEEP_HEAD_LOGITS_BYTES = 256 * 2**20


def _attn_implementation(model: Any) -> str:
    config = getattr(text_body(model), "config", None) or getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "eager")


def supports_packing(model: Any) -> bool:
    """Whether the model's attention implementation handles packed position ids correctly.

    True only when the attention implementation is one transformers packs correctly AND the decoder
    builds its mask with `create_causal_mask` (the function that detects packing); models with
    their own mask code get padded batches instead. A model with 3-D (mrope) positions also needs a
    text model that reads the 1-D ids beside them (prefdata.model.mrope).
    """
    if _attn_implementation(model) not in _PACKING_ATTENTION:
        return False
    if computes_3d_positions(model) and not reads_text_positions(model):
        return False
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:  # older transformers: no packed-sequence detection
        return False
    module = sys.modules.get(type(text_body(model)).__module__)
    return module is not None and hasattr(module, "create_causal_mask")


def packing_is_efficient(model: Any) -> bool:
    """Whether packing saves compute (varlen attention kernels) rather than only padding."""
    return supports_packing(model) and _attn_implementation(model) in _VARLEN_ATTENTION


def plan_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Group row indices into batches of at most ``batch_tokens`` tokens, padding counted.

    Rows are sorted by length, longest first (so an out-of-memory shows up on the first batch), ties
    broken by index, so the plan is deterministic. A row longer than the budget gets a batch alone.
    """
    if batch_tokens <= 0:
        raise ValueError("batch_tokens must be positive")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        # Sorted descending: the first row of a batch is its widest; padded cost = rows * width.
        if current and (len(current) + 1) * width > batch_tokens:
            batches.append(current)
            current = []
        if not current:
            width = lengths[i]
        current.append(i)
    if current:
        batches.append(current)
    return batches


def plan_packed_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Group row indices into padding-free batches of at most ``batch_tokens`` tokens in all.

    Longest first, ties by index (deterministic); each batch takes rows in that order while they
    fit. A row longer than the budget gets a batch alone.
    """
    if batch_tokens <= 0:
        raise ValueError("batch_tokens must be positive")
    batches: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if current and used + lengths[i] > batch_tokens:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += lengths[i]
    if current:
        batches.append(current)
    return batches


def _head_logps(model: Any, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-prob of each target token from its hidden state (rows of one chunk), and the mean of
    the row's logits over the vocabulary (TRL's `logits/*` metrics; not differentiated)."""
    logits = model.get_output_embeddings()(hidden).float()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    scaling = getattr(config, "logits_scaling", None)  # Granite divides its logits
    if scaling:
        logits = logits / scaling
    softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 2 caps them
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1), logits.detach().mean(dim=-1)


@dataclass
class CompletionLogps:
    """Per-sequence sums over completion tokens (float32, on the model's device)."""

    logps: torch.Tensor  # [num_sequences], differentiable under grad
    counts: torch.Tensor  # long [num_sequences]: completion tokens that have a predicting token
    logit_sums: torch.Tensor  # [num_sequences], detached: sum over those tokens of the vocab-mean logit
    # With `public_pairs`: the sum over each half's first min(|yc|, |yr|) counted tokens (LD-DPO's
    # public length), differentiable like `logps`; else None.
    public_logps: torch.Tensor | None = None


def _hidden_states(model: Any, batch: SequenceBatch) -> torch.Tensor:
    """The decoder body's last hidden states [B, T, H] for the batch's layout."""
    kwargs: dict[str, Any] = {}
    if batch.pixel_inputs:  # image pairs: the vision tower runs inside the body's forward
        dtype = next(model.parameters()).dtype
        kwargs.update({k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.pixel_inputs.items()})
    with ExitStack() as stack:
        if batch.blocks is not None:
            kwargs.update(stack.enter_context(block_attention(model, batch.blocks)))
        out = model_body(model)(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=_forward_positions(model, batch),
            use_cache=False,  # a cache would switch off transformers' packed-sequence detection
            **kwargs,
        )
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _forward_positions(model: Any, batch: SequenceBatch) -> torch.Tensor:
    """The position ids the body gets: the batch's 1-D ids, or for a model with 3-D (mrope) positions
    the ones placed for it (prefdata.model.mrope). Text alone has the same id on every axis, so a
    text batch without them passes its 1-D ids (packed: four rows, the first read for packing)."""
    if batch.model_position_ids is not None:
        return batch.model_position_ids
    if computes_3d_positions(model):
        if batch.pixel_inputs:
            raise ValueError("this model computes 3-D (mrope) positions from its image grids: the batch needs them "
                             "(VisionInputs.rope, set by prefdata.model.vision_model.check_loaded_model)")
        if batch.layout == "packed":
            return batch.position_ids.unsqueeze(0).expand(4, -1, -1)
    return batch.position_ids


def _loss_sources(batch: SequenceBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of the loss tokens that have a predicting token, and of those predictors."""
    if batch.source_index is not None:
        source = batch.source_index.flatten()
        target_idx = (batch.loss_mask.flatten() & (source >= 0)).nonzero().squeeze(-1)
        return target_idx, source.index_select(0, target_idx)
    # Token t is predicted by position t-1 of the same sequence; position_ids > 0 guarantees that
    # t-1 is in the same row and the same sequence (also in packed rows).
    target_idx = (batch.loss_mask & (batch.position_ids > 0)).flatten().nonzero().squeeze(-1)
    return target_idx, target_idx - 1


def completion_logps(model: Any, batch: SequenceBatch, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                     public_pairs: bool = False, recompute_head: bool | None = None) -> CompletionLogps:
    """Sum of log-probs over each sequence's completion tokens, their counts and logit sums.

    `public_pairs`: the sequences are the halves of pairs, [chosen..., rejected...]; also sum each
    half's public part (`public_logps`, for LD-DPO). Only the hidden states that predict a completion token go through the output head (never a
    prompt position), a chunk of rows at a time; under grad each head chunk is recomputed in
    backward, so its logits are not kept, when they would take more than KEEP_HEAD_LOGITS_BYTES
    (`recompute_head` decides instead when given). A completion token with no predicting token (first token
    of an empty prompt) is not counted.
    """
    if batch.layout == "packed" and batch.input_ids.shape[0] > 0 and not supports_packing(model):
        raise ValueError(
            f"packed batches are not supported by attention implementation "
            f"{_attn_implementation(model)!r} of {type(model).__name__}; use right or left padding"
        )
    if batch.blocks is not None and not supports_blocks(model):
        raise ValueError(f"block layouts are not supported by {type(model).__name__}; use right or left padding")
    device = next(model.parameters()).device
    batch = batch.to(device)
    n = batch.num_sequences
    sums = torch.zeros(n, dtype=torch.float32, device=device)
    counts = torch.zeros(n, dtype=torch.long, device=device)
    logit_sums = torch.zeros(n, dtype=torch.float32, device=device)
    public = torch.zeros(n, dtype=torch.float32, device=device) if public_pairs else None
    if batch.input_ids.numel() == 0:
        return CompletionLogps(sums, counts, logit_sums, public)
    hidden = _hidden_states(model, batch)
    target_idx, source_idx = _loss_sources(batch)
    if target_idx.numel() == 0:
        return CompletionLogps(sums, counts, logit_sums, public)
    source_hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, source_idx)
    targets = batch.input_ids.flatten().index_select(0, target_idx)
    seq = batch.sequence_index.flatten().index_select(0, target_idx)

    keep_graph = torch.is_grad_enabled() and source_hidden.requires_grad
    if recompute_head is None:
        recompute_head = target_idx.numel() * _vocab_size(model) * 4 > KEEP_HEAD_LOGITS_BYTES
    token_logps, token_means = [], []
    for start in range(0, target_idx.numel(), chunk_rows):
        h = source_hidden[start : start + chunk_rows]
        t = targets[start : start + chunk_rows]
        if keep_graph and recompute_head:
            lp, mean = checkpoint(_head_logps, model, h, t, use_reentrant=False)
        else:
            lp, mean = _head_logps(model, h, t)
        token_logps.append(lp)
        token_means.append(mean)
    token_logps_all = torch.cat(token_logps)
    sums = sums.index_add(0, seq, token_logps_all)
    counts = counts.index_add(0, seq, torch.ones_like(seq))
    logit_sums = logit_sums.index_add(0, seq, torch.cat(token_means))
    if public is not None:
        in_public = _token_ranks(seq, counts) <= public_lengths(counts).index_select(0, seq)
        public = public.index_add(0, seq[in_public], token_logps_all[in_public])
    return CompletionLogps(sums, counts, logit_sums, public)


def _vocab_size(model: Any) -> int:
    """The output head's width (the vocabulary), from its weight; a head without one counts as huge."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None and weight.dim() == 2 else 1 << 40


def public_lengths(counts: torch.Tensor) -> torch.Tensor:
    """Per half of each pair ([chosen..., rejected...] counts): the public length min(|yc|, |yr|)
    that LD-DPO (TRL's `ld_alpha`) weights fully; the tokens after it get alpha."""
    n = counts.numel() // 2
    shortest = torch.minimum(counts[:n], counts[n:])
    return torch.cat([shortest, shortest])


def _token_ranks(seq: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """1-based place of each counted token within its sequence. `seq` lists the tokens in flat
    order, in which every layout keeps a sequence's tokens in completion order."""
    order = torch.argsort(seq, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    ranks = torch.empty_like(seq)
    ranks[order] = torch.arange(1, seq.numel() + 1, device=seq.device) - starts.index_select(0, seq[order])
    return ranks


def sequence_logps(
    model: Any, batch: SequenceBatch, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logps float32 [num_sequences], counts long [num_sequences])``: `completion_logps` without
    the logit sums."""
    out = completion_logps(model, batch, chunk_rows)
    return out.logps, out.counts
