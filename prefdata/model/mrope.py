"""3-D (mrope) position ids, in every layout, for the models that compute their own (Qwen2-VL and kin).

Such a model rotates each token by three position ids (temporal, height, width): a text token has
the same id three times, an image's tokens the (t, h, w) offsets of their grid cell from where the
image starts, and the text after an image continues from the image's largest side, not from its
token count. Given no position ids, the body computes them itself (`get_rope_index`) from input_ids,
the image grids and which tokens are image tokens, one padded row at a time. prefdata's layouts put
several sequences in one row (packed, blocks) or a prompt once for two halves (shared), which that
computation would read as one sequence. So the positions are computed here with the body's own
`get_rope_index`, once per sequence (prompt + half, each a row of its own with its own grids), and
every token of the layout takes its sequence's positions at its place in that sequence. That place
is the token's 1-D position id in every layout (the ids restart per sequence, and a shared block's
rejected tokens continue from the prompt's end, as in prompt + rejected alone), so one gather by
(sequence, 1-D position) places them.

Shapes: right/left padding and the block layouts pass [3, B, T], as the body's own computation
does; packed passes [4, 1, T] with the 1-D ids first, which the text model reads to find the packed
sequences (given [3, ...] it builds one causal mask over the whole row). A text model that does not
read that form cannot run packed rows (`reads_text_positions`); they then run as right padding.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from prefdata.model.attention import model_body, text_body
from prefdata.tokenize.masks import SequenceBatch


@dataclass
class RopeIndex:
    """A model body's own 3-D position computation, as refs and train call it."""

    get_rope_index: Callable[..., Any]
    image_token_id: int
    takes_type_ids: bool  # transformers 5 finds image tokens by `mm_token_type_ids` (1 = image)

    def for_batch(self, batch: SequenceBatch, sequences: Sequence[Sequence[int]],
                  grids: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """The position ids the model gets for `batch`, whose sequence ``s`` is ``sequences[s]`` (the
        whole prompt + half) with image grids ``grids[s]`` (image_grid_thw rows, None: no image)."""
        per_sequence = self.sequence_positions(sequences, grids)  # [3, S, W]
        real = batch.sequence_index >= 0
        seq = batch.sequence_index.clamp(min=0)
        pos = batch.position_ids.clamp(max=max(per_sequence.shape[-1] - 1, 0))
        placed = per_sequence[:, seq, pos] * real  # 0 on padding, as the body's own computation leaves it
        if batch.layout == "packed":
            return torch.cat([batch.position_ids.unsqueeze(0), placed])
        return placed

    def sequence_positions(self, sequences: Sequence[Sequence[int]],
                           grids: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """[3, S, W]: each sequence's positions as the body computes them for that sequence alone."""
        width = max((len(s) for s in sequences), default=0)
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        mask = torch.zeros(len(sequences), width, dtype=torch.long)
        for row, tokens in enumerate(sequences):
            ids[row, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
            mask[row, : len(tokens)] = 1
        held = [g for g in grids if g is not None and len(g)]
        if not held:  # text only: the body's positions are 0, 1, 2, ... on all three axes
            return torch.arange(width, dtype=torch.long).expand(3, len(sequences), width)
        kwargs: dict[str, Any] = {"input_ids": ids, "image_grid_thw": torch.cat(held), "attention_mask": mask}
        if self.takes_type_ids:
            kwargs["mm_token_type_ids"] = ((ids == self.image_token_id) & (mask > 0)).int()
        positions, _ = self.get_rope_index(**kwargs)
        return positions.long()


def rope_index(model: Any, image_token_id: int) -> RopeIndex | None:
    """The body's `get_rope_index` when the model computes 3-D positions for images; None for a
    model with 1-D positions."""
    compute = getattr(model_body(model), "get_rope_index", None)
    if compute is None:
        return None
    params = inspect.signature(compute).parameters
    return RopeIndex(compute, int(image_token_id), "mm_token_type_ids" in params)


def computes_3d_positions(model: Any) -> bool:
    """Whether the model's body computes 3-D (mrope) positions of its own."""
    return hasattr(model_body(model), "get_rope_index")


def reads_text_positions(model: Any) -> bool:
    """Whether the text model takes [4, B, T] position ids with the 1-D ids first (transformers 5's
    Qwen2-VL family), the form packed rows need: it reads them to find the sequences."""
    forward = inspect.unwrap(type(text_body(model)).forward)
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return "shape[0] == 4" in source
