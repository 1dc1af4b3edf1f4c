"""The TRL hand-off with Idefics3 (SmolVLM's architecture): images as tiles under a pixel mask,
through `prefdata.trl.DPOTrainer`, against TRL's own trainer on the same raw rows. The refs are
`prefdata refs`' (test_idefics3_refs_train.py checks them against a plain forward)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Idefics3ForConditionalGeneration"):
    pytest.skip("this transformers has no Idefics3", allow_module_level=True)

import datasets  # noqa: E402
import torch  # noqa: E402

from vision_helpers import (  # noqa: E402
    as_content_parts, dpo_config, first_batch_token_logps, image_row, kept, prepare_with_refs, raw_image_dataset,
    write_jsonl, write_pngs
)

MAX_LENGTH = 512
SIZES = {"wide": (84, 40), "tall": (30, 84), "square": (60, 60)}  # 1 x 3, 3 x 1, 3 x 3 tiles


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


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-idefics3")
    write_pngs(root / "data" / "img", SIZES, lambda i: (50 * i, 200 - 35 * i, 80))
    return write_jsonl(root / "data" / "pairs.jsonl", _rows())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, idefics3_processor_dir) -> str:
    from prefdata.tiny import build_tiny_idefics3_model

    path = tmp_path_factory.mktemp("idefics3-model")
    build_tiny_idefics3_model(path, idefics3_processor_dir, seed=3)
    return str(path)


@pytest.fixture(scope="module")
def prepared(raw, model_dir):
    return prepare_with_refs(raw.parent.parent, _rows(), model_dir, MAX_LENGTH)


def _raw_rows(raw) -> datasets.Dataset:
    return raw_image_dataset(raw, _rows())


def _config(tmp_path, **overrides):
    return dpo_config(tmp_path, MAX_LENGTH, 2, len(_rows()), **overrides)


def test_first_batch_logps_equal_trls_own_trainer_on_the_raw_rows(prepared, raw, model_dir, tmp_path):
    """Same ids, tiles and pixel masks, so the model places the same tile features and gives the
    same policy log-probs. TRL's completions may carry one more token after the end of turn (the
    template's newline): its log-prob is the only one TRL adds."""
    import trl
    from transformers import AutoProcessor

    from prefdata.trl import DPOTrainer

    ours = DPOTrainer(model_dir, args=_config(tmp_path / "ours"), train_dataset=str(prepared))
    raw_rows = _raw_rows(raw)
    theirs = trl.DPOTrainer(model_dir, args=_config(tmp_path / "theirs"), train_dataset=raw_rows,
                            processing_class=AutoProcessor.from_pretrained(model_dir))
    our_batch, our_logps = first_batch_token_logps(ours, ours.train_dataset)
    their_batch, their_logps = first_batch_token_logps(theirs, raw_rows)

    assert our_batch["pixel_values"].dim() == 5 and our_batch["pixel_values"].shape[1] > 1  # rows x tiles
    assert torch.equal(our_batch["pixel_values"], their_batch["pixel_values"])
    assert torch.equal(our_batch["pixel_attention_mask"], their_batch["pixel_attention_mask"])
    for j in range(2 * len(_rows())):
        ids_ours, ids_theirs = kept(our_batch, "input_ids", j), kept(their_batch, "input_ids", j)
        extra = len(ids_theirs) - len(ids_ours)
        assert extra in (0, 1) and ids_theirs[: len(ids_ours)] == ids_ours
        n = len(our_logps[j])
        torch.testing.assert_close(torch.tensor(their_logps[j][:n]), torch.tensor(our_logps[j]), rtol=0, atol=1e-5)
    assert all(math.isfinite(value) for logps in our_logps for value in logps)


def test_trains_on_stored_refs_from_ln2_without_a_reference_model(prepared, model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    dataset = datasets.load_from_disk(str(prepared))
    trainer = DPOTrainer(model_dir, args=_config(tmp_path), train_dataset=dataset)
    assert trainer.ref_model is None
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and abs(losses[0] - math.log(2)) < 1e-4
