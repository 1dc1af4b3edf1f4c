"""`python -m prefdata.demo --images`: the README's image walk-through runs on CPU and ends with a
trained model, and every stage accounts for the example's bad rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_image_demo_runs_every_stage_and_names_the_bad_rows(tmp_path):
    work = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "prefdata.demo", "--images", "--work", str(work), "--max-steps", "4"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "13 rows in · 9 kept · 2 dropped · 2 quarantined" in done.stdout
    assert "image_mismatch" in done.stdout and "cannot decode" in done.stdout and "cannot read" in done.stdout
    assert "Loading weights" not in done.stderr and "Writing model shards" not in done.stderr  # library bars stay quiet
    manifest = json.loads((work / "prepared" / "manifest.json").read_text())
    assert manifest["processor"]["class"] == "LlavaProcessor"
    metrics = [json.loads(line) for line in (work / "checkpoint" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m][-1] == 4
    assert (work / "checkpoint" / "processor_config.json").exists()
