"""The second pass sends the main process only the halves that can be in the report's similarity
sample (prefdata.pipeline.shard_stages._keep_sample_halves): the report is the same as with all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import prefdata.pipeline.shard_stages as stages
from prefdata.prepare import prepare
from prefdata.report.similarity import SimilaritySample


def _report(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    for key in ("generated_at", "seconds"):
        report.pop(key, None)
    return report


@pytest.mark.parametrize("shard_bytes", [4096, 1 << 30])  # many groups; one group (its bound is the sample's)
def test_pruned_halves_give_the_same_report(tmp_path, tiny_tokenizer_dir, monkeypatch, shard_bytes) -> None:
    raw = tmp_path / "raw.jsonl"
    rows = [{"prompt": f"Question {i}: why?", "chosen": f"Because {i} " * (1 + i % 5), "rejected": f"No {i % 7}."}
            for i in range(120)]
    rows += rows[:6]  # copies: each distinct pair enters the sample once, as first seen
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 1024)
    monkeypatch.setattr("prefdata.pipeline.shards.SHARD_BYTES", shard_bytes)
    monkeypatch.setattr("prefdata.pipeline.shards.GROUPS_PER_WORKER", 1)
    monkeypatch.setattr("prefdata.report.builder.SimilaritySample", lambda: SimilaritySample(5))
    kept: list[tuple[int, int]] = []
    prune = stages._keep_sample_halves

    def counting(chunks, k):
        before = sum(len(c.halves) for c in chunks)
        prune(chunks, k)
        kept.append((before, sum(len(c.halves) for c in chunks)))

    monkeypatch.setattr(stages, "_keep_sample_halves", counting)
    prepare(raw, tmp_path / "pruned", tokenizer=tiny_tokenizer_dir, workers=1, progress=False, batch_size=8)
    assert (len(kept) > 1) == (shard_bytes == 4096) and any(after < before for before, after in kept)
    monkeypatch.setattr(stages, "_keep_sample_halves", lambda chunks, k: None)
    prepare(raw, tmp_path / "all", tokenizer=tiny_tokenizer_dir, workers=1, progress=False, batch_size=8)
    pruned, everything = _report(tmp_path / "pruned"), _report(tmp_path / "all")
    assert pruned["similarity"]["rows_measured"] == 5 and pruned["similarity"]["rows_total"] == len(rows)
    assert pruned == everything
