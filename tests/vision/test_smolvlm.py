"""SmolVLM end to end with a tiny processor and model: prepare, refs, train.

SmolVLM shares Idefics3's tiles (rows x cols tiles and a global one, under a pixel mask) but its
processor needs `num2words` and declares a torchvision video processor: without torchvision it is
loaded without one (prefdata.tokenize.processor), images work and a video is refused in one line.
prepare's prompt ids must be the processor's own, the stored refs a plain forward of each pair with
the processor's own pixels and masks in every layout, and train must start at the reference and
move the loss.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")
pytest.importorskip("num2words", reason="SmolVLM's processor needs num2words (the [vision] extra)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
_NEEDS = ("SmolVLMProcessor", "SmolVLMImageProcessorPil", "SmolVLMForConditionalGeneration")
if not all(hasattr(transformers, name) for name in _NEEDS):
    pytest.skip(f"this transformers has no {' / '.join(_NEEDS)}", allow_module_level=True)

import datasets  # noqa: E402

from prefdata import refs as R  # noqa: E402
from prefdata.core.errors import PrefdataError  # noqa: E402
from prefdata.model.vision_inputs import decode_image  # noqa: E402
from prefdata.tokenize.processor import load_processor  # noqa: E402
from vision_helpers import (  # noqa: E402
    assert_policy_equals_refs, assert_refs_equal, assert_starts_at_the_reference, completion_logp_sum, copy_out,
    direct_halves, image_row, prepare_all, processor_prompt_ids, train_policy_forward, train_steps, write_pngs
)

LAYOUTS = ("right", "left", "packed", "blocks", "shared")
# name -> ((width, height), (rows, cols)) under the tiny processor (84-px longest edge, 28-px tiles)
SIZES = {"small": ((10, 10), (3, 3)), "wide": ((100, 60), (2, 3)), "tall": ((40, 130), (3, 1)),
         "strip": ((200, 20), (1, 3))}


@pytest.fixture(scope="module")
def smolvlm_processor_dir(tmp_path_factory) -> Path:
    from prefdata.tiny import build_tiny_smolvlm_processor

    path = tmp_path_factory.mktemp("smolvlm") / "processor"
    build_tiny_smolvlm_processor(path)
    return path


@pytest.fixture(scope="module")
def smolvlm_model_dir(tmp_path_factory, smolvlm_processor_dir) -> Path:
    from prefdata.tiny import build_tiny_smolvlm_model

    path = tmp_path_factory.mktemp("smolvlm-model") / "model"
    build_tiny_smolvlm_model(path, smolvlm_processor_dir, seed=5)  # saved with its processor beside it
    return path


def _rows() -> list[dict]:
    """Five pairs: one image, two images in a row, a text-only row, one image with longer answers, the
    two images in the other order (tall and strip have four tiles each)."""
    return [
        image_row("What colour is this?", ["img/wide.png"]),
        image_row("Compare the two pictures.", ["img/tall.png", "img/strip.png"], placeholders=2,
                  chosen="The first is tall.", rejected="Both blue."),
        {"prompt": "A question without a picture.", "chosen": "An answer.", "rejected": "No."},
        image_row("Describe it.", ["img/small.png"], chosen="A small square, evenly lit.", rejected="Red."),
        image_row("Compare the two pictures.", ["img/strip.png", "img/tall.png"], placeholders=2,
                  chosen="Wide, then tall.", rejected="Both blue."),
    ]


@pytest.fixture(scope="module")
def smolvlm_out(tmp_path_factory, smolvlm_model_dir) -> Path:
    base = tmp_path_factory.mktemp("smolvlm-out")
    write_pngs(base / "data" / "img", {name: size for name, (size, _grid) in SIZES.items()},
               lambda i: (60 * i, 200 - 40 * i, 90))
    return prepare_all(base, _rows(), smolvlm_model_dir)


@pytest.fixture(scope="module")
def smolvlm(smolvlm_model_dir):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(smolvlm_model_dir)).eval()
    return model, load_processor(str(smolvlm_model_dir))


def _direct(model, processor, prompt, half, images) -> float:
    """Sum of log-probs of `half` after `prompt`: one plain forward of this pair's half with the
    processor's own pixel values and pixel mask."""
    kwargs = {}
    if images:
        out = processor.image_processor([decode_image(i) for i in images], return_tensors="pt")
        kwargs = {"pixel_values": out["pixel_values"], "pixel_attention_mask": out["pixel_attention_mask"]}
    return completion_logp_sum(model, prompt, half, lambda _ids: kwargs, attention_mask=True)


@pytest.fixture(scope="module")
def expected(smolvlm_out, smolvlm):
    model, processor = smolvlm
    rows = list(datasets.load_from_disk(str(smolvlm_out)))
    return direct_halves(lambda prompt, half, images: _direct(model, processor, prompt, half, images), rows)


def _tiles(ids, tokenizer):
    names = tokenizer.convert_ids_to_tokens(ids)
    return [tuple(int(x) for x in name[len("<row_"):-1].split("_col_")) for name in names if name.startswith("<row_")]


def test_the_processor_loads_with_pillow_alone(smolvlm_processor_dir):
    processor = load_processor(str(smolvlm_processor_dir))
    assert type(processor).__name__ == "SmolVLMProcessor"
    assert type(processor.image_processor).__name__.startswith("SmolVLMImageProcessor")
    assert processor.image_seq_len == 4 and processor.tokenizer.eos_token == "<end_of_utterance>"


def test_prompt_ids_equal_the_processors_own_for_every_size_and_two_images_in_a_row(smolvlm_out, smolvlm):
    _model, processor = smolvlm
    grids = dict(SIZES.values())
    seen = set()
    rows = list(datasets.load_from_disk(str(smolvlm_out)))
    for row, raw in zip(rows, _rows()):
        if not row["images"]:
            continue
        assert row["prompt_ids"] == processor_prompt_ids(processor, raw["prompt"], row["images"])
        expected_tiles = []
        for image in row["images"]:
            rows_, cols = grids[image.size]
            expected_tiles += [(r, c) for r in range(1, rows_ + 1) for c in range(1, cols + 1)]
            seen.add((rows_, cols))
        assert _tiles(row["prompt_ids"], processor.tokenizer) == expected_tiles
    assert seen == {(3, 3), (2, 3), (3, 1), (1, 3)}
    assert [len(r["images"] or []) for r in rows] == [1, 2, 0, 1, 2]
    # SmolVLM's turn end closes each answer, as its template writes it
    end = processor.tokenizer.convert_tokens_to_ids("<end_of_utterance>")
    assert all(end in row["chosen_ids"] for row in rows)


def test_the_direct_forward_sees_which_tiles_go_where(smolvlm_out, smolvlm, expected):
    """What the refs are compared with tells the two images' tiles apart."""
    model, processor = smolvlm
    row = datasets.load_from_disk(str(smolvlm_out))[1]
    swapped = _direct(model, processor, row["prompt_ids"], row["chosen_ids"], row["images"][::-1])
    assert abs(swapped - expected[0][1]) > 1e-3


def test_refs_equal_a_direct_forward_in_every_layout(tmp_path, smolvlm_out, smolvlm_model_dir, expected):
    for layout in (*LAYOUTS, "auto"):
        out = copy_out(smolvlm_out, tmp_path, layout)
        result = R.compute_refs(out, str(smolvlm_model_dir), layout=layout, progress=False)
        assert result.layout == (layout if layout != "auto" else "shared"), layout
        assert_refs_equal(datasets.load_from_disk(str(out)), expected, err_msg=layout)


@pytest.fixture(scope="module")
def refs_out(tmp_path_factory, smolvlm_out, smolvlm_model_dir) -> Path:
    out = copy_out(smolvlm_out, tmp_path_factory.mktemp("smolvlm-refs"))
    R.compute_refs(out, str(smolvlm_model_dir), layout="right", progress=False)
    return out


def test_the_policy_forward_of_train_equals_the_stored_refs(refs_out, smolvlm_model_dir):
    logps, stored = train_policy_forward(smolvlm_model_dir, refs_out, "packed", load_processor(str(smolvlm_model_dir)))
    assert_policy_equals_refs(logps, stored)


def test_train_starts_at_the_reference_and_moves_the_loss(tmp_path, refs_out, smolvlm_model_dir):
    out = copy_out(refs_out, tmp_path)
    result, steps = train_steps(out, smolvlm_model_dir, tmp_path / "policy", "shared", max_steps=4)
    assert_starts_at_the_reference(steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert result.steps == 4


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                    reason="with torchvision the processor loads its own video processor")
def test_without_torchvision_a_video_is_refused_in_one_line(smolvlm_processor_dir):
    from PIL import Image

    processor = load_processor(str(smolvlm_processor_dir))
    with pytest.raises(PrefdataError) as refused:
        processor(text=["<video>"], videos=[[Image.new("RGB", (10, 10))]])
    message = str(refused.value)
    assert "\n" not in message and "torchvision" in message and "SmolVLMProcessor" in message


def test_a_missing_num2words_is_named_in_one_line(smolvlm_processor_dir, monkeypatch):
    """num2words is not in the [vision] extra (Pillow only): a SmolVLM user without it is told what to install."""
    import importlib

    from prefdata.core.errors import PrefdataError
    from prefdata.tokenize.processor import load_processor

    module = importlib.import_module("transformers.models.smolvlm.processing_smolvlm")
    monkeypatch.setattr(module, "num2words", None)
    with pytest.raises(PrefdataError, match="num2words"):
        load_processor(str(smolvlm_processor_dir))
