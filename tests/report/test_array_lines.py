"""Issue 24, item 3: GitHub annotations and every `source_line` (dataset, dropped.jsonl,
quarantine.jsonl, report) point at the line where a record starts in a pretty-printed JSON array,
as they do for JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import datasets

from prefdata.cli import main

ROWS = [
    {"prompt": "Question one?", "chosen": "A full answer to one.", "rejected": "Nope."},
    {"prompt": "Question two?", "chosen": "same", "rejected": "same"},  # identical: dropped
    {"prompt": "Question three?", "chosen": "A full answer to three.", "rejected": "No."},
    {"prompt": "Question four?", "rejected": "only a rejected"},  # unreadable shape: quarantined
    {"prompt": "Question five?", "chosen": "A careful answer to five.", "rejected": "Meh."},
]


def _pretty_array(path: Path) -> dict[str, int]:
    """ROWS as json.dumps(indent=2); the line where each record's '{' is, by its prompt."""
    text = json.dumps(ROWS, indent=2)
    path.write_text(text, encoding="utf-8")
    lines = text.splitlines()
    starts = {}
    for number, line in enumerate(lines, start=1):
        if line == "  {":
            prompt = lines[number].split('"prompt": ')[1].rstrip(",")  # the line after '{'
            starts[json.loads(prompt)] = number
    assert len(starts) == len(ROWS)
    return starts


def test_github_annotations_land_on_the_record_start_line(tmp_path, capsys):
    data = tmp_path / "pairs.json"
    starts = _pretty_array(data)
    capsys.readouterr()
    main(["validate", str(data), "--format", "github", "--no-progress"])
    annotations = [line for line in capsys.readouterr().out.splitlines() if line.startswith("::")]
    identical = [a for a in annotations if "identical" in a]
    assert len(identical) == 1 and f",line={starts['Question two?']}," in identical[0]
    unreadable = [a for a in annotations if "line=" in a and "identical" not in a]
    assert unreadable and all(f",line={starts['Question four?']}," in a for a in unreadable), annotations


def test_prepare_records_the_start_line_everywhere(tmp_path, tiny_tokenizer_dir):
    data = tmp_path / "pairs.json"
    starts = _pretty_array(data)
    out = tmp_path / "out"
    # 1 of 4 pairs dropped is above max_dropped_share (0.2): exit 1, OUT written all the same.
    assert main(["prepare", str(data), str(out), "--tokenizer", tiny_tokenizer_dir, "--no-progress", "--workers", "1"]) == 1
    kept = datasets.load_from_disk(str(out))
    assert {row["prompt"]: row["source_line"] for row in kept} == {
        p: starts[p] for p in ("Question one?", "Question three?", "Question five?")
    }
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert [d["source_line"] for d in dropped] == [starts["Question two?"]]
    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [q["source_line"] for q in quarantined] == [starts["Question four?"]]
    report = json.loads((out / "report.json").read_text())
    examples = report["flags"]["identical"]["examples"]
    assert [e["source_line"] for e in examples] == [starts["Question two?"]]
