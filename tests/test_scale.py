"""Memory stays flat as the input grows (issue 6, a CI-sized version of bench/bench_scale.py).

The 1M-pair run is `python bench/bench_scale.py`; here two small sizes, each prepared in a fresh
process, must have about the same peak RSS.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_scale import write_synthetic  # noqa: E402


def _peak(tmp_path: Path, rows: int, tokenizer: str) -> dict:
    raw = tmp_path / f"in-{rows}.jsonl"
    write_synthetic(raw, rows, max_words=12)
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_scale.py"), "--_child", str(raw), str(tmp_path / f"out-{rows}"),
         tokenizer, "1"],
        capture_output=True, text=True, check=True, timeout=600,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_memory_flat_in_the_number_of_rows(tmp_path, tiny_tokenizer_dir):
    small = _peak(tmp_path, 1_000, tiny_tokenizer_dir)
    large = _peak(tmp_path, 8_000, tiny_tokenizer_dir)
    assert large["rows_in"] == 8_000 and large["rows_out"] + large["rows_dropped"] == 8_000
    # 8x the rows: the dataset-wide tables and report arrays add a few bytes a row, not a copy of the data.
    assert large["peak_rss_mib"] - small["peak_rss_mib"] < 40, (small, large)
