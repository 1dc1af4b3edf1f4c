"""The TRL hand-off against TRL's own trainer on the same raw rows, for the two models whose batches
carry more than pixel values: Gemma 3 (`token_type_ids`, 1 on `<image_soft_token>`, from which the
model builds its own two-way image mask) and Idefics3, SmolVLM's architecture (images as tiles under
a `pixel_attention_mask`). The refs are `prefdata refs`' (test_gemma3_refs_train.py and
test_idefics3_refs_train.py check them against a plain forward)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

import datasets  # noqa: E402
import torch  # noqa: E402

from vision_helpers import (  # noqa: E402
    as_content_parts, dpo_config, first_batch_token_logps, image_row, kept, prepare_with_refs, raw_image_dataset,
    write_jsonl, write_pngs
)


@dataclass(frozen=True)
class Case:
    name: str  # prefdata.tiny.build_tiny_<name>_model, and the <name>_processor_dir fixture
    model_class: str
    max_length: int
    sizes: dict[str, tuple[int, int]]
    text_keys: tuple[str, ...]  # per-token keys besides input_ids, compared sequence by sequence
    image_keys: tuple[str, ...]  # image-side tensors, compared whole


CASES = [
    Case("gemma3", "Gemma3ForConditionalGeneration", 128, {"wide": (30, 20), "tall": (20, 40), "square": (28, 28)},
         ("token_type_ids",), ("pixel_values",)),
    # 84 px longest edge in 28 px tiles: 1 x 3, 3 x 1 and 3 x 3 tiles
    Case("idefics3", "Idefics3ForConditionalGeneration", 512, {"wide": (84, 40), "tall": (30, 84), "square": (60, 60)},
         (), ("pixel_values", "pixel_attention_mask")),
]


def _rows() -> list[dict]:
    """TRL's vision layout, every content a list of parts: one image, two images (in both orders), a
    text-only row in a batch with images."""
    rows = [
        image_row("What color is it?", ["img/wide.png"]),
        image_row("Compare the two pictures.", ["img/tall.png", "img/square.png"], placeholders=2,
                  chosen="The first is tall.", rejected="Same."),
        image_row("Compare the two pictures.", ["img/square.png", "img/tall.png"], placeholders=2,
                  chosen="Square, then tall.", rejected="Same."),
        image_row("Say hello.", [], placeholders=0, chosen="Hello!", rejected="No."),
    ]
    return as_content_parts(rows)


@pytest.fixture(scope="module", params=CASES, ids=lambda case: case.name)
def case(request, tmp_path_factory):
    """The case's raw rows, model directory and OUT (prepared with the model's processor, with refs)."""
    spec: Case = request.param
    if not hasattr(transformers, spec.model_class):
        pytest.skip(f"this transformers has no {spec.model_class}")
    from prefdata import tiny

    root = tmp_path_factory.mktemp(f"trl-{spec.name}")
    write_pngs(root / "data" / "img", spec.sizes, lambda i: (50 * i, 200 - 35 * i, 80))
    raw = write_jsonl(root / "data" / "pairs.jsonl", _rows())
    model_dir = root / "model"
    getattr(tiny, f"build_tiny_{spec.name}_model")(model_dir, request.getfixturevalue(f"{spec.name}_processor_dir"),
                                                   seed=3)
    prepared = prepare_with_refs(raw.parent.parent, _rows(), str(model_dir), spec.max_length)
    return spec, raw, str(model_dir), prepared


def _config(tmp_path, spec: Case, **overrides):
    return dpo_config(tmp_path, spec.max_length, 2, len(_rows()), **overrides)


def test_first_batch_logps_equal_trls_own_trainer_on_the_raw_rows(case, tmp_path):
    """Same ids, pixels and the model's extra inputs (token types: the same two-way image mask; tiles
    and pixel masks: the same tile features in the same places), so the same policy log-probs. TRL's
    completions may carry one more token after the end of turn (the template's newline): its
    log-prob is the only one TRL adds."""
    import trl
    from transformers import AutoProcessor

    from prefdata.trl import DPOTrainer

    spec, raw, model_dir, prepared = case
    ours = DPOTrainer(model_dir, args=_config(tmp_path / "ours", spec), train_dataset=str(prepared))
    raw_rows = raw_image_dataset(raw, _rows())
    theirs = trl.DPOTrainer(model_dir, args=_config(tmp_path / "theirs", spec), train_dataset=raw_rows,
                            processing_class=AutoProcessor.from_pretrained(model_dir))
    our_batch, our_logps = first_batch_token_logps(ours, ours.train_dataset)
    their_batch, their_logps = first_batch_token_logps(theirs, raw_rows)

    if spec.name == "idefics3":
        assert our_batch["pixel_values"].dim() == 5 and our_batch["pixel_values"].shape[1] > 1  # rows x tiles
    for key in spec.image_keys:
        assert torch.equal(our_batch[key], their_batch[key]), key
    for j in range(2 * len(_rows())):
        ids_ours, ids_theirs = kept(our_batch, "input_ids", j), kept(their_batch, "input_ids", j)
        extra = len(ids_theirs) - len(ids_ours)
        assert extra in (0, 1) and ids_theirs[: len(ids_ours)] == ids_ours
        for key in spec.text_keys:
            values = kept(our_batch, key, j)
            assert kept(their_batch, key, j)[: len(values)] == values, key
        n = len(our_logps[j])
        torch.testing.assert_close(torch.tensor(their_logps[j][:n]), torch.tensor(our_logps[j]), rtol=0, atol=1e-5)
    assert all(math.isfinite(value) for logps in our_logps for value in logps)


def test_trains_on_stored_refs_from_ln2_without_a_reference_model(case, tmp_path):
    from prefdata.trl import DPOTrainer

    spec, _raw, model_dir, prepared = case
    trainer = DPOTrainer(model_dir, args=_config(tmp_path, spec), train_dataset=datasets.load_from_disk(str(prepared)))
    assert trainer.ref_model is None
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and abs(losses[0] - math.log(2)) < 1e-4
