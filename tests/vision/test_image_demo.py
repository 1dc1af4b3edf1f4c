"""`python -m prefdata.tiny.demo --images`: the README's image walk-through runs on CPU and ends with a
trained model, every stage accounts for the example's bad rows, and it writes under WORK/images/,
leaving the text demo's WORK/prepared/ (the README's `show demo-out/prepared --row 0`) as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_image_demo_runs_every_stage_and_names_the_bad_rows(tmp_path):
    work = tmp_path / "demo"
    text_demo = {work / "prepared" / "manifest.json": "text demo", work / "checkpoint" / "metrics.jsonl": "text demo"}
    for path, text in text_demo.items():
        path.parent.mkdir(parents=True)
        path.write_text(text)
    done = subprocess.run([sys.executable, "-m", "prefdata.tiny.demo", "--images", "--work", str(work), "--max-steps", "4"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "13 rows in · 9 kept · 2 dropped · 2 quarantined" in done.stdout
    assert "image_mismatch" in done.stdout and "cannot decode" in done.stdout and "cannot read" in done.stdout
    assert "Loading weights" not in done.stderr and "Writing model shards" not in done.stderr  # library bars stay quiet
    assert {path: path.read_text() for path in text_demo} == text_demo  # the text demo's output is untouched
    assert sorted(p.name for p in work.iterdir()) == ["checkpoint", "images", "prepared"]
    work = work / "images"
    assert f"prefdata show {work / 'prepared'} --row 0" in done.stdout
    manifest = json.loads((work / "prepared" / "manifest.json").read_text())
    assert manifest["processor"]["class"] == "LlavaProcessor"
    metrics = [json.loads(line) for line in (work / "checkpoint" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m][-1] == 4
    assert (work / "checkpoint" / "processor_config.json").exists()
