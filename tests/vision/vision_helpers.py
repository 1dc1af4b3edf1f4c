"""Helpers for the image-pair tests: images made by Pillow, rows in TRL's conversational layout, prepared
OUTs, the direct per-pair forward the refs are checked against, train's policy forward and first steps,
and the settings of the TRL first-batch comparisons. What is particular to a model stays in its file."""

from __future__ import annotations

import io
import json
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
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


# --------------------------------------------------------------------------------------------- inputs

Size = tuple[int, int]
Color = tuple[int, int, int]


def write_pngs(directory: Path, sizes: Mapping[str, Size], color: Callable[[int], Color]) -> Path:
    """`directory/<name>.png` for each named size, the i-th image in `color(i)`."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, (name, size) in enumerate(sizes.items()):
        (directory / f"{name}.png").write_bytes(png_bytes(size, color(i)))
    return directory


def as_content_parts(rows: list[dict]) -> list[dict]:
    """Every message's content a list of parts, so the rows make one Arrow table for TRL's own
    trainer (a column holds one type)."""
    for row in rows:
        for message in row["prompt"] + row["chosen"] + row["rejected"]:
            if isinstance(message["content"], str):
                message["content"] = [{"type": "text", "text": message["content"]}]
    return rows


def raw_image_dataset(raw: Path, rows: list[dict]) -> Any:
    """The raw rows as TRL's own trainer takes them: each image opened from beside the JSONL."""
    import datasets
    from PIL import Image

    return datasets.Dataset.from_list([
        {"prompt": row["prompt"], "chosen": row["chosen"], "rejected": row["rejected"],
         "images": [Image.open(raw.parent / path).convert("RGB") for path in row["images"]]} for row in rows
    ])


# --------------------------------------------------------------------------------------------- prepare


def prepare_rows(base: Path, rows: list[dict], processor: str | Path, name: str = "out",
                 **kwargs: Any) -> tuple[Any, Path]:
    """`rows` written to base/data/pairs.jsonl (images under base/data) and prepared into base/name
    with `processor`, one worker; the PrepareResult and OUT."""
    from prefdata.prepare import prepare

    raw = write_jsonl(base / "data" / "pairs.jsonl", rows)
    result = prepare(raw, base / name, processor=str(processor), progress=False, **{"workers": 1, **kwargs})
    return result, base / name


def prepare_all(base: Path, rows: list[dict], processor: str | Path, **kwargs: Any) -> Path:
    """`prepare_rows` where every row must be kept (the dropped rows shown if not); OUT."""
    result, out = prepare_rows(base, rows, processor, **kwargs)
    assert result.rows_out == len(rows), (out / "dropped.jsonl").read_text()
    return out


def dropped(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]


def copy_out(out: Path, tmp_path: Path, name: str = "out") -> Path:
    """A copy of a module's prepared OUT that one test may add refs to."""
    return Path(shutil.copytree(out, tmp_path / name))


# --------------------------------------------------------------------------------------------- refs


def completion_logp_sum(model: Any, prompt: Sequence[int], half: Sequence[int],
                        inputs: Callable[[Any], dict] | None = None, attention_mask: bool = False) -> float:
    """Sum of log-probs of `half` after `prompt`: one plain forward of prompt + half alone, with the
    model inputs `inputs(ids)` (pixel values, grids, token types: each model's own) and, where asked,
    an all-ones attention mask."""
    import torch

    ids = torch.tensor([list(prompt) + list(half)])
    kwargs = dict(inputs(ids)) if inputs else {}
    if attention_mask:
        kwargs["attention_mask"] = torch.ones_like(ids)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, **kwargs).logits.float()[0], dim=-1)
    return float(sum(logp[t - 1, ids[0, t]] for t in range(len(prompt), ids.shape[1])))


def direct_halves(direct: Callable[[Sequence[int], Sequence[int], Any], float],
                  rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: `direct(prompt_ids, half_ids, images)` of its chosen and of its rejected half."""
    return (np.array([direct(r["prompt_ids"], r["chosen_ids"], r["images"]) for r in rows]),
            np.array([direct(r["prompt_ids"], r["rejected_ids"], r["images"]) for r in rows]))


def assert_refs_equal(rows: Any, expected: tuple[np.ndarray, np.ndarray], err_msg: str = "") -> None:
    """OUT's stored chosen and rejected refs equal `expected` (the direct forward) within 2e-4."""
    np.testing.assert_allclose(rows["ref_chosen_logps"], expected[0], atol=2e-4, err_msg=err_msg)
    np.testing.assert_allclose(rows["ref_rejected_logps"], expected[1], atol=2e-4, err_msg=err_msg)


# --------------------------------------------------------------------------------------------- train


def assert_policy_equals_refs(logps: Any, stored: Any) -> None:
    """train's policy log-probs (`logps.chosen` / `.rejected`) equal the stored refs of those rows within 2e-4."""
    np.testing.assert_allclose(logps.chosen.numpy(), stored["ref_chosen_logps"], atol=2e-4)
    np.testing.assert_allclose(logps.rejected.numpy(), stored["ref_rejected_logps"], atol=2e-4)

SHUFFLED_ROWS = [3, 0, 4, 2, 1]  # not in dataset order: a batch's images (grids, tiles) must follow its rows


def train_policy_forward(model_dir: str | Path, out: Path, layout: str, processor: Any,
                         vision_change: dict | None = None) -> tuple[Any, Any]:
    """train's policy forward (the model in train mode, the vision inputs checked on it as train
    checks them) of OUT's rows in SHUFFLED_ROWS order; the log-probs and those rows of OUT."""
    import datasets
    import torch
    from transformers import AutoModelForImageTextToText

    from prefdata.model.vision_model import check_loaded_model, vision_inputs
    from prefdata.train.data import load_pairs
    from prefdata.train.step import PairForward, forward_pairs

    data = load_pairs(out, need_refs=True)
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir)).train()  # as train runs it
    vision = check_loaded_model(model, vision_inputs(processor), model_dir)
    if vision_change:
        vision = replace(vision, **vision_change)
    fwd = PairForward(model=model, layout=layout, pad_token_id=0, device=torch.device("cpu"),
                      loss_kwargs={"loss_type": "sigmoid", "beta": 0.1}, vision=vision)
    with torch.no_grad():
        _, logps, _ = forward_pairs(fwd, data, SHUFFLED_ROWS)
    return logps, datasets.load_from_disk(str(out)).select(SHUFFLED_ROWS)


def train_steps(out: Path, model_dir: str | Path, output: Path, layout: str, max_steps: int) -> tuple[Any, list[dict]]:
    """`train` on all five pairs a step, constant lr 2e-3 on CPU; its result and the metrics of its steps."""
    from prefdata.train.recipe import train

    result = train(out, model=model_dir, output=output, lr=2e-3, max_steps=max_steps, batch_pairs=5,
                   warmup_ratio=0.0, lr_schedule="constant", layout=layout, progress=False, save_every=None,
                   device="cpu")
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return result, [line for line in lines if "loss" in line]


def assert_starts_at_the_reference(steps: list[dict]) -> None:
    """Step 1's forward runs the unchanged policy on every pair: it equals the stored reference."""
    assert abs(steps[0]["rewards/chosen"]) < 1e-5 and abs(steps[0]["rewards/rejected"]) < 1e-5
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)


# --------------------------------------------------------------------------------------------- TRL


def dpo_config(tmp_path: Path, out_max_length: int, train_batch: int, eval_batch: int, **overrides: Any) -> Any:
    """prefdata.trl.DPOConfig for a tiny CPU run: two steps at lr 1e-6, beta 0.1, nothing saved, OUT's
    max_length; `overrides` (max_length included) replace any of these."""
    from prefdata.trl import DPOConfig

    settings = dict(
        output_dir=str(tmp_path / "run"), max_length=out_max_length, per_device_train_batch_size=train_batch,
        per_device_eval_batch_size=eval_batch, max_steps=2, logging_steps=1, report_to=[], use_cpu=True,
        bf16=False, activation_checkpointing=False, save_strategy="no", learning_rate=1e-6, disable_tqdm=True,
        beta=0.1, seed=0,
    )
    settings.update(overrides)
    return DPOConfig(**settings)


def kept(batch: dict, key: str, j: int) -> list:
    """Sequence j's `key` values where its attention mask is 1 (padding left out)."""
    return batch[key][j][batch["attention_mask"][j].bool()].tolist()


def assert_cuts(base: Path, row: dict, processor: str | Path, ids: list[int], cuts: list[tuple[int, bool]],
                check_dropped: bool = True) -> None:
    """Prepare `row` (whole prompt `ids`) with its prompt cut at each index of `cuts`: a cut marked
    True must drop the row as image_truncated (in dropped.jsonl too, with `check_dropped`), one
    marked False must keep ids[cut:] unflagged."""
    import datasets

    from prefdata.core import flags as F

    for cut, truncated in cuts:
        keep = len(ids) - cut
        result, out = prepare_rows(base, [row], processor, name=f"cut{cut}", max_prompt_length=keep,
                                   max_length=keep + 8)
        if truncated:
            assert result.flag_counts.get(F.IMAGE_TRUNCATED) == 1, cut
            if check_dropped:
                assert [d["flags"] for d in dropped(out)] == [[F.IMAGE_TRUNCATED]]
        else:
            [kept_row] = datasets.load_from_disk(str(out))
            assert kept_row["prompt_ids"] == ids[cut:] and F.IMAGE_TRUNCATED not in kept_row["flags"]


def prepare_with_refs(base: Path, rows: list[dict], model_dir: str, max_length: int) -> Path:
    """OUT prepared with the model directory's processor (every row kept), plus `prefdata refs` from that model."""
    from prefdata.refs import compute_refs

    out = prepare_all(base, rows, model_dir, max_length=max_length)
    compute_refs(out, model_dir, progress=False)
    return out
