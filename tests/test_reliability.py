"""Issue 16: no input stalls a run, empty results fail loudly, one writer per OUT, write failures
are one line.

Each test runs what a user runs (the typed function or the CLI) and checks what they rely on: the
exit code, one line on stderr, and what OUT holds afterwards.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.core.errors import PrefdataError
from prefdata.io import writer as W
from prefdata.io.lock import LOCK_NAME, OutLock
from prefdata.prepare import prepare
from prefdata.validate.command import validate

REPO = Path(__file__).resolve().parents[1]


def _rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _good(path: Path, n: int = 3) -> Path:
    return _rows(path, [{"prompt": f"q{i}?", "chosen": f"good answer {i}", "rejected": f"bad {i}"} for i in range(n)])


def _one_line(text: str) -> str:
    text = text.strip()
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


# --- empty results ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, records",
    [
        ("numbers.json", b"[1, 2, 3.5, 4]", 4),
        ("binary.jsonl", bytes(random.Random(0).randrange(256) for _ in range(3000)).replace(b"\n", b"\x00") + b"\n", 1),
        ("notes.jsonl", b"hello world\nthis is not JSON\n", 2),
    ],
)
def test_a_run_that_reads_no_record_exits_2_and_keeps_the_quarantine(name, content, records, tmp_path, tiny_tokenizer_dir, capsys):
    raw = tmp_path / name
    raw.write_bytes(content)
    out = tmp_path / "out"
    with pytest.raises(PrefdataError) as info:
        prepare(raw, out, tokenizer=tiny_tokenizer_dir, progress=False)
    message = _one_line(str(info.value))
    assert info.value.exit_code == 2
    assert "no record" in message and str(out / "quarantine.jsonl") in message
    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert len(quarantined) == records and all(q["error"] for q in quarantined)
    assert (out / "dropped.jsonl").exists() and (out / "report.md").exists()
    assert not (out / "manifest.json").exists()  # not a finished output: refs/train refuse it

    # The CLI: exit 2, one line; a second run into the same OUT needs no --overwrite.
    code = main(["prepare", str(raw), str(out), "--tokenizer", tiny_tokenizer_dir, "--no-progress"])
    assert code == 2
    assert "quarantine.jsonl" in _one_line(capsys.readouterr().err)


def test_a_prepare_that_keeps_no_pair_exits_1(tmp_path, tiny_tokenizer_dir, capsys):
    raw = _rows(tmp_path / "same.jsonl", [{"prompt": "q", "chosen": "same", "rejected": "same"}] * 2 + [{"prompt": "q"}])
    out = tmp_path / "out"
    result = prepare(raw, out, tokenizer=tiny_tokenizer_dir, progress=False)
    assert (result.rows_out, result.rows_dropped, result.rows_quarantined) == (0, 2, 1)
    assert result.exit_code == 1 and "no pair kept" in _one_line(result.problem)
    assert len((out / "dropped.jsonl").read_text().splitlines()) == 2
    assert len((out / "quarantine.jsonl").read_text().splitlines()) == 1

    code = main(["prepare", str(raw), str(tmp_path / "out2"), "--tokenizer", tiny_tokenizer_dir, "--no-progress"])
    assert code == 1
    err = _one_line(capsys.readouterr().err)
    assert "no pair kept" in err and "dropped.jsonl" in err
    # A dataset with kept pairs still exits 0.
    assert prepare(_good(tmp_path / "good.jsonl"), tmp_path / "out3", tokenizer=tiny_tokenizer_dir, progress=False).exit_code == 0


# --- one writer per OUT -------------------------------------------------------------------------

_HOLDER = """
import os, sys, time
from pathlib import Path
from prefdata.io.lock import OutLock
from prefdata.io.out_dir import prepare_output_dir
out = Path(sys.argv[1])
OutLock(out, "prepare").acquire()  # what prepare does first
staging = prepare_output_dir(out, overwrite=False)
(staging / "part.arrow").write_text("being written")
print("ready", flush=True)
time.sleep(120)
"""


def _hold_lock(out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    return holder


def test_a_second_writer_is_refused_and_a_killed_writers_lock_is_taken_over(tmp_path, tiny_tokenizer_dir, capsys):
    raw = _good(tmp_path / "raw.jsonl")
    out = tmp_path / "out"
    holder = _hold_lock(out)
    try:
        staging = next(out.glob(".prefdata-staging-*"))
        with pytest.raises(PrefdataError) as info:
            prepare(raw, out, tokenizer=tiny_tokenizer_dir, progress=False)
        message = _one_line(str(info.value))
        assert "in use" in message and f"pid {holder.pid}" in message
        assert (staging / "part.arrow").read_text() == "being written"  # the first run is untouched
        assert main(["prepare", str(raw), str(out), "--tokenizer", tiny_tokenizer_dir, "--no-progress"]) == 2
        assert "in use" in _one_line(capsys.readouterr().err)
        # refs on the same OUT is refused before it loads anything.
        from prefdata.refs import compute_refs

        with pytest.raises(PrefdataError, match="in use"):
            compute_refs(out, model=str(tmp_path / "no-model"))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / LOCK_NAME).exists()  # the killed run left its lock file behind ...
    result = prepare(raw, out, tokenizer=tiny_tokenizer_dir, progress=False)  # ... and it is taken over
    assert result.rows_out == 3
    assert not list(out.glob(".prefdata-staging-*")) and not (out / LOCK_NAME).exists()


def test_the_lock_is_released_after_success_and_failure(tmp_path, tiny_tokenizer_dir):
    out = tmp_path / "out"
    prepare(_good(tmp_path / "raw.jsonl"), out, tokenizer=tiny_tokenizer_dir, progress=False)
    assert not (out / LOCK_NAME).exists()
    with pytest.raises(PrefdataError, match="already exists"):
        prepare(_good(tmp_path / "raw.jsonl"), out, tokenizer=tiny_tokenizer_dir, progress=False)
    with OutLock(out, "prepare"), pytest.raises(PrefdataError, match="in use"):  # free again after the refusal
        OutLock(out, "refs").acquire()
    missing = tmp_path / "fresh" / "out"
    kto = _rows(tmp_path / "kto.jsonl", [{"prompt": "p", "completion": "c", "label": True}])
    with pytest.raises(PrefdataError, match="does not look like preference data"):  # fails mid-run
        prepare(kto, missing, tokenizer=tiny_tokenizer_dir, progress=False)
    assert not missing.exists()  # nothing half-made is left, lock included


# --- disk full, read-only OUT -------------------------------------------------------------------


def _failing(code: int | None, message: str):
    def fail(*_args, **_kwargs):
        raise OSError(message) if code is None else OSError(code, message)

    return fail


@pytest.mark.parametrize(
    "target, error",
    [
        ("JsonlWriter.close", (errno.ENOSPC, "No space left on device")),
        # pyarrow's form: no errno attribute, "[errno 28]" in the text
        ("DatasetWriter.write_rows", (None, "Error writing bytes to file. Detail: [errno 28] No space left on device")),
        ("write_datasets_metadata", (errno.EDQUOT, "Disk quota exceeded")),  # the dataset's last files
    ],
)
def test_disk_full_is_one_line_and_leaves_no_finished_out(target, error, tmp_path, tiny_tokenizer_dir, monkeypatch, capsys):
    raw = _good(tmp_path / "raw.jsonl")
    previous = tmp_path / "previous"
    prepare(raw, previous, tokenizer=tiny_tokenizer_dir, progress=False)
    before = (previous / "manifest.json").read_text()
    owner, _, name = target.rpartition(".")
    code, text = error
    monkeypatch.setattr(getattr(W, owner) if owner else W, name, _failing(code, text))
    fresh = tmp_path / "fresh"
    with pytest.raises(PrefdataError) as info:
        prepare(raw, fresh, tokenizer=tiny_tokenizer_dir, progress=False)
    message = _one_line(str(info.value))
    assert str(fresh) in message and ("No space left" in message or "quota" in message)
    assert not fresh.exists()
    # --overwrite of a finished OUT: the previous output stays whole (its manifest included).
    assert main(["prepare", str(raw), str(previous), "--tokenizer", tiny_tokenizer_dir, "--overwrite", "--no-progress"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert str(previous) in err and "internal error" not in err
    assert (previous / "manifest.json").read_text() == before
    assert not list(previous.glob(".prefdata-staging-*")) and not (previous / LOCK_NAME).exists()


def test_a_read_only_out_is_one_line(tmp_path, tiny_tokenizer_dir, monkeypatch, capsys):
    raw = _good(tmp_path / "raw.jsonl")
    out = tmp_path / "out"

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(["prepare", str(raw), str(out), "--tokenizer", tiny_tokenizer_dir, "--no-progress"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"cannot write {out}: Read-only file system" in err
    monkeypatch.undo()
    # An existing OUT on a read-only file system: the lock file cannot be made.
    out.mkdir()
    real_open = os.open

    def no_create(path, flags, *args):
        if str(path).endswith(LOCK_NAME):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_create)
    with pytest.raises(PrefdataError) as info:
        prepare(raw, out, tokenizer=tiny_tokenizer_dir, progress=False)
    assert "Read-only file system" in _one_line(str(info.value)) and str(out) in str(info.value)


def test_unrelated_os_errors_are_not_blamed_on_out(tmp_path):
    from prefdata.io.write_errors import write_problem

    out = tmp_path / "out"
    assert write_problem(OSError(errno.EACCES, "Permission denied", str(tmp_path / "input.jsonl")), out) is None
    assert write_problem(OSError(errno.EIO, "I/O error", str(out / "x")), out) is None
    assert "Permission denied" in str(write_problem(OSError(errno.EACCES, "Permission denied", str(out / "x")), out))


# --- a huge pair --------------------------------------------------------------------------------


def _words(rng: random.Random, chars: int) -> str:
    vocab = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    return " ".join(rng.choice(vocab) for _ in range(chars // 5))[:chars]


@pytest.mark.slow
def test_a_10_mb_pair_goes_through_prepare_and_validate_in_seconds(tmp_path, tiny_tokenizer_dir):
    """Before issue 16 the near_duplicate check alone took 149 s on a 6 MB / 5 MB pair.

    Budgets are generous for a busy CI machine; idle, prepare takes ~15 s (tokenizer-bound) and
    validate ~3 s. Equal lengths make the similarity do its most work (no length bound)."""
    rng = random.Random(16)
    chosen = _words(rng, 5_000_000)
    rejected = chosen[:2_000_000] + " a small edit " + chosen[2_000_014:]  # a near copy: flagged
    other = _words(rng, 5_000_000)
    raw = _rows(tmp_path / "huge.jsonl", [
        {"prompt": "Summarize.", "chosen": chosen, "rejected": rejected},
        {"prompt": "Summarize again.", "chosen": chosen, "rejected": other},
        {"prompt": "q?", "chosen": "yes", "rejected": "no"},
    ])
    started = time.perf_counter()
    report = validate(raw, progress=False, format="json", output=tmp_path / "report.json").report
    assert time.perf_counter() - started < 90
    assert report["flags"]["near_duplicate"]["count"] == 1
    bounded = report["similarity"]["bounded"]
    assert bounded["rows"] == 2 and [e["source_line"] for e in bounded["examples"]] == [1, 2]
    started = time.perf_counter()
    result = prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, progress=False)
    assert time.perf_counter() - started < 240
    assert result.rows_out == 3 and result.flag_counts.get("near_duplicate") == 1
    assert "measured by" in (tmp_path / "out" / "report.md").read_text()


def test_releasing_never_removes_another_runs_lock(tmp_path):
    out = tmp_path / "out"
    first = OutLock(out, "prepare").acquire()
    shutil.rmtree(out)  # what a failed run's cleanup does while it still holds its lock
    second = OutLock(out, "prepare").acquire()
    first.release()
    assert (out / LOCK_NAME).exists()
    with pytest.raises(PrefdataError, match="in use"):
        OutLock(out, "refs").acquire()
    second.release()
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("workers", [1, 2])  # the row-by-row and the chunked (compact) report paths
def test_the_report_names_the_pairs_measured_the_bounded_way(workers, tmp_path):
    rng = random.Random(5)
    long_text = _words(rng, 40_000)  # 80k characters in the pair: over EXACT_LIMIT
    raw = _rows(tmp_path / "mixed.jsonl", [
        {"prompt": "q1?", "chosen": "short answer", "rejected": "another"},
        {"prompt": "q2?", "chosen": long_text, "rejected": long_text[:-10] + " different"},
        {"prompt": "q3?", "chosen": long_text[:30_000], "rejected": long_text[:30_000] + "!"},  # 60k: exact
    ])
    result = validate(raw, workers=workers, progress=False, format="markdown", output=tmp_path / "report.md")
    bounded = result.report["similarity"]["bounded"]
    assert bounded["rows"] == 1 and bounded["examples"] == [{"source_file": str(raw), "source_line": 2}]
    assert result.report["flags"]["near_duplicate"]["count"] == 2
    assert "measured by overlap of 4-word windows" in (tmp_path / "report.md").read_text()
