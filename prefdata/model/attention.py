"""Block attention for padding-free rows: each attention block of a row (one half, or one
shared-prompt pair) runs through PyTorch's SDPA on its own, so no row-wide mask is built and no
work is spent on pairs that cannot see each other.

transformers calls the attention function named by `config._attn_implementation` with the extra
keyword arguments given to the model's forward. `block_attention` registers a function under its
own name for the duration of one forward and hands it the row's `AttentionBlocks`; that name has no
mask function in transformers, so the model builds no mask of its own. Causal blocks, and the
prompt + chosen part of a shared-prompt block, use SDPA's causal kernel with no mask; the rejected
tokens of a shared block attend the prompt's keys and their own under a small boolean mask
[R, P + R], so no score against chosen is ever computed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from prefdata.tokenize.masks import AttentionBlocks

ATTENTION_NAME = "prefdata_blocks"
BLOCKS_KWARG = "prefdata_blocks"
MASKS_KWARG = "prefdata_rejected_masks"
_registered = False


def _blocks_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; query [1, H, T, D] -> output [1, T, H, D]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    blocks: AttentionBlocks = kwargs.pop(BLOCKS_KWARG)
    rejected_masks = kwargs.pop(MASKS_KWARG)
    kwargs.pop("is_causal", None)

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        out, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling,
                                        is_causal=mask is None, **kwargs)
        return out

    # Cut the row with one split (its backward is one concatenation), never with per-block slices
    # (each slice's backward would add a zero-filled row-sized gradient).
    q_sizes, kv_sizes = [], []
    for (start, end), parts in zip(blocks.bounds, blocks.shared):
        if parts is None:
            q_sizes.append(end - start)
            kv_sizes.append(end - start)
        else:
            p, c, r = parts
            q_sizes += [p + c, r]
            kv_sizes += [p, c, r]
    qs = iter(query.split(q_sizes, dim=2))
    ks, vs = iter(key.split(kv_sizes, dim=2)), iter(value.split(kv_sizes, dim=2))
    outputs = []
    for parts, mask in zip(blocks.shared, rejected_masks):
        if parts is None:  # one causal block: SDPA's causal kernel, no mask
            outputs.append(sdpa(next(qs), next(ks), next(vs), None))
            continue
        q_head, q_rejected = next(qs), next(qs)
        k_prompt, k_chosen, k_rejected = next(ks), next(ks), next(ks)
        v_prompt, v_chosen, v_rejected = next(vs), next(vs), next(vs)
        if q_head.shape[2]:  # prompt + chosen: plain causal
            outputs.append(sdpa(q_head, torch.cat([k_prompt, k_chosen], dim=2), torch.cat([v_prompt, v_chosen], dim=2),
                                None))
        if q_rejected.shape[2]:  # rejected queries over the prompt's keys and their own, never chosen's
            outputs.append(sdpa(q_rejected, torch.cat([k_prompt, k_rejected], dim=2),
                                torch.cat([v_prompt, v_rejected], dim=2), mask))
    return torch.cat(outputs, dim=1), None


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(ATTENTION_NAME, _blocks_forward)
        _registered = True


def model_body(model: Any) -> Any:
    """The decoder stack without the output head (a vision-language model's: vision tower,
    projector and language model)."""
    body = getattr(model, "model", None)
    if body is None:
        body = model.get_decoder()
    return body


def text_body(model: Any) -> Any:
    """The language model that builds the attention mask and runs attention: the body itself, or a
    vision-language body's `language_model` (Idefics3 / SmolVLM: `text_model`), whose config carries
    the attention implementation."""
    body = model_body(model)
    return getattr(body, "language_model", None) or getattr(body, "text_model", None) or body


def supports_blocks(model: Any) -> bool:
    """Whether block attention can run this model: a decoder that builds its mask with transformers'
    `create_causal_mask` and dispatches attention by name (Llama, Qwen2, Mistral, ...), with no
    sliding-window layers and not using a mask-only implementation."""
    if getattr(model, "config", None) is None:
        return False
    body = text_body(model)  # a vision-language model's language model: its mask, its attention
    config = getattr(body, "config", None) or model.config
    module = sys.modules.get(type(body).__module__)
    if module is None or not hasattr(module, "create_causal_mask") or not hasattr(module, "ALL_ATTENTION_FUNCTIONS"):
        return False
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    return not getattr(config, "attn_logit_softcapping", None)


@contextmanager
def block_attention(model: Any, blocks: AttentionBlocks) -> Iterator[dict[str, Any]]:
    """Inside: the model's attention runs block by block; yields the kwargs to pass to its forward.

    The previous implementation is restored on exit. Backward needs no config (autograd holds the
    graph), so the forward alone runs under the switch. Only the language model switches: setting a
    composite (vision-language) config would switch its vision tower too.
    """
    _register()
    config = getattr(text_body(model), "config", None) or model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        device = next(model.parameters()).device
        yield {BLOCKS_KWARG: blocks, MASKS_KWARG: blocks.rejected_masks(device)}
    finally:
        config._attn_implementation = previous
