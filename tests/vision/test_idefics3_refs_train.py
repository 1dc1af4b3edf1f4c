"""`refs` and `train` with a tiny Idefics3 (SmolVLM's architecture): images come as tiles.

Idefics3's image processor cuts each image into rows x cols tiles plus a global one (the count
follows the image's size), and the model drops all-zero padding tiles and scatters the remaining
tiles' features into the `<image>` tokens of the flattened batch, in order. prefdata lays out one
sample holding the real tiles of every image whose tokens appear, in the order they appear, with
their pixel masks (prefdata.model.vision_inputs). The stored refs must equal a plain forward of
each pair with the processor's own pixel values and masks, in every layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Idefics3ForConditionalGeneration"):
    pytest.skip("this transformers has no Idefics3", allow_module_level=True)

import datasets  # noqa: E402

from prefdata import refs as R  # noqa: E402
from prefdata.core.errors import PrefdataError  # noqa: E402
from prefdata.model import vision_inputs as VI  # noqa: E402
from prefdata.model.vision_inputs import decode_image  # noqa: E402
from vision_helpers import (  # noqa: E402
    assert_policy_equals_refs, assert_refs_equal, assert_starts_at_the_reference, completion_logp_sum, copy_out,
    direct_halves, image_row, prepare_all, train_policy_forward, train_steps, write_pngs
)

LAYOUTS = ("right", "left", "packed", "blocks", "shared")
# name -> (width, height); tiles under the tiny processor (84-px longest edge, 28-px tiles, + global)
SIZES = {"small": (10, 10), "wide": (100, 60), "tall": (40, 130), "strip": (200, 20)}  # 10, 7, 4, 4 tiles


@pytest.fixture(scope="module")
def idefics_model_dir(tmp_path_factory, idefics3_processor_dir) -> Path:
    from prefdata.tiny import build_tiny_idefics3_model

    path = tmp_path_factory.mktemp("idefics3-model") / "model"
    build_tiny_idefics3_model(path, idefics3_processor_dir, seed=5)  # saved with its processor beside it
    return path


@pytest.fixture(scope="module")
def idefics_out(tmp_path_factory, idefics_model_dir) -> Path:
    """Five pairs: one image, two images, a text-only row, one image with longer answers, the two
    images in the other order (tall and strip have four tiles each)."""
    base = tmp_path_factory.mktemp("idefics3-out")
    write_pngs(base / "data" / "img", SIZES, lambda i: (60 * i, 200 - 40 * i, 90))
    rows = [
        image_row("What colour is this?", ["img/wide.png"]),
        image_row("Compare the two pictures.", ["img/tall.png", "img/strip.png"], placeholders=2,
                  chosen="The first is tall.", rejected="Both blue."),
        {"prompt": "A question without a picture.", "chosen": "An answer.", "rejected": "No."},
        image_row("Describe it.", ["img/small.png"], chosen="A small square, evenly lit.", rejected="Red."),
        image_row("Compare the two pictures.", ["img/strip.png", "img/tall.png"], placeholders=2,
                  chosen="Wide, then tall.", rejected="Both blue."),
    ]
    return prepare_all(base, rows, idefics_model_dir)


@pytest.fixture(scope="module")
def idefics(idefics_model_dir):
    from transformers import AutoModelForImageTextToText

    from prefdata.tokenize.processor import load_processor

    model = AutoModelForImageTextToText.from_pretrained(str(idefics_model_dir)).eval()
    return model, load_processor(str(idefics_model_dir))


def _direct(model, processor, prompt, half, images) -> float:
    """Sum of log-probs of `half` after `prompt`: one plain forward of this pair's half with the
    processor's own pixel values and pixel mask."""
    kwargs = {}
    if images:
        out = processor.image_processor([decode_image(i) for i in images], return_tensors="pt")
        kwargs = {"pixel_values": out["pixel_values"], "pixel_attention_mask": out["pixel_attention_mask"]}
    return completion_logp_sum(model, prompt, half, lambda _ids: kwargs, attention_mask=True)


@pytest.fixture(scope="module")
def expected(idefics_out, idefics):
    """Per row: the direct forward's chosen and rejected sums."""
    model, processor = idefics
    rows = list(datasets.load_from_disk(str(idefics_out)))
    return direct_halves(lambda prompt, half, images: _direct(model, processor, prompt, half, images), rows)


def test_the_tiny_idefics3_gives_each_tile_the_processors_tokens(idefics, idefics_out):
    model, processor = idefics
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    assert model.model.image_seq_len == processor.image_seq_len
    rows = list(datasets.load_from_disk(str(idefics_out)))
    image_id = model.config.image_token_id
    for row in rows:
        tiles = 0
        if row["images"]:
            pixels = processor.image_processor([decode_image(i) for i in row["images"]], return_tensors="pt")
            tiles = pixels["pixel_values"].shape[1]
        assert row["prompt_ids"].count(image_id) == tiles * processor.image_seq_len
    assert [len(r["images"] or []) for r in rows] == [1, 2, 0, 1, 2]


def test_the_direct_forward_sees_which_tiles_go_where(idefics_out, idefics, expected):
    """What the refs are compared with tells the two images' tiles apart: the same ids with the
    two images' tiles swapped score otherwise."""
    model, processor = idefics
    row = datasets.load_from_disk(str(idefics_out))[1]
    swapped = _direct(model, processor, row["prompt_ids"], row["chosen_ids"], row["images"][::-1])
    assert abs(swapped - expected[0][1]) > 1e-3


def test_refs_equal_a_direct_forward_in_every_layout(tmp_path, idefics_out, idefics_model_dir, expected):
    """Every layout runs as asked: the text model inside is a Llama, so packing and block attention apply."""
    for layout in (*LAYOUTS, "auto"):
        out = copy_out(idefics_out, tmp_path, layout)
        result = R.compute_refs(out, str(idefics_model_dir), layout=layout, progress=False)
        assert result.layout == (layout if layout != "auto" else "shared"), layout
        assert_refs_equal(datasets.load_from_disk(str(out)), expected, err_msg=layout)


def test_refs_in_small_batches(tmp_path, idefics_out, idefics_model_dir, expected):
    out = copy_out(idefics_out, tmp_path)
    result = R.compute_refs(out, str(idefics_model_dir), layout="packed", batch_tokens=200, shard_batches=1,
                            progress=False)
    assert result.shards_total >= 3
    np.testing.assert_allclose(datasets.load_from_disk(str(out))["ref_chosen_logps"], expected[0], atol=2e-4)


def _forward(model_dir, out, layout):
    from prefdata.tokenize.processor import load_processor

    return train_policy_forward(model_dir, out, layout, load_processor(str(model_dir)))


@pytest.fixture(scope="module")
def refs_out(tmp_path_factory, idefics_out, idefics_model_dir) -> Path:
    out = copy_out(idefics_out, tmp_path_factory.mktemp("idefics3-refs"))
    R.compute_refs(out, str(idefics_model_dir), layout="right", progress=False)
    return out


@pytest.mark.parametrize("layout", ["shared", "packed", "left"])
def test_the_policy_forward_of_train_equals_the_stored_refs_pair_by_pair(refs_out, idefics_model_dir, layout):
    logps, stored = _forward(idefics_model_dir, refs_out, layout)
    assert_policy_equals_refs(logps, stored)


def test_two_images_tiles_swapped_miss_the_refs(refs_out, idefics_model_dir, monkeypatch):
    """The check above can fail: a layout that hands the first two images' tiles over in the other
    order (tall and strip have as many tiles, so the model takes them) misses the refs."""
    tiles = VI._tiles

    four_tiles = {SIZES["tall"], SIZES["strip"]}

    def swapped(image_processor, decoded, sequence):
        """The first two neighbouring images that are tall and strip, handed over the other way round."""
        sequence = list(sequence)
        for k in range(len(sequence) - 1):
            if {decoded[sequence[k]].size, decoded[sequence[k + 1]].size} == four_tiles:
                sequence[k], sequence[k + 1] = sequence[k + 1], sequence[k]
                break
        return tiles(image_processor, decoded, sequence)

    monkeypatch.setattr(VI, "_tiles", swapped)
    logps, stored = _forward(idefics_model_dir, refs_out, "right")
    two_images = [i for i, images in enumerate(stored["images"]) if len(images or []) == 2]
    miss = np.abs(logps.chosen.numpy() - np.array(stored["ref_chosen_logps"]))
    assert miss[two_images].max() > 1e-3
    one_or_none = [i for i in range(len(stored)) if i not in two_images]
    assert miss[one_or_none].max() < 2e-4  # only the pair whose tiles were swapped moves


@pytest.mark.parametrize("layout", ["shared", "right"])
def test_train_starts_at_the_reference_and_moves_the_loss(tmp_path, refs_out, idefics_model_dir, layout):
    out = copy_out(refs_out, tmp_path)
    result, steps = train_steps(out, idefics_model_dir, tmp_path / "policy", layout, max_steps=4)
    assert_starts_at_the_reference(steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert result.steps == 4


def test_a_tiled_processor_prefdata_has_not_checked_is_refused_in_one_line(idefics3_processor_dir):
    """Tiles under a pixel mask are laid out for Idefics3 / SmolVLM only; another tiled image
    processor (Idefics2's) is refused rather than scored wrong."""
    from prefdata.model.vision_model import vision_inputs
    from prefdata.tokenize.processor import load_processor

    processor = load_processor(str(idefics3_processor_dir))

    class Idefics2ImageProcessor:  # what vision_inputs reads of it: its class name and inputs
        model_input_names = ["pixel_values", "pixel_attention_mask"]

    processor.image_processor = Idefics2ImageProcessor()
    with pytest.raises(PrefdataError) as refused:
        vision_inputs(processor)
    assert "\n" not in str(refused.value) and "pixel_attention_mask" in str(refused.value)
