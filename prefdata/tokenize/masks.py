"""Loss masks and position ids, built from stored ids. The one place every stage gets them from.

Three layouts of the same sequences (prompt ids + completion ids):

- ``right``: rows padded at the end, with an attention mask;
- ``left``: rows padded at the start, with an attention mask;
- ``packed``: all sequences concatenated into one row of real tokens, no padding, no attention
  mask; sequence boundaries are carried by position ids that restart at 0 (transformers detects
  packing from them when the attention mask is None).

Two padding-free pair layouts carry their attention structure as explicit blocks
(`AttentionBlocks`, run by prefdata.model.attention), so no row-wide mask is ever built:

- ``blocks``: every half is its own causal block (prompt + completion), several pairs per row;
- ``shared``: a pair whose prompt is worth sharing is one block ``prompt + chosen + rejected``
  in which rejected tokens see the prompt and themselves but never chosen, and rejected position
  ids continue from the prompt's end (the ids they would have alone); other pairs as in ``blocks``.

In every layout the position ids of a token depend only on its place in its own sequence, never on
padding, and the loss mask is True exactly on the completion tokens of every sequence (chosen and
rejected halves alike: the historic bug masked only the chosen half's prompt).

`--loss-on answer`: an optional per-sequence loss start ``k`` keeps the first ``k`` completion tokens
(a reasoning block) in the sequence, where later tokens attend to them, but out of the loss mask.

Agent trajectories and multi-turn completions: an optional per-sequence token mask (OUT's
``chosen_loss_mask``/``rejected_loss_mask``, 1 = in the loss, one entry per completion token; None =
every completion token) is ANDed into the loss mask, so tool results and user turns stay in the
sequence as context, out of the loss. It composes with a loss start: a token is in the loss when it
is past the loss start and its mask entry is 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

Layout = Literal["right", "left", "packed"]
LAYOUTS: tuple[str, ...] = ("right", "left", "packed")

def _checked_starts(loss_starts: list[int] | None, n: int) -> list[int]:
    if loss_starts is None:
        return [0] * n
    starts = [int(k) for k in loss_starts]
    if len(starts) != n:
        raise ValueError(f"{len(starts)} loss starts for {n} sequences")
    if any(k < 0 for k in starts):
        raise ValueError("a loss start is negative")
    return starts


TokenMasks = Sequence["Sequence[int] | None"]


def _checked_token_masks(token_masks: TokenMasks | None, completion_lens: list[int]) -> list[Sequence[int] | None]:
    if token_masks is None:
        return [None] * len(completion_lens)
    masks = list(token_masks)
    if len(masks) != len(completion_lens):
        raise ValueError(f"{len(masks)} token masks for {len(completion_lens)} sequences")
    for i, (mask, n) in enumerate(zip(masks, completion_lens)):
        if mask is not None and len(mask) != n:
            raise ValueError(f"sequence {i}: a loss mask of {len(mask)} entries for {n} completion tokens")
    return masks


def _allowed_tokens(prompt_lens: list[int], masks: list[Sequence[int] | None], completion_lens: list[int]) -> torch.Tensor:
    """bool [total]: False on completion tokens a token mask keeps out of the loss, True elsewhere."""
    parts: list[torch.Tensor] = []
    for p, mask, n in zip(prompt_lens, masks, completion_lens):
        parts.append(torch.ones(p, dtype=torch.bool))
        parts.append(torch.ones(n, dtype=torch.bool) if mask is None else torch.as_tensor(list(mask), dtype=torch.bool))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor  # long [B, T]; packed: [1, total_tokens]
    attention_mask: torch.Tensor | None  # long [B, T] for right/left; None for packed
    position_ids: torch.Tensor  # long [B, T]; restart at 0 for every sequence; 0 on padding
    loss_mask: torch.Tensor  # bool [B, T]: True exactly on completion tokens of each sequence
    sequence_index: torch.Tensor  # long [B, T]: sequence number of each token, -1 on padding
    num_sequences: int
    layout: str = "right"
    # Block layouts only: the attention blocks, and for every token the flat index of the token whose
    # hidden state predicts it (-1: none). Other layouts predict token t from t-1 of the same sequence.
    blocks: AttentionBlocks | None = None
    source_index: torch.Tensor | None = None
    # Image pairs: the image processor's outputs (pixel_values, image_sizes / image_grid_thw) for the
    # images in the order their tokens appear in the flattened input_ids (prefdata.model.vision_inputs).
    pixel_inputs: dict[str, torch.Tensor] | None = None
    # Models with 3-D (mrope) positions: the position ids their forward gets instead ([3, B, T], or
    # [4, B, T] with `position_ids` first; prefdata.model.mrope). `position_ids` stay the 1-D
    # per-sequence ids the loss reads.
    model_position_ids: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> SequenceBatch:
        """The same batch on another device."""
        return SequenceBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=None if self.attention_mask is None else self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            loss_mask=self.loss_mask.to(device),
            sequence_index=self.sequence_index.to(device),
            num_sequences=self.num_sequences,
            layout=self.layout,
            blocks=None if self.blocks is None else self.blocks.to(device),
            source_index=None if self.source_index is None else self.source_index.to(device),
            pixel_inputs=None if self.pixel_inputs is None else {k: v.to(device) for k, v in self.pixel_inputs.items()},
            model_position_ids=None if self.model_position_ids is None else self.model_position_ids.to(device),
        )

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        if self.blocks is not None:
            return int(self.input_ids.numel())  # block layouts have no padding
        return int((self.sequence_index >= 0).sum())


@dataclass
class AttentionBlocks:
    """A padding-free row cut into attention blocks: a token attends causally inside its own block
    only. A shared-prompt block (prompt, chosen, rejected) runs as two mask-free-or-small parts:
    prompt + chosen causally, then the rejected tokens against the prompt's and their own keys."""

    bounds: list[tuple[int, int]]  # [start, end) of each block in the row
    shared: list[tuple[int, int, int] | None]  # per block: (prompt, chosen, rejected) lengths, or None

    def to(self, device: torch.device | str) -> AttentionBlocks:
        return self  # plain Python data; the masks are built on the device that asks for them

    def rejected_masks(self, device: torch.device | str = "cpu") -> list[torch.Tensor | None]:
        """Per block: for a shared block the bool [1, 1, R, P + R] mask of its rejected queries over
        the prompt's and the rejected keys (True = attend), else None."""
        out: list[torch.Tensor | None] = []
        for parts in self.shared:
            if parts is None or parts[2] == 0:
                out.append(None)
                continue
            p, _, r = parts
            own = torch.ones(r, r, dtype=torch.bool, device=device).tril()
            out.append(torch.cat([torch.ones(r, p, dtype=torch.bool, device=device), own], dim=1)[None, None])
        return out

    def allowed(self, total: int) -> torch.Tensor:
        """The whole row's bool [total, total] attention pattern (for tests and small checks only)."""
        full = torch.zeros(total, total, dtype=torch.bool)
        for (start, end), parts in zip(self.bounds, self.shared):
            n = end - start
            block = torch.ones(n, n, dtype=torch.bool).tril()
            if parts is not None:
                p, c, _ = parts
                block[p + c :, p : p + c] = False  # rejected never sees chosen
            full[start:end, start:end] = block
        return full


def build_sequence_batch(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    layout: Layout,
    pad_token_id: int,
    loss_starts: list[int] | None = None,
    token_masks: TokenMasks | None = None,
) -> SequenceBatch:
    """Lay out sequences ``prompt_ids[i] + completion_ids[i]`` as one batch.

    Sequence ``i`` of the result is ``prompt_ids[i] + completion_ids[i]``; its completion tokens
    (and only those) carry the loss mask, from completion token ``loss_starts[i]`` on (default 0),
    where ``token_masks[i]`` (when given and not None) is 1.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (one of {', '.join(LAYOUTS)})")
    n = len(prompt_ids)
    starts_in_completion = _checked_starts(loss_starts, n)
    prompt_lens = [len(p) for p in prompt_ids]
    seq_lens = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    flat = [tok for p, c in zip(prompt_ids, completion_ids) for part in (p, c) for tok in part]
    flat_ids = torch.tensor(flat, dtype=torch.long)
    total = len(flat)

    lens = torch.tensor(seq_lens, dtype=torch.long)
    plens = torch.tensor(prompt_lens, dtype=torch.long)
    loss_from = plens + torch.tensor(starts_in_completion, dtype=torch.long)  # first loss position
    seq_of_token = torch.repeat_interleave(torch.arange(n, dtype=torch.long), lens)  # [total]
    starts = torch.cumsum(lens, 0) - lens  # start of each sequence in `flat`
    pos_in_seq = torch.arange(total, dtype=torch.long) - starts[seq_of_token]  # restart at 0
    is_completion = pos_in_seq >= loss_from[seq_of_token]
    masks = _checked_token_masks(token_masks, [len(c) for c in completion_ids])
    if any(mask is not None for mask in masks):
        is_completion &= _allowed_tokens(prompt_lens, masks, [len(c) for c in completion_ids])

    if layout == "packed":
        return SequenceBatch(
            input_ids=flat_ids.unsqueeze(0),
            attention_mask=None,
            position_ids=pos_in_seq.unsqueeze(0),
            loss_mask=is_completion.unsqueeze(0),
            sequence_index=seq_of_token.unsqueeze(0),
            num_sequences=n,
            layout=layout,
        )

    width = max(seq_lens, default=0)
    # Column of each real token in its row: right padding starts at 0, left padding after the pads.
    offset = torch.zeros(n, dtype=torch.long) if layout == "right" else width - lens
    cols = offset[seq_of_token] + pos_in_seq
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    position_ids = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.bool)
    sequence_index = torch.full((n, width), -1, dtype=torch.long)
    input_ids[seq_of_token, cols] = flat_ids
    attention_mask[seq_of_token, cols] = 1
    position_ids[seq_of_token, cols] = pos_in_seq
    loss_mask[seq_of_token, cols] = is_completion
    sequence_index[seq_of_token, cols] = seq_of_token
    return SequenceBatch(input_ids, attention_mask, position_ids, loss_mask, sequence_index, n, layout)


def build_pair_batch(
    prompt_ids: list[list[int]],
    chosen_ids: list[list[int]],
    rejected_ids: list[list[int]],
    layout: Layout,
    pad_token_id: int,
    chosen_loss_starts: list[int] | None = None,
    rejected_loss_starts: list[int] | None = None,
    chosen_loss_masks: TokenMasks | None = None,
    rejected_loss_masks: TokenMasks | None = None,
) -> SequenceBatch:
    """Both halves of ``n`` pairs in one batch: sequences ``[chosen_0..chosen_{n-1},
    rejected_0..rejected_{n-1}]``, each half with the same prompt ids and its own completion mask
    (starting at its loss start, and ANDed with its token mask, when given)."""
    n = len(prompt_ids)
    if not n == len(chosen_ids) == len(rejected_ids):
        raise ValueError("prompt_ids, chosen_ids and rejected_ids must have the same number of rows")
    starts = None
    if chosen_loss_starts is not None or rejected_loss_starts is not None:
        starts = _checked_starts(chosen_loss_starts, n) + _checked_starts(rejected_loss_starts, n)
    masks = None
    if chosen_loss_masks is not None or rejected_loss_masks is not None:
        masks = list(chosen_loss_masks or [None] * n) + list(rejected_loss_masks or [None] * n)
    return build_sequence_batch(
        list(prompt_ids) + list(prompt_ids), list(chosen_ids) + list(rejected_ids), layout, pad_token_id, starts, masks
    )


def sequence_masks(batch: SequenceBatch) -> list[list[int]]:
    """The loss mask of each sequence in sequence order, padding removed (for checks and `show`)."""
    seq = batch.sequence_index.flatten()
    mask = batch.loss_mask.flatten()
    out: list[list[int]] = [[] for _ in range(batch.num_sequences)]
    # Tokens of one sequence appear in order in the flattened batch in every layout.
    for s, m in zip(seq.tolist(), mask.tolist()):
        if s >= 0:
            out[s].append(int(m))
    return out


def check_loss_masks(batch: SequenceBatch, prompt_lens: list[int], completion_lens: list[int],
                     loss_starts: list[int] | None = None, token_masks: TokenMasks | None = None) -> None:
    """Raise ValueError unless every sequence's loss mask is 1 exactly on its completion tokens (from
    its loss start on, where its token mask is 1) and 0 on its prompt and on padding (invariant 1)."""
    if batch.num_sequences != len(prompt_lens) or len(prompt_lens) != len(completion_lens):
        raise ValueError("sequence counts do not match")
    if bool((batch.loss_mask & (batch.sequence_index < 0)).any()):
        raise ValueError("loss mask is set on padding")
    starts = _checked_starts(loss_starts, len(prompt_lens))
    token = _checked_token_masks(token_masks, completion_lens)
    for i, mask in enumerate(sequence_masks(batch)):
        skipped = min(starts[i], completion_lens[i])
        expected = [0] * (prompt_lens[i] + skipped) + [1] * (completion_lens[i] - skipped)
        if token[i] is not None:
            expected[prompt_lens[i]:] = [e & int(bool(t)) for e, t in zip(expected[prompt_lens[i]:], token[i])]
        if mask != expected:
            where = "prompt" if any(mask[: prompt_lens[i]]) else "completion"
            raise ValueError(f"sequence {i}: loss mask is wrong on its {where} tokens")


def build_block_pair_batch(
    prompt_ids: list[list[int]],
    chosen_ids: list[list[int]],
    rejected_ids: list[list[int]],
    share: list[bool] | None = None,
    chosen_loss_starts: list[int] | None = None,
    rejected_loss_starts: list[int] | None = None,
    chosen_loss_masks: TokenMasks | None = None,
    rejected_loss_masks: TokenMasks | None = None,
) -> SequenceBatch:
    """``n`` pairs in one padding-free row of attention blocks; sequence ``i`` is chosen ``i`` and
    sequence ``n + i`` is rejected ``i``, as in `build_pair_batch`.

    ``share[i]`` puts pair ``i`` in one shared-prompt block (its prompt tokens appear once); other
    pairs get one causal block per half. Position ids are those each half would have alone. Loss
    starts and token masks as in `build_pair_batch`.
    """
    n = len(prompt_ids)
    if not n == len(chosen_ids) == len(rejected_ids):
        raise ValueError("prompt_ids, chosen_ids and rejected_ids must have the same number of rows")
    share = [False] * n if share is None else list(share)
    if len(share) != n:
        raise ValueError(f"share has {len(share)} entries for {n} pairs")
    chosen_starts = _checked_starts(chosen_loss_starts, n)
    rejected_starts = _checked_starts(rejected_loss_starts, n)
    chosen_masks = _checked_token_masks(chosen_loss_masks, [len(c) for c in chosen_ids])
    rejected_masks = _checked_token_masks(rejected_loss_masks, [len(r) for r in rejected_ids])
    ids: list[int] = []
    pos: list[int] = []
    seq: list[int] = []
    loss: list[bool] = []
    src: list[int] = []
    bounds: list[tuple[int, int]] = []
    shared_parts: list[tuple[int, int, int] | None] = []

    def add_half(tokens: list[int], start_pos: int, seq_id: int, first_source: int, loss_from: int,
                 token_mask: Sequence[int] | None = None) -> None:
        # The first token's predictor is `first_source` (-1: none); later ones are predicted by the
        # token just before them in the row, which is in the same half. Tokens from `loss_from` on
        # carry the loss (a prompt passes len(tokens): none), where `token_mask` is 1.
        base = len(ids)
        ids.extend(tokens)
        pos.extend(range(start_pos, start_pos + len(tokens)))
        seq.extend([seq_id] * len(tokens))
        skipped = min(loss_from, len(tokens))
        if token_mask is None:
            loss.extend([False] * skipped + [True] * (len(tokens) - skipped))
        else:
            loss.extend(k >= skipped and bool(m) for k, m in enumerate(token_mask))
        src.extend([first_source] + list(range(base, base + len(tokens) - 1)) if tokens else [])

    for i in range(n):
        p, c, r = list(prompt_ids[i]), list(chosen_ids[i]), list(rejected_ids[i])
        if share[i]:
            start = len(ids)
            add_half(p, 0, i, -1, len(p))
            last_prompt = len(ids) - 1 if p else -1
            add_half(c, len(p), i, last_prompt, chosen_starts[i], chosen_masks[i])
            add_half(r, len(p), n + i, last_prompt, rejected_starts[i], rejected_masks[i])
            bounds.append((start, len(ids)))
            shared_parts.append((len(p), len(c), len(r)))
            continue
        for completion, seq_id, loss_start, token_mask in ((c, i, chosen_starts[i], chosen_masks[i]),
                                                           (r, n + i, rejected_starts[i], rejected_masks[i])):
            start = len(ids)
            add_half(p, 0, seq_id, -1, len(p))
            add_half(completion, len(p), seq_id, len(ids) - 1 if p else -1, loss_start, token_mask)
            bounds.append((start, len(ids)))
            shared_parts.append(None)
    bounds_kept = [(a, b) for a, b in bounds if b > a]
    shared_kept = [s for (a, b), s in zip(bounds, shared_parts) if b > a]
    return SequenceBatch(
        input_ids=torch.tensor(ids, dtype=torch.long).reshape(1, -1),
        attention_mask=None,
        position_ids=torch.tensor(pos, dtype=torch.long).reshape(1, -1),
        loss_mask=torch.tensor(loss, dtype=torch.bool).reshape(1, -1),
        sequence_index=torch.tensor(seq, dtype=torch.long).reshape(1, -1),
        num_sequences=2 * n,
        layout="shared" if any(share) else "blocks",
        blocks=AttentionBlocks(bounds_kept, shared_kept),
        source_index=torch.tensor(src, dtype=torch.long).reshape(1, -1),
    )
