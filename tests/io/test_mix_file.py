"""Mix files (prefdata.sets.mix) and the seeded sampling behind them (prefdata.sets.sampling): exact sample
sizes, samples that do not depend on how the records are cut into chunks, one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.core.errors import PrefdataError
from prefdata.io.chunks import iter_chunks, record_count
from prefdata.sets.mix import is_mix_file, plan_mix, read_mix
from prefdata.sets.sampling import TAKE_ALL, keep_mask, keys_of, sample_base, threshold_for, threshold_of_range


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), data=st.data(), seed=st.integers(0, 2**31), cuts=st.lists(st.integers(1, 400), max_size=8))
def test_a_threshold_keeps_exactly_k_positions_however_they_are_cut(n, data, seed, cuts) -> None:
    k = data.draw(st.integers(0, n))
    base = sample_base(seed, "source")
    threshold = threshold_of_range(base, n, k)
    whole = keep_mask(base, threshold, 0, n)
    assert int(whole.sum()) == k
    # The k smallest keys, computed plainly.
    keys = keys_of(base, np.arange(n))
    assert set(np.flatnonzero(whole).tolist()) == set(np.argsort(keys)[:k].tolist())
    # Any chunking of the positions decides the same, each chunk alone (what the workers do).
    pieces, first = [], 0
    for size in cuts + [n]:
        if first >= n:
            break
        count = min(size, n - first)
        pieces.append(keep_mask(base, threshold, first, count))
        first += count
    assert np.array_equal(np.concatenate(pieces), whole)


def test_thresholds_agree_on_both_sides_of_the_middle() -> None:
    base = sample_base(7, "x")
    keys = keys_of(base, np.arange(10_000))
    for k in (1, 10, 4_999, 5_000, 5_001, 9_999):
        assert threshold_of_range(base, 10_000, k) == threshold_for(keys, k)
    assert threshold_of_range(base, 10, 10) == TAKE_ALL and threshold_of_range(base, 10, 0) < 0


def test_other_seeds_and_names_sample_other_records() -> None:
    picks = {}
    for seed, name in ((0, "a"), (1, "a"), (0, "b")):
        base = sample_base(seed, name)
        picks[seed, name] = frozenset(np.flatnonzero(keep_mask(base, threshold_of_range(base, 500, 50), 0, 500)).tolist())
    assert len(set(picks.values())) == 3


def test_record_count_matches_the_records_read(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    lines = ['\ufeff{"prompt": "p", "chosen": "a", "rejected": "b"}', "", "   ", "{not json", '{"prompt": "q"}', "\r", ""]
    path.write_text("\n".join(lines * 50), encoding="utf-8")
    from prefdata.io.chunks import chunk_records

    for max_bytes in (64, 1000, 1 << 20):
        chunks = list(iter_chunks(path, max_lines=7, max_bytes=max_bytes))
        assert [record_count(c) for c in chunks] == [len(list(chunk_records(c))) for c in chunks]


def _write(path: Path, rows: int, tag: str) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(json.dumps({"prompt": f"{tag} {i}?", "chosen": f"yes {i}", "rejected": f"no {i}"}) + "\n")
    return path


def _mix(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mix.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_weights_take_the_largest_mixture_at_the_declared_shares(tmp_path: Path) -> None:
    _write(tmp_path / "a.jsonl", 301, "a")
    (tmp_path / "b").mkdir()
    _write(tmp_path / "b" / "one.jsonl", 50, "b1")
    _write(tmp_path / "b" / "two.jsonl", 71, "b2")
    mix = read_mix(_mix(tmp_path, 'seed = 3\n[[source]]\npath = "a.jsonl"\nweight = 3\n'
                                  '[[source]]\nname = "bee"\npath = "b"\nweight = 2\n'))
    assert [s.name for s in mix.sources] == ["a", "bee"]  # a name defaults to the file's stem
    plan = plan_mix(mix, 16, 512)
    # Computed here: shares 0.6 / 0.4; the largest total both fill is min(301 / 0.6, 121 / 0.4) = 302.
    total = math.floor(min(301 / 0.6, 121 / 0.4))
    assert [(s.available, s.sampled) for s in plan.sources] == [(301, 181), (121, 121)]
    assert sum(s.sampled for s in plan.sources) == total
    assert plan.file_sources() == {"a.jsonl": "a", "b/one.jsonl": "bee", "b/two.jsonl": "bee"}
    record = plan.record()
    assert record["rows_available"] == record["rows_sampled"] + record["rows_not_sampled"] == 422
    for source in record["sources"]:
        assert source["available"] == source["sampled"] + source["not_sampled"]


def test_a_total_and_per_source_rows(tmp_path: Path) -> None:
    _write(tmp_path / "a.jsonl", 100, "a")
    _write(tmp_path / "b.jsonl", 100, "b")
    plan = plan_mix(read_mix(_mix(tmp_path, 'rows = 101\n[[source]]\npath = "a.jsonl"\nweight = 1\n'
                                            '[[source]]\npath = "b.jsonl"\nweight = 1\n')), 16, 512)
    assert sorted(s.sampled for s in plan.sources) == [50, 51]
    plan = plan_mix(read_mix(_mix(tmp_path, '[[source]]\npath = "a.jsonl"\nrows = 7\n'
                                            '[[source]]\npath = "b.jsonl"\nrows = 100\n')), 16, 512)
    assert [s.sampled for s in plan.sources] == [7, 100]


@pytest.mark.parametrize(
    "text, message",
    [
        ('seed = 1\n', "no \\[\\[source\\]\\] table"),
        ('[[source]]\npath = "a.jsonl"\n', "give weight = SHARE or rows = N"),
        ('[[source]]\npath = "a.jsonl"\nweight = 1\n[[source]]\npath = "b.jsonl"\nrows = 5\n', "every source gives a weight"),
        ('[[source]]\npath = "a.jsonl"\nweight = 1\nname = "x"\n[[source]]\npath = "b.jsonl"\nweight = 1\nname = "x"\n', "two sources are named 'x'"),
        ('[[source]]\npath = "a.jsonl"\nweight = 1\n[[source]]\nname = "again"\npath = "./a.jsonl"\nweight = 1\n', "read the same input"),
        ('[[source]]\npath = "missing.jsonl"\nweight = 1\n', "missing.jsonl: no such file or directory"),
        ('[[source]]\npath = "a.jsonl"\nweight = -1\n', "weight = -1: must be a number > 0"),
        ('[[source]]\npath = "a.jsonl"\nweight = 1\nupsample = true\n', "unknown key 'upsample'"),
        ('sed = 1\n[[source]]\npath = "a.jsonl"\nweight = 1\n', "unknown key 'sed'"),
        ('rows = 10\n[[source]]\npath = "a.jsonl"\nrows = 5\n', "a top-level rows goes with weights"),
        ('[[source]\n', "not a readable TOML mix file"),
    ],
)
def test_mix_file_errors_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    _write(tmp_path / "a.jsonl", 10, "a")
    _write(tmp_path / "b.jsonl", 10, "b")
    with pytest.raises(PrefdataError, match=message) as info:
        read_mix(_mix(tmp_path, text))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[source]]\npath = "a.jsonl"\nrows = 11\n', "source 'a' has 10 records, fewer than its rows = 11"),
        ('rows = 30\n[[source]]\npath = "a.jsonl"\nweight = 1\n[[source]]\npath = "b.jsonl"\nweight = 1\n',
         "source 'a' has 10 records, fewer than the 15 its weight asks of rows = 30"),
    ],
)
def test_a_source_too_small_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    _write(tmp_path / "a.jsonl", 10, "a")
    _write(tmp_path / "b.jsonl", 10, "b")
    with pytest.raises(PrefdataError, match=message) as info:
        plan_mix(read_mix(_mix(tmp_path, text)), 16, 512)
    assert "\n" not in str(info.value)


def test_is_mix_file(tmp_path: Path) -> None:
    assert is_mix_file(_mix(tmp_path, "seed = 0\n")) and not is_mix_file(tmp_path / "none.toml")
    assert not is_mix_file(_write(tmp_path / "a.jsonl", 1, "a"))
