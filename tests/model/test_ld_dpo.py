"""LD-DPO (`--ld-alpha`, TRL's `ld_alpha`): each half's log-prob sum becomes public + α·(rest), the
public part being its first min(|yc|, |yr|) completion tokens. Checked against an independent full
forward, against TRL 1.16's own `DPOTrainer.compute_ref_log_probs` on the same tensors, and across
every pair layout (right, left, packed, blocks, shared), with and without loss starts."""

from __future__ import annotations

import random
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefdata.model.losses import dpo_loss, length_desensitized
from prefdata.model.pairs import PAIR_LAYOUTS, pair_logps

from tests.model.test_pairs import PAD, _edge_rows, _ids, _tiny

RTOL = 1e-5


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request):
    return _tiny(request.param)


def _token_logps(model, prompt: list[int], completion: list[int], start: int = 0) -> list[float]:
    """Independent: full forward, log-softmax, the log-prob of each counted completion token in
    order (a first token without a predicting token, and tokens before `start`, are not counted)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    return [float(logp[t - 1, ids[0, t]]) for t in range(max(len(prompt), 1), len(prompt) + len(completion))
            if t - len(prompt) >= start]


def _ld_expected(model, prompts, chosen, rejected, alpha, c_starts=None, r_starts=None):
    n = len(prompts)
    c_starts, r_starts = c_starts or [0] * n, r_starts or [0] * n
    out_c, out_r = [], []
    for p, c, r, sc, sr in zip(prompts, chosen, rejected, c_starts, r_starts):
        tc, tr = _token_logps(model, p, c, sc), _token_logps(model, p, r, sr)
        k = min(len(tc), len(tr))
        out_c.append(sum(tc[:k]) + alpha * sum(tc[k:]))
        out_r.append(sum(tr[:k]) + alpha * sum(tr[k:]))
    return torch.tensor(out_c), torch.tensor(out_r)


def _weighted(out, alpha):
    return length_desensitized(out.chosen, out.chosen_public, alpha), length_desensitized(out.rejected, out.rejected_public, alpha)


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=1e-5)


def test_formula() -> None:
    full, public = torch.tensor([-10.0, -3.0]), torch.tensor([-4.0, -3.0])
    assert length_desensitized(full, public, 0.5).tolist() == [-7.0, -3.0]
    assert torch.equal(length_desensitized(full, public, 1.0), full)
    assert torch.equal(length_desensitized(full, public, 0.0), public)


@pytest.mark.parametrize("layout", PAIR_LAYOUTS)
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_every_layout_equals_the_independent_computation(model, layout, alpha) -> None:
    prompts, chosen, rejected = _edge_rows()
    with torch.no_grad():
        out = pair_logps(model, prompts, chosen, rejected, layout, PAD, public=True)
    expected_c, expected_r = _ld_expected(model, prompts, chosen, rejected, alpha)
    got_c, got_r = _weighted(out, alpha)
    _close(got_c, expected_c)
    _close(got_r, expected_r)
    if alpha == 1.0:
        _close(got_c, out.chosen)
    # the edge rows have unequal halves, so the weighting really changes something
    assert alpha == 1.0 or not torch.allclose(got_c, out.chosen) or not torch.allclose(got_r, out.rejected)


@pytest.mark.parametrize("layout", PAIR_LAYOUTS)
def test_loss_starts_count_the_public_length_in_answer_tokens(model, layout) -> None:
    prompts, chosen, rejected = _edge_rows()
    c_starts, r_starts = [2, 0, 1, 0, 9, 1, 4], [0, 1, 0, 5, 1, 3, 9]
    with torch.no_grad():
        out = pair_logps(model, prompts, chosen, rejected, layout, PAD, c_starts, r_starts, public=True)
    expected = _ld_expected(model, prompts, chosen, rejected, 0.25, c_starts, r_starts)
    for got, want in zip(_weighted(out, 0.25), expected):
        _close(got, want)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=5),
       st.integers(0, 1000), st.floats(0, 1))
def test_random_rows_agree_across_layouts(model, shapes, seed, alpha) -> None:
    rng = random.Random(seed)
    prompts = [_ids(rng, p) for p, _, _ in shapes]
    chosen = [_ids(rng, c) for _, c, _ in shapes]
    rejected = [_ids(rng, r) for _, _, r in shapes]
    with torch.no_grad():
        outs = [_weighted(pair_logps(model, prompts, chosen, rejected, layout, PAD, public=True), alpha)
                for layout in PAIR_LAYOUTS]
    for got in outs[1:]:
        _close(got[0], outs[0][0])
        _close(got[1], outs[0][1])


def _trl_batch(prompts, chosen, rejected):
    """TRL's collator layout: [chosen..., rejected...] rows of prompt + completion, right padded,
    completion_mask over the completion tokens."""
    rows = [(p, c) for p, c in zip(prompts, chosen)] + [(p, r) for p, r in zip(prompts, rejected)]
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), PAD)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    completion = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attention[i, : len(p) + len(c)] = 1
        completion[i, len(p) : len(p) + len(c)] = 1
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.9])
def test_equals_trls_compute_ref_log_probs_on_the_same_tensors(alpha) -> None:
    """TRL's own method (its precompute path; `_compute_loss` weighs the policy the same way), run
    on TRL's padded batch of the same pairs with its fused log-prob head."""
    pytest.importorskip("trl")
    from trl.trainer.dpo_trainer import DPOTrainer as TRLTrainer
    from trl.trainer.utils import add_fused_lm_head

    model = _tiny("qwen2", attn="eager")
    prompts, chosen, rejected = _edge_rows()
    with torch.no_grad():
        ours = _weighted(pair_logps(model, prompts, chosen, rejected, "shared", PAD, public=True), alpha)
    add_fused_lm_head(model)
    fake = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), autocast=nullcontext), ld_alpha=alpha, ref_model=None,
        model=model, args=SimpleNamespace(gradient_checkpointing_kwargs=None),
    )
    trl_c, trl_r = TRLTrainer.compute_ref_log_probs(fake, model, _trl_batch(prompts, chosen, rejected))
    torch.testing.assert_close(ours[0], trl_c.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours[1], trl_r.float(), rtol=1e-4, atol=1e-4)


def test_loss_with_alpha_one_is_plain_dpo_and_equal_policy_and_reference_give_ln2(model) -> None:
    prompts, chosen, rejected = _edge_rows()
    with torch.no_grad():
        out = pair_logps(model, prompts, chosen, rejected, "shared", PAD, public=True)
    for alpha in (0.0, 0.4):
        c, r = _weighted(out, alpha)
        same = dpo_loss(c, r, c.clone(), r.clone(), loss_type="sigmoid", beta=0.1)
        _close(same.losses, torch.full_like(same.losses, 0.6931471805599453))
    ref_c, ref_r = out.chosen - 1.0, out.rejected + 0.5
    plain = dpo_loss(out.chosen, out.rejected, ref_c, ref_r, loss_type="sigmoid", beta=0.1)
    c, r = _weighted(out, 1.0)
    weighted = dpo_loss(c, r, ref_c, ref_r, loss_type="sigmoid", beta=0.1)
    _close(weighted.losses, plain.losses)
