"""`prefdata train` killed with SIGKILL in a subprocess, then `--resume`: the final weights equal an
uninterrupted run (issue 6)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_train import CHOSEN, PROMPTS, REJECTED, make_out

STEPS = 12


def _command(out: Path, model: str, output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "prefdata", "train", str(out), "--model", model, "--output", str(output),
            "--max-steps", str(STEPS), "--batch-pairs", "4", "--lr", "3e-3", "--warmup-ratio", "0",
            "--save-every", "2", "--device", "cpu", "--no-progress", *extra]


def _weights(output: Path) -> dict[str, torch.Tensor]:
    files = sorted(output.glob("*.safetensors"))
    assert files, f"no saved model in {output}"
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_same_weights(tmp_path, tiny_model_dir):
    out = make_out(tmp_path / "prepared", tiny_model_dir, [(p, CHOSEN, REJECTED) for p in PROMPTS])
    straight = tmp_path / "straight"
    subprocess.run(_command(out, tiny_model_dir, straight), check=True, capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    process = subprocess.Popen(_command(out, tiny_model_dir, killed), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    checkpoints = killed / "checkpoints"
    while process.poll() is None and time.time() < deadline and not any(checkpoints.glob("step-*")):
        time.sleep(0.05)
    time.sleep(random.Random(3).uniform(0.0, 1.0))  # somewhere after the first checkpoint
    process.send_signal(signal.SIGKILL)
    process.wait()
    if process.returncode == 0:
        pytest.skip("training finished before the kill arrived")

    subprocess.run(_command(out, tiny_model_dir, killed, "--resume"), check=True, capture_output=True, timeout=600)
    expected, got = _weights(straight), _weights(killed)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
