"""`torchrun --nproc-per-node 2 -m prefdata refs|train` on CPU (gloo): the same refs and the same
weights as one process, and a run that reads like one process's: one summary, one progress bar,
one metrics line per step, one manifest update. `--batch-pairs` is per rank (TRL's
per_device_train_batch_size): 2 ranks x 2 pairs equal one process with 2 pairs x 2 accumulation steps."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from prefdata.refs import REF_COLUMNS, compute_refs
from prefdata.train.recipe import train
from tests.refs.test_refs import make_out as make_ids_out
from tests.train.test_train import CHOSEN, PROMPTS, REJECTED
from tests.train.test_train import make_out as make_train_out

REPO = Path(__file__).resolve().parents[2]


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Two CPU processes under torchrun, each running `python -m prefdata ARGS` (cwd: no pyproject
    settings of this repository apply)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "prefdata", *args]
    # stderr is a terminal, as in a user's shell: progress bars are drawn only on one (a redirected
    # stderr gets none), and the test counts them.
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 120 columns: a bar has room
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(master, chunks), daemon=True)
    reader.start()
    stdout, _ = proc.communicate(timeout=300)
    reader.join(timeout=10)
    os.close(master)
    stderr = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    assert proc.returncode == 0, stderr[-3000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _drain(fd: int, chunks: list[bytes]) -> None:
    """Read a pty's master end until the last writer closes it (EIO on Linux)."""
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            return
        if not data:
            return
        chunks.append(data)


def _bars(stderr: str, desc: str) -> int:
    """How many progress bars named `desc` were drawn (each starts with its 0% line)."""
    return len(re.findall(rf"{desc}:\s+0%\|", stderr))


@pytest.mark.slow
def test_refs_under_torchrun_equal_one_process_and_speak_once(tmp_path, tiny_model_dir):
    single = make_ids_out(tmp_path / "single", tiny_model_dir)
    compute_refs(single, tiny_model_dir, batch_tokens=200, progress=False, shard_batches=1, device="cpu")
    out = make_ids_out(tmp_path / "ranks", tiny_model_dir)
    config = tmp_path / "refs.toml"  # several shards, so that both ranks compute some
    config.write_text("[refs]\nshard_batches = 1\nbatch_tokens = 200\n")
    proc = _torchrun(["refs", str(out), "--model", tiny_model_dir, "--device", "cpu", "--config", str(config)],
                     tmp_path)

    ours, theirs = datasets.load_from_disk(str(out)), datasets.load_from_disk(str(single))
    for name in REF_COLUMNS:
        np.testing.assert_array_equal(np.asarray(ours[name]), np.asarray(theirs[name]))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["refs"]["settings"]["world_size"] == 2
    summaries = [line for line in proc.stdout.splitlines() if line.startswith("refs: ")]
    assert len(summaries) == 1 and "wrote" in summaries[0], proc.stdout
    assert "rank 1" not in proc.stdout + proc.stderr
    assert _bars(proc.stderr, "refs") == 1, proc.stderr


@pytest.mark.slow
def test_train_under_torchrun_equals_one_process_with_the_same_global_batch(tmp_path, tiny_model_dir):
    out = make_train_out(tmp_path / "out", tiny_model_dir, [(p, CHOSEN, REJECTED) for p in PROMPTS])
    settings = dict(lr=3e-3, warmup_ratio=0.0, max_steps=3, seed=0)
    # One process: 2 pairs per micro-batch, 2 micro-batches per step = 4 pairs per step.
    single = train(out, model=tiny_model_dir, output=tmp_path / "single", batch_pairs=2, grad_accum=2,
                   progress=False, device="cpu", save_every=None, **settings)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    # Two ranks, --batch-pairs 2 each: the same 4 pairs per step.
    proc = _torchrun(["train", str(out), "--model", tiny_model_dir, "--output", str(tmp_path / "ranks"),
                      "--device", "cpu", "--batch-pairs", "2", *flags], tmp_path)

    from transformers import AutoModelForCausalLM

    ranks = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ranks")).state_dict()
    ones = {k: v.detach() for k, v in single.model.state_dict().items()}
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(ranks[k], base[k]) for k in ranks)  # it trained
    assert max(float((ranks[k] - ones[k]).abs().max()) for k in ranks) < 1e-5

    lines = [json.loads(x) for x in (tmp_path / "ranks" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "loss" in m] == [1, 2, 3]  # written once, by rank 0
    singles = [json.loads(x) for x in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(lines, singles):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["num_tokens"] == b["num_tokens"]  # the same pairs in each step
    config = json.loads((tmp_path / "ranks" / "train_config.json").read_text())
    assert config["world_size"] == 2 and config["batch_pairs"] == 2 and config["grad_accum"] == 1
    assert config["total_steps"] == 3
    summaries = [line for line in proc.stdout.splitlines() if line.startswith("trained ")]
    assert len(summaries) == 1 and summaries[0].startswith("trained 3 steps (0.75 epochs)"), proc.stdout
    assert proc.stdout.count("model: ") == 1
    assert _bars(proc.stderr, "train") == 1, proc.stderr


def test_other_ranks_print_no_summary_and_tag_their_errors(tmp_path, tiny_model_dir, monkeypatch, capsys):
    from prefdata.cli import main

    missing = tmp_path / "missing-out"
    monkeypatch.setenv("RANK", "1")
    assert main(["train", str(missing), "--model", tiny_model_dir, "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefdata train (rank 1): error: ") and err.count("\n") == 1
    monkeypatch.setenv("RANK", "0")
    assert main(["train", str(missing), "--model", tiny_model_dir, "--output", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.startswith("prefdata train: error: ")
