"""`refs` and `train` on image OUTs with a tiny LLaVA: stored refs equal a direct per-pair forward
with the processor's pixel values in every layout, the shared layout counts a shared prompt's
images once, train starts at policy == reference and moves the loss, kill -9 resumes, and a wrong
processor or a text-only model is refused with one line (Qwen2-VL's 3-D positions:
test_qwen2vl_refs_train.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")
torch = pytest.importorskip("torch")

import datasets  # noqa: E402

from prefdata import refs as R  # noqa: E402
from prefdata.core.errors import PrefdataError  # noqa: E402
from prefdata.io.manifest import read_manifest  # noqa: E402
from vision_helpers import (  # noqa: E402
    assert_policy_equals_refs, assert_refs_equal, assert_starts_at_the_reference, completion_logp_sum, copy_out,
    direct_halves, image_row, prepare_all, train_policy_forward, train_steps, write_pngs
)

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = ("right", "left", "packed", "blocks", "shared")


@pytest.fixture(scope="module")
def llava_model_dir(tmp_path_factory, llava_processor_dir) -> Path:
    from prefdata.tiny import build_tiny_llava_model

    path = tmp_path_factory.mktemp("llava-model") / "model"
    build_tiny_llava_model(path, llava_processor_dir, seed=3)  # saved with its processor beside it
    return path


@pytest.fixture(scope="module")
def image_out(tmp_path_factory, llava_processor_dir) -> Path:
    """Five prepared pairs: one image, two images of different sizes (both orders of a pair of
    colours), a text-only row, and an image of another size with longer answers."""
    base = tmp_path_factory.mktemp("image-out")
    colors = [(220, 30, 30), (20, 200, 60), (40, 40, 230)]
    write_pngs(base / "data" / "img", {"wide": (64, 20), "tall": (12, 70), "square": (33, 33)}, colors.__getitem__)
    rows = [
        image_row("What colour is this?", ["img/wide.png"]),
        image_row("Compare the two pictures.", ["img/wide.png", "img/tall.png"], placeholders=2,
                  chosen="The first is red, the second green.", rejected="Both are blue."),
        {"prompt": "A question without a picture.", "chosen": "An answer.", "rejected": "No."},
        image_row("Describe it in detail, please.", ["img/square.png"], chosen="A blue square, evenly lit.",
                  rejected="Red."),
        image_row("Compare the two pictures.", ["img/tall.png", "img/wide.png"], placeholders=2,
                  chosen="Green first, then red.", rejected="Both are blue."),
    ]
    return prepare_all(base, rows, llava_processor_dir)


def _direct(model, processor, prompt, half, images) -> float:
    """The plain forward of this pair's half with the processor's pixel values for its images."""
    pixels = dict(processor.image_processor(images, return_tensors="pt")) if images else {}
    return completion_logp_sum(model, prompt, half, lambda _ids: pixels)


@pytest.fixture(scope="module")
def expected(image_out, llava_model_dir):
    """Per row: the direct forward's chosen and rejected sums."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(str(llava_model_dir)).eval()
    processor = AutoProcessor.from_pretrained(str(llava_model_dir))
    rows = list(datasets.load_from_disk(str(image_out)))
    halves = direct_halves(lambda prompt, half, images: _direct(model, processor, prompt, half, images), rows)
    # The images matter: the two-image row with its images swapped scores differently.
    two = next(r for r in rows if r["images"] and len(r["images"]) == 2)
    swapped = _direct(model, processor, two["prompt_ids"], two["chosen_ids"], two["images"][::-1])
    assert abs(swapped - _direct(model, processor, two["prompt_ids"], two["chosen_ids"], two["images"])) > 1e-3
    return halves


def test_refs_equal_a_direct_forward_in_every_layout(tmp_path, image_out, llava_model_dir, expected):
    results = {}
    for layout in LAYOUTS:
        out = copy_out(image_out, tmp_path, layout)
        results[layout] = result = R.compute_refs(out, str(llava_model_dir), layout=layout, progress=False)
        assert result.layout == layout  # the model runs it, no fallback to right padding
        rows = datasets.load_from_disk(str(out))
        assert_refs_equal(rows, expected, err_msg=layout)
        assert rows["chosen_token_count"] == [len(c) for c in rows["chosen_ids"]]
        assert [len(i or []) for i in rows["images"]] == [1, 2, 0, 1, 2]  # the images stay in OUT
        refs = read_manifest(out)["refs"]
        assert refs["model"]["architecture"] == "LlavaForConditionalGeneration"
        assert refs["processor_fingerprint_checked"] == read_manifest(out)["processor"]["fingerprint"]
    # A shared prompt (its image tokens included) goes through once: fewer tokens than blocks.
    assert results["shared"].shared_pairs == 5 and results["blocks"].shared_pairs == 0
    prompt_tokens = sum(len(p) for p in datasets.load_from_disk(str(image_out))["prompt_ids"])
    assert results["blocks"].tokens - results["shared"].tokens == prompt_tokens


def test_refs_in_small_batches_and_auto_layout(tmp_path, image_out, llava_model_dir, expected):
    out = copy_out(image_out, tmp_path)
    result = R.compute_refs(out, str(llava_model_dir), batch_tokens=60, shard_batches=1, progress=False)
    assert result.layout == "shared" and result.shards_total >= 3  # one or two pairs per batch
    assert_refs_equal(datasets.load_from_disk(str(out)), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_refs_on_gpu_bf16_close_to_cpu_fp32(tmp_path, image_out, llava_model_dir, expected):
    out = copy_out(image_out, tmp_path)
    result = R.compute_refs(out, str(llava_model_dir), device="cuda", progress=False)  # pixel values in bf16 too
    assert result.dtype == "bfloat16" and result.device.startswith("cuda") and result.layout == "shared"
    np.testing.assert_allclose(datasets.load_from_disk(str(out))["ref_chosen_logps"], expected[0], atol=1.0, rtol=0.05)


def _run_killed(out: Path, model_dir: Path, kill_after: int) -> subprocess.CompletedProcess:
    code = (
        "from prefdata.refs import compute_refs; "
        f"compute_refs({str(out)!r}, {str(model_dir)!r}, batch_tokens=60, progress=False, shard_batches=1)"
    )
    env = {**os.environ, R.KILL_AFTER_SHARDS_ENV: str(kill_after), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_refs_resume_after_kill_9(tmp_path, image_out, llava_model_dir, expected):
    out = copy_out(image_out, tmp_path)
    proc = _run_killed(out, llava_model_dir, kill_after=2)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(list((out / R.WORK_DIR).glob("*/shard-*.npz"))) == 2
    assert "ref_chosen_logps" not in datasets.load_from_disk(str(out)).column_names
    result = R.compute_refs(out, str(llava_model_dir), batch_tokens=60, progress=False, shard_batches=1)
    assert result.shards_resumed == 2 and result.shards_total > 2
    rows = datasets.load_from_disk(str(out))
    np.testing.assert_allclose(rows["ref_chosen_logps"], expected[0], atol=2e-4)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_policy_forward_of_train_equals_the_stored_refs_pair_by_pair(tmp_path, image_out, llava_model_dir, layout):
    from transformers import AutoProcessor

    out = copy_out(image_out, tmp_path)
    R.compute_refs(out, str(llava_model_dir), progress=False)  # auto: shared
    logps, stored = train_policy_forward(llava_model_dir, out, layout, AutoProcessor.from_pretrained(str(llava_model_dir)))
    assert_policy_equals_refs(logps, stored)


@pytest.mark.parametrize("layout", ["shared", "right"])
def test_train_starts_at_the_reference_and_moves_the_loss(tmp_path, image_out, llava_model_dir, layout):
    from prefdata.tokenize.vision import holds_processor

    out = copy_out(image_out, tmp_path)
    R.compute_refs(out, str(llava_model_dir), progress=False)
    result, steps = train_steps(out, llava_model_dir, tmp_path / "policy", layout, max_steps=6)
    assert_starts_at_the_reference(steps)
    ref_mean = float(np.mean(datasets.load_from_disk(str(out))["ref_chosen_logps"]))
    assert steps[0]["logps/chosen"] == pytest.approx(ref_mean, abs=1e-3)
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.05  # the loss moves
    # The trained model is saved with its processor: loadable, and the processor for the next refs.
    assert result.steps == 6 and holds_processor(tmp_path / "policy")
    from transformers import AutoModelForImageTextToText

    assert type(AutoModelForImageTextToText.from_pretrained(str(tmp_path / "policy"))).__name__ == (
        "LlavaForConditionalGeneration")


def test_a_wrong_processor_is_refused(tmp_path, image_out, llava_model_dir, capsys):
    from prefdata.cli import main
    from prefdata.tiny import build_tiny_llava_processor
    from prefdata.train.recipe import train

    other = tmp_path / "other-processor"
    build_tiny_llava_processor(other, image_size=42)  # another image size: other pixel values
    out = copy_out(image_out, tmp_path)
    with pytest.raises(PrefdataError, match="differs from the one OUT was prepared with") as info:
        R.compute_refs(out, str(llava_model_dir), processor=str(other), progress=False)
    assert "\n" not in str(info.value)
    with pytest.raises(PrefdataError, match="differs from the one OUT was prepared with"):
        train(out, model=llava_model_dir, output=tmp_path / "policy", loss="simpo", processor=other, progress=False)
    capsys.readouterr()
    assert main(["refs", str(out), "--model", str(llava_model_dir), "--processor", str(other), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "differs from the one OUT was prepared with" in err and len(err.splitlines()) == 1
    assert "ref_chosen_logps" not in datasets.load_from_disk(str(out)).column_names


def test_the_processor_defaults_to_the_manifests_when_the_model_has_none(tmp_path, image_out, llava_model_dir,
                                                                          expected):
    bare = Path(shutil.copytree(llava_model_dir, tmp_path / "bare-model"))
    for name in ("processor_config.json", "preprocessor_config.json"):
        (bare / name).unlink(missing_ok=True)
    out = copy_out(image_out, tmp_path)
    R.compute_refs(out, str(bare), progress=False)  # the manifest's processor (llava_processor_dir)
    np.testing.assert_allclose(datasets.load_from_disk(str(out))["ref_chosen_logps"], expected[0], atol=2e-4)


def test_a_text_only_model_is_refused(tmp_path, image_out, llava_processor_dir, capsys):
    from prefdata.cli import main
    from prefdata.tiny import build_tiny_model

    text_model = tmp_path / "text-model"
    build_tiny_model(text_model, architecture="llama")
    out = copy_out(image_out, tmp_path)
    with pytest.raises(PrefdataError, match="text-only model"):
        R.compute_refs(out, str(text_model), processor=str(llava_processor_dir), progress=False)
    capsys.readouterr()
    assert main(["train", str(out), "--model", str(text_model), "--output", str(tmp_path / "p"), "--loss", "simpo",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "text-only model" in err and len(err.splitlines()) == 1


def test_rows_kept_with_image_mismatch_are_refused():
    import pyarrow as pa

    from prefdata.model.vision_model import refuse_mismatched_rows

    refuse_mismatched_rows(pa.table({"flags": [["near_duplicate"], []]}), "OUT")
    with pytest.raises(PrefdataError, match="keeps 1 rows flagged image_mismatch"):
        refuse_mismatched_rows(pa.table({"flags": [["image_mismatch"], [], None]}), "OUT")
