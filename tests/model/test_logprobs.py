"""Invariants 3 and 4: per-sequence log-probs are padding-invariant and equal a plain computation,
on tiny random Llama and Qwen2 models built from config, with eager and sdpa attention."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from prefdata.model.logprobs import (completion_logps, packing_is_efficient, plan_batches, sequence_logps,
                                     supports_packing)
from prefdata.tokenize.masks import LAYOUTS, SequenceBatch, build_pair_batch, build_sequence_batch

VOCAB = 97
PAD = 0
ATOL = 1e-4


def _tiny(arch: str, attn: str, seed: int = 0):
    cls, cfg_cls = {"qwen2": (Qwen2ForCausalLM, Qwen2Config), "llama": (LlamaForCausalLM, LlamaConfig)}[arch]
    config = cfg_cls(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation=attn,
    )
    torch.manual_seed(seed)
    return cls(config).eval()


def _random_pairs(n: int, seed: int):
    rng = random.Random(seed)

    def ids(lo: int, hi: int) -> list[int]:
        return [rng.randrange(1, VOCAB) for _ in range(rng.randint(lo, hi))]

    return [ids(1, 9) for _ in range(n)], [ids(1, 12) for _ in range(n)], [ids(1, 12) for _ in range(n)]


def plain_logps(model, prompts, completions, starts=None) -> tuple[list[float], list[int]]:
    """Independent reference: one unpadded sequence at a time through the full model forward,
    log-softmax over the full logits, gather, sum over the completion (from completion position
    ``starts[i]`` on, when given)."""
    sums, counts = [], []
    starts = [0] * len(prompts) if starts is None else starts
    with torch.no_grad():
        for p, c, k in zip(prompts, completions, starts):
            ids = torch.tensor([p + c])
            logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
            total = 0.0
            n = 0
            for t in range(max(len(p) + k, 1), len(p) + len(c)):
                total += float(logp[t - 1, ids[0, t]])
                n += 1
            sums.append(total)
            counts.append(n)
    return sums, counts


MODELS = [("qwen2", "eager"), ("qwen2", "sdpa"), ("llama", "eager"), ("llama", "sdpa")]


@pytest.mark.parametrize("arch,attn", MODELS)
def test_layouts_agree_and_equal_plain_forward(arch, attn):
    model = _tiny(arch, attn)
    assert model.config._attn_implementation == attn
    assert supports_packing(model)
    prompts, chosen, rejected = _random_pairs(5, seed=1)
    expected, expected_counts = plain_logps(model, prompts + prompts, chosen + rejected)
    results = {}
    with torch.no_grad():
        for layout in LAYOUTS:
            logps, counts = sequence_logps(model, build_pair_batch(prompts, chosen, rejected, layout, PAD))
            assert logps.dtype == torch.float32 and counts.dtype == torch.long
            assert torch.isfinite(logps).all()
            assert counts.tolist() == expected_counts
            results[layout] = logps
    # Invariant 4: equal to the independent computation.
    torch.testing.assert_close(results["right"], torch.tensor(expected), atol=ATOL, rtol=0)
    # Invariant 3: right, left and packed agree.
    torch.testing.assert_close(results["left"], results["right"], atol=ATOL, rtol=0)
    torch.testing.assert_close(results["packed"], results["right"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch,attn", MODELS)
def test_loss_starts_equal_plain_forward_in_padded_and_packed_layouts(arch, attn):
    """`--loss-on answer`: with per-half loss starts, every layout sums exactly the completion
    positions >= the start, and counts them (invariants 3 and 4 on the restricted positions)."""
    model = _tiny(arch, attn)
    prompts, chosen, rejected = _random_pairs(6, seed=7)
    rng = random.Random(8)
    chosen_starts = [rng.randint(0, len(c)) for c in chosen]
    rejected_starts = [rng.randint(0, len(r) + 1) for r in rejected]
    chosen_starts[0] = len(chosen[0]) - 1  # one answer token left
    expected, expected_counts = plain_logps(model, prompts + prompts, chosen + rejected, chosen_starts + rejected_starts)
    with torch.no_grad():
        for layout in LAYOUTS:
            batch = build_pair_batch(prompts, chosen, rejected, layout, PAD, chosen_starts, rejected_starts)
            logps, counts = sequence_logps(model, batch)
            assert counts.tolist() == expected_counts, layout
            torch.testing.assert_close(logps, torch.tensor(expected), atol=ATOL, rtol=0, msg=layout)
    assert expected_counts[0] == 1 and sum(expected_counts) < sum(map(len, chosen + rejected))


def test_tiny_model_from_prefdata_tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    vocab = model.config.vocab_size
    rng = random.Random(3)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(2, 20))] for _ in range(4)]
    comps = [[rng.randrange(vocab) for _ in range(rng.randint(1, 20))] for _ in range(4)]
    expected, _ = plain_logps(model, prompts, comps)
    with torch.no_grad():
        for layout in LAYOUTS:
            logps, _ = sequence_logps(model, build_sequence_batch(prompts, comps, layout, 3))
            torch.testing.assert_close(logps, torch.tensor(expected), atol=ATOL, rtol=0)


def test_position_ids_that_do_not_restart_would_be_caught():
    """The check has teeth: packed position ids that run on across sequences (instead of restarting
    at 0) hide the boundaries, attention crosses them, and the log-probs move far beyond the
    tolerance. (A constant shift of a whole sequence would not show: RoPE is relative.)"""
    model = _tiny("llama", "eager")
    prompts, chosen, rejected = _random_pairs(4, seed=2)
    with torch.no_grad():
        right, _ = sequence_logps(model, build_pair_batch(prompts, chosen, rejected, "right", PAD))
        packed = build_pair_batch(prompts, chosen, rejected, "packed", PAD)
        running = torch.arange(packed.input_ids.shape[1]).unsqueeze(0)
        wrong = SequenceBatch(
            packed.input_ids, None, running, packed.loss_mask, packed.sequence_index, packed.num_sequences, "packed"
        )
        bad, _ = sequence_logps(model, wrong)
    assert (bad - right)[1:].abs().max() > 1e-2
    torch.testing.assert_close(bad[0], right[0], atol=ATOL, rtol=0)  # the first sequence sees no other


def test_packed_without_mask_detection_is_wrong():
    """Why sequence_logps passes use_cache=False: with a cache, transformers does not detect packed
    sequences, attention crosses sequence boundaries, and packed log-probs come out wrong."""
    model = _tiny("qwen2", "sdpa")
    prompts, chosen, rejected = _random_pairs(3, seed=4)
    batch = build_pair_batch(prompts, chosen, rejected, "packed", PAD)
    with torch.no_grad():
        good, _ = sequence_logps(model, batch)
        leaky = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=True)
        good_hidden = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    right, _ = sequence_logps(model, build_pair_batch(prompts, chosen, rejected, "right", PAD))
    torch.testing.assert_close(good, right, atol=ATOL, rtol=0)
    assert not torch.allclose(leaky.last_hidden_state, good_hidden.last_hidden_state, atol=1e-3)


class _CustomDecoder(torch.nn.Module):
    """A decoder whose module builds its own masks (no transformers create_causal_mask)."""


class _CustomModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _CustomDecoder()
        self.lin = torch.nn.Linear(2, 2)
        self.config = type("Cfg", (), {"_attn_implementation": "sdpa"})()


def test_packing_falls_back_to_padding_when_unsupported():
    custom = _CustomModel()
    assert not supports_packing(custom)
    packed = build_sequence_batch([[1]], [[2]], "packed", PAD)
    with pytest.raises(ValueError, match="packed batches are not supported"):
        sequence_logps(custom, packed)
    model = _tiny("qwen2", "sdpa")
    model.config._attn_implementation = "some_custom_kernel"
    assert not supports_packing(model)
    # sdpa packs correctly but attends over the whole packed row; only varlen kernels make it pay.
    assert not packing_is_efficient(_tiny("qwen2", "sdpa"))


def test_chunking_and_gradients_match_plain():
    model = _tiny("qwen2", "eager")
    prompts, chosen, _ = _random_pairs(3, seed=5)
    batch = build_sequence_batch(prompts, chosen, "packed", PAD)
    with torch.no_grad():
        whole, _ = sequence_logps(model, batch)
        chunked, _ = sequence_logps(model, batch, chunk_rows=3)
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=0)

    # Gradient through the head chunks equals the gradient of the plain computation, with the
    # head's logits kept (small batches) or recomputed in backward (large ones).
    plain = 0.0
    for p, c in zip(prompts, chosen):
        ids = torch.tensor([p + c])
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
        plain = plain + sum(logp[t - 1, ids[0, t]] for t in range(len(p), len(p) + len(c)))
    plain.backward()
    expected = model.lm_head.weight.grad.clone()
    for recompute in (True, False, None):
        model.zero_grad()
        completion_logps(model, batch, chunk_rows=4, recompute_head=recompute).logps.sum().backward()
        torch.testing.assert_close(model.lm_head.weight.grad, expected, atol=1e-5, rtol=1e-4)


def test_the_head_is_recomputed_in_backward_only_for_large_logits(monkeypatch):
    """Kept logits cost memory (tokens x vocabulary floats): past KEEP_HEAD_LOGITS_BYTES the head
    runs again in backward instead, so a 151k vocabulary fits; below it there is no second pass."""
    from prefdata.model import logprobs as L

    model = _tiny("qwen2", "eager")
    prompts, chosen, _ = _random_pairs(3, seed=5)
    batch = build_sequence_batch(prompts, chosen, "packed", PAD)
    calls = []
    real = L._head_logps
    monkeypatch.setattr(L, "_head_logps", lambda *a: calls.append(1) or real(*a))
    for limit, passes in ((1 << 30, 1), (1, 2)):  # per chunk: once, or again in backward
        monkeypatch.setattr(L, "KEEP_HEAD_LOGITS_BYTES", limit)
        calls.clear()
        L.completion_logps(model, batch, chunk_rows=1 << 20).logps.sum().backward()
        assert len(calls) == passes


def test_empty_prompt_first_token_is_not_counted():
    model = _tiny("llama", "sdpa")
    with torch.no_grad():
        logps, counts = sequence_logps(model, build_sequence_batch([[], [5]], [[7, 8, 9], [7]], "right", PAD))
    assert counts.tolist() == [2, 1]
    expected, expected_counts = plain_logps(model, [[], [5]], [[7, 8, 9], [7]])
    assert expected_counts == [2, 1]
    torch.testing.assert_close(logps, torch.tensor(expected), atol=ATOL, rtol=0)


def test_plan_batches_budget_order_and_determinism():
    rng = random.Random(0)
    lengths = [rng.randint(1, 300) for _ in range(500)] + [5000]
    plan = plan_batches(lengths, 1024)
    assert plan == plan_batches(list(lengths), 1024)
    flat = [i for batch in plan for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for batch in plan:
        cost = len(batch) * max(lengths[i] for i in batch)
        assert cost <= 1024 or len(batch) == 1
    assert plan[0] == [len(lengths) - 1]  # the oversize row stands alone, first
    assert plan_batches([], 10) == []
    with pytest.raises(ValueError):
        plan_batches([1], 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_on_gpu_is_close_and_finite():
    model = _tiny("qwen2", "sdpa").cuda()
    prompts, chosen, rejected = _random_pairs(4, seed=6)
    with torch.no_grad():
        ref32, _ = sequence_logps(model, build_pair_batch(prompts, chosen, rejected, "right", PAD))
        model = model.to(torch.bfloat16)
        for layout in LAYOUTS:
            logps, _ = sequence_logps(model, build_pair_batch(prompts, chosen, rejected, layout, PAD))
            assert logps.dtype == torch.float32 and torch.isfinite(logps).all()
            torch.testing.assert_close(logps, ref32, atol=0.5, rtol=0.05)
