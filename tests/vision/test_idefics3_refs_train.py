"""`refs` and `train` with a tiny Idefics3 (SmolVLM's architecture): images come as tiles.

Idefics3's image processor cuts each image into rows x cols tiles plus a global one (the count
follows the image's size), and the model drops all-zero padding tiles and scatters the remaining
tiles' features into the `<image>` tokens of the flattened batch, in order. prefdata lays out one
sample holding the real tiles of every image whose tokens appear, in the order they appear, with
their pixel masks (prefdata.model.vision_inputs). The stored refs must equal a plain forward of
each pair with the processor's own pixel values and masks, in every layout.
"""

from __future__ import annotations

import json
import math
import shutil
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
from prefdata.errors import PrefdataError  # noqa: E402
from prefdata.model import vision_inputs as VI  # noqa: E402
from prefdata.model.vision_inputs import decode_image  # noqa: E402
from vision_helpers import image_row, png_bytes, write_jsonl  # noqa: E402

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
    from prefdata.prepare import prepare

    base = tmp_path_factory.mktemp("idefics3-out")
    images = base / "data" / "img"
    images.mkdir(parents=True)
    for i, (name, size) in enumerate(SIZES.items()):
        (images / f"{name}.png").write_bytes(png_bytes(size, (60 * i, 200 - 40 * i, 90)))
    rows = [
        image_row("What colour is this?", ["img/wide.png"]),
        image_row("Compare the two pictures.", ["img/tall.png", "img/strip.png"], placeholders=2,
                  chosen="The first is tall.", rejected="Both blue."),
        {"prompt": "A question without a picture.", "chosen": "An answer.", "rejected": "No."},
        image_row("Describe it.", ["img/small.png"], chosen="A small square, evenly lit.", rejected="Red."),
        image_row("Compare the two pictures.", ["img/strip.png", "img/tall.png"], placeholders=2,
                  chosen="Wide, then tall.", rejected="Both blue."),
    ]
    raw = write_jsonl(base / "data" / "pairs.jsonl", rows)
    result = prepare(raw, base / "out", processor=str(idefics_model_dir), progress=False, workers=1)
    assert result.rows_out == len(rows), (base / "out" / "dropped.jsonl").read_text()
    return base / "out"


@pytest.fixture(scope="module")
def idefics(idefics_model_dir):
    from transformers import AutoModelForImageTextToText

    from prefdata.tokenize.processor import load_processor

    model = AutoModelForImageTextToText.from_pretrained(str(idefics_model_dir)).eval()
    return model, load_processor(str(idefics_model_dir))


def _copy(out: Path, tmp_path: Path, name: str = "out") -> Path:
    return Path(shutil.copytree(out, tmp_path / name))


def _direct(model, processor, prompt, half, images) -> float:
    """Sum of log-probs of `half` after `prompt`: one plain forward of this pair's half with the
    processor's own pixel values and pixel mask."""
    ids = torch.tensor([list(prompt) + list(half)])
    kwargs = {}
    if images:
        out = processor.image_processor([decode_image(i) for i in images], return_tensors="pt")
        kwargs = {"pixel_values": out["pixel_values"], "pixel_attention_mask": out["pixel_attention_mask"]}
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).logits
    logp = torch.log_softmax(logits.float()[0], dim=-1)
    return float(sum(logp[t - 1, ids[0, t]] for t in range(len(prompt), ids.shape[1])))


@pytest.fixture(scope="module")
def expected(idefics_out, idefics):
    """Per row: the direct forward's chosen and rejected sums."""
    model, processor = idefics
    rows = list(datasets.load_from_disk(str(idefics_out)))
    return (np.array([_direct(model, processor, r["prompt_ids"], r["chosen_ids"], r["images"]) for r in rows]),
            np.array([_direct(model, processor, r["prompt_ids"], r["rejected_ids"], r["images"]) for r in rows]))


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
        out = _copy(idefics_out, tmp_path, layout)
        result = R.compute_refs(out, str(idefics_model_dir), layout=layout, progress=False)
        assert result.layout == (layout if layout != "auto" else "shared"), layout
        rows = datasets.load_from_disk(str(out))
        np.testing.assert_allclose(rows["ref_chosen_logps"], expected[0], atol=2e-4, err_msg=layout)
        np.testing.assert_allclose(rows["ref_rejected_logps"], expected[1], atol=2e-4, err_msg=layout)


def test_refs_in_small_batches(tmp_path, idefics_out, idefics_model_dir, expected):
    out = _copy(idefics_out, tmp_path)
    result = R.compute_refs(out, str(idefics_model_dir), layout="packed", batch_tokens=200, shard_batches=1,
                            progress=False)
    assert result.shards_total >= 3
    np.testing.assert_allclose(datasets.load_from_disk(str(out))["ref_chosen_logps"], expected[0], atol=2e-4)


def _forward(model_dir, out, layout):
    from transformers import AutoModelForImageTextToText

    from prefdata.model.vision_model import check_loaded_model, vision_inputs
    from prefdata.tokenize.processor import load_processor
    from prefdata.train.data import load_pairs
    from prefdata.train.step import PairForward, forward_pairs

    data = load_pairs(out, need_refs=True)
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir)).train()  # as train runs it
    vision = check_loaded_model(model, vision_inputs(load_processor(str(model_dir))), model_dir)
    fwd = PairForward(model=model, layout=layout, pad_token_id=0, device=torch.device("cpu"),
                      loss_kwargs={"loss_type": "sigmoid", "beta": 0.1}, vision=vision)
    rows = [3, 0, 4, 2, 1]  # not in dataset order: the batch's tiles follow its rows
    with torch.no_grad():
        _, logps, _ = forward_pairs(fwd, data, rows)
    return logps, datasets.load_from_disk(str(out)).select(rows)


@pytest.fixture(scope="module")
def refs_out(tmp_path_factory, idefics_out, idefics_model_dir) -> Path:
    out = _copy(idefics_out, tmp_path_factory.mktemp("idefics3-refs"))
    R.compute_refs(out, str(idefics_model_dir), layout="right", progress=False)
    return out


@pytest.mark.parametrize("layout", ["shared", "packed", "left"])
def test_the_policy_forward_of_train_equals_the_stored_refs_pair_by_pair(refs_out, idefics_model_dir, layout):
    logps, stored = _forward(idefics_model_dir, refs_out, layout)
    np.testing.assert_allclose(logps.chosen.numpy(), stored["ref_chosen_logps"], atol=2e-4)
    np.testing.assert_allclose(logps.rejected.numpy(), stored["ref_rejected_logps"], atol=2e-4)


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
    from prefdata.train.recipe import train

    out = _copy(refs_out, tmp_path)
    result = train(out, model=idefics_model_dir, output=tmp_path / "policy", lr=2e-3, max_steps=4, batch_pairs=5,
                   warmup_ratio=0.0, lr_schedule="constant", layout=layout, progress=False, save_every=None,
                   device="cpu")
    lines = [json.loads(line) for line in (tmp_path / "policy" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert abs(steps[0]["rewards/chosen"]) < 1e-5 and abs(steps[0]["rewards/rejected"]) < 1e-5
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
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
