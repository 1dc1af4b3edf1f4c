"""Batched sampling with a KV cache: the decode loop of `generate` for the transformers engine.

Why not `model.generate`: on CPU its sampler, `torch.multinomial`, costs more than the tiny models'
forward passes (about 4.5 ms for 16 rows of a 6k vocabulary, against 0.1 ms for the inverse-CDF draw
used here: one uniform per row and a binary search in the cumulative probabilities, the same
categorical distribution), and it is called once per new token. The loop is the textbook one: one
forward over the left-padded prompts, then one token per step with the cache, position ids counted
from each row's first real token (so a row's completion does not depend on its padding), finished
rows padded until every row has stopped or `max_new_tokens` is reached. A prompt with several
samples runs once: its KV cache is copied to each sample's row.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Sample:
    """One sampled completion: its text (no special tokens, think tags kept), whether it ended with a
    stop token, and the sampled ids through that stop token (all of them when it did not stop)."""

    text: str
    finished: bool
    ids: list[int]


def draw(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from `logits` [rows, vocab]: greedy at temperature 0, else a draw from the
    softmax at `temperature`, restricted to the smallest set of tokens whose mass reaches `top_p`."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token while the mass before it is below top_p (the first token always stays).
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    cumulative = probs.double().cumsum(-1)
    target = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device, generator=generator)
    target = target * cumulative[:, -1:]  # an unnormalized mass (after top-p) needs no renormalizing
    return torch.searchsorted(cumulative, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@torch.inference_mode()
def sample(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
           temperature: float, top_p: float, stop_ids: list[int], pad_id: int,
           generator: torch.Generator | None = None, samples: int = 1) -> torch.Tensor:
    """New tokens [rows x samples, <= max_new_tokens] for left-padded prompts, each prompt's `samples`
    rows next to each other; after a row's stop token, pad."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)
    mask = attention_mask.long()
    cache = cache_name(model)
    # The prompt's forward needs the last position's logits only: all of them would be rows x prompt
    # length x vocabulary floats (96 prompts of 3k tokens x 6k vocabulary: 7 GB; 151k vocabularies far more).
    last_only = {"logits_to_keep": 1} if accepts(model, "logits_to_keep") else {}
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **last_only)
    logits = out.logits[:, -1, :]
    if samples > 1:
        kv = getattr(out, cache, None)
        if hasattr(kv, "batch_repeat_interleave"):
            # Each prompt ran once; its KV cache is copied to its samples' rows (135-token prompts, 2
            # samples: the prompts' forward was a third of SmolLM2's sampling time on 2 CPU cores).
            kv.batch_repeat_interleave(samples)
            logits, mask, positions = (t.repeat_interleave(samples, dim=0) for t in (logits, mask, positions))
        else:  # a cache that cannot be copied row-wise: each sample's row runs its own prompt
            input_ids, mask, positions = (t.repeat_interleave(samples, dim=0) for t in (input_ids, mask, positions))
            out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **last_only)
            logits = out.logits[:, -1, :]
    stops = torch.tensor(stop_ids, device=input_ids.device)
    done = torch.zeros(mask.shape[0], dtype=torch.bool, device=input_ids.device)
    new: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        token = draw(logits, temperature, top_p, generator)
        token = torch.where(done, torch.full_like(token, pad_id), token)
        new.append(token)
        done |= torch.isin(token, stops)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=positions,
                    use_cache=True, **{cache: getattr(out, cache)})
        logits = out.logits[:, -1, :]
    return torch.stack(new, dim=1)


def accepts(model: Any, keyword: str) -> bool:
    """Whether the model's forward takes `keyword` by name."""
    return keyword in inspect.signature(model.forward).parameters


def cache_name(model: Any) -> str:
    """What the model's forward calls its KV cache, in and out: `cache` from transformers 5.24 on
    (where `past_key_values` still works but warns that it goes away in 5.40), `past_key_values` before."""
    return "cache" if accepts(model, "cache") else "past_key_values"
