"""Scored completions with the other features of a preference set at once: a scored file as one
source of a mix, `--decontaminate-against` and `--balance-length` on the same run. The pairs a
scored record makes are pairs like any other (checked for benchmark_overlap, balanced, dropped as
ordinary pairs), the records are counted once, and the OUT does not depend on the workers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from prefdata.core import flags as F
from prefdata.prepare import prepare

GSM = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
       "How many clips did Natalia sell altogether in April and May?")


def _write(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _scored(path: Path) -> Path:
    """Records of three scored completions (the best mostly the longest: length bias to balance),
    some with the benchmark's question in the prompt, some with tied or single completions (no
    pair), and a malformed record (quarantined)."""
    rng = random.Random(11)
    rows: list[dict | str] = []
    for i in range(48):
        prompt = f"Please solve: {GSM} (variant {i})" if i % 4 == 1 else f"Scored question {i}: explain tides."
        texts = [" ".join(["answer"] * rng.randint(6, 20)) + f" s{i}", " ".join(["meh"] * rng.randint(2, 8)) + f" s{i}",
                 " ".join(["no"] * rng.randint(1, 10)) + f" s{i}"]
        scores: list[float] = [5.0, 3.0, 1.0]
        if i % 9 == 4:
            scores = [2.0, 2.0, 2.0]  # ties: no pair
        if i % 11 == 6:
            texts, scores = texts[:1], scores[:1]  # a single completion: no pair
        rows.append({"prompt": prompt, "completions": texts, "scores": scores, "id": i})
    rows.append({"prompt": "broken", "completions": ["a", "b"], "scores": [1]})  # quarantined
    return _write(path, rows)


def _plain(path: Path) -> Path:
    rng = random.Random(12)
    rows: list[dict | str] = []
    for i in range(60):
        prompt = f"Please solve: {GSM}" if i == 3 else f"Plain question {i}?"
        long, short = " ".join(["good"] * rng.randint(8, 20)) + f" p{i}", " ".join(["bad"] * rng.randint(1, 6)) + f" p{i}"
        chosen, rejected = (long, short) if rng.random() < 0.7 else (short, long)
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    rows.append("{not json")
    return _write(path, rows)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_scored_source_in_a_mix_with_decontamination_and_length_balance(tmp_path, tiny_tokenizer_dir, monkeypatch) -> None:
    import datasets

    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 700)  # many chunks: samples and pairs decided chunk by chunk
    _scored(tmp_path / "uf.jsonl")
    _plain(tmp_path / "hh.jsonl")
    bench = _write(tmp_path / "gsm8k.jsonl", [{"question": "What is 2 + 2?"}, {"question": GSM}])
    mix = tmp_path / "mix.toml"
    mix.write_text('seed = 3\n[[source]]\nname = "uf"\npath = "uf.jsonl"\nrows = 40\n'
                   '[[source]]\nname = "hh"\npath = "hh.jsonl"\nrows = 50\n', encoding="utf-8")
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        result = prepare(mix, out, tokenizer=tiny_tokenizer_dir, workers=workers, progress=False, pairing="all-pairs",
                         decontaminate_against=[str(bench)], balance_length=0.5)
        manifest = json.loads((out / "manifest.json").read_text())
        report = json.loads((out / "report.json").read_text())
        kept = datasets.load_from_disk(str(out)).to_list()
        dropped, quarantined = _lines(out / "dropped.jsonl"), _lines(out / "quarantine.jsonl")
        acc = manifest["row_accounting"]
        assert report["accounting"] == acc

        # Rows: the three files' lines.
        assert (acc["rows_out"], acc["rows_dropped"], acc["rows_quarantined"]) == (len(kept), len(dropped), len(quarantined))
        assert acc["rows_in"] == result.rows_in == len(kept) + len(dropped) + len(quarantined)
        # Records: each sampled record once, however many pairs it made.
        sampled = {s["name"]: s["sampled"] for s in manifest["mix"]["sources"]}
        assert sampled == {"uf": 40, "hh": 50}
        assert acc["records_in"] == 90 == acc["records_paired"] + acc["records_unpaired"] + acc["records_quarantined"]
        unpaired = [d for d in dropped if "unpaired" in d]
        assert acc["records_unpaired"] == len(unpaired) > 0 and {d["unpaired"] for d in unpaired} <= {"ties", "single_completion"}
        # Pairs: benchmark overlaps and the length subsample are ordinary dropped pairs.
        pairs_dropped = [d for d in dropped if "unpaired" not in d]
        assert acc["pairs_made"] == acc["pairs_kept"] + acc["pairs_dropped"] == len(kept) + len(pairs_dropped)
        assert acc["pairs_made"] > acc["records_paired"]  # all-pairs: several pairs per scored record
        scored_gone = [d for d in pairs_dropped if "group_id" in d.get("extra", {})]
        overlap = [d for d in scored_gone if F.BENCHMARK_OVERLAP in d["flags"]]
        assert overlap and all(d["benchmark_overlap"]["item_line"] == 2 for d in overlap)
        assert all(d["extra"]["source"] == "uf" for d in scored_gone)
        balanced = [d for d in pairs_dropped if F.LENGTH_BALANCE in d["flags"]]
        assert any("group_id" in d.get("extra", {}) for d in balanced)  # scored pairs are balanced too
        assert report["length_balance"]["dropped"] == len(balanced) and report["length_balance"]["reached"]
        assert not any(F.BENCHMARK_OVERLAP in r["flags"] for r in kept)
        assert report["decontamination"]["pairs_flagged"] == sum(F.BENCHMARK_OVERLAP in d["flags"] for d in pairs_dropped)
        assert report["scored"]["records_unpaired"] == acc["records_unpaired"]
        # Per source: rows and records both ways; the scored source's records are what the mix sampled.
        for entry in report["sources"]:
            assert entry["rows_in"] == entry["kept"] + entry["dropped"] + entry["quarantined"] + entry["unpaired"]
            assert entry["records_in"] == entry["mix"]["sampled"] == sampled[entry["name"]]
            assert entry["kept"] == sum(r["source"] == entry["name"] for r in kept)
        uf = next(e for e in report["sources"] if e["name"] == "uf")
        assert uf["rows_in"] > uf["records_in"] and uf["unpaired"] == acc["records_unpaired"]
        runs[workers] = (manifest["content_hash"], (out / "dropped.jsonl").read_bytes(), acc, report["sources"],
                         report["length_balance"], report["decontamination"]["matches"])
    assert runs[1] == runs[2]
