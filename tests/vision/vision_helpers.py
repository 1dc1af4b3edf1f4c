"""Helpers for the image-pair tests: images made by Pillow, rows in TRL's conversational layout."""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image as PIL


def png_bytes(size: tuple[int, int], color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def image_row(prompt_text: str, images: list, placeholders: int = 1, chosen: str = "Red.", rejected: str = "Blue.") -> dict:
    """A TRL conversational image row: `placeholders` image parts, then the text."""
    content = [{"type": "image"}] * placeholders + [{"type": "text", "text": prompt_text}]
    return {"prompt": [{"role": "user", "content": content}], "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}], "images": images}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def processor_prompt_ids(processor, prompt: list[dict], images: list) -> list[int]:
    """The processor's own ids for a prompt: its chat template over the messages as TRL hands them to
    a vision-language model (text as content parts), then `processor(text=..., images=...)`."""
    messages = [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m["content"], str) else m
                for m in prompt]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return [int(i) for i in processor(text=[text], images=images)["input_ids"][0]]


def first_batch_token_logps(trainer, dataset) -> tuple[dict, list[list[float]]]:
    """The first (sequential) batch the trainer's own dataloader makes of `dataset`, and the per-token
    policy log-probs of each sequence's completion, captured from the trainer's own loss pass."""
    import torch

    captured = {}

    def keep(module, args, output) -> None:  # returns None: the output goes on unchanged
        captured.setdefault("log_probs", output.log_probs)

    hook = trainer.model.register_forward_hook(keep)
    try:
        batch = next(iter(trainer.get_eval_dataloader(dataset)))
        with torch.no_grad():
            trainer.compute_loss(trainer.model, trainer._prepare_inputs(batch))
    finally:
        hook.remove()
    mask = batch["completion_mask"][:, 1:].bool()
    log_probs = captured["log_probs"][:, -mask.size(1) :]
    return batch, [log_probs[j][mask[j]].tolist() for j in range(mask.size(0))]
