"""Ctrl-C while one long record is being worked on (issue 30): `prepare` and `validate` end within
a few seconds, exit 130 with their one line, leave no finished-looking output and no worker behind.

With --workers 2 the workers ignore SIGINT (Ctrl-C is the main process's to report), so before the
fix the main process waited in the pool's shutdown for the running record: 20-39 s here for a 40 MB
record, now 0.1-1.7 s. With --workers 1 the record is tokenized in the main process, where a Rust
call on the whole 40 MB text held Ctrl-C off until it returned (over 60 s); it now takes 64 Ki
characters a call (prefdata.tokenize.pieces), so Ctrl-C lands between two."""

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

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads worker processes from /proc")

HUGE_MB = 40  # tokenizing it keeps a worker busy for 15-30 s on a laptop core, far past EXIT_WITHIN_S
EXIT_WITHIN_S = 5.0  # "a few seconds", with room for a loaded CI machine
_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}


def _write_slow_input(path: Path) -> None:
    """A huge record first (the first unit a worker takes), then a few ordinary rows."""
    rng = random.Random(3)
    vocabulary = [f"w{rng.randrange(10**6)}" for _ in range(50_000)]
    huge = " ".join(rng.choices(vocabulary, k=HUGE_MB * 2**20 // 7))
    rows = [{"prompt": "Think long.", "chosen": huge, "rejected": "no"}]
    rows += [{"prompt": f"Question {i}?", "chosen": f"Good {i}.", "rejected": f"Bad {i}."} for i in range(5)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the engine's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 is the parent pid; the command name (field 2) may hold spaces, so split after ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for_busy_workers(process: subprocess.Popen, workers: int, timeout: float = 120.0) -> list[int]:
    """The worker pids, once the pool has started and a worker has had a moment to take the huge
    record (waiting on the pool rather than a fixed sleep: a cold start can take many seconds)."""
    deadline = time.time() + timeout
    while process.poll() is None and time.time() < deadline:
        pids = _children(process.pid)
        if len(pids) >= workers:
            time.sleep(2.0)  # read, parse and normalize the huge record; then it is tokenizing
            return pids
        time.sleep(0.05)
    pytest.fail(f"the worker pool never started (exit {process.poll()})")


def _args(command: str, raw: Path, tmp_path: Path, tokenizer: str, workers: int) -> list[str]:
    args = [sys.executable, "-m", "prefdata", command, str(raw)]
    if command == "prepare":
        args += [str(tmp_path / "out"), "--tokenizer", tokenizer, "--overwrite"]
    else:
        args += ["--tokenizer", tokenizer, "--format", "json", "--output", str(tmp_path / "report.json")]
    return args + ["--workers", str(workers), "--no-progress"]


def _startup_seconds(command: str, tmp_path: Path, tokenizer: str) -> float:
    """How long the same command takes on one ordinary row: past that, a run is at its records."""
    raw = tmp_path / "one.jsonl"
    raw.write_text(json.dumps({"prompt": "q?", "chosen": "yes", "rejected": "no"}) + "\n")
    started = time.monotonic()
    subprocess.run(_args(command, raw, tmp_path / "warm", tokenizer, 1), capture_output=True, env=_ENV, timeout=300)
    return time.monotonic() - started


@pytest.mark.parametrize("workers", [2, 1])
@pytest.mark.parametrize("command", ["prepare", "validate"])
def test_ctrl_c_stops_a_busy_worker_within_seconds(command, workers, tmp_path, tiny_tokenizer_dir):
    raw = tmp_path / "raw.jsonl"
    _write_slow_input(raw)
    out = tmp_path / "out"
    report = tmp_path / "report.json"
    (tmp_path / "warm").mkdir()
    startup = _startup_seconds(command, tmp_path, tiny_tokenizer_dir) if workers == 1 else 0.0
    # A session of its own, so the SIGINT goes to the whole group as a terminal's Ctrl-C does.
    process = subprocess.Popen(_args(command, raw, tmp_path, tiny_tokenizer_dir, workers), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=_ENV, start_new_session=True)
    try:
        if workers > 1:
            workers_seen = _wait_for_busy_workers(process, workers)
        else:  # no pool to watch: past the startup and 5 s more, the huge record is being tokenized
            workers_seen = []
            time.sleep(startup + 5.0)
        interrupted_at = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command} was still running 60 s after Ctrl-C")
        took = time.monotonic() - interrupted_at
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if process.returncode == 0:
        pytest.skip(f"{command} finished before the interrupt arrived")
    assert process.returncode == 130, err
    assert took < EXIT_WITHIN_S, f"{command} took {took:.1f} s to exit after Ctrl-C"
    assert "Traceback" not in err and f"prefdata {command}: interrupted" in err
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not report.exists()  # nothing partial left as finished output
    assert not list(tmp_path.glob("out?*"))
    deadline = time.time() + 5
    while any(_alive(pid) for pid in workers_seen) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers_seen), "a worker outlived the interrupted run"
