"""Per-token loss masks (OUT's `chosen_loss_mask`/`rejected_loss_mask`) on the model side: every
layout sums and counts exactly the tokens marked 1, alone and combined with `--loss-on answer`'s
loss starts, against an independent masked forward written here (plain model call per sequence,
log-softmax, gather, sum where the mask is 1)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM

from prefdata.model.pairs import PAIR_LAYOUTS, pair_logps
from prefdata.tokenize.masks import build_block_pair_batch, build_pair_batch, check_loss_masks

VOCAB = 97
PAD = 0


@pytest.fixture(scope="module")
def model():
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def _rows(seed: int = 1):
    """Pairs with masks of every kind: None (all trained), alternating runs, all zero, an empty prompt."""
    rng = random.Random(seed)

    def ids(n):
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    prompts = [ids(5), ids(9), [], ids(3), ids(7)]
    chosen = [ids(8), ids(6), ids(5), ids(4), ids(10)]
    rejected = [ids(7), ids(3), ids(6), ids(4), ids(2)]
    chosen_masks = [[1, 1, 0, 0, 0, 1, 1, 1], None, [1, 0, 1, 0, 1], [0, 0, 0, 0], [0, 1] * 5]
    rejected_masks = [[1, 1, 1, 0, 0, 0, 1], [1, 1, 1], [0, 0, 1, 1, 1, 1], None, [1, 0]]
    return prompts, chosen, rejected, chosen_masks, rejected_masks


def _masked_plain(model, prompt, completion, mask, start=0) -> tuple[float, int]:
    """The independent computation: one unpadded forward, sum over completion positions >= start
    whose mask entry is 1 (the first token of an empty prompt has no predictor)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    mask = [1] * len(completion) if mask is None else mask
    positions = [len(prompt) + k for k in range(len(completion)) if k >= start and mask[k] and len(prompt) + k > 0]
    return float(sum(logp[t - 1, ids[0, t]] for t in positions)), len(positions)


def _close(a: torch.Tensor, b: list[float]) -> None:
    torch.testing.assert_close(a, torch.tensor(b, dtype=torch.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", PAIR_LAYOUTS)
def test_masked_logps_equal_an_independent_masked_forward_in_every_layout(model, layout):
    prompts, chosen, rejected, chosen_masks, rejected_masks = _rows()
    with torch.no_grad():
        out = pair_logps(model, prompts, chosen, rejected, layout, PAD,
                         chosen_loss_masks=chosen_masks, rejected_loss_masks=rejected_masks)
        whole = pair_logps(model, prompts, chosen, rejected, layout, PAD)
    expected_c = [_masked_plain(model, p, c, m) for p, c, m in zip(prompts, chosen, chosen_masks)]
    expected_r = [_masked_plain(model, p, r, m) for p, r, m in zip(prompts, rejected, rejected_masks)]
    _close(out.chosen, [v for v, _ in expected_c])
    _close(out.rejected, [v for v, _ in expected_r])
    assert out.chosen_counts.tolist() == [k for _, k in expected_c] == [5, 6, 2, 0, 5]
    assert out.rejected_counts.tolist() == [k for _, k in expected_r]
    # A row without a mask is summed whole; the masked ones moved.
    torch.testing.assert_close(out.chosen[1], whole.chosen[1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out.chosen[0], whole.chosen[0])


@pytest.mark.parametrize("layout", PAIR_LAYOUTS)
def test_masks_compose_with_loss_starts(model, layout):
    """`--loss-on answer` and a token mask together: a token counts when it is past the loss start AND
    marked 1."""
    prompts, chosen, rejected, chosen_masks, rejected_masks = _rows()
    chosen_starts, rejected_starts = [2, 0, 1, 0, 3], [1, 2, 0, 1, 0]
    with torch.no_grad():
        out = pair_logps(model, prompts, chosen, rejected, layout, PAD, chosen_starts, rejected_starts,
                         chosen_loss_masks=chosen_masks, rejected_loss_masks=rejected_masks)
    expected_c = [_masked_plain(model, *args) for args in zip(prompts, chosen, chosen_masks, chosen_starts)]
    expected_r = [_masked_plain(model, *args) for args in zip(prompts, rejected, rejected_masks, rejected_starts)]
    _close(out.chosen, [v for v, _ in expected_c])
    _close(out.rejected, [v for v, _ in expected_r])
    assert out.chosen_counts.tolist() == [k for _, k in expected_c] == [3, 6, 2, 0, 4]
    assert out.rejected_counts.tolist() == [k for _, k in expected_r]


@pytest.mark.parametrize("layout", PAIR_LAYOUTS)
def test_the_batch_loss_mask_is_the_completion_masked(layout):
    prompts, chosen, rejected, chosen_masks, rejected_masks = _rows()
    n = len(prompts)
    if layout in ("blocks", "shared"):
        batch = build_block_pair_batch(prompts, chosen, rejected, [layout == "shared"] * n,
                                       chosen_loss_masks=chosen_masks, rejected_loss_masks=rejected_masks)
    else:
        batch = build_pair_batch(prompts, chosen, rejected, layout, PAD, chosen_loss_masks=chosen_masks,
                                 rejected_loss_masks=rejected_masks)
    prompt_lens = [len(p) for p in prompts] * 2
    if layout == "shared":  # a shared block holds its prompt once, under the chosen half's sequence
        prompt_lens = prompt_lens[:n] + [0] * n
    completion_lens = [len(c) for c in chosen] + [len(r) for r in rejected]
    check_loss_masks(batch, prompt_lens, completion_lens, token_masks=chosen_masks + rejected_masks)
    with pytest.raises(ValueError, match="completion"):  # the check sees masks that were applied
        check_loss_masks(batch, prompt_lens, completion_lens)


def test_a_mask_that_does_not_fit_its_completion_is_refused():
    prompts, chosen, rejected, chosen_masks, rejected_masks = _rows()
    chosen_masks[0] = chosen_masks[0][:-1]
    with pytest.raises(ValueError, match="sequence 0: a loss mask of 7 entries for 8 completion tokens"):
        build_pair_batch(prompts, chosen, rejected, "right", PAD, chosen_loss_masks=chosen_masks)
    with pytest.raises(ValueError, match="loss mask of 7 entries"):
        build_block_pair_batch(prompts, chosen, rejected, chosen_loss_masks=chosen_masks)


@given(seed=st.integers(0, 10_000), layout=st.sampled_from(PAIR_LAYOUTS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_property_random_masks_equal_the_masked_forward(model, seed, layout):
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    chosen = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    rejected = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 8))] for _ in range(n)]

    def mask(c):
        return None if rng.random() < 0.2 else [rng.randint(0, 1) for _ in c]

    chosen_masks, rejected_masks = [mask(c) for c in chosen], [mask(r) for r in rejected]
    with torch.no_grad():
        out = pair_logps(model, prompts, chosen, rejected, layout, PAD,
                         chosen_loss_masks=chosen_masks, rejected_loss_masks=rejected_masks)
    expected = [_masked_plain(model, p, c, m) for p, c, m in zip(prompts, chosen, chosen_masks)]
    _close(out.chosen, [v for v, _ in expected])
    assert out.chosen_counts.tolist() == [k for _, k in expected]
    expected = [_masked_plain(model, p, r, m) for p, r, m in zip(prompts, rejected, rejected_masks)]
    _close(out.rejected, [v for v, _ in expected])
