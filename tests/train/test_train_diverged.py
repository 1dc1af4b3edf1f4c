"""Training never ends with non-finite parameters and exit 0: a step whose loss or gradient norm is not
finite stops the run (exit 1, one line naming the step and the pairs), before the optimizer or any
save sees it."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch

from prefdata import cli
from prefdata.train.recipe import train
from prefdata.train.stall import TrainingDiverged

from tests.train.test_train import CHOSEN, PROMPTS, REJECTED, make_out


@pytest.fixture(scope="module")
def small_out(tmp_path_factory, tiny_model_dir) -> Path:
    import json

    pairs = [(p, CHOSEN, REJECTED) for p in PROMPTS[:6]]
    out = make_out(tmp_path_factory.mktemp("diverge") / "out", tiny_model_dir, pairs)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["row_accounting"] = {"rows_in": 6, "rows_out": 6, "rows_dropped": 0, "rows_quarantined": 0}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _saved_tensors(output: Path) -> list[torch.Tensor]:
    """Every tensor a run left under `output`: checkpoints and a final model alike."""
    from safetensors.torch import load_file

    tensors = []
    for path in output.rglob("*.safetensors"):
        tensors += list(load_file(path).values())
    for path in output.rglob("trainable.pt"):
        tensors += list(torch.load(path, weights_only=True).values())
    return tensors


def test_a_learning_rate_that_blows_up_the_policy_stops_at_that_step(small_out, tiny_model_dir, tmp_path, capsys):
    output = tmp_path / "run"
    code = cli.main(["train", str(small_out), "--model", tiny_model_dir, "--output", str(output), "--lr", "1e30",
                     "--max-steps", "4", "--batch-pairs", "3", "--save-every", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 1, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "prefdata train: error: training stopped" in err and "at step 2" in err
    assert not (output / "model.safetensors").exists()  # no final model
    saved = _saved_tensors(output)
    assert all(bool(torch.isfinite(t).all()) for t in saved)  # nothing NaN was written


def test_an_offset_that_overflows_float32_stops_the_first_step_naming_the_pair(small_out, tiny_model_dir, tmp_path,
                                                                              monkeypatch):
    """A tampered OUT whose offset float32 cannot hold (1e39: the loss is inf), with OUT's schema check
    bypassed through the Python API: the run stops at step 1 naming that pair's source line."""
    import prefdata.core.schema as schema

    ds = datasets.load_from_disk(str(small_out))
    offsets = [0.0] * len(ds)
    offsets[4] = 1e39
    crafted = tmp_path / "crafted"
    ds.add_column("offset", offsets).save_to_disk(str(crafted))
    (crafted / "manifest.json").write_text((small_out / "manifest.json").read_text())
    monkeypatch.setattr(schema, "check_out", lambda *args, **kwargs: 0)
    output = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"at step 1: the loss is (inf|nan).*first at synthetic\.jsonl:5") as info:
        train(crafted, model=tiny_model_dir, output=output, max_steps=2, batch_pairs=6, save_every=1, lr=1e-3,
              warmup_ratio=0.0, progress=False, device="cpu")
    assert info.value.exit_code == 1 and "\n" not in str(info.value)
    assert not (output / "model.safetensors").exists() and not (output / "checkpoints").exists()
