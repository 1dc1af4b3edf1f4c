"""`refs` and `train` with a tiny Qwen2-VL: image grids and 3-D (mrope) positions through every layout.

Qwen2-VL computes its own position ids from input_ids and the image grids (`get_rope_index`): the
text after an image continues from the image's largest side, not from its token count. prefdata
computes them per sequence with the body's own function and places them in the layout (packed rows,
blocks, a shared prompt); the stored refs must equal a plain per-pair forward that lets the model
compute its positions itself. Images of several sizes give grids of several shapes (some square, so
that their positions and their token counts differ), and two rows hold the same two images in both
orders (grids out of order would score the wrong row).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen2VLForConditionalGeneration"):
    pytest.skip("this transformers has no Qwen2-VL", allow_module_level=True)

import datasets  # noqa: E402

from prefdata import refs as R  # noqa: E402
from prefdata.core.errors import PrefdataError  # noqa: E402
from prefdata.model.vision_inputs import decode_image  # noqa: E402
from prefdata.tokenize.processor import load_processor  # noqa: E402
from vision_helpers import (  # noqa: E402
    assert_policy_equals_refs, assert_refs_equal, assert_starts_at_the_reference, completion_logp_sum, copy_out,
    direct_halves, image_row, png_bytes, prepare_all, train_policy_forward, train_steps, write_jsonl, write_pngs
)

LAYOUTS = ("right", "left", "packed", "blocks", "shared")
# merged 28px cells (t, h, w): square 2x2 (4 tokens, positions advance 2), wide 1x2, tall 3x1, big 4x3
SIZES = {"square": (56, 56), "wide": (64, 20), "tall": (12, 70), "big": (100, 80)}


@pytest.fixture(scope="module")
def qwen_model_dir(tmp_path_factory, qwen2vl_processor_dir) -> Path:
    from prefdata.tiny import build_tiny_qwen2vl_model

    path = tmp_path_factory.mktemp("qwen2vl-model") / "model"
    build_tiny_qwen2vl_model(path, qwen2vl_processor_dir, seed=3)  # saved with its processor beside it
    return path


@pytest.fixture(scope="module")
def qwen_out(tmp_path_factory, qwen2vl_processor_dir) -> Path:
    """Five pairs: one image, two images of different grids (in both orders), a text-only row, one
    image with longer answers."""
    base = tmp_path_factory.mktemp("qwen2vl-out")
    write_pngs(base / "data" / "img", SIZES, lambda i: (60 * i, 200 - 40 * i, 90))
    rows = [
        image_row("What colour is this?", ["img/square.png"]),
        image_row("Compare the two pictures.", ["img/big.png", "img/tall.png"], placeholders=2,
                  chosen="The first is wide, the second tall.", rejected="Both are blue."),
        {"prompt": "A question without a picture.", "chosen": "An answer.", "rejected": "No."},
        image_row("Describe it in detail, please.", ["img/wide.png"], chosen="A red strip, evenly lit.",
                  rejected="Red."),
        image_row("Compare the two pictures.", ["img/tall.png", "img/big.png"], placeholders=2,
                  chosen="Tall first, then wide.", rejected="Both are blue."),
    ]
    return prepare_all(base, rows, qwen2vl_processor_dir)


@pytest.fixture(scope="module")
def qwen(qwen_model_dir):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(qwen_model_dir)).eval()
    return model, load_processor(str(qwen_model_dir))


def _direct(model, processor, prompt, half, images, positions: str = "model") -> float:
    """Sum of log-probs of `half` after `prompt`: one plain forward of this pair's half, the model
    computing its own 3-D positions from the ids, the grids and the image-token types (``positions
    = "1d"``: 0, 1, 2, ... instead, to show they matter)."""
    def inputs(ids) -> dict:
        kwargs = {}
        if images:
            kwargs = dict(processor.image_processor([decode_image(i) for i in images], return_tensors="pt"))
            kwargs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))
        if positions == "1d":
            kwargs["position_ids"] = torch.arange(ids.shape[1])[None]
        return kwargs

    return completion_logp_sum(model, prompt, half, inputs)


@pytest.fixture(scope="module")
def expected(qwen_out, qwen):
    """Per row: the direct forward's chosen and rejected sums."""
    model, processor = qwen
    rows = list(datasets.load_from_disk(str(qwen_out)))
    return direct_halves(lambda prompt, half, images: _direct(model, processor, prompt, half, images), rows)


def test_the_tiny_qwen2vl_forwards_the_processors_output_on_cpu(qwen):
    from PIL import Image

    model, processor = qwen
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    images = [Image.new("RGB", size, (30, 90, 200)) for size in (SIZES["square"], SIZES["tall"])]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=images, return_tensors="pt")
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4], [1, 6, 2]]  # the vision tower's patch/merge sizes fit
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer)) and bool(logits.isfinite().all())
    positions, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                              image_grid_thw=inputs["image_grid_thw"])
    assert int(positions.max()) + 1 < inputs["input_ids"].shape[1]  # 3-D: fewer positions than tokens


def test_positions_and_grids_matter_for_the_direct_forward(qwen_out, qwen, expected):
    """What the refs below are compared with can tell wrong positions or grids apart."""
    model, processor = qwen
    rows = list(datasets.load_from_disk(str(qwen_out)))
    one_d = [_direct(model, processor, r["prompt_ids"], r["chosen_ids"], r["images"], positions="1d") for r in rows]
    assert abs(one_d[0] - expected[0][0]) > 1e-3  # the square image: 4 tokens, positions advance 2
    assert one_d[2] == pytest.approx(expected[0][2], abs=1e-5)  # text alone: 3-D positions are 0, 1, 2, ...
    two = rows[1]
    swapped = _direct(model, processor, two["prompt_ids"], two["chosen_ids"], two["images"][::-1])
    assert abs(swapped - expected[0][1]) > 1e-3


def test_each_sequences_positions_in_every_layout_are_its_own(qwen_out, qwen):
    """Placed 3-D positions of every sequence (the tokens it has in the layout) equal the model's
    own positions for that prompt + half alone; a shared block's rejected tokens continue after the
    prompt as in prompt + rejected alone, and packed rows carry the 1-D ids first."""
    from prefdata.model.pairs import sharing_plan
    from prefdata.model.vision_model import check_loaded_model, vision_inputs
    from prefdata.tokenize.masks import build_block_pair_batch, build_pair_batch

    model, processor = qwen
    vision = check_loaded_model(model, vision_inputs(processor), "qwen")
    assert vision.rope is not None
    rows = list(datasets.load_from_disk(str(qwen_out)))
    prompts, chosens, rejecteds = ([r[k] for r in rows] for k in ("prompt_ids", "chosen_ids", "rejected_ids"))
    images = [r["images"] for r in rows]
    n = len(rows)
    alone = []
    for s in range(2 * n):
        i = s % n
        ids = torch.tensor([prompts[i] + (chosens if s < n else rejecteds)[i]])
        grids = processor.image_processor([decode_image(x) for x in images[i]], return_tensors="pt")["image_grid_thw"] \
            if images[i] else None
        types = torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))
        alone.append(model.model.get_rope_index(ids, types, image_grid_thw=grids)[0][:, 0])
    for continues, layout in [(None, layout) for layout in LAYOUTS] + [(False, "shared")]:
        # None: each prompt computed once, its completions continuing (the rule checked on the first
        # image pair: it holds for Qwen2-VL); False: every whole sequence computed, as for a model where it fails.
        vision.rope.continues = continues if continues is not None else vision.rope.continues
        if layout in ("blocks", "shared"):
            share = sharing_plan(prompts, chosens, rejecteds) if layout == "shared" else [False] * n
            batch = build_block_pair_batch(prompts, chosens, rejecteds, share)
        else:
            batch = build_pair_batch(prompts, chosens, rejecteds, layout, 0)
        found = vision.for_batch(batch, images)
        placed = vision.rope.for_batch(batch, prompts, chosens + rejecteds, found.grids)
        if layout == "packed":
            assert placed.shape[0] == 4 and torch.equal(placed[0], batch.position_ids)
            placed = placed[1:]
        assert placed.shape == (3, *batch.input_ids.shape)
        for s in range(2 * n):
            where = batch.sequence_index == s
            got, own = placed[:, where], alone[s]
            assert torch.equal(got, own[:, own.shape[1] - got.shape[1]:]), (layout, s)  # shared rejected: its tail
        assert vision.rope.continues is (False if continues is False else True)


def test_refs_equal_a_direct_forward_in_every_layout(tmp_path, qwen_out, qwen_model_dir, expected):
    results = {}
    for layout in LAYOUTS:
        out = copy_out(qwen_out, tmp_path, layout)
        results[layout] = result = R.compute_refs(out, str(qwen_model_dir), layout=layout, progress=False)
        assert result.layout == layout  # the model runs it, no fallback to right padding
        rows = datasets.load_from_disk(str(out))
        assert_refs_equal(rows, expected, err_msg=layout)
        assert [len(i or []) for i in rows["images"]] == [1, 2, 0, 1, 2]
    assert results["shared"].shared_pairs == 5 and results["blocks"].shared_pairs == 0
    prompt_tokens = sum(len(p) for p in datasets.load_from_disk(str(qwen_out))["prompt_ids"])
    assert results["blocks"].tokens - results["shared"].tokens == prompt_tokens  # each prompt once


def test_refs_in_small_batches_and_auto_layout(tmp_path, qwen_out, qwen_model_dir, expected):
    out = copy_out(qwen_out, tmp_path)
    result = R.compute_refs(out, str(qwen_model_dir), batch_tokens=70, shard_batches=1, progress=False)
    assert result.layout == "shared" and result.shards_total >= 3
    assert_refs_equal(datasets.load_from_disk(str(out)), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_refs_on_gpu_bf16_close_to_cpu_fp32(tmp_path, qwen_out, qwen_model_dir, expected):
    out = copy_out(qwen_out, tmp_path)
    result = R.compute_refs(out, str(qwen_model_dir), device="cuda", progress=False)  # positions computed on CPU
    assert result.dtype == "bfloat16" and result.device.startswith("cuda") and result.layout == "shared"
    np.testing.assert_allclose(datasets.load_from_disk(str(out))["ref_chosen_logps"], expected[0], atol=1.0, rtol=0.05)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_policy_forward_of_train_equals_the_stored_refs_pair_by_pair(tmp_path, qwen_out, qwen_model_dir, layout):
    out = copy_out(qwen_out, tmp_path)
    R.compute_refs(out, str(qwen_model_dir), progress=False)  # auto: shared
    logps, stored = train_policy_forward(qwen_model_dir, out, layout, load_processor(str(qwen_model_dir)))
    assert_policy_equals_refs(logps, stored)


@pytest.mark.parametrize("layout", ["shared", "packed"])
def test_train_starts_at_the_reference_and_moves_the_loss(tmp_path, qwen_out, qwen_model_dir, layout):
    from transformers import AutoModelForImageTextToText

    from prefdata.tokenize.vision import holds_processor

    out = copy_out(qwen_out, tmp_path)
    R.compute_refs(out, str(qwen_model_dir), progress=False)
    result, steps = train_steps(out, qwen_model_dir, tmp_path / "policy", layout, max_steps=6)
    assert_starts_at_the_reference(steps)
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.05
    assert result.steps == 6 and holds_processor(tmp_path / "policy")
    trained = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "policy"))
    assert type(trained).__name__ == "Qwen2VLForConditionalGeneration"


def test_a_model_that_wants_3d_positions_it_cannot_compute_is_refused(tmp_path, llava_processor_dir):
    """An mrope config on a body with no `get_rope_index` (a remote-code model, say): refused."""
    from prefdata.model.vision_model import check_loaded_model, vision_inputs
    from prefdata.tiny import build_tiny_llava_model

    processor = load_processor(str(llava_processor_dir))
    model = build_tiny_llava_model(tmp_path / "llava", llava_processor_dir)
    assert check_loaded_model(model, vision_inputs(processor), "llava").rope is None  # 1-D positions: as before
    model.config.text_config.rope_parameters = {**model.config.text_config.rope_parameters, "mrope_section": [2, 3, 3]}
    with pytest.raises(PrefdataError, match=r"3-D \(mrope\) position ids but offers no get_rope_index") as info:
        check_loaded_model(model, vision_inputs(processor), "llava-mrope")
    assert "\n" not in str(info.value)


def test_a_qwen2vl_model_with_a_llava_processor_is_refused(tmp_path, qwen_model_dir, llava_processor_dir):
    from prefdata.prepare import prepare

    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(png_bytes((28, 28), (1, 2, 3)))
    raw = write_jsonl(tmp_path / "pairs.jsonl", [image_row("What is it?", ["img/a.png"])])
    prepare(raw, tmp_path / "out", processor=str(llava_processor_dir), progress=False, workers=1)
    with pytest.raises(PrefdataError, match="image token id"):
        R.compute_refs(tmp_path / "out", str(qwen_model_dir), processor=str(llava_processor_dir), progress=False)


def test_text_batches_and_packing_without_text_positions(qwen_out, qwen, expected, monkeypatch):
    """A text-only batch needs no grids: its 1-D ids are its 3-D positions on every axis, given as four
    rows when packed (else the text model would attend across the packed sequences). A text model that
    cannot read the 1-D row runs packed requests as right padding."""
    from prefdata.model import logprobs
    from prefdata.model.pairs import choose_layout, pair_logps

    model, _ = qwen
    row = datasets.load_from_disk(str(qwen_out))[2]
    assert not row["images"]
    two = [row["prompt_ids"], row["prompt_ids"][:-3]]  # two text sequences of other lengths in one packed row
    for layout in ("packed", "right"):
        with torch.no_grad():
            logps = pair_logps(model, two, [row["chosen_ids"]] * 2, [row["rejected_ids"]] * 2, layout, 0)
        assert float(logps.chosen[0]) == pytest.approx(expected[0][2], abs=2e-4), layout
        assert float(logps.rejected[0]) == pytest.approx(expected[1][2], abs=2e-4), layout
    assert choose_layout(model, "packed") == "packed"
    monkeypatch.setattr(logprobs, "reads_text_positions", lambda _model: False)
    assert choose_layout(model, "packed") == "right"
