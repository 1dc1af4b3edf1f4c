"""`prefdata prepare` end to end: the output contract, row accounting, determinism, real data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import load_from_disk

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.prepare import prepare

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pairs"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _accounting_holds(out: Path) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    acc = manifest["row_accounting"]
    assert acc["rows_in"] == acc["rows_out"] + acc["rows_dropped"] + acc["rows_quarantined"]
    assert len(load_from_disk(str(out))) == acc["rows_out"]
    assert len(_jsonl(out / "dropped.jsonl")) == acc["rows_dropped"]
    assert len(_jsonl(out / "quarantine.jsonl")) == acc["rows_quarantined"]
    return manifest


@pytest.fixture(scope="module")
def example_out(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    out = tmp_path_factory.mktemp("prep") / "out"
    prepare(EXAMPLES, out, tokenizer=tiny_tokenizer_dir, max_length=256, progress=False)
    return out


def test_output_contract(example_out):
    manifest = _accounting_holds(example_out)
    ds = load_from_disk(str(example_out))
    for column in ("prompt_ids", "chosen_ids", "rejected_ids", "prompt", "chosen", "rejected", "flags",
                   "source_file", "source_line"):
        assert column in ds.column_names
    assert "id" in ds.column_names  # pass-through column survives
    for key in ("format_version", "prefdata_version", "inputs", "config", "tokenizer", "row_accounting"):
        assert key in manifest
    assert manifest["tokenizer"]["fingerprint"].startswith("sha256:")
    assert all(entry["sha256"] and entry["bytes"] > 0 for entry in manifest["inputs"])
    assert (example_out / "report.json").is_file() and (example_out / "report.html").is_file()


def test_bad_rows_are_accounted_with_their_lines(example_out):
    quarantined = {(q["source_file"], q["source_line"]) for q in _jsonl(example_out / "quarantine.jsonl")}
    assert ("explicit.jsonl", 11) in quarantined  # broken JSON
    assert ("explicit.jsonl", 12) in quarantined  # no rejected
    assert any(q["source_file"] == "conversational.jsonl" and q["source_line"] == 4 for q in
               _jsonl(example_out / "quarantine.jsonl"))  # unknown role "wizard"
    for q in _jsonl(example_out / "quarantine.jsonl"):
        assert q["error"] and "\n" not in q["error"]
    dropped = {(d["source_file"], d["source_line"]): d["flags"] for d in _jsonl(example_out / "dropped.jsonl")}
    assert F.IDENTICAL in dropped[("explicit.jsonl", 3)]
    assert F.WHITESPACE_ONLY in dropped[("explicit.jsonl", 4)]
    assert F.EMPTY_CHOSEN in dropped[("explicit.jsonl", 5)]
    assert F.IDENTICAL in dropped[("conversational.jsonl", 3)]


def test_dataset_wide_flags_on_kept_rows(example_out):
    ds = load_from_disk(str(example_out))
    by_line = {(r["source_file"], r["source_line"]): r["flags"] for r in ds}
    assert F.DUPLICATE_PAIR in by_line[("explicit.jsonl", 7)]
    assert F.DUPLICATE_PAIR not in by_line[("explicit.jsonl", 1)]  # the first occurrence is not a duplicate
    assert F.CONFLICTING_PAIR in by_line[("explicit.jsonl", 8)]


def test_prompt_ids_shared_and_completions_end_with_eos(example_out, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(tiny_tokenizer_dir).eos_token_id
    for row in load_from_disk(str(example_out)):
        assert row["prompt_ids"], row["source_line"]
        for half in ("chosen_ids", "rejected_ids"):
            assert row[half].count(eos) == 1 and row[half][-1] == eos


def test_refuses_existing_out_and_overwrites_on_request(example_out, tiny_tokenizer_dir):
    with pytest.raises(PrefdataError, match="--overwrite"):
        prepare(EXAMPLES, example_out, tokenizer=tiny_tokenizer_dir, progress=False)


def test_same_content_whatever_the_batch_size_and_workers(tmp_path, tiny_tokenizer_dir):
    hashes = set()
    reports = []
    for batch_size, workers in ((1, 1), (3, 2), (1000, 1), (2, 3)):
        out = tmp_path / f"out{batch_size}"
        prepare(EXAMPLES, out, tokenizer=tiny_tokenizer_dir, batch_size=batch_size, workers=workers, progress=False)
        manifest = json.loads((out / "manifest.json").read_text())
        hashes.add(manifest["content_hash"])
        report = json.loads((out / "report.json").read_text())
        report.pop("generated_at", None)
        reports.append(json.dumps(report.get("flags"), sort_keys=True))
        assert (out / "dropped.jsonl").read_bytes() == (tmp_path / "out1" / "dropped.jsonl").read_bytes()
    assert len(hashes) == 1
    assert len(set(reports)) == 1


@pytest.mark.parametrize(
    "make_input, message",
    [
        (lambda d: d / "missing.jsonl", "does not exist|not found|no such"),
        (lambda d: (d / "empty.jsonl").write_text("") * 0 or d / "empty.jsonl", "empty|no records"),
    ],
)
def test_input_errors_are_one_line(tmp_path, tiny_tokenizer_dir, make_input, message):
    path = make_input(tmp_path)
    with pytest.raises(PrefdataError, match=f"(?i){message}") as info:
        prepare(path, tmp_path / "out", tokenizer=tiny_tokenizer_dir, progress=False)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_kto_data_is_not_preference_data(shared_data, tmp_path, tiny_tokenizer_dir):
    with pytest.raises(PrefdataError, match="preference"):
        prepare(shared_data("llamafactory-demo/kto_en_demo.json"), tmp_path / "out",
                tokenizer=tiny_tokenizer_dir, progress=False)
    assert not (tmp_path / "out").exists()


def test_ultrafeedback_with_qwen(shared_data, shared_tokenizer, tmp_path):
    out = tmp_path / "uf"
    result = prepare(shared_data("ultrafeedback-sample/train.jsonl"), out,
                     tokenizer=shared_tokenizer("qwen2.5-instruct"), max_length=1024, progress=False)
    manifest = _accounting_holds(out)
    assert result.rows_in == 1000
    dropped = _jsonl(out / "dropped.jsonl")
    assert any(F.IDENTICAL in d["flags"] for d in dropped)
    assert any(F.EMPTY_CHOSEN in d["flags"] for d in dropped)
    assert any(F.EMPTY_REJECTED in d["flags"] for d in dropped)
    assert manifest["flag_counts"].get(F.COMPLETION_TRUNCATED, 0) > 0  # 1024 tokens truncates some
    ds = load_from_disk(str(out))
    assert all(len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"])) <= 1024 for r in ds)


def test_sharegpt_duplicates_flagged(shared_data, shared_tokenizer, tmp_path):
    out = tmp_path / "lf"
    prepare(shared_data("llamafactory-demo/dpo_en_demo.json"), out,
            tokenizer=shared_tokenizer("smollm2-135m-instruct"), progress=False)
    manifest = _accounting_holds(out)
    assert manifest["row_accounting"]["rows_in"] == 300
    assert manifest["flag_counts"].get(F.DUPLICATE_PAIR, 0) > 0


def test_orca_openai_shape_last_line_without_newline(shared_data, shared_tokenizer, tmp_path):
    out = tmp_path / "orca"
    prepare(shared_data("orca-dpo-pairs/validation.jsonl"), out,
            tokenizer=shared_tokenizer("phi-3-mini-4k-instruct"), progress=False)
    manifest = _accounting_holds(out)
    assert manifest["row_accounting"]["rows_in"] == 284
    assert manifest["row_accounting"]["rows_quarantined"] == 0
