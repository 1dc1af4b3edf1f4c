"""Block attention for padding-free rows: each attention block of a row (one half, or one
shared-prompt pair) runs through PyTorch's SDPA on its own, so no row-wide mask is built and no
work is spent on pairs that cannot see each other.

transformers calls the attention function named by `config._attn_implementation` with the extra
keyword arguments given to the model's forward. `block_attention` registers a function under its
own name for the duration of one forward and hands it the row's `AttentionBlocks`; that name has no
mask function in transformers, so the model builds no mask of its own. Causal blocks use SDPA's
causal kernel; shared-prompt blocks a boolean block mask.
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
_registered = False


def _blocks_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; query [1, H, T, D] -> output [1, T, H, D]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    blocks: AttentionBlocks = kwargs.pop(BLOCKS_KWARG)
    masks = kwargs.pop("_prefdata_masks")
    kwargs.pop("is_causal", None)
    outputs = []
    for (start, end), mask in zip(blocks.bounds, masks):
        out, _ = sdpa_attention_forward(
            module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], mask,
            dropout=dropout, scaling=scaling, is_causal=mask is None, **kwargs,
        )
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(ATTENTION_NAME, _blocks_forward)
        _registered = True


def supports_blocks(model: Any) -> bool:
    """Whether block attention can run this model: a decoder that builds its mask with transformers'
    `create_causal_mask` and dispatches attention by name (Llama, Qwen2, Mistral, ...), with no
    sliding-window layers and not using a mask-only implementation."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    body = getattr(model, "model", None) or model.get_decoder()
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
    graph), so the forward alone runs under the switch.
    """
    _register()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield {BLOCKS_KWARG: blocks, "_prefdata_masks": blocks.masks()}
    finally:
        config._attn_implementation = previous
