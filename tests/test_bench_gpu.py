"""bench/bench_gpu.py (`make bench-gpu`) as far as a CPU can check it: the harness runs end to end
with --device cpu --tiny, every tool measured on the same OUT, the cells that need a GPU say "not
measured" (never a figure), the GPU tests are run and reported as skipped, and gpu.md says what
gpu.json says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from gpu_peak import mfu, peak_bf16_tflops  # noqa: E402


def test_peak_is_looked_up_from_the_most_specific_gpu_name():
    assert peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_bf16_tflops("NVIDIA H200") == 989.0
    assert peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_bf16_tflops("NVIDIA A10G") == 70.0 and peak_bf16_tflops("NVIDIA A10") == 125.0
    assert peak_bf16_tflops("NVIDIA L40S") == 362.0 and peak_bf16_tflops("NVIDIA L4") == 121.0
    assert peak_bf16_tflops("Tesla T4") is None and peak_bf16_tflops(None) is None  # unknown: no guess
    # 6 * 0.5e9 FLOPs per token at 100k tokens/s on a 989 TFLOP/s GPU: 30.3%
    assert mfu(3e9, 1e5, 989.0) == pytest.approx(0.3033, abs=1e-4)
    assert mfu(3e9, 1e5, None) is None


def test_every_test_that_needs_a_gpu_is_marked_gpu():
    """`pytest -m gpu` (what bench_gpu.py runs on the GPU) must find every GPU test."""
    unmarked = []
    for path in (REPO / "tests").rglob("test_*.py"):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if re.match(r"@pytest\.mark\.skipif\(.*(cuda\.is_available|_vllm_ready)\(\)", line):
                if "@pytest.mark.gpu" not in lines[max(0, i - 3) : i]:
                    unmarked.append(f"{path.relative_to(REPO)}:{i + 1}")
    assert not unmarked, unmarked


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.mark.slow
def test_harness_runs_on_cpu_and_its_table_agrees_with_its_json(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--device", "cpu", "--tiny",
                           "--out", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    markdown = (tmp_path / "gpu.md").read_text()
    assert proc.stdout.strip() == markdown.strip()

    assert report["device"] == "cpu" and report["gpu"] is None and report["peak_bf16_tflops"] is None
    assert markdown.startswith("GPU: none (cpu)")
    rows = report["rows"]
    assert [r["section"] for r in rows] == ["refs"] * 4 + ["train"] * 4
    assert rows[0]["tool"].startswith("TRL precompute") and rows[4]["tool"].startswith("TRL DPOTrainer")
    for r in rows:  # every tool measured on CPU; nothing that needs a GPU is filled in
        assert r["tokens_per_s"] > 0 and r["vs_trl"] > 0, r
        assert r["mfu"] is None and r["peak_gpu_gib"] is None, r
    refs = rows[:4]
    assert len({r["tokens"] for r in refs}) == 1  # the same OUT, counted alike
    for r in refs[1:]:  # each layout's refs equal TRL's on the same ids (fp32 on CPU)
        assert r["max_abs_diff_vs_trl"] < 1e-3
    train = rows[4:]
    assert all(r["steps"] == train[0]["steps"] >= 2 for r in train)  # equal settings: same steps per epoch
    assert all(r["steps_per_s"] > 0 for r in train)

    tests = report["gpu_tests"]
    marked = sum(p.read_text(encoding="utf-8").count("@pytest.mark.gpu\n") for p in (REPO / "tests").rglob("test_*.py"))
    assert tests["passed"] == 0 and tests["failed"] == 0 and tests["skipped"] == marked
    assert tests["skip_reasons"].get("needs a CUDA GPU", 0) >= 1

    table = [line for line in markdown.splitlines() if line.startswith("| ")][2:]  # past header and rule
    assert len(table) == len(rows) + 1
    for line, r in zip(table, rows):
        what, tool, tokens, _, tps, sps, vs, mfu_cell, mem, _ = _cells(line)
        assert (what, tool) == (r["section"], r["tool"])
        assert tokens == f"{r['tokens']:,}" and tps == f"{r['tokens_per_s']:,.0f}"
        assert sps == ("" if r["steps_per_s"] is None else f"{r['steps_per_s']:.2f}")
        assert vs == f"{r['vs_trl']:.2f}x"
        assert mfu_cell == mem == "not measured (no GPU)"
    last = _cells(table[-1])
    assert last[0] == "GPU tests"
    assert last[-1].startswith(f"0 passed, 0 failed, {marked} skipped")
