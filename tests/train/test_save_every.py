"""`--save-every 0` means what `train(save_every=0)` means: no periodic checkpoints, the trained model
still saved at the end; a negative value is refused in one line by the CLI and by the API alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefdata import cli
from prefdata.core.errors import PrefdataError
from prefdata.train.checkpoint import CHECKPOINT_DIR
from prefdata.train.recipe import train
from tests.train.test_train import CHOSEN, FAST, PROMPTS, REJECTED, make_out


@pytest.fixture(scope="module")
def small_out(tmp_path_factory, tiny_model_dir) -> Path:
    pairs = [(p, CHOSEN, REJECTED) for p in PROMPTS[:8]]
    return make_out(tmp_path_factory.mktemp("save-every"), tiny_model_dir, pairs)


@pytest.fixture
def captured(monkeypatch) -> dict:
    """The settings the CLI hands to train(), which stops there."""
    settings_seen: dict = {}

    def fake_train(out_dir, **settings):
        settings_seen.update(settings)
        raise PrefdataError("stop here")

    monkeypatch.setattr("prefdata.train.recipe.train", fake_train)
    return settings_seen


def test_cli_save_every_0_reaches_train_as_0(captured) -> None:
    assert cli.main(["train", "OUT", "--model", "m", "--output", "o", "--save-every", "0"]) == 2
    assert captured["save_every"] == 0


def test_a_negative_save_every_is_one_line_in_the_cli_and_the_api(small_out, tiny_model_dir, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["train", str(small_out), "--model", tiny_model_dir, "--output", str(tmp_path / "o"),
                  "--save-every", "-1"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(err) == 1 and "expected an integer >= 0, got -1" in err[0], err
    with pytest.raises(PrefdataError, match="save_every and eval_every must be >= 0") as excinfo:
        train(small_out, model=tiny_model_dir, output=tmp_path / "p", max_steps=1, save_every=-1, **FAST)
    assert "\n" not in str(excinfo.value)


def test_save_every_0_writes_no_checkpoint_but_the_final_model(small_out, tiny_model_dir, tmp_path) -> None:
    argv = ["train", str(small_out), "--model", tiny_model_dir, "--max-steps", "2", "--batch-pairs", "4",
            "--warmup-ratio", "0", "--device", "cpu", "--no-progress"]
    assert cli.main([*argv, "--output", str(tmp_path / "none"), "--save-every", "0"]) == 0
    assert not (tmp_path / "none" / CHECKPOINT_DIR).exists()
    assert (tmp_path / "none" / "config.json").is_file()  # the trained model, saved at the end
    # the same run saving every step keeps a checkpoint: the flag is what decides
    assert cli.main([*argv, "--output", str(tmp_path / "every"), "--save-every", "1"]) == 0
    assert [p.name for p in (tmp_path / "every" / CHECKPOINT_DIR).iterdir()] == ["step-00000001"]


def test_cli_eval_every_0_reaches_train_as_0_and_a_negative_is_one_line(captured, capsys) -> None:
    """`--eval-every 0` is what `train(eval_every=0)` always meant: no evaluation between steps."""
    assert cli.main(["train", "OUT", "--model", "m", "--output", "o", "--eval", "E", "--eval-every", "0"]) == 2
    assert captured["eval_every"] == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "OUT", "--model", "m", "--output", "o", "--eval-every", "-2"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(err) == 1 and "expected an integer >= 0, got -2" in err[0], err
