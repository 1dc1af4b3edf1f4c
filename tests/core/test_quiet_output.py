"""What a user reads in the terminal: no third-party bars or warnings when quiet, no line twice,
counts with thousands separators and plurals, validate's words, the baseline verdict, refs' bar."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prefdata.report.render_text import render_text

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pairs"
THIRD_PARTY = ("Loading weights", "Writing model shards", "Saving the dataset", "[transformers]", "it/s]")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real entry point, output captured (so stderr is not a terminal)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("PREFDATA_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "prefdata", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("quiet") / "out"
    done = _cli("prepare", str(EXAMPLES), str(out), "--tokenizer", tiny_model_dir, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert not [s for s in THIRD_PARTY if s in done.stdout + done.stderr]
    return out


@pytest.mark.parametrize("flags", [["--no-progress"], []], ids=["no-progress", "not-a-tty"])
def test_refs_shows_no_third_party_bars(prepared, tiny_model_dir, tmp_path, flags):
    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    done = _cli("refs", str(out), "--model", tiny_model_dir, *flags)
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    assert [s for s in THIRD_PARTY if s in text] == [], text
    # --no-progress, or stderr redirected (issue 40): not even prefdata's own bar, as prepare and validate
    assert done.stderr == "", done.stderr


def test_show_prints_no_library_warning(prepared):
    done = _cli("show", str(prepared), "--row", "0")
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_directory_input_names_each_skipped_file_once(tmp_path, tiny_tokenizer_dir):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(EXAMPLES / "explicit.jsonl", data / "pairs.jsonl")
    (data / "notes.txt").write_text("not data\n")
    for args in (["prepare", str(data), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir],
                 ["validate", str(data)], ["validate", str(data), "--tokenizer", tiny_tokenizer_dir]):
        done = _cli(*args, "--no-progress")
        skipping = [line for line in done.stderr.splitlines() if "skipping" in line]
        assert len(skipping) == 1 and "notes.txt" in skipping[0], done.stderr


def _report(**overrides) -> dict:
    report = {"command": "prepare", "input": "data.jsonl", "status": "warn", "errors": 0, "warnings": 1,
              "accounting": {"rows_in": 2308, "rows_out": 2308, "rows_dropped": 0, "rows_quarantined": 0}}
    return {**report, **overrides}


def test_counts_have_plurals_and_thousands_separators():
    assert "PASS with warnings (0 of 2,308 rows with errors, 1 with warnings)" in render_text(_report())
    text = render_text(_report(warnings=2307, errors=1, status="fail"))
    assert "FAIL (1 of 2,308 rows with errors, 2,307 with warnings)" in text and "2,308 rows in" in text


def test_validate_speaks_of_findings_not_kept_rows(tmp_path):
    done = _cli("validate", str(EXAMPLES / "explicit.jsonl"), "--no-progress")
    first_lines = "\n".join(done.stdout.splitlines()[:2])
    assert "kept" not in first_lines and " dropped ·" not in first_lines
    assert re.search(r"15 rows in · 13 pairs checked · \d+ with findings \(3 that prepare would drop\) · 2 quarantined",
                     first_lines), first_lines


def test_baseline_pass_with_known_errors_says_no_regressions(tmp_path):
    base = tmp_path / "base.json"
    policy = str(REPO / "checks" / "pr.toml")
    data = str(EXAMPLES / "explicit.jsonl")
    assert _cli("validate", data, "--policy", policy, "--format", "json", "--output", str(base), "--no-progress").returncode == 1
    done = _cli("validate", data, "--policy", policy, "--baseline", str(base), "--no-progress")
    assert done.returncode == 0
    errors = json.loads(base.read_text())["errors"]
    assert f"no regressions ({errors:,} of " in done.stdout.splitlines()[0] and " rows with errors, " in done.stdout
    assert done.stdout.splitlines()[0].endswith(", all in the baseline)")
    assert "PASS with warnings" not in done.stdout


def test_online_summary_does_not_repeat_the_rounds_printed_live(tmp_path):
    from prefdata.online.rounds import OnlineResult

    line = {"round": 1, "reward_mean": 1.0, "reward_std": 0.5, "pairs_kept": 3, "pairs_dropped": 0,
            "flag_counts": {}, "trained": False}
    fresh = OnlineResult(tmp_path, tmp_path / "policy", rounds=[line], resumed_after=0)
    assert "round 1:" not in fresh.summary()  # run_online printed it when the round finished
    resumed = OnlineResult(tmp_path, tmp_path / "policy", rounds=[line], resumed_after=1)
    assert resumed.summary().count("round 1:") == 1  # an earlier run's round: not printed by this one


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal: where prefdata draws its bars."""

    def isatty(self) -> bool:
        return True


def test_refs_bar_counts_what_the_summary_counts(prepared, tiny_model_dir, tmp_path, monkeypatch):
    from tqdm import tqdm

    from prefdata.refs import compute_refs

    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    result = compute_refs(out, model=tiny_model_dir, progress=True)
    err = terminal.getvalue()
    total = tqdm.format_sizeof(result.tokens)
    assert f"{total}/{total}" in err, (result.tokens, err[-500:])
    assert f"{result.tokens:,} tokens in" in result.summary()


def test_train_draws_no_bar_into_a_redirected_stderr(prepared, tiny_model_dir, tmp_path):
    """Issue 40: refs, train and online drew their bars into a log file; prepare and validate did not."""
    done = _cli("train", str(prepared), "--model", tiny_model_dir, "--output", str(tmp_path / "policy"),
                "--loss", "simpo", "--max-steps", "2")
    assert done.returncode == 0, done.stderr
    assert "train:" not in done.stderr and "\r" not in done.stderr, done.stderr


def test_the_online_rounds_bar_is_drawn_only_on_a_terminal(monkeypatch):
    from prefdata.online.rounds import _rounds_bar

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # redirected
    assert _rounds_bar(3, 0, enabled=True).disable
    monkeypatch.setattr(sys, "stderr", _Terminal())
    bar = _rounds_bar(3, 0, enabled=True)
    assert not bar.disable and _rounds_bar(3, 0, enabled=False).disable
    bar.close()


def test_building_a_learning_case_draws_no_library_bars(tmp_path):
    """prefdata.tiny.build_learning_case (benches, the online tests) is set-up: transformers' loading and
    shard-writing bars stay hidden even outside a quiet command, in a fresh process as a bench runs it."""
    code = ("import sys; from prefdata.tiny.learning_case import build_learning_case; "
            "build_learning_case(sys.argv[1], prompts=4, warm_start_steps=1)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("PREFDATA_DEBUG", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "case")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "case" / "policy" / "config.json").is_file()
    assert not [s for s in THIRD_PARTY if s in done.stdout + done.stderr], done.stderr
