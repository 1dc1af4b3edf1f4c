"""The batches `prefdata.trl.DPOTrainer` gives TRL for image OUTs: OUT's stored ids plus pixel values.

TRL 1.16's `DataCollatorForVisionPreference` renders the text columns again and runs
`processor(text, images)` for every batch, so prefdata's truncation and checks would not reach
training. `ImagePairCollator` builds the same batch from what OUT stores: TRL's text collator
(`DataCollatorForPreference`) over `prompt_ids`/`chosen_ids`/`rejected_ids` (the image tokens are
already expanded there), plus the processor's image outputs for the rows' images, laid out as TRL
lays them out (each row's images once for the chosen half, once for the rejected half; computed once
and repeated, where TRL runs the image processor twice). What
`processor(text, images)` adds on the text side (`token_type_ids`, `mm_token_type_ids`) comes from the
processor's own `create_mm_token_type_ids` over the stored ids. Stored `ref_chosen_logps` /
`ref_rejected_logps` pass through, as in TRL's text collator.

`LossMaskCollator` wraps either for OUTs with per-token loss masks (agent trajectories, multi-turn
completions): TRL's `completion_mask` is 1 on every completion token, and TRL sums log-probs where it
is 1 (labels elsewhere are -100), so ANDing the stored masks into it makes TRL's loss sum exactly
the tokens `prefdata refs` summed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl.trainer.dpo_trainer import DataCollatorForPreference

from prefdata.core.errors import PrefdataError
from prefdata.io.images import pillow

# Keys `processor(text, images)` returns that the collator builds itself from the stored ids.
_TEXT_KEYS = frozenset({"input_ids", "attention_mask"})
_TYPE_ID_KEYS = ("token_type_ids", "mm_token_type_ids")  # Gemma 3, Qwen2-VL: which tokens are image tokens


@dataclass
class ImagePairCollator:
    """DataCollatorForPreference over OUT's ids, plus the images through the processor."""

    processor: Any
    pad_token_id: int
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    type_id_keys: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self._text = DataCollatorForPreference(
            pad_token_id=self.pad_token_id, max_length=self.max_length, pad_to_multiple_of=self.pad_to_multiple_of
        )
        self.type_id_keys = _text_side_keys(self.processor)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self._text(examples)
        rows = [list(example.get("images") or []) for example in examples]
        if any(rows):  # a processor given no image at all raises; text-only batches have none to give
            # padding: a processor that writes placeholder text for images alone (Gemma 3) pads it; that
            # text and its token types are not kept (the types come from the stored ids, below).
            images = self.processor(images=rows, return_tensors="pt", padding=True)
            # The chosen rows, then the rejected rows: TRL runs the processor on `rows * 2`; the values
            # index images (or rows, or their patches in order) along dim 0, so twice is a concatenation.
            batch.update({key: _twice(value) for key, value in images.items()
                          if key not in _TEXT_KEYS and key not in _TYPE_ID_KEYS})
        if self.type_id_keys:
            import torch

            type_ids = torch.tensor(self.processor.create_mm_token_type_ids(batch["input_ids"]))
            batch.update({key: type_ids for key in self.type_id_keys})
        return batch


@dataclass
class LossMaskCollator:
    """A preference collator whose `completion_mask` keeps only the tokens OUT's loss masks mark 1.

    TRL lays a batch out as rows [chosen_0..chosen_{n-1}, rejected_0..rejected_{n-1}], each
    `prompt_ids + completion_ids`, right-padded and uncut (the hand-off holds `max_length` to OUT's)."""

    base: Any

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = self.base(examples)
        mask = batch["completion_mask"]
        n = len(examples)
        for i, example in enumerate(examples):
            start = len(example["prompt_ids"])
            for row, half in ((i, "chosen"), (n + i, "rejected")):
                kept = example.get(f"{half}_loss_mask")
                if kept is None:
                    continue
                if len(kept) != len(example[f"{half}_ids"]) or start + len(kept) > mask.shape[1]:
                    raise PrefdataError(f"a {half}_loss_mask does not fit its completion in the batch (cut by max_length?)")
                span = mask[row, start : start + len(kept)]
                mask[row, start : start + len(kept)] = span * torch.tensor(kept, dtype=span.dtype)
        return batch


def _twice(value: Any) -> Any:
    import torch

    return torch.cat([value, value]) if isinstance(value, torch.Tensor) else list(value) * 2


def _text_side_keys(processor: Any) -> tuple[str, ...]:
    """The token-type keys `processor(text, images)` returns beside input_ids/attention_mask; any other
    text-side key is one the stored ids cannot give, refused in one line."""
    image = pillow().new("RGB", (28, 28))
    probe = processor(text=[processor.image_token], images=[image])
    image_keys = set(processor(images=[image]).keys())
    # Type ids count as text-side even when images alone return them (Gemma 3 writes placeholder text).
    extra = [key for key in probe.keys() if key not in _TEXT_KEYS and (key not in image_keys or key in _TYPE_ID_KEYS)]
    unknown = [key for key in extra if key not in _TYPE_ID_KEYS]
    if unknown:
        raise PrefdataError(
            f"processor {type(processor).__name__} returns {', '.join(unknown)} with its text, which the hand-off "
            "cannot build from OUT's stored ids"
        )
    return tuple(extra)
