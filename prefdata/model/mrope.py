"""3-D (mrope) position ids, in every layout, for the models that compute their own (Qwen2-VL and kin).

Such a model rotates each token by three position ids (temporal, height, width): a text token has
the same id three times, an image's tokens the (t, h, w) offsets of their grid cell from where the
image starts, and the text after an image continues from the image's largest side, not from its
token count. Given no position ids, the body computes them itself (`get_rope_index`) from input_ids,
the image grids and which tokens are image tokens, one padded row at a time. prefdata's layouts put
several sequences in one row (packed, blocks) or a prompt once for two halves (shared), which that
computation would read as one sequence. So the positions are computed here with the body's own
`get_rope_index` for each sequence (prompt + half) as a row of its own with its own grids, and every
token of the layout takes its sequence's positions at its place in that sequence. That place is the
token's 1-D position id in every layout (the ids restart per sequence, and a shared block's rejected
tokens continue from the prompt's end, as in prompt + rejected alone), so one gather by (sequence,
1-D position) places them.

A pair's prompt goes through `get_rope_index` once for both halves (its Python loop costs a few
microseconds a token): the completions are text, which continues from the prompt's largest position
+ 1, as the model's own generation continues it. That rule is checked once against a whole
sequence's positions; a model where it fails gets every whole sequence computed.

Shapes: right/left padding and the block layouts pass [3, B, T], as the body's own computation
does; packed passes [4, 1, T] with the 1-D ids first, which the text model reads to find the packed
sequences (given [3, ...] it builds one causal mask over the whole row). A text model that does not
read that form cannot run packed rows (`reads_text_positions`); they then run as right padding.
"""

from __future__ import annotations

import functools
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
    # Whether text after a prompt continues from the prompt's largest position + 1 (as the model's own
    # generation continues it), so each prompt needs computing once: checked on the first image pair.
    continues: bool | None = None

    def for_batch(self, batch: SequenceBatch, prompts: Sequence[Sequence[int]], halves: Sequence[Sequence[int]],
                  grids: dict[int, torch.Tensor]) -> torch.Tensor:
        """The position ids the model gets for the pair batch `batch`, whose sequence ``s`` is
        ``prompts[s % n] + halves[s]`` (n pairs; halves: chosen..., rejected...); `grids`: per pair
        with images, its images' image_grid_thw rows."""
        per_sequence = self.sequence_positions(prompts, halves, grids)  # [3, 2n, W]
        real = batch.sequence_index >= 0
        seq = batch.sequence_index.clamp(min=0)
        pos = batch.position_ids.clamp(max=max(per_sequence.shape[-1] - 1, 0))
        placed = per_sequence[:, seq, pos] * real  # 0 on padding, as the body's own computation leaves it
        if batch.layout == "packed":
            return torch.cat([batch.position_ids.unsqueeze(0), placed])
        return placed

    def sequence_positions(self, prompts: Sequence[Sequence[int]], halves: Sequence[Sequence[int]],
                           grids: dict[int, torch.Tensor]) -> torch.Tensor:
        """[3, 2n, W]: each sequence's positions as the body computes them for that sequence alone.

        Text alone is 0, 1, 2, ... on every axis. A pair with images has its prompt computed once by
        the body, its completions continuing from there (both are text); where that rule does not
        hold for the model, or a completion holds an image token, each whole sequence is computed."""
        n = len(prompts)
        width = max((len(prompts[s % n]) + len(halves[s]) for s in range(2 * n)), default=0)
        out = torch.arange(width, dtype=torch.long).repeat(3, 2 * n, 1)
        pairs = [i for i in range(n) if grids.get(i) is not None and len(grids[i])]
        if not pairs:
            return out
        if self.continues is None:
            i = pairs[0]
            whole = self.rope_rows([list(prompts[i]) + list(halves[i])], [grids[i]])[:, 0]
            continued = self._continued(prompts, halves, grids, [i], out.clone())[:, i, : whole.shape[1]]
            self.continues = torch.equal(continued, whole)
        if self.continues and not any(self.image_token_id in halves[s] for i in pairs for s in (i, i + n)):
            return self._continued(prompts, halves, grids, pairs, out)
        sequences = [s for i in pairs for s in (i, i + n)]
        whole = self.rope_rows([list(prompts[s % n]) + list(halves[s]) for s in sequences],
                               [grids[s % n] for s in sequences])
        out[:, sequences, : whole.shape[-1]] = whole
        return out

    def _continued(self, prompts: Sequence[Sequence[int]], halves: Sequence[Sequence[int]],
                   grids: dict[int, torch.Tensor], pairs: list[int], out: torch.Tensor) -> torch.Tensor:
        """`out` with the sequences of `pairs` set: the prompt as the body computes it, then the
        completion from the prompt's largest position + 1 on."""
        n = len(prompts)
        computed = self.rope_rows([prompts[i] for i in pairs], [grids[i] for i in pairs])
        for row, i in enumerate(pairs):
            p = len(prompts[i])
            own = computed[:, row, :p]
            shift = int(own.max()) + 1 - p if p else 0
            for s in (i, i + n):
                out[:, s, :p] = own
                out[:, s, p:] += shift
        return out

    def rope_rows(self, sequences: Sequence[Sequence[int]], grids: Sequence[torch.Tensor]) -> torch.Tensor:
        """[3, S, W]: the body's `get_rope_index` over `sequences` as right-padded rows, each with its
        own grids (in row order, as the body reads them)."""
        width = max((len(s) for s in sequences), default=0)
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        mask = torch.zeros(len(sequences), width, dtype=torch.long)
        for row, tokens in enumerate(sequences):
            ids[row, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
            mask[row, : len(tokens)] = 1
        kwargs: dict[str, Any] = {"input_ids": ids, "image_grid_thw": torch.cat(list(grids)), "attention_mask": mask}
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
    return _reads_text_positions(type(text_body(model)))


@functools.lru_cache(maxsize=None)
def _reads_text_positions(text_model: type) -> bool:
    try:  # read once per class: packed batches ask on every forward
        source = inspect.getsource(inspect.unwrap(text_model.forward))
    except (OSError, TypeError):
        return False
    return "shape[0] == 4" in source
