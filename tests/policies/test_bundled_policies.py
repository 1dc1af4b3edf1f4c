"""Issue 24, item 7: the bundled policies are package data, loaded by name from any directory; and a
tokenizer file passed for --tokenizer is answered with "pass the directory"."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefdata.checks.policy import BUNDLED_POLICIES, DEFAULT_POLICY_TOML, load_policy
from prefdata.cli import main
from prefdata.core.errors import PrefdataError

REPO = Path(__file__).resolve().parents[2]
ROWS = [
    {"prompt": "Question one?", "chosen": "A careful answer to one.", "rejected": "Nope, sorry."},
    {"prompt": "Question two?", "chosen": "same", "rejected": "same"},  # identical: drop by default, error in pr
] + [  # clean pairs, so the default's one drop stays under max_dropped_share (0.2)
    {"prompt": f"Question {n}?", "chosen": f"A careful answer to {n}.", "rejected": f"No idea about {n}."}
    for n in ("three", "four", "five", "six")
]


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def test_the_policy_files_live_in_the_package_and_checks_links_to_them():
    package = REPO / "prefdata" / "policies"
    for name in BUNDLED_POLICIES:
        assert (package / f"{name}.toml").is_file()
        assert (REPO / "checks" / f"{name}.toml").resolve() == (package / f"{name}.toml").resolve()
    assert (package / "default.toml").read_text(encoding="utf-8") == DEFAULT_POLICY_TOML
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'prefdata = \[[^]]*"policies/\*\.toml"', pyproject)  # shipped in the wheel


def test_a_bundled_name_equals_its_file_and_a_missing_path_names_the_bundled_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no checks/ here
    by_name = load_policy("pr")
    by_path = load_policy(REPO / "checks" / "pr.toml")
    assert by_name.severities == by_path.severities and by_name.severities["identical"] == "error"
    with pytest.raises(PrefdataError, match=r"not found: checks/pr\.toml .*--policy pr"):
        load_policy("checks/pr.toml")
    # A file named like a bundled policy in the working directory is that file.
    (tmp_path / "pr").write_text('[flags]\nidentical = "ignore"\n', encoding="utf-8")
    assert load_policy("pr").severities["identical"] == "ignore"


def test_policy_pr_works_from_another_directory(tmp_path):
    """The real entry point, run outside the checkout (prefdata imported from this tree)."""
    data = _data(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "prefdata", "validate", data.name, "--policy", "pr", "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 1, run.stderr  # pr.toml: identical is an error
    assert "Traceback" not in run.stderr and "identical" in run.stdout
    default = subprocess.run(
        [sys.executable, "-m", "prefdata", "validate", data.name, "--policy", "default", "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert default.returncode == 0, default.stderr


def test_a_tokenizer_file_is_answered_with_pass_the_directory(tmp_path, tiny_tokenizer_dir, capsys):
    file = Path(tiny_tokenizer_dir) / "tokenizer.json"
    code = main(["prepare", str(_data(tmp_path)), str(tmp_path / "out"), "--tokenizer", str(file), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"pass {tiny_tokenizer_dir} instead of {file}" in err and "not found" not in err
    assert not (tmp_path / "out").exists()
