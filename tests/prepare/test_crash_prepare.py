"""`prepare` killed with SIGKILL at random points: OUT/ never looks finished, and a rerun gives the
same output as an uninterrupted run. Ctrl-C exits with a message and leaves nothing half-written."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROWS = 3000


def _write_input(path: Path, rows: int = ROWS) -> None:
    rng = random.Random(7)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            prompt = " ".join(rng.choices(words, k=rng.randint(3, 30)))
            chosen = " ".join(rng.choices(words, k=rng.randint(1, 40)))
            rejected = chosen if i % 50 == 0 else " ".join(rng.choices(words, k=rng.randint(1, 40)))
            handle.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected, "i": i}) + "\n")
            if i % 333 == 0:
                handle.write("{not json\n")


def _command(raw: Path, out: Path, tokenizer: str) -> list[str]:
    return [sys.executable, "-m", "prefdata", "prepare", str(raw), str(out), "--tokenizer", tokenizer,
            "--batch-size", "100", "--overwrite", "--no-progress"]


def _assert_no_orphans(out: Path, timeout: float = 10.0) -> None:
    """Worker processes of a killed prepare must not linger (they exit once their parent is gone)."""
    deadline = time.time() + timeout
    while True:
        alive = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "prefdata prepare" in cmdline and str(out) in cmdline:
                alive.append(proc.name)
        if not alive or time.time() > deadline:
            break
        time.sleep(0.2)
    assert not alive, f"orphaned worker processes: {alive}"


def _signature(out: Path) -> tuple:
    manifest = json.loads((out / "manifest.json").read_text())
    return (
        manifest["content_hash"],
        json.dumps(manifest["row_accounting"], sort_keys=True),
        (out / "dropped.jsonl").read_bytes(),
        (out / "quarantine.jsonl").read_bytes(),
    )


@pytest.mark.slow
def test_sigkill_at_random_points_then_rerun(tmp_path, tiny_tokenizer_dir):
    raw = tmp_path / "raw.jsonl"
    _write_input(raw)
    reference = tmp_path / "reference"
    subprocess.run(_command(raw, reference, tiny_tokenizer_dir), check=True, capture_output=True, timeout=600)
    expected = _signature(reference)

    out = tmp_path / "out"
    rng = random.Random(1)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for attempt in range(3):
        process = subprocess.Popen(_command(raw, out, tiny_tokenizer_dir), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=env)
        # Kill while it is writing: wait for its temporary directory, then a random moment more.
        deadline = time.time() + 120
        while not list(out.glob(".prefdata-staging-*")) and process.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        process.send_signal(signal.SIGKILL)
        process.wait()
        _assert_no_orphans(out)
        # Whatever was left is either a finished output equal to the reference, or has no manifest.
        if (out / "manifest.json").exists():
            assert _signature(out) == expected

    subprocess.run(_command(raw, out, tiny_tokenizer_dir), check=True, capture_output=True, timeout=600)
    assert _signature(out) == expected
    assert not list(out.glob(".prefdata-staging-*")), "stale staging directories were not cleaned"
    assert not list(tmp_path.glob("out?*")), "nothing may be written beside OUT"


@pytest.mark.slow
def test_ctrl_c_exits_cleanly(tmp_path, tiny_tokenizer_dir):
    raw = tmp_path / "raw.jsonl"
    _write_input(raw, rows=ROWS * 8)  # long enough that the interrupt lands mid-run, not at exit
    out = tmp_path / "out"
    process = subprocess.Popen(_command(raw, out, tiny_tokenizer_dir), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    # Interrupt once the run has begun writing (its lock and staging appear under OUT), not after a
    # fixed sleep: a fresh checkout's first start (bytecode compiled, cold caches) can take longer.
    deadline = time.time() + 60
    while not out.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip("prepare finished before the interrupt arrived")
    assert process.returncode == 130
    assert "Traceback" not in err and "interrupted" in err
    assert not out.exists()
    assert not list(tmp_path.glob("out?*"))
