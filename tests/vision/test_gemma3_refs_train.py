"""`refs` and `train` with a tiny Gemma 3: an image's tokens attend each other both ways.

Gemma 3 builds its own attention mask from `token_type_ids` (1 on `<image_soft_token>`): within one
image every token sees every other, text stays causal, and its sliding-window layers cap how far
back a token looks. prefdata learns that from the body itself (`image_type_ids_key`, a probe) and
passes the token types in right and left padding, where the model builds that mask per row; packed
rows (whose sliding mask transformers reads at each token's position in its sequence, not in the
row) and the block layouts (causal SDPA blocks) would score image pairs wrong, so every request for
them runs right padding. The stored refs must equal a plain forward of each pair with the
processor's own inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma3ForConditionalGeneration"):
    pytest.skip("this transformers has no Gemma 3", allow_module_level=True)

import datasets  # noqa: E402

from prefdata import refs as R  # noqa: E402
from prefdata.model.vision_inputs import decode_image  # noqa: E402
from vision_helpers import (  # noqa: E402
    assert_policy_equals_refs, assert_refs_equal, assert_starts_at_the_reference, completion_logp_sum, copy_out,
    direct_halves, image_row, prepare_all, train_policy_forward, train_steps, write_pngs
)

LAYOUTS = ("right", "left", "packed", "blocks", "shared")
SIZES = [(30, 20), (20, 40), (28, 28)]


@pytest.fixture(scope="module")
def gemma_model_dir(tmp_path_factory, gemma3_processor_dir) -> Path:
    from prefdata.tiny import build_tiny_gemma3_model

    path = tmp_path_factory.mktemp("gemma3-model") / "model"
    build_tiny_gemma3_model(path, gemma3_processor_dir, seed=3)  # saved with its processor beside it
    return path


@pytest.fixture(scope="module")
def gemma_out(tmp_path_factory, gemma_model_dir) -> Path:
    """Five pairs: one image, two images, a text-only row, one image with longer answers, the two
    images in the other order. Prompts are longer than the sliding window (8)."""
    base = tmp_path_factory.mktemp("gemma3-out")
    write_pngs(base / "data" / "img", {str(i): size for i, size in enumerate(SIZES)}, lambda i: (60 * i, 200 - 40 * i, 90))
    rows = [
        image_row("What colour is this?", ["img/0.png"]),
        image_row("Compare the two pictures.", ["img/1.png", "img/2.png"], placeholders=2,
                  chosen="The first is wide.", rejected="Both blue."),
        {"prompt": "A question without a picture.", "chosen": "An answer.", "rejected": "No."},
        image_row("Describe it.", ["img/2.png"], chosen="A strip, evenly lit.", rejected="Red."),
        image_row("Compare the two pictures.", ["img/2.png", "img/1.png"], placeholders=2,
                  chosen="Square, then tall.", rejected="Both blue."),
    ]
    return prepare_all(base, rows, gemma_model_dir)


@pytest.fixture(scope="module")
def gemma(gemma_model_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(str(gemma_model_dir)).eval()
    return model, AutoProcessor.from_pretrained(str(gemma_model_dir))


def _direct(model, processor, prompt, half, images, types: bool = True) -> float:
    """Sum of log-probs of `half` after `prompt`: one plain forward of this pair's half with the
    processor's inputs (pixel values, `token_type_ids`); ``types=False`` leaves the types out."""
    def inputs(ids) -> dict:
        kwargs = {}
        if images:
            kwargs = dict(processor.image_processor([decode_image(i) for i in images], return_tensors="pt"))
            if types:
                kwargs["token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))
        return kwargs

    return completion_logp_sum(model, prompt, half, inputs, attention_mask=True)


def _halves(model, processor, rows, types: bool = True):
    return direct_halves(lambda prompt, half, images: _direct(model, processor, prompt, half, images, types), rows)


@pytest.fixture(scope="module")
def expected(gemma_out, gemma):
    """Per row: the direct forward's chosen and rejected sums."""
    model, processor = gemma
    return _halves(model, processor, list(datasets.load_from_disk(str(gemma_out))))


def test_the_tiny_gemma3_forwards_the_processors_output_on_cpu(gemma):
    from PIL import Image

    model, processor = gemma
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert "sliding_attention" in model.config.text_config.layer_types
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.new("RGB", (30, 20), (30, 90, 200))], return_tensors="pt")
    assert int(inputs["token_type_ids"].sum()) == processor.image_seq_length  # the soft tokens, not <start_of_image>
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer)) and bool(logits.isfinite().all())


def test_token_types_matter_for_the_direct_forward(gemma_out, gemma, expected):
    """What the refs below are compared with can tell a causal image from a two-way one."""
    model, processor = gemma
    rows = list(datasets.load_from_disk(str(gemma_out)))
    causal = _halves(model, processor, rows, types=False)
    with_images = [i for i, r in enumerate(rows) if r["images"]]
    assert np.abs(causal[0] - expected[0])[with_images].min() > 1e-3
    assert causal[0][2] == pytest.approx(expected[0][2], abs=1e-6)  # the text-only row


def test_the_body_is_probed_for_two_way_image_attention(gemma, gemma_model_dir):
    from prefdata.model.vision_model import check_loaded_model, image_type_ids_key, vision_inputs

    model, processor = gemma
    vision = check_loaded_model(model, vision_inputs(processor), gemma_model_dir)
    assert vision.type_ids_key == "token_type_ids"
    assert vision.image_token_id == processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert model.training is False and image_type_ids_key(model) == "token_type_ids"


def test_the_llava_body_needs_no_token_types(llava_processor_dir, tmp_path):
    from prefdata.model.vision_model import image_type_ids_key
    from prefdata.tiny import build_tiny_llava_model

    assert image_type_ids_key(build_tiny_llava_model(tmp_path / "llava", llava_processor_dir)) is None


def test_refs_equal_a_direct_forward_in_every_layout(tmp_path, gemma_out, gemma_model_dir, expected):
    """right and left run as asked; packed and the block layouts (and auto) run right padding."""
    for layout in (*LAYOUTS, "auto"):
        out = copy_out(gemma_out, tmp_path, layout)
        result = R.compute_refs(out, str(gemma_model_dir), layout=layout, progress=False)
        assert result.layout == (layout if layout in ("right", "left") else "right"), layout
        assert_refs_equal(datasets.load_from_disk(str(out)), expected, err_msg=layout)


def test_refs_in_small_batches(tmp_path, gemma_out, gemma_model_dir, expected):
    out = copy_out(gemma_out, tmp_path)
    result = R.compute_refs(out, str(gemma_model_dir), layout="left", batch_tokens=70, shard_batches=1,
                            progress=False)
    assert result.shards_total >= 3
    np.testing.assert_allclose(datasets.load_from_disk(str(out))["ref_chosen_logps"], expected[0], atol=2e-4)


def _forward(model_dir, out, layout, vision_change=None):
    from transformers import AutoProcessor

    return train_policy_forward(model_dir, out, layout, AutoProcessor.from_pretrained(str(model_dir)), vision_change)


@pytest.mark.parametrize("layout", ["right", "left"])
def test_the_policy_forward_of_train_equals_the_stored_refs_pair_by_pair(tmp_path, gemma_out, gemma_model_dir, layout):
    out = copy_out(gemma_out, tmp_path)
    R.compute_refs(out, str(gemma_model_dir), progress=False)  # auto: right
    logps, stored = _forward(gemma_model_dir, out, layout)
    assert_policy_equals_refs(logps, stored)


def test_without_token_types_the_forward_is_wrong_and_a_packed_one_is_refused(tmp_path, gemma_out, gemma_model_dir):
    """The check above can fail: a forward that leaves the types out (the image causal) misses the
    refs; a pair forward asked for packed rows refuses rather than score them wrong."""
    out = copy_out(gemma_out, tmp_path)
    R.compute_refs(out, str(gemma_model_dir), progress=False)
    logps, stored = _forward(gemma_model_dir, out, "right", {"type_ids_key": None})
    with_images = [i for i, n in enumerate(stored["images"]) if n]
    assert np.abs(logps.chosen.numpy() - np.array(stored["ref_chosen_logps"]))[with_images].min() > 1e-3
    with pytest.raises(ValueError, match="right or left padding"):
        _forward(gemma_model_dir, out, "packed")


@pytest.mark.parametrize("layout", ["shared", "left"])
def test_train_starts_at_the_reference_and_moves_the_loss(tmp_path, gemma_out, gemma_model_dir, layout):
    out = copy_out(gemma_out, tmp_path)
    R.compute_refs(out, str(gemma_model_dir), progress=False)
    result, steps = train_steps(out, gemma_model_dir, tmp_path / "policy", layout, max_steps=4)
    assert_starts_at_the_reference(steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert result.steps == 4


def test_a_prefix_lm_that_reads_token_types_otherwise_is_refused():
    """PaliGemma reads `token_type_ids` as prefix (0, attended both ways) and suffix (1): the probe
    sees the text before the image change, and prefdata refuses in one line instead of guessing."""
    if not hasattr(transformers, "PaliGemmaForConditionalGeneration"):
        pytest.skip("this transformers has no PaliGemma")
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    from prefdata.core.errors import PrefdataError
    from prefdata.model.vision_model import image_type_ids_key

    config = PaliGemmaConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=7),
        text_config=dict(model_type="gemma", vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16),
        image_token_index=299, initializer_range=0.1,
    )
    torch.manual_seed(0)
    with pytest.raises(PrefdataError, match="reads token_type_ids as more than which tokens are image tokens"):
        image_type_ids_key(PaliGemmaForConditionalGeneration(config), "paligemma-dir")
