"""Hostile reward columns in `select`: text that is no number is one line naming its row; values whose
difference overflows are non-finite signals (never selected), with no numpy warning on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.prepare import prepare


def _prepare(tmp_path: Path, tiny_model_dir: str, rewards: list[tuple[object, object]]) -> Path:
    rows = [{"prompt": f"Question {i}?", "chosen": "A fine answer " * (1 + i % 3), "rejected": "No " * (1 + i % 2),
             "reward_chosen": c, "reward_rejected": r} for i, (c, r) in enumerate(rewards)]
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    prepare(raw, tmp_path / "out", tokenizer=tiny_model_dir, progress=False, workers=1)
    return tmp_path / "out"


def test_a_reward_that_is_no_number_is_named_at_its_row(tmp_path, tiny_model_dir, capsys):
    out = _prepare(tmp_path, tiny_model_dir, [(1.0, 0.5), (2.0, 0.1), (0.3, 0.2), ("abc", 0.4), (1.5, 0.0)])
    capsys.readouterr()
    code = main(["select", str(out), str(tmp_path / "new"), "--by", "reward_margin", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "column reward_chosen holds" in err and "abc" in err and "raw.jsonl:4, not a number" in err
    assert not (tmp_path / "new").exists()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_overflowing_and_infinite_rewards_select_without_warnings(tmp_path, tiny_model_dir, capsys):
    out = _prepare(tmp_path, tiny_model_dir, [(1.0, 0.5), (1.7e308, -1.7e308), (2.0, 0.1), (None, 0.1), (0.3, 0.2),
                                              (1.5, 0.0)])
    capsys.readouterr()
    for by in ("reward_margin", "rip"):
        new = tmp_path / f"new-{by}"
        code = main(["select", str(out), str(new), "--by", by, "--keep", "3", "--no-progress"])
        err = capsys.readouterr().err
        assert code == 0 and "Warning" not in err, err
        dropped = [json.loads(line) for line in (new / "dropped.jsonl").read_text().splitlines()]
        non_finite = sorted(d["source_line"] for d in dropped if d.get("why") == "non_finite")
        assert non_finite == [2, 4]  # the overflowing margin and the missing reward: never selected


def test_offsets_beyond_what_float32_training_holds_are_refused_before_new_is_written(tmp_path, tiny_model_dir,
                                                                                      capsys):
    out = _prepare(tmp_path, tiny_model_dir, [(1.0, 0.5), (2.0, 0.1), (9000.0, -3000.0), (1.5, 0.0)])
    capsys.readouterr()
    code = main(["select", str(out), str(tmp_path / "new"), "--by", "reward_margin", "--offset-by", "reward_margin",
                 "--offset-scale", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "gives an offset of 12000 at" in err and "raw.jsonl:3" in err and "smaller --offset-scale" in err
    assert not (tmp_path / "new").exists()
    # within the bound: written, and train's schema accepts it
    assert main(["select", str(out), str(tmp_path / "ok"), "--by", "reward_margin", "--offset-by", "reward_margin",
                 "--offset-scale", "0.5", "--no-progress"]) == 0
    from prefdata.core.schema import check_out

    assert check_out(tmp_path / "ok", tokens_only=True) == 4


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_rewards_at_float64s_ends_report_finite_figures(tmp_path, tiny_model_dir, capsys):
    """Rewards of ±1.7e308 (a sum or a bin width overflows) and subnormal ones: the report's mean,
    quantiles and histogram are still finite numbers, with no warning and no crash."""
    out = _prepare(tmp_path, tiny_model_dir, [(1.0, 1.7e308), (2.0, -1.7e308), (0.5, 0.1), (1e-300, 5e-324),
                                              (3.0, 2.0)])
    capsys.readouterr()
    new = tmp_path / "new"
    assert main(["select", str(out), str(new), "--by", "reward_rejected", "--keep", "2", "--no-progress"]) == 0
    assert "Warning" not in capsys.readouterr().err
    summary = json.loads((new / "report.json").read_text())["signals"]["reward_rejected"]["before"]
    assert summary["min"] == -1.7e308 and summary["max"] == 1.7e308
    assert summary["mean"] == pytest.approx((0.1 + 5e-324 + 2.0) / 5)
    assert sum(summary["histogram"]["counts"]) == 5 and summary["histogram"]["edges"][-1] == pytest.approx(1.7e308)
    (tmp_path / "tiny").mkdir()
    tiny = _prepare(tmp_path / "tiny", tiny_model_dir, [(1.0, 5e-324), (2.0, 1e-323), (0.5, 1.5e-323)])
    assert main(["select", str(tiny), str(tmp_path / "tiny-new"), "--by", "reward_rejected", "--no-progress"]) == 0
