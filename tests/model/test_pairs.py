"""Prefix sharing and padding-free packing: the same per-sequence log-probs (fp32, 1e-5 relative)
and gradients as the plain padded computation and an independent full forward, on tiny random
Llama and Qwen2 models, for edge rows and random rows."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from prefdata.model.attention import supports_blocks
from prefdata.model.logprobs import completion_logps, plan_packed_batches
from prefdata.model.losses import dpo_loss
from prefdata.model.pairs import PAIR_LAYOUTS, choose_layout, pair_logps, share_pays, sharing_plan
from prefdata.tokenize.masks import build_block_pair_batch, build_pair_batch, check_loss_masks

VOCAB = 97
PAD = 0
MAX_LEN = 48
RTOL = 1e-5


def _tiny(arch: str, attn: str = "sdpa", seed: int = 0):
    cls, cfg_cls = {"qwen2": (Qwen2ForCausalLM, Qwen2Config), "llama": (LlamaForCausalLM, LlamaConfig)}[arch]
    config = cfg_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_LEN,
                     attn_implementation=attn)
    torch.manual_seed(seed)
    return cls(config).eval()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request):
    return _tiny(request.param)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def _edge_rows():
    """Rows that touch every edge: empty prompt (all of it truncated away), one-token completions,
    a prompt that fills max length but one token, identical halves, long vs short halves."""
    rng = random.Random(1)
    rows = [
        ([], _ids(rng, 5), _ids(rng, 3)),
        ([], [7], [9]),
        (_ids(rng, 6), [4], [5]),
        (_ids(rng, MAX_LEN - 1), [11], [12]),
        (_ids(rng, 30), _ids(rng, 17), _ids(rng, 1)),
        (_ids(rng, 3), [8, 8, 8], [8, 8, 8]),
        (_ids(rng, 20), _ids(rng, 12), _ids(rng, 9)),
    ]
    return [list(x) for x in zip(*rows)]


def _plain(model, prompt: list[int], completion: list[int]) -> float:
    """Independent reference: the full model forward on one unpadded sequence, full log-softmax."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    return float(sum(logp[t - 1, ids[0, t]] for t in range(max(len(prompt), 1), len(prompt) + len(completion))))


def _plain_from(model, prompt: list[int], completion: list[int], start: int) -> tuple[float, int]:
    """Independent reference for `--loss-on answer`: the full forward over prompt + the whole completion,
    log-softmax, gather, sum over completion positions >= start only (and their count)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    positions = [t for t in range(max(len(prompt), 1), len(prompt) + len(completion)) if t - len(prompt) >= start]
    return float(sum(logp[t - 1, ids[0, t]] for t in positions)), len(positions)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=RTOL, atol=1e-6)


def test_block_attention_is_supported_and_auto_shares(model):
    assert supports_blocks(model)
    assert choose_layout(model, "auto") == "shared"
    with pytest.raises(ValueError, match="unknown layout"):
        choose_layout(model, "diagonal")


def test_shared_packed_and_padded_agree_on_edge_rows(model):
    prompts, chosen, rejected = _edge_rows()
    n = len(prompts)
    with torch.no_grad():
        right = pair_logps(model, prompts, chosen, rejected, "right", PAD)
        left = pair_logps(model, prompts, chosen, rejected, "left", PAD)
        blocks = pair_logps(model, prompts, chosen, rejected, "blocks", PAD)
        shared_all = completion_logps(model, build_block_pair_batch(prompts, chosen, rejected, [True] * n))
        auto = pair_logps(model, prompts, chosen, rejected, "shared", PAD)
    assert blocks.shared_pairs == 0 and 0 < auto.shared_pairs < n  # the rule shares some pairs, not all
    for other in (left, blocks, auto):
        _close(other.chosen, right.chosen)
        _close(other.rejected, right.rejected)
        assert torch.equal(other.chosen_counts, right.chosen_counts)
        assert torch.equal(other.rejected_counts, right.rejected_counts)
    _close(shared_all.logps, torch.cat([right.chosen, right.rejected]))
    assert torch.equal(shared_all.counts, torch.cat([right.chosen_counts, right.rejected_counts]))
    _close(shared_all.logit_sums, torch.cat([right.chosen_logit_sums, right.rejected_logit_sums]))
    expected_c = torch.tensor([_plain(model, p, c) for p, c in zip(prompts, chosen)])
    expected_r = torch.tensor([_plain(model, p, r) for p, r in zip(prompts, rejected)])
    _close(shared_all.logps[:n], expected_c)
    _close(shared_all.logps[n:], expected_r)
    # Empty prompt: the first completion token has no predicting token and is not counted.
    assert int(right.chosen_counts[1]) == 0 and int(right.chosen_counts[0]) == len(chosen[0]) - 1


def test_shared_block_costs_one_prompt(model):
    prompts, chosen, rejected = _edge_rows()
    n = len(prompts)
    shared = build_block_pair_batch(prompts, chosen, rejected, [True] * n)
    plain = build_block_pair_batch(prompts, chosen, rejected, [False] * n)
    prompt_tokens = sum(map(len, prompts))
    assert plain.num_tokens - shared.num_tokens == prompt_tokens
    assert shared.num_tokens == prompt_tokens + sum(map(len, chosen)) + sum(map(len, rejected))


def test_pair_results_do_not_depend_on_batch_company(model):
    """A pair's log-probs alone and inside a packed row of other pairs agree (no attention leaks
    across blocks; only float rounding of differently shaped matmuls may differ)."""
    prompts, chosen, rejected = _edge_rows()
    with torch.no_grad():
        together = pair_logps(model, prompts, chosen, rejected, "shared", PAD)
        for i in range(len(prompts)):
            alone = pair_logps(model, [prompts[i]], [chosen[i]], [rejected[i]], "shared", PAD)
            _close(alone.chosen[0], together.chosen[i])
            _close(alone.rejected[0], together.rejected[i])


def test_loss_and_gradients_with_sharing_equal_unshared():
    model = _tiny("llama")
    model.train()
    prompts, chosen, rejected = _edge_rows()
    n = len(prompts)
    ref_c, ref_r = torch.randn(n) - 20, torch.randn(n) - 20

    def loss_and_grads(batch):
        model.zero_grad(set_to_none=True)
        out = completion_logps(model, batch)
        loss = dpo_loss(out.logps[:n], out.logps[n:], ref_c, ref_r, loss_type="sigmoid", beta=0.1).losses.mean()
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    from prefdata.tokenize.masks import build_pair_batch

    loss_plain, grads_plain = loss_and_grads(build_pair_batch(prompts, chosen, rejected, "right", PAD))
    loss_shared, grads_shared = loss_and_grads(build_block_pair_batch(prompts, chosen, rejected, [True] * n))
    _close(loss_shared, loss_plain)
    for name, grad in grads_plain.items():
        torch.testing.assert_close(grads_shared[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_equal_policy_and_reference_give_exactly_ln2(model):
    """Reference computed without grad (as refs does), policy with grad (as train does), same
    batches: zero margin, loss exactly ln 2."""
    prompts, chosen, rejected = _edge_rows()
    half = len(prompts) // 2
    for rows in (list(range(half)), list(range(half, len(prompts)))):
        batch = ([prompts[i] for i in rows], [chosen[i] for i in rows], [rejected[i] for i in rows])
        with torch.no_grad():
            ref = pair_logps(model, *batch, "shared", PAD)
        pol = pair_logps(model, *batch, "shared", PAD)
        assert pol.chosen.requires_grad
        losses = dpo_loss(pol.chosen, pol.rejected, ref.chosen, ref.rejected, loss_type="sigmoid", beta=0.1).losses
        assert torch.equal(losses.detach(), torch.full((len(rows),), math.log(2), dtype=torch.float32))


_lengths = st.tuples(st.integers(0, 20), st.integers(1, 8), st.integers(1, 8))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_lengths, st.booleans()), min_size=1, max_size=6), seed=st.integers(0, 10**6))
def test_property_random_rows_any_sharing_equal_padded(model, rows, seed):
    rng = random.Random(seed)
    prompts = [_ids(rng, p) for (p, _, _), _ in rows]
    chosen = [_ids(rng, c) for (_, c, _), _ in rows]
    rejected = [_ids(rng, r) for (_, _, r), _ in rows]
    share = [s for _, s in rows]
    with torch.no_grad():
        right = pair_logps(model, prompts, chosen, rejected, "right", PAD)
        mixed = completion_logps(model, build_block_pair_batch(prompts, chosen, rejected, share))
    _close(mixed.logps, torch.cat([right.chosen, right.rejected]))
    assert torch.equal(mixed.counts, torch.cat([right.chosen_counts, right.rejected_counts]))


def test_sharing_pays_wherever_there_is_a_prompt():
    assert share_pays(200, 50, 50) and share_pays(1, 400, 400)
    assert not share_pays(0, 5, 5)  # nothing to share: empty prompt (e.g. all of it truncated away)
    assert not share_pays(5, 0, 5)
    assert sharing_plan([[1] * 30, []], [[2] * 3, [2]], [[3] * 3, [3]]) == [True, False]


def test_plan_packed_batches_budget_and_determinism():
    lengths = [5, 30, 12, 12, 7, 50, 1]
    plan = plan_packed_batches(lengths, 40)
    assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
    assert plan[0] == [5]  # longer than the budget: alone
    assert all(sum(lengths[i] for i in b) <= 40 for b in plan[1:])
    assert plan == plan_packed_batches(lengths, 40)
    with pytest.raises(ValueError):
        plan_packed_batches(lengths, 0)


@pytest.mark.parametrize("layout", PAIR_LAYOUTS)
def test_loss_starts_equal_plain_forward_in_every_layout(model, layout):
    """`--loss-on answer`: every layout sums exactly the completion positions >= each half's loss
    start (the skipped tokens stay in the sequence: later tokens are conditioned on them)."""
    prompts, chosen, rejected = _edge_rows()
    # 0 (all), inside, exactly the whole completion (no loss token left), past it, and on an empty prompt.
    chosen_starts = [2, 0, 1, 0, 9, 1, 4]
    rejected_starts = [0, 1, 0, 5, 1, 3, 9]
    with torch.no_grad():
        out = pair_logps(model, prompts, chosen, rejected, layout, PAD, chosen_starts, rejected_starts)
        whole = pair_logps(model, prompts, chosen, rejected, layout, PAD)
    expected_c = [_plain_from(model, p, c, k) for p, c, k in zip(prompts, chosen, chosen_starts)]
    expected_r = [_plain_from(model, p, r, k) for p, r, k in zip(prompts, rejected, rejected_starts)]
    _close(out.chosen, torch.tensor([v for v, _ in expected_c]))
    _close(out.rejected, torch.tensor([v for v, _ in expected_r]))
    assert out.chosen_counts.tolist() == [k for _, k in expected_c]
    assert out.rejected_counts.tolist() == [k for _, k in expected_r]
    assert out.chosen_counts.tolist() == [3, 0, 0, 1, 8, 2, 8]  # the starts really cut tokens
    # Rows whose starts skip nothing are unchanged; the others moved.
    _close(out.rejected[0], whole.rejected[0])
    assert not torch.allclose(out.chosen[0], whole.chosen[0])


@pytest.mark.parametrize("layout", PAIR_LAYOUTS)
def test_loss_start_masks_in_every_layout(layout):
    prompts, chosen, rejected = _edge_rows()
    n = len(prompts)
    chosen_starts = [2, 0, 1, 0, 9, 1, 4]
    rejected_starts = [0, 1, 0, 5, 1, 3, 9]
    if layout in ("blocks", "shared"):
        batch = build_block_pair_batch(prompts, chosen, rejected, [layout == "shared"] * n, chosen_starts,
                                       rejected_starts)
    else:
        batch = build_pair_batch(prompts, chosen, rejected, layout, PAD, chosen_starts, rejected_starts)
    prompt_lens = [len(p) for p in prompts] * 2
    if layout == "shared":  # a shared block holds its prompt once, under the chosen half's sequence
        prompt_lens = prompt_lens[:n] + [0] * n
    completion_lens = [len(c) for c in chosen] + [len(r) for r in rejected]
    check_loss_masks(batch, prompt_lens, completion_lens, chosen_starts + rejected_starts)
    with pytest.raises(ValueError, match="completion"):  # the check sees a start that was not applied
        check_loss_masks(batch, prompt_lens, completion_lens)
    with pytest.raises(ValueError, match="negative"):
        build_pair_batch(prompts, chosen, rejected, "right", PAD, [-1] * n, None)
