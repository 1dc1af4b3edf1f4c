"""`CheckChunk`, the per-chunk stage of prepare: the same records as the reader, quarantined ones
exactly as read (quarantine.jsonl shows their text), lines placed by the passes."""

from __future__ import annotations

import json
import os

from prefdata.checks import stream
from prefdata.checks.policy import load_policy
from prefdata.checks.stage import CheckChunk
from prefdata.io.chunks import iter_chunks
from prefdata.io.readers import iter_raw_records
from prefdata.tokenize.settings import TokenizeSettings


def _write(path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_chunk_records_match_the_reader(tmp_path, monkeypatch, tiny_tokenizer_dir) -> None:
    from prefdata.prepare import prepare

    rows = [json.dumps({"prompt": f"q{i}", "chosen": f"a{i}", "rejected": f"b{i}"}) for i in range(30)]
    rows[7] = '{"prompt": "broken'
    rows[12] = json.dumps({"text": "not a pair"})
    rows.insert(20, "")  # a blank line is no record, but counts as a line
    path = tmp_path / "d.jsonl"
    _write(path, rows)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    stage = CheckChunk(None, TokenizeSettings(), load_policy(None))
    stage.setup()  # in this process: the environment stays as it is
    assert "TOKENIZERS_PARALLELISM" not in os.environ

    chunks = list(iter_chunks(path, max_bytes=200))  # several byte ranges
    assert len(chunks) > 3
    checked = [stage.run(chunk) for chunk in chunks]
    assert sum(c.line_count for c in checked) == len(rows)

    expected = {record.source_line: record for record in iter_raw_records(path)}
    monkeypatch.setattr(stream, "CHUNK_BYTES", 200)  # the passes place the lines of many chunks
    out = tmp_path / "out"
    prepare(path, out, tokenizer=tiny_tokenizer_dir, progress=False, workers=2)
    import datasets

    kept = datasets.load_from_disk(str(out))
    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert sorted([*kept["source_line"], *(q["source_line"] for q in quarantined)]) == list(expected)
    for line, prompt in zip(kept["source_line"], kept["prompt"]):
        assert prompt == expected[line].value["prompt"]
    assert [q["source_line"] for q in quarantined] == [8, 13]
    for q in quarantined:
        assert q["raw"] == expected[q["source_line"]].raw_text is not None
