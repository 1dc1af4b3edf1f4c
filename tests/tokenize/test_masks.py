"""Invariants 1 and 2 on the masks/position-ids module, for all three layouts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.tokenize.masks import (
    LAYOUTS,
    SequenceBatch,
    build_pair_batch,
    build_sequence_batch,
    check_loss_masks,
    sequence_masks,
)

PAD = 0


def _pairs(prompt_lens, chosen_lens, rejected_lens):
    """Distinct non-pad token ids, so a token's place can be read back from its value."""
    counter = iter(range(1, 10**6))
    prompts = [[next(counter) for _ in range(n)] for n in prompt_lens]
    chosen = [[next(counter) for _ in range(n)] for n in chosen_lens]
    rejected = [[next(counter) for _ in range(n)] for n in rejected_lens]
    return prompts, chosen, rejected


def _sequence_tokens(batch: SequenceBatch) -> list[list[int]]:
    seqs: list[list[int]] = [[] for _ in range(batch.num_sequences)]
    for s, tok in zip(batch.sequence_index.flatten().tolist(), batch.input_ids.flatten().tolist()):
        if s >= 0:
            seqs[s].append(tok)
    return seqs


def _sequence_positions(batch: SequenceBatch) -> list[list[int]]:
    seqs: list[list[int]] = [[] for _ in range(batch.num_sequences)]
    for s, pos in zip(batch.sequence_index.flatten().tolist(), batch.position_ids.flatten().tolist()):
        if s >= 0:
            seqs[s].append(pos)
    return seqs


def _check_pair_batch(batch, prompts, chosen, rejected):
    n = len(prompts)
    assert batch.num_sequences == 2 * n
    # Invariant 1: each half's mask is 1 exactly on its completion, 0 on prompt and padding.
    check_loss_masks(batch, [len(p) for p in prompts] * 2, [len(c) for c in chosen] + [len(r) for r in rejected])
    masks = sequence_masks(batch)
    for i in range(n):
        assert masks[i] == [0] * len(prompts[i]) + [1] * len(chosen[i])
        assert masks[n + i] == [0] * len(prompts[i]) + [1] * len(rejected[i])
    assert not bool((batch.loss_mask & (batch.sequence_index < 0)).any())
    # Invariant 2: prompt ids are a prefix of both halves, identical across halves.
    tokens = _sequence_tokens(batch)
    for i in range(n):
        assert tokens[i] == prompts[i] + chosen[i]
        assert tokens[n + i] == prompts[i] + rejected[i]
        assert tokens[i][: len(prompts[i])] == tokens[n + i][: len(prompts[i])]
    # Position ids restart at 0 for every sequence, whatever the padding.
    for s, positions in enumerate(_sequence_positions(batch)):
        assert positions == list(range(len(tokens[s])))
    # Shapes and dtypes of the contract.
    assert batch.input_ids.dtype == torch.long and batch.position_ids.dtype == torch.long
    assert batch.loss_mask.dtype == torch.bool and batch.sequence_index.dtype == torch.long
    if batch.layout == "packed":
        assert batch.attention_mask is None
        assert batch.input_ids.shape == (1, sum(len(t) for t in tokens))
        assert bool((batch.sequence_index >= 0).all())
    else:
        assert batch.attention_mask is not None and batch.attention_mask.dtype == torch.long
        assert torch.equal(batch.attention_mask.bool(), batch.sequence_index >= 0)
        assert bool((batch.input_ids[batch.attention_mask == 0] == PAD).all())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pair_batch_masks_every_half(layout):
    prompts, chosen, rejected = _pairs([3, 5, 1], [2, 4, 6], [5, 1, 3])
    batch = build_pair_batch(prompts, chosen, rejected, layout, PAD)
    _check_pair_batch(batch, prompts, chosen, rejected)


def test_right_and_left_layouts_concretely():
    right = build_sequence_batch([[7, 8]], [[9]], "right", PAD)
    both = build_sequence_batch([[7, 8], [5]], [[9], [6]], "left", PAD)
    assert right.loss_mask.tolist() == [[False, False, True]]
    assert both.input_ids.tolist() == [[7, 8, 9], [PAD, 5, 6]]
    assert both.position_ids.tolist() == [[0, 1, 2], [0, 0, 1]]
    assert both.loss_mask.tolist() == [[False, False, True], [False, False, True]]
    assert both.sequence_index.tolist() == [[0, 0, 0], [-1, 1, 1]]
    packed = build_sequence_batch([[7, 8], [5]], [[9], [6]], "packed", PAD)
    assert packed.input_ids.tolist() == [[7, 8, 9, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert packed.sequence_index.tolist() == [[0, 0, 0, 1, 1]]


def _buggy_chosen_only_prompt_mask(batch: SequenceBatch, prompt_lens: list[int]) -> SequenceBatch:
    """The historic bug: the prompt is masked out of the chosen half only, so the rejected half's
    loss also counts its prompt tokens."""
    n = len(prompt_lens)
    mask = batch.sequence_index >= 0
    for s, positions in enumerate(_sequence_positions(batch)):
        if s < n:  # chosen half: prompt masked
            mask &= ~((batch.sequence_index == s) & (batch.position_ids < prompt_lens[s]))
    return SequenceBatch(
        batch.input_ids, batch.attention_mask, batch.position_ids, mask, batch.sequence_index, batch.num_sequences, batch.layout
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_regression_mask_applied_to_chosen_half_only_is_caught(layout):
    prompts, chosen, rejected = _pairs([4, 2], [3, 3], [2, 5])
    batch = build_pair_batch(prompts, chosen, rejected, layout, PAD)
    buggy = _buggy_chosen_only_prompt_mask(batch, [len(p) for p in prompts])
    prompt_lens = [len(p) for p in prompts] * 2
    completion_lens = [len(c) for c in chosen] + [len(r) for r in rejected]
    check_loss_masks(batch, prompt_lens, completion_lens)  # the real mask passes
    with pytest.raises(ValueError, match="sequence 2: loss mask is wrong on its prompt tokens"):
        check_loss_masks(buggy, prompt_lens, completion_lens)
    # The chosen half alone looks right, which is why the bug went unnoticed.
    assert sequence_masks(buggy)[:2] == sequence_masks(batch)[:2]


def test_check_catches_mask_on_padding():
    batch = build_sequence_batch([[1, 2], [3]], [[4], [5]], "right", PAD)
    batch.loss_mask[1, 2] = True  # the pad slot of the short row
    with pytest.raises(ValueError, match="padding"):
        check_loss_masks(batch, [2, 1], [1, 1])


def test_empty_batch_and_empty_parts():
    for layout in LAYOUTS:
        empty = build_pair_batch([], [], [], layout, PAD)
        assert empty.num_sequences == 0 and empty.input_ids.numel() == 0
        batch = build_pair_batch([[]], [[1, 2]], [[]], layout, PAD)
        check_loss_masks(batch, [0, 0], [2, 0])


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError):
        build_pair_batch([[1]], [[2]], [], "right", PAD)
    with pytest.raises(ValueError, match="layout"):
        build_sequence_batch([[1]], [[2]], "middle", PAD)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(
        st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=8
    ),
    layout=st.sampled_from(LAYOUTS),
)
def test_invariants_hold_for_random_lengths(lens, layout):
    prompts, chosen, rejected = _pairs(*zip(*lens))
    batch = build_pair_batch(prompts, chosen, rejected, layout, PAD)
    _check_pair_batch(batch, prompts, chosen, rejected)


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(0, 10), st.integers(0, 10), st.integers(0, 10)), min_size=1, max_size=6))
def test_layouts_agree_per_sequence(lens):
    prompts, chosen, rejected = _pairs(*zip(*lens))
    views = [build_pair_batch(prompts, chosen, rejected, layout, PAD) for layout in LAYOUTS]
    for view in views[1:]:
        assert _sequence_tokens(view) == _sequence_tokens(views[0])
        assert _sequence_positions(view) == _sequence_positions(views[0])
        assert sequence_masks(view) == sequence_masks(views[0])


def test_shared_block_layout_attention_positions_and_sources():
    """One shared pair: rejected sees the prompt and itself, never chosen; its position ids continue
    from the prompt's end; each completion's first token is predicted by the last prompt token."""
    from prefdata.tokenize.masks import build_block_pair_batch

    prompts, chosen, rejected = _pairs([3], [2], [2])  # row: p0 p1 p2 c0 c1 r0 r1
    batch = build_block_pair_batch(prompts, chosen, rejected, [True])
    assert batch.layout == "shared" and batch.attention_mask is None
    assert batch.input_ids[0].tolist() == prompts[0] + chosen[0] + rejected[0]
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 3, 4]
    assert batch.sequence_index[0].tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert batch.loss_mask[0].tolist() == [False] * 3 + [True] * 4
    assert batch.source_index[0].tolist() == [-1, 0, 1, 2, 3, 2, 5]
    allowed = batch.blocks.allowed(7).int().tolist()
    assert allowed[5] == [1, 1, 1, 0, 0, 1, 0]  # r0: prompt + itself
    assert allowed[6] == [1, 1, 1, 0, 0, 1, 1]  # r1: prompt + r0 + itself
    assert allowed[4] == [1, 1, 1, 1, 1, 0, 0]  # c1: causal over prompt + chosen
    assert batch.num_tokens == 7


def test_unshared_block_layout_is_two_causal_blocks_per_pair():
    from prefdata.tokenize.masks import build_block_pair_batch

    prompts, chosen, rejected = _pairs([2, 0], [1, 2], [2, 1])
    batch = build_block_pair_batch(prompts, chosen, rejected)
    assert batch.layout == "blocks"
    assert batch.blocks.bounds == [(0, 3), (3, 7), (7, 9), (9, 10)]
    assert batch.blocks.shared == [None] * 4
    assert _sequence_tokens(batch) == [prompts[0] + chosen[0], chosen[1], prompts[0] + rejected[0], rejected[1]]
    assert _sequence_positions(batch) == [[0, 1, 2], [0, 1], [0, 1, 2, 3], [0]]
    # Empty prompt: the first completion token has no predictor.
    assert batch.source_index[0, 7].item() == -1 and batch.source_index[0, 9].item() == -1
    allowed = batch.blocks.allowed(10)
    assert not bool(allowed[3:7, 0:3].any())  # no attention across blocks
    with pytest.raises(ValueError, match="share has"):
        build_block_pair_batch(prompts, chosen, rejected, [True])
