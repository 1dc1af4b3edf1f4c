"""The OUT content hash of a fixed input and fixed settings, pinned as a literal (and, below, every file
prepare writes and every report validate renders, for every way of spreading the work).

Refactors (modules moved, functions split) must not change what prepare writes: the manifest's
`content_hash` covers every kept row (ids, texts, flags, source lines, pass-through columns). The
input mixes shapes (explicit, conversational, HH transcripts, reasoning, scored completions) and
bad records (identical, whitespace-only, empty, broken JSON, a missing half, duplicates, a
conflicting pair); the second run spreads over two workers with a length-balance subsample and
decontamination. A change to the expected values here is a change of behaviour:
make it only on purpose, and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from prefdata.prepare import prepare
from prefdata.validate import validate

RECORDS = [
    {"id": "a1", "prompt": "What is the capital of France?", "chosen": "Paris is the capital of France.",
     "rejected": "France is in Europe."},
    {"id": "a2", "prompt": "Write a haiku about rain.", "chosen": "Soft rain on the roof,\nthe gutters hum low songs,\n"
     "puddles keep the sky.", "rejected": "Rain is wet."},
    {"id": "a3", "prompt": "How many legs does a spider have?", "chosen": "Eight.", "rejected": "Eight."},
    {"id": "a4", "prompt": "Name a prime number.", "chosen": "Seven is prime.", "rejected": "Seven  is prime. "},
    {"id": "a5", "prompt": "Say hello.", "chosen": "", "rejected": "Hello!"},
    {"id": "a6", "prompt": "What is the capital of France?", "chosen": "Paris is the capital of France.",
     "rejected": "France is in Europe."},
    {"id": "a7", "prompt": "What is the capital of France?", "chosen": "France is in Europe.",
     "rejected": "Paris is the capital of France."},
    "{not json",
    {"id": "a9", "prompt": "Only one half here.", "chosen": "Yes."},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}],
     "chosen": [{"role": "assistant", "content": "4."}], "rejected": [{"role": "assistant", "content": "5."}]},
    {"prompt": [{"role": "user", "content": "Is 9 prime?"}],
     "chosen": [{"role": "assistant", "reasoning_content": "9 = 3 * 3.", "content": "No, 9 = 3 x 3."}],
     "rejected": [{"role": "assistant", "content": "Yes."}]},
    {"chosen": "\n\nHuman: How do I boil an egg?\n\nAssistant: Nine minutes in boiling water, then cold water.",
     "rejected": "\n\nHuman: How do I boil an egg?\n\nAssistant: Eggs come from chickens."},
    {"prompt": "Suggest a name for a cat.", "completions": ["Miso.", "Cat.", "Whiskers, a classic.", "Dog."],
     "scores": [8.0, 2.0, 6.5, 1.0]},
    {"prompt": "Pick a colour.", "completions": ["Blue.", "Blue!"], "scores": [5.0, 5.0]},
    {"id": "a15", "prompt": "Translate 'gato' to English.", "chosen": "Cat, a small domesticated feline.",
     "rejected": "Dog."},
    {"id": "a16", "prompt": "Give a long answer about tides.", "chosen": "Tides.",
     "rejected": "Tides rise and fall twice a day as the moon and the sun pull on the oceans."},
]

BENCHMARK = [{"question": "Translate 'gato' to English."}]

# The pinned values. A change here is a change of behaviour (see the module docstring).
PLAIN_HASH = "37a219152a695d617684d4c62841e147"
PLAIN_ACCOUNTING = {
    "completions_in": 6, "completions_paired": 2, "completions_unpaired": 4, "pairs_dropped": 4, "pairs_kept": 9,
    "pairs_made": 13, "records_in": 16, "records_paired": 13, "records_quarantined": 2, "records_unpaired": 1,
    "rows_dropped": 5, "rows_in": 16, "rows_out": 9, "rows_quarantined": 2, "scored_records": 2,
}
PLAIN_FLAGS = {
    "conflicting_pair": 1, "duplicate_pair": 1, "empty_chosen": 1, "identical": 1, "reasoning_lost": 1,
    "reasoning_mismatch": 1, "whitespace_only": 1,
}
PLAIN_DROPPED = [(3, ["identical"]), (4, ["whitespace_only"]), (5, ["empty_chosen"]),
                 (11, ["reasoning_lost", "reasoning_mismatch"]), (14, [])]
WORKERS_HASH = "0f83553b47d8c52615f5e907c450c120"
WORKERS_ACCOUNTING = {
    "completions_in": 6, "completions_paired": 4, "completions_unpaired": 2, "pairs_dropped": 6, "pairs_kept": 12,
    "pairs_made": 18, "records_in": 16, "records_paired": 13, "records_quarantined": 2, "records_unpaired": 1,
    "rows_dropped": 7, "rows_in": 21, "rows_out": 12, "rows_quarantined": 2, "scored_records": 2,
}
WORKERS_FLAGS = {
    "benchmark_overlap": 1, "completion_truncated": 2, "conflicting_pair": 1, "duplicate_pair": 1, "empty_chosen": 1,
    "identical": 1, "length_balance": 1, "reasoning_lost": 1, "reasoning_mismatch": 1, "whitespace_only": 1,
}
WORKERS_DROPPED = [(3, ["identical"]), (4, ["whitespace_only"]), (5, ["empty_chosen"]), (10, ["length_balance"]),
                   (11, ["reasoning_lost", "reasoning_mismatch"]), (14, []), (15, ["benchmark_overlap"])]
QUARANTINED_LINES = [8, 9]  # broken JSON, a missing half


def _write_input(directory: Path) -> Path:
    """RAW as a directory, so `source_file` is the relative name (a file given alone keeps its whole
    path, which would put the test's temporary directory into the hash)."""
    raw = directory / "raw"
    raw.mkdir()
    with open(raw / "pin.jsonl", "w", encoding="utf-8") as handle:
        for record in RECORDS:
            handle.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return raw


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _assert_pinned(out: Path, content_hash: str, accounting: dict, flags: dict, dropped: list) -> None:
    manifest = _manifest(out)
    assert manifest["content_hash"] == content_hash
    assert manifest["row_accounting"] == accounting
    assert manifest["flag_counts"] == flags
    assert [(row["source_line"], row["flags"]) for row in _lines(out / "dropped.jsonl")] == dropped
    assert [row["source_line"] for row in _lines(out / "quarantine.jsonl")] == QUARANTINED_LINES


def test_plain_run_content_hash_is_pinned(tmp_path, tiny_tokenizer_dir):
    raw = _write_input(tmp_path)
    out = tmp_path / "out"
    prepare(raw, out, tokenizer=tiny_tokenizer_dir, max_length=64, workers=1, batch_size=4, progress=False)
    _assert_pinned(out, PLAIN_HASH, PLAIN_ACCOUNTING, PLAIN_FLAGS, PLAIN_DROPPED)


def test_worker_write_run_content_hash_is_pinned(tmp_path, tiny_tokenizer_dir):
    raw = _write_input(tmp_path)
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps(item) + "\n" for item in BENCHMARK))
    out = tmp_path / "out"
    prepare(raw, out, tokenizer=tiny_tokenizer_dir, max_length=64, chat_template=True, workers=2, batch_size=3,
            balance_length=0.5, seed=3, decontaminate_against=bench,
            decontaminate_field="question", decontaminate_ngram=3, pairing="all-pairs", progress=False)
    _assert_pinned(out, WORKERS_HASH, WORKERS_ACCOUNTING, WORKERS_FLAGS, WORKERS_DROPPED)


# ----------------------------------------------------------------------------- every run shape, every file
#
# Before the pipelines became one (issue 44), every file prepare writes and every report validate
# renders was pinned by content, for each way of running them: one worker or two, the dataset-wide
# checks partitioned or not, the main process or the workers writing. A run shape changes how the
# work is spread, never a byte of what comes out, so each input's digest is one literal that every
# shape must give. Only what names the run (timestamps, temporary paths, the run-shape settings the
# manifest's config records) is left out of the digest.

CONVERSATIONAL = [
    {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "chosen": [{"role": "assistant", "content": "4."}],
     "rejected": [{"role": "assistant", "content": "5."}]},
    {"prompt": [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Sky colour?"}],
     "chosen": [{"role": "assistant", "content": "Blue."}], "rejected": [{"role": "assistant", "content": "Green."}]},
    {"prompt": [{"role": "user", "content": "Same?"}], "chosen": [{"role": "assistant", "content": "Yes."}],
     "rejected": [{"role": "assistant", "content": "Yes."}]},
    {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "chosen": [{"role": "assistant", "content": "4."}],
     "rejected": [{"role": "assistant", "content": "5."}]},
    {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "chosen": [{"role": "assistant", "content": "5."}],
     "rejected": [{"role": "assistant", "content": "4."}]},
    {"chosen": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple, crisp."}],
     "rejected": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "A car."}]},
    {"prompt": [{"role": "user", "content": "Is 9 prime?"}],
     "chosen": [{"role": "assistant", "reasoning_content": "9 = 3 * 3.", "content": "No."}],
     "rejected": [{"role": "assistant", "content": "Yes."}]},
    {"prompt": [{"role": "user", "content": "Empty?"}], "chosen": [{"role": "assistant", "content": ""}],
     "rejected": [{"role": "assistant", "content": "No."}]},
    "[broken",
    {"prompt": [{"role": "user", "content": "Explain tides at length."}],
     "chosen": [{"role": "assistant", "content": "The moon pulls the sea toward it, twice a day. " * 6}],
     "rejected": [{"role": "assistant", "content": "Wind."}]},
]

# (input, chat template) -> digest of OUT's files; (input, tokenizer, format) -> digest of the report.
PREPARE_PINS = {
    ("conversational", False): "2291d47db760f3624d8a80154748d80d2318596fab6702a175cd3b2b3fc48f25",
    ("conversational", True): "88ba18ace2954c678623c8f355692b9ca1bcfb537a153ae03f90512776f818a6",
    ("text", False): "1443e51a030addf34ace8a89791acf54d0552295f2e818aeb456504bdf0b5448",
    ("text", True): "ff358a3903c6b8eb44b099726032dd56aeabc271c779860d3dc74169dc26907b",
}
VALIDATE_PINS = {
    ("conversational", False, "json"): "c2e39db655595fd158e501d6b1800a868ab88f49f7e2bb5cfc1a71f76d71acf3",
    ("conversational", False, "markdown"): "4f898946361cd6ad4216f3afb7b9b6d6c5e792780ff30f4c7ddfaa674462b84a",
    ("conversational", False, "text"): "7af5bda8bf2195fb1564aaa4cb365c5c779bf8256ecff54531b046f095c1044b",
    ("conversational", True, "json"): "bfdc84027d76f70a9eba177012466e88bdf146a5d6dff3ef005e337754f6e75d",
    ("conversational", True, "markdown"): "788c73d8bc518ae41dace6ddb28b6da9bcc00c2a9a213194f154b9c7a1bffea7",
    ("conversational", True, "text"): "1d842f1830008e4a96b57f4d0d7dd9f8d7c48a1b174be660f00a4b769a777d34",
    ("text", False, "json"): "7c41db88464342b9831cd536b5de8f83f4e636187750e163560363eb1dd2a918",
    ("text", False, "markdown"): "9d10defcaa7385c809cda1fad3d74f2c5283459552258cf787bc8e282ac669e5",
    ("text", False, "text"): "c256016789527a96100a032929277cfb35cb2494398bb799e205187a3bfec7ad",
    ("text", True, "json"): "5145d70dad2e51511c29707b836040b8896d1095014f1905ced5154e87677600",
    ("text", True, "markdown"): "165be04fa07bedc2ad04b48fd7fec8e278447b91100421216198c5fda7ab3ece",
    ("text", True, "text"): "35e6fa2ece1b8bc4b2c3ab7fcf8ea5d49c4cc23f1c7811fcc3c2fa43d2af2d61",
}
# How the work is spread: workers. Until issue 44 also the main process or the workers writing
# (`worker_writes`, gone: the workers always write, one worker in this process) and the dataset-wide
# checks in one process or partitioned (`partitioned_checks`, gone: always partitioned).
RUN_SHAPES = [1, 2]
VALIDATE_SHAPES = [1, 2]
_STAMP = re.compile(rb'"(generated_at|created_at)": "[^"]*"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ|'
                    rb'\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)? UTC')
_RUN_KEYS = ("workers", "partitioned_checks", "worker_writes", "batch_size")


def _input(directory: Path, shape: str) -> Path:
    if shape == "text":
        return _write_input(directory)
    raw = directory / "raw"
    raw.mkdir()
    lines = [record if isinstance(record, str) else json.dumps(record) for record in CONVERSATIONAL]
    (raw / "pin.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return raw


def _normalized(data: bytes, places: dict[str, str]) -> bytes:
    for path, name in places.items():
        data = data.replace(path.encode(), name.encode())
    return _STAMP.sub(b"STAMP", data)


def _out_digest(out: Path, places: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(out.iterdir()):
        data = path.read_bytes()
        if path.name == "manifest.json":  # its config names the run shape; the rest is pinned
            manifest = json.loads(data)
            for key in _RUN_KEYS:
                manifest["config"].pop(key, None)
            data = json.dumps(manifest, sort_keys=True).encode()
        digest.update(path.name.encode() + b"\0" + _normalized(data, places) + b"\0")
    return digest.hexdigest()


@pytest.mark.parametrize("shape", ["text", "conversational"])
@pytest.mark.parametrize("template", [False, True])
@pytest.mark.parametrize("workers", RUN_SHAPES)
def test_prepare_outputs_are_pinned_for_every_run_shape(tmp_path, tiny_tokenizer_dir, shape, template, workers):
    raw = _input(tmp_path, shape)
    out = tmp_path / "out"
    prepare(raw, out, tokenizer=tiny_tokenizer_dir, max_length=48, chat_template=template, workers=workers,
            batch_size=3, progress=False)
    places = {tiny_tokenizer_dir: "TOKENIZER", str(tmp_path): "TMP"}
    assert _out_digest(out, places) == PREPARE_PINS[(shape, template)]


@pytest.mark.parametrize("shape", ["text", "conversational"])
@pytest.mark.parametrize("tokenizer", [False, True])
@pytest.mark.parametrize("workers", VALIDATE_SHAPES)
def test_validate_reports_are_pinned_for_every_run_shape(tmp_path, tiny_tokenizer_dir, shape, tokenizer, workers):
    raw = _input(tmp_path, shape)
    places = {tiny_tokenizer_dir: "TOKENIZER", str(tmp_path): "TMP"}
    for format in ("json", "text", "markdown"):
        output = tmp_path / f"report.{format}"
        validate(raw, tokenizer=tiny_tokenizer_dir if tokenizer else None, max_length=48, format=format,
                 output=output, workers=workers, batch_size=3, progress=False)
        digest = hashlib.sha256(_normalized(output.read_bytes(), places)).hexdigest()
        assert digest == VALIDATE_PINS[(shape, tokenizer, format)], format


# A Hub split's text-only validate report: the same whether the checked-row stream or the text path
# reads it (the stream did until the text path read Hub splits too), with one worker or two.
HUB_PINS = {
    "json": "93c99aa830d684795b20285b58fa25a994337bbba1b57538c008e59c7e487b28",
    "text": "8bd85957b08476769bcfb4fc55406d186f2554cdf690359fee4c83fe180cd74c",
    "markdown": "d83a8ecf032a9845dfa539049dcb86b774951db3b9aaf26807080a6f517a2d03",
}


def _hub_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """RECORDS' explicit pairs as a Hub split, read offline from a local `org/name` directory."""
    import datasets.config
    import huggingface_hub.constants
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{key: record.get(key) for key in ("id", "prompt", "chosen", "rejected")} for record in RECORDS
            if isinstance(record, dict) and isinstance(record.get("prompt"), str) and "completions" not in record]
    data = tmp_path / "org" / "name" / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), data / "train-00000-of-00001.parquet")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return "org/name:train"


@pytest.mark.parametrize("workers", [1, 2])
def test_validate_reports_of_a_hub_split_are_pinned(tmp_path, monkeypatch, workers):
    split = _hub_split(tmp_path, monkeypatch)
    for format in ("json", "text", "markdown"):
        output = tmp_path / f"report.{format}"
        validate(split, format=format, output=output, workers=workers, batch_size=3, progress=False)
        digest = hashlib.sha256(_normalized(output.read_bytes(), {str(tmp_path): "TMP"})).hexdigest()
        assert digest == HUB_PINS[format], format
        if format == "json":
            accounting = json.loads(output.read_text())["accounting"]
            assert accounting["rows_in"] == 10 and accounting["rows_quarantined"] == 1  # a9: no rejected half
