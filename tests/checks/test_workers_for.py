"""How many workers a run forks when --workers is not given (issue 45: a 50-row validate forked a
worker per core for one chunk of input, 0.1-0.16 s of its start-up)."""

from __future__ import annotations

import json

from prefdata.checks.stream import CHUNK_BYTES, workers_for
from prefdata.engine.local import default_workers
from prefdata.prepare import prepare

ROW = {"prompt": "What is 2 + 2?", "chosen": "4.", "rejected": "5."}


def _jsonl(path, rows: int) -> None:
    path.write_text("".join(json.dumps({**ROW, "id": i}) + "\n" for i in range(rows)), encoding="utf-8")


def test_one_chunk_of_input_runs_in_one_worker(tmp_path) -> None:
    small = tmp_path / "small.jsonl"
    _jsonl(small, 50)
    assert workers_for(small, None, "local") == 1


def test_a_larger_input_a_directory_or_an_explicit_count_keep_theirs(tmp_path) -> None:
    big = tmp_path / "big.jsonl"
    _jsonl(big, CHUNK_BYTES // len(json.dumps(ROW)) + 10)
    assert big.stat().st_size > CHUNK_BYTES
    assert workers_for(big, None, "local") == default_workers()
    assert workers_for(tmp_path, None, "local") == default_workers()  # a directory: any size
    assert workers_for(tmp_path / "small.jsonl", 2, "local") == 2  # what the user asked for
    assert workers_for(big, None, "ray") == 0  # one actor per cluster CPU


def test_prepare_of_a_small_file_records_one_worker(tmp_path, tiny_tokenizer_dir) -> None:
    raw = tmp_path / "raw.jsonl"
    _jsonl(raw, 20)
    result = prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, progress=False)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["workers"] == 1
    assert result.rows_out + result.rows_dropped == 20
