"""`prepare --balance-length [TARGET]`: the kept pairs reach the target share of chosen-longer pairs
within rounding, every pair it removes is in dropped.jsonl flagged length_balance, and the same seed
removes the same pairs whatever the workers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.core.errors import PrefdataError
from prefdata.prepare import prepare
from prefdata.sets.balance import balanced_counts


@settings(max_examples=300, deadline=None)
@given(c=st.integers(0, 500), r=st.integers(0, 500), target=st.floats(0, 1))
def test_balanced_counts_shrink_one_side_to_the_nearest_share(c, r, target) -> None:
    keep_c, keep_r, reached = balanced_counts(c, r, target)
    assert 0 <= keep_c <= c and 0 <= keep_r <= r
    assert keep_c == c or keep_r == r  # only the over-represented side shrinks
    if not reached:
        assert (keep_c, keep_r) == (c, r) and (r == 0 or c == 0)
        return
    if keep_c + keep_r == 0:
        return
    share = keep_c / (keep_c + keep_r)
    # No other count on the shrinking side gets nearer the target.
    if keep_c < c:
        options = [n / (n + r) for n in range(0, c + 1) if n + r]
    elif keep_r < r:
        options = [c / (c + n) for n in range(0, r + 1) if c + n]
    else:
        options = [share]
    assert abs(share - target) <= min(abs(o - target) for o in options) + 1e-12


def _raw(path: Path, rows: int, longer_share: float, seed: int = 0) -> Path:
    """Pairs whose chosen half is the longer one in about `longer_share` of them, a few identical
    pairs (dropped by the policy) and one unreadable line."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            short, long = " ".join(["w"] * rng.randint(1, 5)), " ".join(["w"] * rng.randint(8, 20))
            chosen, rejected = (long, short) if rng.random() < longer_share else (short, long)
            if i % 50 == 7:
                rejected = chosen = f"same {i}"
            handle.write(json.dumps({"prompt": f"question {i}?", "chosen": f"{chosen} c{i}", "rejected": f"{rejected} c{i}"}) + "\n")
        handle.write("{not json\n")
    return path


def _out(out: Path) -> tuple[list[dict], list[dict], dict, dict]:
    import datasets

    rows = datasets.load_from_disk(str(out)).to_list()
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    return rows, dropped, json.loads((out / "manifest.json").read_text()), json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("target, longer_share", [(0.5, 0.8), (0.3, 0.6), (0.7, 0.3)])
def test_balance_reaches_the_target_and_accounts_every_dropped_pair(tmp_path, tiny_tokenizer_dir, target, longer_share) -> None:
    raw = _raw(tmp_path / "raw.jsonl", 400, longer_share)
    plain = prepare(raw, tmp_path / "plain", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)
    result = prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=2, progress=False, balance_length=target)
    rows, dropped, manifest, report = _out(tmp_path / "out")
    plain_rows, plain_dropped, _, _ = _out(tmp_path / "plain")
    # Counted here, from the stored ids (no --max-length: they are the whole completions).
    c = sum(len(r["chosen_ids"]) > len(r["rejected_ids"]) for r in plain_rows)
    n = len(plain_rows)
    kept_longer = sum(len(r["chosen_ids"]) > len(r["rejected_ids"]) for r in rows)
    share = kept_longer / len(rows)
    assert abs(share - target) <= 1 / len(rows)  # the target, within rounding
    balanced = [d for d in dropped if d["flags"] == ["length_balance"]]
    assert len(balanced) == n - len(rows) == report["length_balance"]["dropped"] > 0
    # Every pair the plain run kept is kept or dropped as length_balance here; nothing else moved.
    where = lambda items: {(i["source_file"], i["source_line"]) for i in items}  # noqa: E731
    assert where(rows) | where(balanced) == where(plain_rows) and not where(rows) & where(balanced)
    assert [d for d in dropped if d not in balanced] == plain_dropped
    # Only the over-represented side lost pairs.
    side = (lambda d: d) if c / n > target else (lambda d: not d)
    removed = {(d["source_file"], d["source_line"]) for d in balanced}
    lengths = {(r["source_file"], r["source_line"]): len(r["chosen_ids"]) > len(r["rejected_ids"]) for r in plain_rows}
    assert all(side(lengths[key]) for key in removed)
    acc = manifest["row_accounting"]
    assert acc["rows_in"] == acc["rows_out"] + acc["rows_dropped"] + acc["rows_quarantined"] == 401
    summary = report["length_balance"]
    assert (summary["pairs_before"], summary["chosen_longer_count_before"]) == (n, c)
    assert summary["chosen_longer_after"] == round(share, 6) and summary["pairs_after"] == len(rows)
    assert report["length_bias"]["kept"]["tokens"]["chosen_longer"] == round(share, 6)
    assert manifest["config"]["balance_length"] == target and manifest["config"]["worker_writes"] is True
    # A requested subsample does not trip max_dropped_share (it removed well over 20% at 0.5 / 0.8).
    assert result.exit_code == 0 and not result.problem
    assert "length_balance" in (tmp_path / "out" / "report.md").read_text()


def test_same_seed_same_pairs_whatever_the_workers_other_seed_other_pairs(tmp_path, tiny_tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 1024)
    raw = _raw(tmp_path / "raw.jsonl", 300, 0.75, seed=3)
    seen = {}
    for name, options in (("a", {"workers": 1, "seed": 4}), ("b", {"workers": 2, "seed": 4, "batch_size": 9}),
                          ("c", {"workers": 2, "seed": 5})):
        prepare(raw, tmp_path / name, tokenizer=tiny_tokenizer_dir, progress=False, balance_length=0.5, **options)
        rows, dropped, manifest, _ = _out(tmp_path / name)
        seen[name] = (manifest["content_hash"], (tmp_path / name / "dropped.jsonl").read_bytes(), len(rows))
    assert seen["a"] == seen["b"]
    assert seen["c"][0] != seen["a"][0] and seen["c"][2] == seen["a"][2]  # other pairs, as many


def test_balance_with_a_mix_seeds_from_the_mix_file(tmp_path, tiny_tokenizer_dir) -> None:
    _raw(tmp_path / "a.jsonl", 200, 0.8, seed=1)
    _raw(tmp_path / "b.jsonl", 200, 0.4, seed=2)
    mix = tmp_path / "mix.toml"
    mix.write_text('seed = 9\n[[source]]\npath = "a.jsonl"\nweight = 1\n[[source]]\npath = "b.jsonl"\nweight = 1\n')
    result = prepare(mix, tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=2, progress=False, balance_length=0.5)
    rows, dropped, manifest, report = _out(tmp_path / "out")
    assert manifest["config"]["seed"] == 9 and report["length_balance"]["seed"] == 9
    assert abs(sum(len(r["chosen_ids"]) > len(r["rejected_ids"]) for r in rows) / len(rows) - 0.5) <= 1 / len(rows)
    per_source = {s["name"]: s for s in report["sources"]}
    assert sum(s["flags"].get("length_balance", 0) for s in per_source.values()) == report["length_balance"]["dropped"]
    for name, entry in per_source.items():
        mine = [r for r in rows if r["source"] == name]
        assert entry["kept"] == len(mine)
        assert entry["length_bias"]["kept"]["tokens"]["chosen_longer_count"] == sum(
            len(r["chosen_ids"]) > len(r["rejected_ids"]) for r in mine)
    assert result.rows_in == 402


def test_balance_flag_at_warn_marks_without_removing(tmp_path, tiny_tokenizer_dir) -> None:
    raw = _raw(tmp_path / "raw.jsonl", 200, 0.8)
    policy = tmp_path / "policy.toml"
    policy.write_text('[flags]\nlength_balance = "warn"\n')
    plain = prepare(raw, tmp_path / "plain", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)
    marked = prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=1, progress=False, balance_length=0.5,
                     policy=policy)
    assert marked.rows_out == plain.rows_out
    assert marked.flag_counts["length_balance"] == marked.report["length_balance"]["flagged"] > 0
    assert marked.report["length_balance"]["dropped"] == 0


def test_balance_errors_and_cli(tmp_path, tiny_tokenizer_dir, capsys) -> None:
    from prefdata.cli import main

    raw = _raw(tmp_path / "raw.jsonl", 120, 0.8)
    with pytest.raises(PrefdataError, match="must be in \\[0, 1\\]"):
        prepare(raw, tmp_path / "x", tokenizer=tiny_tokenizer_dir, balance_length=1.5)
    # Without a value: 0.5.
    assert main(["prepare", str(raw), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir, "--no-progress",
                 "--workers", "1", "--balance-length"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["length_balance"]["target"] == 0.5 and report["length_balance"]["seed"] == 0
    assert "--balance-length 0.5 (seed 0)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:  # argparse's own one-line usage error
        main(["prepare", str(raw), str(tmp_path / "o2"), "--tokenizer", tiny_tokenizer_dir, "--balance-length", "2"])
    assert usage.value.code == 2 and "expected a share between 0 and 1" in capsys.readouterr().err
