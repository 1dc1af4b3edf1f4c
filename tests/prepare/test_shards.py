"""prepare's one write path: the workers write the Arrow shards; OUT is the same whatever the number
of workers (one: this process) and the shard size.

Run here on the local engine (worker processes); tests/engine/test_ray.py runs the same on a
two-node Ray cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefdata.core.errors import PrefdataError
from prefdata.io.chunks import RangeChunk, RecordsChunk
from prefdata.prepare import prepare
from prefdata.pipeline.shards import group_chunks, shard_bytes_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pairs"


def _rows(n: int = 60) -> list[str]:
    """Every dataset-wide case, drops, bad lines, and pass-through columns whose type changes
    between early and late rows (so shards type them differently and one must be rewritten)."""
    lines = []
    for i in range(n):
        row = {"prompt": f"Question {i % 17}: why is the sky blue at noon?", "chosen": f"Rayleigh scattering {i}.",
               "rejected": f"It reflects the sea {i}.", "id": i, "score": i if i < n // 2 else i + 0.5}
        if i >= n - 5:
            row["meta"] = {"source": "late", "tags": [i]}  # only in the last shard
        elif i % 7 == 0:
            row["meta"] = f"early-{i}"  # a string early, an object late: stored as JSON text
        lines.append(json.dumps(row))
    lines.append(lines[3])  # exact duplicate
    swapped = json.loads(lines[5])
    swapped["chosen"], swapped["rejected"] = swapped["rejected"], swapped["chosen"]
    lines.append(json.dumps(swapped))  # conflicting
    lines.append(json.dumps({"prompt": "p", "chosen": "same", "rejected": "same"}))  # identical: dropped
    long_pair = json.dumps({"prompt": "Explain   this:\n " + "word  " * 400, "chosen": "step \t" * 300,
                            "rejected": "no " * 500})
    lines += [long_pair, long_pair]  # long texts in a flagged row: the report's excerpts must not change
    lines.append("{not json")  # quarantined
    lines.append(json.dumps({"prompt": "QUESTION 1: Why is the sky blue at noon??", "chosen": "a", "rejected": "b"}))
    return lines


@pytest.fixture
def small_shards(monkeypatch) -> None:
    """~1 KiB chunks and shards of two chunks: a small input spreads over many shards."""
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 1024)
    monkeypatch.setattr("prefdata.pipeline.shards.SHARD_BYTES", 2048)
    monkeypatch.setattr("prefdata.pipeline.shards.SHARD_CHUNKS", 2)


def _out(path: Path) -> dict:
    """What must be equal between two ways of spreading the work (run details aside)."""
    manifest = json.loads((path / "manifest.json").read_text())
    report = json.loads((path / "report.json").read_text())
    for key in ("generated_at", "seconds"):
        report.pop(key, None)
    return {
        "content_hash": manifest["content_hash"],
        "accounting": manifest["row_accounting"],
        "flags": manifest["flag_counts"],
        "errors": manifest["errors"],
        "columns": manifest["columns"],
        "json_columns": manifest["json_columns"],
        "text_columns": manifest["text_columns"],
        "dropped": (path / "dropped.jsonl").read_text(),
        "quarantine": (path / "quarantine.jsonl").read_text(),
        "report": report,
    }


def _both(raw: Path, tmp_path: Path, tokenizer: str, **kwargs) -> tuple[Path, Path]:
    """OUT written by this process alone (one worker), and by two worker processes."""
    here, workers = tmp_path / "one-worker", tmp_path / "two-workers"
    prepare(raw, here, tokenizer=tokenizer, workers=1, progress=False, batch_size=8, **kwargs)
    prepare(raw, workers, tokenizer=tokenizer, workers=2, progress=False, batch_size=8, **kwargs)
    return here, workers


def test_two_workers_write_the_out_one_worker_writes(tmp_path, tiny_tokenizer_dir, small_shards) -> None:
    import datasets
    import polars as pl

    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join(_rows()) + "\n", encoding="utf-8")
    here, workers = _both(raw, tmp_path, tiny_tokenizer_dir)
    expected, got = _out(here), _out(workers)
    assert got == expected
    assert expected["flags"]["duplicate_pair"] >= 1 and expected["flags"]["conflicting_pair"] == 1
    assert expected["accounting"]["rows_quarantined"] == 1 and expected["accounting"]["rows_dropped"] >= 1
    assert "meta" in expected["json_columns"]  # typed differently by different shards, unified the same way

    manifest = json.loads((workers / "manifest.json").read_text())
    assert manifest["config"]["worker_writes"] and manifest["config"]["partitioned_checks"]
    state = json.loads((workers / "state.json").read_text())
    assert [s["file"] for s in manifest["shards"]] == [f["filename"] for f in state["_data_files"]]
    assert len(manifest["shards"]) >= 4
    assert sum(s["rows"] for s in manifest["shards"]) == manifest["row_accounting"]["rows_out"]
    for shard in manifest["shards"]:  # each listed file holds the rows the manifest says
        assert pl.read_ipc_stream(workers / shard["file"]).height == shard["rows"]
    # Nothing of the two passes is left behind: no cache, no unnamed shard.
    assert sorted(p.name for p in workers.iterdir() if p.name.startswith(("shard-", ".groups", "part-"))) == []

    a, b = datasets.load_from_disk(str(here)), datasets.load_from_disk(str(workers))
    assert a.features == b.features and a.to_list() == b.to_list()
    frame = pl.concat([pl.read_ipc_stream(p) for p in sorted(workers.glob("data-*.arrow"))], how="vertical")
    assert frame["prompt_ids"].to_list() == b["prompt_ids"] and frame["source_line"].to_list() == b["source_line"]


def test_shards_keep_every_input_format_and_mixed_text_columns(tmp_path, tiny_tokenizer_dir, small_shards) -> None:
    """examples/pairs: JSON lines, a JSON array, conversational rows beside strings (mixed); a
    max length that truncates, so the report's truncation counts are compared too."""
    here, workers = _both(EXAMPLES, tmp_path / "whole", tiny_tokenizer_dir)
    expected = _out(here)
    assert _out(workers) == expected
    assert expected["text_columns"] == "mixed"
    here, workers = _both(EXAMPLES, tmp_path / "cut", tiny_tokenizer_dir, max_length=24)
    expected = _out(here)
    assert _out(workers) == expected
    assert expected["flags"]["completion_truncated"] > 0 and expected["report"]["truncation"]["rejected_count"] > 0


def test_one_and_two_workers_fail_alike(tmp_path, tiny_tokenizer_dir, small_shards) -> None:
    not_pairs = tmp_path / "sft.jsonl"
    not_pairs.write_text("".join(json.dumps({"text": f"hello {i}"}) + "\n" for i in range(30)), encoding="utf-8")
    messages = []
    for workers in (1, 2):
        with pytest.raises(PrefdataError) as info:
            prepare(not_pairs, tmp_path / f"out-{workers}", tokenizer=tiny_tokenizer_dir, workers=workers,
                    progress=False, batch_size=8)
        messages.append(str(info.value).replace(f"out-{workers}", "OUT"))
    assert messages[0] == messages[1] and "does not look like preference data" in messages[0]

    all_dropped = tmp_path / "same.jsonl"
    all_dropped.write_text("".join(json.dumps({"prompt": f"p{i}", "chosen": "x", "rejected": "x"}) + "\n" for i in range(20)))
    results = [prepare(all_dropped, tmp_path / f"dropped-{w}", tokenizer=tiny_tokenizer_dir, workers=w, progress=False)
               for w in (1, 2)]
    assert [r.exit_code for r in results] == [1, 1]
    assert results[0].problem.replace("dropped-1", "X") == results[1].problem.replace("dropped-2", "X")
    assert _out(tmp_path / "dropped-1") == _out(tmp_path / "dropped-2")


_row = st.fixed_dictionaries({
    "prompt": st.sampled_from(["hi", "hello there", "why?", "", "  why? "]),
    "chosen": st.sampled_from(["a", "b", "a ", "long answer " * 3]),
    "rejected": st.sampled_from(["a", "b", "c"]),
})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.one_of(_row, st.just("{broken")), min_size=1, max_size=40), shard_chunks=st.integers(1, 4))
def test_the_out_is_the_same_for_any_rows_and_shard_size(
    rows, shard_chunks, tmp_path_factory, tiny_tokenizer_dir, monkeypatch
) -> None:
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 256)
    monkeypatch.setattr("prefdata.pipeline.shards.SHARD_BYTES", 1 << 30)
    tmp = tmp_path_factory.mktemp("prop")
    raw = tmp / "raw.jsonl"
    raw.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    outcomes = []
    for chunks in (1 << 30, shard_chunks):  # one shard, then shards of `shard_chunks` chunks
        monkeypatch.setattr("prefdata.pipeline.shards.SHARD_CHUNKS", chunks)
        try:
            prepare(raw, tmp / f"out-{chunks}", tokenizer=tiny_tokenizer_dir, workers=1, progress=False, batch_size=4)
            outcomes.append(_out(tmp / f"out-{chunks}"))
        except PrefdataError as exc:
            outcomes.append(str(exc).replace(f"out-{chunks}", "OUT"))
    assert outcomes[0] == outcomes[1]


def test_groups_keep_input_order_within_their_limits() -> None:
    ranges = [RangeChunk("f", "f", start, start + 100) for start in range(0, 1000, 100)]
    groups = list(group_chunks(ranges, max_bytes=250, max_chunks=100))
    assert [len(g.chunks) for g in groups] == [3, 3, 3, 1]  # a group closes once it reaches 250 bytes
    assert [c for g in groups for c in g.chunks] == ranges and [g.index for g in groups] == [0, 1, 2, 3]
    records = [RecordsChunk("f", []) for _ in range(5)]
    assert [len(g.chunks) for g in group_chunks(records, max_bytes=1, max_chunks=2)] == [2, 2, 1]
    # Small inputs still give every worker several shards; large ones stop at SHARD_BYTES.
    assert shard_bytes_for(32 << 20, workers=2, chunk_bytes=256 << 10) == 1 << 20  # 16 groups a worker
    assert shard_bytes_for(1 << 40, workers=2, chunk_bytes=256 << 10) == 64 << 20
    assert shard_bytes_for(1000, workers=8, chunk_bytes=256 << 10) == 256 << 10


def test_a_full_disk_in_a_worker_is_one_line_and_leaves_no_finished_out(tmp_path, tiny_tokenizer_dir, monkeypatch) -> None:
    """A shard write that fails in a worker process (forked after the patch) reaches the user as
    the same one line as in this process, and OUT is not left looking finished."""
    import errno

    from prefdata.io import writer as W

    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join(_rows(20)) + "\n", encoding="utf-8")

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(W.DatasetWriter, "write_rows", full)
    out = tmp_path / "out"
    with pytest.raises(PrefdataError) as info:
        prepare(raw, out, tokenizer=tiny_tokenizer_dir, workers=2, progress=False)
    message = str(info.value)
    assert "\n" not in message and str(out) in message and "No space left" in message
    assert not out.exists()
