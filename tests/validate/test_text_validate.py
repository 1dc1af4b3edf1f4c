"""Text-level `validate` (prefdata.validate.merge) gives exactly the same report and the same input
errors with one worker (this process) and with two worker processes, with and without partitioned
dataset-wide checks, and behaves on Ctrl-C and SIGKILL."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.core.errors import PrefdataError
from prefdata.io import chunks as text_chunks
from prefdata.io.readers import iter_raw_records
from prefdata.report import builder as R
from prefdata.validate.command import validate

REPO = Path(__file__).resolve().parents[2]
HOSTILE = REPO / "tests" / "hostile"
PR_POLICY = str(REPO / "checks" / "pr.toml")


def _report(path: Path | str, workers: int, **kwargs) -> tuple[str, object]:
    """("ok", report without its timestamp) or ("error", the PrefdataError message)."""
    try:
        result = validate(str(path), format="json", output=os.devnull, progress=False, workers=workers, **kwargs)
    except PrefdataError as exc:
        return "error", str(exc)
    report = dict(result.report)
    report.pop("generated_at")
    return "ok", (result.exit_code, report)


def assert_same(path: Path | str, **kwargs) -> object:
    sequential = _report(path, 1, **kwargs)
    parallel = _report(path, 2, **kwargs)
    assert parallel == sequential
    return sequential


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few rows: every dataset-wide table and sample crosses many chunk borders."""
    monkeypatch.setattr(text_chunks, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(text_chunks, "CHUNK_LINES", 7)
    monkeypatch.setattr(R, "EXCERPT_ROWS", 50)


# ----------------------------------------------------------------------------- planted problems

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def planted_lines(n: int, seed: int = 0) -> list[str]:
    """JSON lines with every kind of row and problem validate reports, in random order."""
    rng = random.Random(seed)
    rows: list[dict] = []
    lines: list[str] = []
    for i in range(n):
        kind = rng.random()
        earlier = rng.choice(rows) if rows else None
        if earlier is not None and kind < 0.04:
            row = dict(earlier)  # duplicate pair
        elif earlier is not None and kind < 0.06:
            row = {**earlier, "prompt": "  " + earlier["prompt"].replace(" ", "\n ")}  # duplicate after whitespace
        elif earlier is not None and kind < 0.08:
            row = {**earlier, "chosen": earlier["rejected"], "rejected": earlier["chosen"]}  # conflicting
        elif earlier is not None and kind < 0.10:
            words = earlier["prompt"].split() + ["extra"]
            row = {"prompt": " ".join(words), "chosen": _text(rng, 3, 30), "rejected": _text(rng, 3, 30)}  # near-dup prompt
        else:
            row = {"prompt": f"Q{i}: " + _text(rng, 5, 60), "chosen": _text(rng, 1, 80), "rejected": _text(rng, 1, 80)}
            if kind < 0.12:
                row["rejected"] = row["chosen"]  # identical
            elif kind < 0.14:
                row["rejected"] = " " + row["chosen"] + "\n"  # whitespace only
            elif kind < 0.15:
                row["rejected"] = row["chosen"] + "!"  # near duplicate halves
            elif kind < 0.16:
                row["prompt"] = "   "  # empty prompt
            elif kind < 0.165:
                row["chosen"] = ""
        if rng.random() < 0.3:
            row = {**row, "score": rng.random() * 10, "id": f"row:{i}"}  # pass-through, ':' in strings
        rows.append(row)
        lines.append(json.dumps(row))
        special = rng.random()
        if special < 0.01:
            lines.append("{not json")
        elif special < 0.015:
            lines.append("")  # blank line: not a record
        elif special < 0.02:
            lines.append(json.dumps({"prompt": "p", "completion": "c", "label": True}))  # KTO: unknown shape
        elif special < 0.025:
            lines.append('{"prompt": "a", "chosen": "b", "rejected": "c", "chosen": "d"}')  # duplicate key
        elif special < 0.03:
            lines.append(json.dumps({"prompt": [{"role": "user", "content": _text(rng, 2, 9)}],
                                     "chosen": [{"role": "assistant", "content": _text(rng, 1, 9)}],
                                     "rejected": [{"role": "assistant", "content": _text(rng, 1, 9)}]}))
        elif special < 0.035:
            transcript = "\n\nHuman: " + _text(rng, 2, 9) + "\n\nAssistant:"
            lines.append(json.dumps({"chosen": transcript + " yes", "rejected": transcript + " no\n\nHuman: x\n\nAssistant: y"}))
        elif special < 0.04:
            lines.append(json.dumps({"prompt_ids": [1, 2, 3], "chosen_ids": list(range(rng.randint(0, 40))),
                                     "rejected_ids": list(range(rng.randint(0, 40)))}))
        elif special < 0.043:
            lines.append('{"prompt": "\\u003a big", "chosen": "12345678901234567890123", "rejected": 1.5e3, "n": 123456789012345678901234}')
        elif special < 0.046:
            lines.append('{"prompt": "x", "chosen": "\\ud800", "rejected": "y"}')  # lone surrogate
        elif special < 0.048:
            lines.append('{"prompt": "x", "chosen": "\\ud83d\\ude00", "rejected": "y\\u003A"}')  # escaped emoji
        elif special < 0.05:
            lines.append('["an", "array"]')
        elif special < 0.06:  # long halves: the similarity sample measures these at once
            lines.append(json.dumps({"prompt": f"long {i}", "chosen": _text(rng, 900, 1200), "rejected": _text(rng, 900, 1200)}))
    return lines


def write_lines(path: Path, lines: list[str], *, bom: bool = False, crlf: bool = False, final_newline: bool = True) -> Path:
    text = ("\r\n" if crlf else "\n").join(lines) + ("\n" if final_newline else "")
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def test_examples_are_the_same():
    status, (code, report) = assert_same(REPO / "examples" / "pairs")
    assert status == "ok" and report["accounting"]["rows_in"] > 20 and report["quarantine"]["count"] > 0


@pytest.mark.parametrize("name", sorted(p.name for p in HOSTILE.iterdir() if p.name != "EXPECTATIONS.toml"))
def test_hostile_corpus_is_the_same(name, small_chunks):
    assert_same(HOSTILE / name)


def test_hostile_directory_is_the_same():
    assert_same(HOSTILE)


@pytest.mark.parametrize("chunks", ["default", "small"])
def test_planted_problems_are_the_same(tmp_path, chunks, request):
    if chunks == "small":
        request.getfixturevalue("small_chunks")
    data = write_lines(tmp_path / "planted.jsonl", planted_lines(6000), bom=True, crlf=True, final_newline=False)
    status, (code, report) = assert_same(data)
    assert status == "ok"
    flags = report["flags"]
    for flag in ("duplicate_pair", "conflicting_pair", "identical", "whitespace_only", "near_duplicate", "empty_prompt",
                 "multi_turn_completion", "no_completion_tokens"):
        assert flags[flag]["count"] > 0, flag
    assert report["dataset"]["near_duplicate_prompts"]["clusters"] > 0
    assert report["quarantine"]["count"] > 0 and report["similarity"]["sampled"]
    assert_same(data, policy=PR_POLICY, max_length=20, max_prompt_length=8)


def test_dataset_wide_checks_give_the_same_report_with_any_workers(tmp_path, small_chunks):
    """The dataset-wide answers by hash partitioning (prefdata.checks.partitioned: a first pass of
    the text stage, digests only), then the merge: the same report with one worker or two."""
    data = write_lines(tmp_path / "planted.jsonl", planted_lines(1500, seed=4))
    plain = _report(data, 2)
    assert plain[0] == "ok" and plain[1][1]["dataset"]["duplicate_pairs"]["groups"] > 0
    assert _report(data, 1) == plain


def test_directory_of_every_format_is_the_same(tmp_path, small_chunks):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = planted_lines(900, seed=3)
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    write_lines(root / "a.jsonl", lines[:300])
    write_lines(root / "b.jsonl.gz", lines[300:500])
    (root / "sub" / "c.json").write_text("[" + ",\n".join(lines[500:600]) + "]")
    records = [json.loads(line) for line in lines[600:] if line.startswith('{"prompt": "Q')]
    table = pa.table({key: [r[key] for r in records] for key in ("prompt", "chosen", "rejected")})
    pq.write_table(table, root / "sub" / "d.parquet")
    write_lines(root / "sub" / "e.jsonl", [])
    status, (code, report) = assert_same(root)
    assert status == "ok" and len({row["source_file"] for row in report["flagged_rows"]}) == 4


def test_against_and_policies_are_the_same(tmp_path, small_chunks):
    lines = planted_lines(800, seed=5)
    data = write_lines(tmp_path / "train.jsonl", lines)
    other = write_lines(tmp_path / "eval.jsonl", lines[::9])
    status, (code, report) = assert_same(data, against=other)
    assert report["flags"]["prompt_leak"]["count"] > 0
    quiet = tmp_path / "quiet.toml"
    quiet.write_text('[flags]\nduplicate_pair = "ignore"\nidentical = "error"\n[thresholds]\nnear_duplicate = 0.5\n')
    status, (code, report) = assert_same(data, policy=quiet)
    assert "duplicate_pair" not in report["flags"] and code == 1


def test_long_lines_fall_back_to_the_line_reader(tmp_path, monkeypatch, small_chunks):
    monkeypatch.setattr(text_chunks, "LONG_LINE", 3000)
    lines = planted_lines(400, seed=7)
    long_row = {"prompt": "long " * 2000, "chosen": "a", "rejected": "b"}
    lines[200:200] = [json.dumps(long_row)] * 2
    data = write_lines(tmp_path / "long.jsonl", lines)
    kinds = {type(chunk).__name__ for chunk in text_chunks.iter_chunks(data)}
    assert kinds == {"RangeChunk", "LinesChunk"}
    assert_same(data)


def test_chunks_hold_exactly_the_readers_records(tmp_path, small_chunks):
    data = write_lines(tmp_path / "planted.jsonl", planted_lines(1500, seed=11), bom=True)
    expected = [(r.source_line, r.value, r.error) for r in iter_raw_records(data)]
    got, next_line = [], 1
    for chunk in text_chunks.iter_chunks(data):
        ranged = isinstance(chunk, text_chunks.RangeChunk)
        content = text_chunks.range_data(chunk) if ranged else None
        offset = next_line - 1 if ranged else 0  # range chunks number their lines from 1
        for position, (record, start, length) in enumerate(text_chunks.chunk_records(chunk, content)):
            line = record.source_line + offset
            exact = text_chunks.exact_record(chunk, position, line, (start, length) if ranged else None)
            assert (exact.value, exact.error) == (record.value, record.error)
            got.append((line, record.value, record.error))
        next_line += text_chunks.line_count(content) if ranged else 0
    assert got == expected


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("batch_size", [1, 3, 5, 1000])
def test_unknown_shapes_fail_at_the_same_point(tmp_path, batch_size):
    kto = json.dumps({"prompt": "p", "completion": "c", "label": True})
    good = json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"})
    for lines in ([kto] * 4 + [good] * 3, [kto] * 3, [kto, "{bad", kto], [good, kto, kto]):
        data = write_lines(tmp_path / "shapes.jsonl", lines)
        assert_same(data, batch_size=batch_size)


def test_input_errors_are_the_same(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n  \n")
    bad_dir = tmp_path / "dir"
    bad_dir.mkdir()
    write_lines(bad_dir / "a.jsonl", planted_lines(50))
    (bad_dir / "b.jsonl.gz").write_bytes(b"not gzip at all")
    empty_dir = tmp_path / "empty_dir"
    empty_dir.mkdir()
    (empty_dir / "x.jsonl").write_text("")
    for path in ("empty.jsonl", "blank.jsonl", "dir", "empty_dir"):
        status, message = assert_same(tmp_path / path)
        assert status == "error", path


@pytest.mark.parametrize("args", [["empty.jsonl"], ["kto.jsonl"], ["missing.jsonl"]])
def test_cli_errors_stay_one_line(tmp_path, capsys, args):
    (tmp_path / "empty.jsonl").write_text("")
    write_lines(tmp_path / "kto.jsonl", [json.dumps({"prompt": "p", "completion": "c", "label": True})] * 3)
    assert main(["validate", str(tmp_path / args[0]), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prefdata validate: error:") and "\n" not in err


# ----------------------------------------------------------------------------- signals


@pytest.fixture(scope="module")
def big_input(tmp_path_factory) -> Path:
    """~100 MB of pairs: validate runs for several seconds."""
    rng = random.Random(0)
    texts = [_text(rng, 40, 120) for _ in range(1000)]
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(120_000):
            handle.write(json.dumps({"prompt": f"{i} {texts[i % 1000]}", "chosen": texts[(i * 7) % 1000],
                                     "rejected": texts[(i * 13 + 1) % 1000]}) + "\n")
    return path


def _processes_reading(path: Path) -> list[str]:
    alive = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "prefdata validate" in cmdline and str(path) in cmdline:
            alive.append(proc.name)
    return alive


def _start(data: Path) -> subprocess.Popen:
    # Ctrl-C as a terminal delivers it: a test run started in the background (`cmd &` in a script)
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all.
    process = subprocess.Popen([sys.executable, "-m", "prefdata", "validate", str(data), "--no-progress"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while len(_processes_reading(data)) < 3 and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    return process


@pytest.mark.slow
def test_ctrl_c_gives_one_line_and_130(big_input):
    data = big_input
    process = _start(data)
    if process.poll() is not None:
        pytest.skip("validate finished before the interrupt")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err and err.strip().count("\n") == 0 and "interrupted" in err


@pytest.mark.slow
def test_sigkill_leaves_no_workers(big_input):
    data = big_input
    process = _start(data)
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.time() + 10
    while _processes_reading(data) and time.time() < deadline:
        time.sleep(0.2)
    assert not _processes_reading(data), "worker processes outlived a killed validate"
