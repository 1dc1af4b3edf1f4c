"""The OUT content hash of a fixed input and fixed settings, pinned as a literal.

Refactors (modules moved, functions split) must not change what prepare writes: the manifest's
`content_hash` covers every kept row (ids, texts, flags, source lines, pass-through columns). The
input mixes shapes (explicit, conversational, HH transcripts, reasoning, scored completions) and
bad records (identical, whitespace-only, empty, broken JSON, a missing half, duplicates, a
conflicting pair); the second run goes through the worker-write path with a length-balance
subsample and decontamination. A change to the expected values here is a change of behaviour:
make it only on purpose, and say why in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefdata.prepare import prepare

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
            worker_writes=True, balance_length=0.5, seed=3, decontaminate_against=bench,
            decontaminate_field="question", decontaminate_ngram=3, pairing="all-pairs", progress=False)
    _assert_pinned(out, WORKERS_HASH, WORKERS_ACCOUNTING, WORKERS_FLAGS, WORKERS_DROPPED)
