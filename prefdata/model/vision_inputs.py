"""Pixel inputs for a batch of image pairs, in the order the model consumes them.

A LLaVA-style model (LlavaModel and its kin) encodes every image of `pixel_values` and scatters the
features into the image-token positions of the whole flattened batch, in order of appearance. So
the images must be listed in the order their image tokens appear in the batch's flattened
`input_ids`, whatever the layout: right/left/packed put the chosen halves, then the rejected ones,
each carrying its pair's prompt (and so its images); the block layouts put each half's prompt in
its block, and a shared-prompt block holds its prompt (and its images) once.

That order is read from the batch itself: the sequences that hold image tokens, in the order their
first image token appears (a sequence's tokens are contiguous in every layout, and its images sit
in its prompt in image order). Sequence ``s`` of a pair batch is a half of pair ``s % n``.

Images are decoded here, per batch (lazily: a dataset of images is never decoded up front), and each
distinct image goes through the image processor once even when two halves carry it. Each pair's
image grids (Qwen2-VL's `image_grid_thw`) are kept per pair too: a model with 3-D positions needs
them per sequence (prefdata.model.mrope).

A tiled image processor (Idefics3 / SmolVLM: `pixel_attention_mask` among its inputs) cuts each
image into tiles, and its model drops all-zero (padding) tiles, encodes the rest, and scatters
their features into the image tokens of the flattened batch in order. So each image is processed
as its own sample (its tiles, then zero padding tiles), its real tiles are kept (by the model's own
test: not all zero), and the batch gets one sample holding every listed image's tiles in turn, with
the matching pixel masks: the model sees exactly the tiles of the images whose tokens appear.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from prefdata.model.mrope import RopeIndex
from prefdata.tokenize.masks import SequenceBatch

# What an image processor may return that the model's forward takes; other keys are not read.
IMAGE_INPUT_KEYS: tuple[str, ...] = ("pixel_values", "pixel_attention_mask", "image_sizes", "image_grid_thw")


@dataclass
class BatchImages:
    """A pair batch's images as the forward takes them, and each image pair's grids."""

    inputs: dict[str, torch.Tensor] | None  # None when no sequence holds an image token
    grids: dict[int, torch.Tensor]  # pair -> its images' image_grid_thw rows (processors with grids only)


@dataclass
class VisionInputs:
    """How a forward feeds images: the processor's image processor and the image token's id, and
    for a model with 3-D (mrope) positions its own position computation (set by
    prefdata.model.vision_model.check_loaded_model)."""

    image_processor: Any
    image_token_id: int
    rope: RopeIndex | None = None
    # For a model whose image tokens attend each other both ways (Gemma 3 and kin): the forward's
    # keyword that marks them (its own mask reads it); set by check_loaded_model.
    type_ids_key: str | None = None
    # For a tiled image processor (Idefics3 / SmolVLM): pixel inputs are tiles under a pixel mask.
    tiled: bool = False

    def for_batch(self, batch: SequenceBatch, images: Sequence[Sequence[Any] | None]) -> BatchImages:
        """The image-processor outputs for `batch` (a pair batch of ``len(images)`` pairs, sequences
        [chosen..., rejected...]), and the grids of each pair with images; with `type_ids_key`, also
        the batch's token types as the processor gives them (1 on image tokens, else 0)."""
        order = image_pair_order(batch, self.image_token_id, len(images))
        found = pixel_inputs(self.image_processor, images, order, self.tiled)
        if self.type_ids_key and found.inputs is not None:
            found.inputs[self.type_ids_key] = (batch.input_ids == self.image_token_id).long()
        return found


def image_pair_order(batch: SequenceBatch, image_token_id: int, num_pairs: int) -> list[int]:
    """For every sequence that holds image tokens, in the order its image tokens appear in the
    flattened batch: the pair it belongs to (``sequence % num_pairs``)."""
    flat_ids = batch.input_ids.flatten()
    seq = batch.sequence_index.flatten()
    holders = seq[(flat_ids == image_token_id) & (seq >= 0)]
    if holders.numel() == 0:
        return []
    return [int(s) % num_pairs for s in torch.unique_consecutive(holders).tolist()]


def decode_image(item: Any) -> Any:
    """A PIL image from what OUT's `images` column holds (``{"bytes", "path"}``, as datasets.Image
    stores it), a path, or an image already decoded."""
    from prefdata.io.images import pillow

    image_module = pillow()
    if isinstance(item, image_module.Image):
        return item
    if isinstance(item, dict):
        data, path = item.get("bytes"), item.get("path")
        if data is not None:
            image = image_module.open(io.BytesIO(data))
        elif path:
            image = image_module.open(path)
        else:
            raise ValueError("an image with neither bytes nor a path")
    else:
        image = image_module.open(item)
    image.load()
    return image


def pixel_inputs(image_processor: Any, images: Sequence[Sequence[Any] | None], order: list[int],
                 tiled: bool = False) -> BatchImages:
    """The image processor's outputs for the images of pairs ``order[0], order[1], ...`` in turn
    (each pair's images in their own order), and each of those pairs' grids. Each pair's images are
    decoded and processed once; `tiled`: each image as its own sample, its real tiles kept."""
    if not order:
        return BatchImages(None, {})
    pairs = list(dict.fromkeys(order))  # distinct pairs, first appearance first
    first_image: dict[int, int] = {}
    decoded: list[Any] = []
    for p in pairs:
        first_image[p] = len(decoded)
        decoded.extend(decode_image(item) for item in images[p] or [])
    sequence = [first_image[p] + k for p in order for k in range(len(images[p] or []))]
    if not sequence:
        return BatchImages(None, {})
    if tiled:
        return BatchImages(_tiles(image_processor, decoded, sequence), {})
    out = image_processor(images=decoded, return_tensors="pt")
    tensors = {key: out[key] for key in IMAGE_INPUT_KEYS if key in out and out[key] is not None}
    if "pixel_values" not in tensors:
        raise ValueError(f"{type(image_processor).__name__} returned no pixel_values")
    grids = tensors.get("image_grid_thw")
    per_pair = {} if grids is None else {p: grids[first_image[p] : first_image[p] + len(images[p] or [])]
                                         for p in pairs if images[p]}
    return BatchImages({key: _per_image(key, value, tensors, sequence) for key, value in tensors.items()}, per_pair)


def _per_image(key: str, value: torch.Tensor, tensors: dict[str, torch.Tensor], sequence: list[int]) -> torch.Tensor:
    """`value` (one entry per decoded image along dim 0) rearranged to the images in `sequence`.
    With grids (Qwen2-VL style) pixel_values are the images' patches concatenated: cut by grid."""
    if key == "pixel_values" and "image_grid_thw" in tensors:
        chunks = value.split(tensors["image_grid_thw"].prod(dim=-1).tolist(), dim=0)
        return torch.cat([chunks[i] for i in sequence], dim=0)
    return value.index_select(0, torch.tensor(sequence, dtype=torch.long))


def _tiles(image_processor: Any, decoded: list[Any], sequence: list[int]) -> dict[str, torch.Tensor]:
    """A tiled processor's pixel values and pixel masks, one sample [1, tiles, ...] holding the real
    tiles of images ``sequence[0], sequence[1], ...`` in turn. Each image is a sample of its own, so
    its tiles are never mixed with another's; the padding tiles (all zero, as the model tells them)
    are dropped here as the model would drop them."""
    out = image_processor(images=[[image] for image in decoded], return_tensors="pt")
    values, masks = out["pixel_values"], out.get("pixel_attention_mask")
    if values is None or values.dim() != 5:
        raise ValueError(f"{type(image_processor).__name__} returned no tiles [images, tiles, C, H, W]")
    real = values.flatten(2).ne(0).any(dim=-1)  # [images, tiles]
    picked = {"pixel_values": torch.cat([values[i][real[i]] for i in sequence])[None]}
    if masks is not None:
        picked["pixel_attention_mask"] = torch.cat([masks[i][real[i]] for i in sequence])[None]
    return picked
