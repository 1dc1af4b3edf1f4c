"""Settings files as users write them, and as a hostile or careless one does: both layouts in `--config`,
misspelt tables, values of the wrong type, files that are no settings file. Every failure is one line,
exit 2, naming the file and the key (issue 40 item 2, issue 41 items 2 and 5)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from prefdata.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pairs"


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_config_file_in_pyproject_layout_is_read(tmp_path, tiny_tokenizer_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml around
    config = tmp_path / "prefdata.toml"
    config.write_text(f'[tool.prefdata]\ntokenizer = "{tiny_tokenizer_dir}"\n[tool.prefdata.prepare]\nmax_length = 64\n'
                      '[tool.other]\nanything = 1\n[project]\nname = "x"\n', encoding="utf-8")
    assert main(["prepare", str(EXAMPLES), str(tmp_path / "out"), "--config", str(config), "--no-progress"]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["max_length"] == 64
    assert manifest["config"]["tokenizer"]  # came from [tool.prefdata], not the command line


@pytest.mark.parametrize(("body", "named"), [
    ("[prepair]\nmax_length = 64\n", "unknown table [prepair]; did you mean [prepare]?"),
    ("[tool.prefdata.prepair]\nmax_length = 64\n", "unknown table [tool.prefdata.prepair]; did you mean [tool.prefdata.prepare]?"),
    ("[tool.prefdat]\nmax_length = 64\n", "unknown table [tool.prefdat]; did you mean [tool.prefdata]?"),
    ("[prepare]\nmax_lenght = 64\n", "unknown setting 'max_lenght' in [prepare] for `prefdata prepare`; did you mean 'max_length'?"),
    ("[tool.prefdata]\nmax_lenght = 64\n", "unknown setting 'max_lenght' in [tool.prefdata]"),
    ("prepare = 3\n", "[prepare] must be a table"),
])
def test_a_misspelt_table_or_key_is_named(body, named, tmp_path, tiny_tokenizer_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "prefdata.toml"
    config.write_text(body, encoding="utf-8")
    assert main(["prepare", str(EXAMPLES), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir,
                 "--config", str(config), "--no-progress"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"prefdata prepare: error: {config}: ") and named in line, line
    assert not (tmp_path / "out").exists()


# (command line, settings file, what the one error line says after `FILE KEY: `)
WRONG_TYPES = [
    (["validate", "data.jsonl"], "trust_remote_code = \"false\"\n", "trust_remote_code: expected a boolean"),
    (["prepare", "data.jsonl", "out"], "[prepare]\ntrust_remote_code = \"false\"\n", "[prepare] trust_remote_code: expected a boolean"),
    (["prepare", "data.jsonl", "out"], "overwrite = \"false\"\n", "overwrite: expected a boolean (true or false, unquoted), got the string 'false'"),
    (["select", "out", "new"], "[select]\nlowest = \"false\"\n", "[select] lowest: expected a boolean"),
    (["select", "out", "new"], "[select]\nlowest = 1\n", "[select] lowest: expected a boolean"),
    (["select", "out", "new"], "max_signal = nan\n", "max_signal: expected a finite number, got nan"),
    (["select", "out", "new"], "min_signal = \"abc\"\n", "min_signal: expected a number, got the string 'abc'"),
    (["select", "out", "new"], "offset_scale = 1e39\n", "offset_scale: expected a number with |A| <= 10000"),
    (["select", "out", "new"], "keep = true\n", "keep: expected a number or a string, got true"),
    (["select", "out", "new"], "keep = 1.5\n", "keep: expected a share in (0, 1] or a number of pairs >= 1"),
    (["prepare", "data.jsonl", "out"], "policy = [\"pr\"]\n", "policy: expected a string, got an array"),
    (["prepare", "data.jsonl", "out"], "max_length = 2.0\n", "max_length: expected an integer, got 2.0"),
    (["prepare", "data.jsonl", "out"], "max_length = 0\n", "max_length: expected a positive integer, got 0"),
    (["prepare", "data.jsonl", "out"], "train_turns = \"first\"\n", "train_turns: expected one of all, last"),
    (["prepare", "data.jsonl", "out"], "allowed_image_root = 3\n", "allowed_image_root: expected a string or an array"),
    (["train", "out"], "[train]\nlr = inf\n", "[train] lr: expected a finite number, got inf"),
    (["train", "out"], "[train]\nbeta = \"0.1\"\n", "[train] beta: expected a number, got the string '0.1'"),
    (["refs", "out"], "[refs]\nbatch_tokens = 1970-01-01\n", "[refs] batch_tokens: expected an integer, got a date"),
]


@pytest.mark.parametrize(("argv", "body", "said"), WRONG_TYPES)
def test_a_value_of_the_wrong_type_is_one_line_naming_file_and_key(argv, body, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "prefdata.toml"
    config.write_text(body, encoding="utf-8")
    assert main([*argv, "--config", str(config), "--no-progress"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"prefdata {argv[0]}: error: {config} {said}"), line


def test_overwrite_as_a_string_never_replaces_an_out(tmp_path, tiny_tokenizer_dir, capsys, monkeypatch):
    """`overwrite = "false"` is truthy in Python: read as given it would replace OUT."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["prepare", str(EXAMPLES), str(out), "--tokenizer", tiny_tokenizer_dir, "--no-progress"]) == 0
    before = (out / "manifest.json").read_bytes()
    (tmp_path / "pyproject.toml").write_text('[tool.prefdata]\noverwrite = "false"\nmax_length = 32\n', encoding="utf-8")
    capsys.readouterr()
    assert main(["prepare", str(EXAMPLES), str(out), "--tokenizer", tiny_tokenizer_dir, "--no-progress"]) == 2
    assert "pyproject.toml [tool.prefdata] overwrite: expected a boolean" in _one_error_line(capsys)
    assert (out / "manifest.json").read_bytes() == before


def test_a_value_from_pyproject_names_pyproject_in_later_errors(tmp_path, capsys, monkeypatch):
    """A tokenizer path the user never typed: the error says where it came from."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.prefdata]\ntokenizer = "no-such-tokenizer"\n', encoding="utf-8")
    assert main(["prepare", str(EXAMPLES), str(tmp_path / "out"), "--no-progress"]) == 2
    line = _one_error_line(capsys)
    assert "no-such-tokenizer" in line and "is from pyproject.toml [tool.prefdata] tokenizer" in line, line


@pytest.mark.parametrize(("make", "said"), [
    (lambda p: p.write_bytes(b'max_length = 64\n# caf\xe9\n'), "is not UTF-8 text (byte 21)"),
    (lambda p: p.mkdir(), "is a directory, not a TOML file"),
    (lambda p: p.write_text("max_length = \n"), "is not valid TOML"),
    (lambda p: p.write_bytes(b"# " + b"x" * (1 << 20) + b"\n"), "is larger than 1 MiB"),
])
def test_a_config_that_is_no_settings_file_is_one_line(make, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "prefdata.toml"
    make(config)
    assert main(["prepare", "data.jsonl", "out", "--config", str(config)]) == 2
    assert _one_error_line(capsys).startswith(f"prefdata prepare: error: config file {config} {said}")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero on this system")
def test_dev_zero_as_config_is_refused_after_a_megabyte(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    assert main(["prepare", "data.jsonl", "out", "--config", "/dev/zero"]) == 2
    assert time.monotonic() - started < 10  # read 1 MiB, not 3 GB
    assert "config file /dev/zero is larger than 1 MiB" in _one_error_line(capsys)


@pytest.mark.parametrize(("body", "said"), [
    ("tool = 3\n", "`tool` must be a table ([tool.prefdata]), got a number"),
    ("tool = \"prefdata\"\n", "`tool` must be a table ([tool.prefdata]), got a string"),
    ("[tool]\nprefdata = [1, 2]\n", "`tool.prefdata` must be a table ([tool.prefdata]), got an array"),
    ("[tool]\nprefdata = true\n", "`tool.prefdata` must be a table ([tool.prefdata]), got a boolean"),
    ("[tool.prefdata]\nvalidate = 1\n", "[tool.prefdata.validate] must be a table of `prefdata validate` settings, got a number"),
])
def test_a_pyproject_whose_tool_is_no_table_is_one_line(body, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(body, encoding="utf-8")
    assert main(["validate", "data.jsonl", "--no-progress"]) == 2
    assert _one_error_line(capsys) == f"prefdata validate: error: pyproject.toml: {said}"


def test_a_pyproject_of_another_tool_is_left_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.ruff]\nline-length = 3\n'
                                             '[tool.prefdata-lint]\nstrict = true\n', encoding="utf-8")
    from prefdata.settings.config import load_settings

    assert load_settings("prepare", None) == {}
