"""The command line: exit codes, one-line errors, settings from files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefdata.cli import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "pairs"


def _stderr_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_prepare_prints_summary_and_exits_0(tmp_path, tiny_tokenizer_dir, capsys):
    code = main(["prepare", str(EXAMPLES), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir, "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "rows in" in out and "quarantined" in out
    assert "report.html" in out


@pytest.mark.parametrize(
    "argv_tail",
    [
        ["prepare", "{tmp}/missing.jsonl", "{tmp}/out", "--tokenizer", "{tok}"],
        ["prepare", str(EXAMPLES), "{tmp}/out"],  # no --tokenizer
        ["prepare", str(EXAMPLES), "{tmp}/out", "--tokenizer", "{tmp}/no-such-tokenizer"],
        ["prepare", str(EXAMPLES), "{tmp}/out", "--tokenizer", "{tok}", "--policy", "{tmp}/missing.toml"],
    ],
)
def test_usage_and_input_errors_exit_2_with_one_line(tmp_path, tiny_tokenizer_dir, capsys, argv_tail):
    argv = [a.format(tmp=tmp_path, tok=tiny_tokenizer_dir) for a in argv_tail]
    code = main(argv + ["--no-progress"])
    lines = _stderr_lines(capsys)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("prefdata prepare: error:"), lines


def test_error_severity_findings_exit_1(tmp_path, tiny_tokenizer_dir, capsys):
    policy = tmp_path / "strict.toml"
    policy.write_text('[flags]\nidentical = "error"\n')
    code = main(["prepare", str(EXAMPLES), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir,
                 "--policy", str(policy), "--no-progress"])
    assert code == 1
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["errors"] == 2  # the two identical pairs


def test_settings_from_config_file_and_pyproject(tmp_path, tiny_tokenizer_dir, capsys, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[tool.prefdata]\ntokenizer = "{tiny_tokenizer_dir}"\n[tool.prefdata.prepare]\nmax_length = 64\n'
    )
    monkeypatch.chdir(project)
    config = tmp_path / "prefdata.toml"
    config.write_text("[prepare]\nmax_prompt_length = 16\n")
    code = main(["prepare", str(EXAMPLES), str(tmp_path / "out"), "--config", str(config), "--no-progress"])
    assert code == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["max_length"] == 64
    assert manifest["config"]["max_prompt_length"] == 16
    # flags win over files
    code = main(["prepare", str(EXAMPLES), str(tmp_path / "out"), "--config", str(config), "--max-length", "128",
                 "--overwrite", "--no-progress"])
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["config"]["max_length"] == 128


def test_unknown_config_key_is_named(tmp_path, tiny_tokenizer_dir, capsys):
    config = tmp_path / "prefdata.toml"
    config.write_text("[prepare]\nmax_lenght = 16\n")
    code = main(["prepare", str(EXAMPLES), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir,
                 "--config", str(config)])
    assert code == 2
    assert "max_lenght" in capsys.readouterr().err


def test_show_marks_loss_tokens(tmp_path, tiny_tokenizer_dir, capsys):
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLES), str(out), "--tokenizer", tiny_tokenizer_dir, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["show", str(out), "--row", "0"]) == 0
    shown = capsys.readouterr().out
    body = [line for line in shown.splitlines() if not line.startswith("---")]
    assert sum(line.count("⟦") for line in body) == 2  # one loss span per half, never in the prompt
    assert all(not line.startswith("<|im_start|>system") or "⟦" not in line for line in body)
    assert "--- chosen" in shown and "--- rejected" in shown
    assert main(["show", str(out), "--row", "9999"]) == 2


def test_real_entry_point_never_prints_a_traceback(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xff\xfe not json\n")
    result = subprocess.run(
        [sys.executable, "-m", "prefdata", "prepare", str(bad), str(tmp_path / "out"), "--tokenizer", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_help_explains_every_command():
    for command in ("prepare", "validate", "refs", "train", "show"):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0


@pytest.mark.parametrize(("argv", "said"), [
    (["prepare", "r", "o", "--max-len", "5"], "unrecognized arguments: --max-len 5; did you mean --max-length?"),
    (["prepare", "r", "o", "--tok", "t"], "unrecognized arguments: --tok t"),
    (["show", "o", "--ro", "1"], "unrecognized arguments: --ro 1; did you mean --row?"),
    (["train", "o", "--learning-rate", "1e-5"], "unrecognized arguments: --learning-rate 1e-5; did you mean --lr"),
    (["--vers"], "unrecognized arguments: --vers; did you mean --version?"),
])
def test_a_flag_is_never_abbreviated_and_an_unknown_one_names_the_near_flags(argv, said, capsys):
    """argparse's abbreviations let `--max-len` pass for `--max-length` (and would make a new flag break old
    command lines); a shortened or unknown flag is refused in one line naming the flags meant."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    lines = _stderr_lines(capsys)
    assert info.value.code == 2 and len(lines) == 1 and said in lines[0], lines


@pytest.mark.parametrize(("argv", "said"), [
    (["select", "o", "n", "--by", "random", "--offset-scale", "1e39"], "--offset-scale: expected a number with |A| <= 10000"),
    (["select", "o", "n", "--by", "random", "--offset-scale=-1e5"], "--offset-scale: expected a number with |A| <= 10000"),
    (["select", "o", "n", "--by", "random", "--offset-scale", "nan"], "--offset-scale: expected a finite number"),
    (["select", "o", "n", "--by", "random", "--max", "nan"], "--max: expected a finite number"),
    (["train", "o", "--lr", "inf"], "--lr: expected a finite number, got inf"),
    (["train", "o", "--beta", "nan"], "--beta: expected a finite number, got nan"),
    (["generate", "p", "o", "--temperature", "nan"], "--temperature: expected a finite number"),
])
def test_a_number_float32_training_cannot_hold_is_refused_on_the_command_line(argv, said, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    lines = _stderr_lines(capsys)
    assert info.value.code == 2 and len(lines) == 1 and said in lines[0], lines


def test_select_help_states_the_offset_scale_bound(capsys):
    with pytest.raises(SystemExit):
        main(["select", "--help"])
    assert "|A| <= 10000 (offsets are float32)" in " ".join(capsys.readouterr().out.split())
