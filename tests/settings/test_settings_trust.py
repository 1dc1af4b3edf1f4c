"""A pull request's own settings files cannot make `validate` run code, write elsewhere or read outside the
checkout (issue 41 item 1). The hostile repository is real: a tokenizer directory whose Python file
writes a marker when imported, and a pyproject.toml that asks for it, run as the PR workflow (docs/settings.md)
runs validate (working directory: the PR's checkout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefdata.cli import main

REPO = Path(__file__).resolve().parents[2]
PR_COMMAND = ["validate", "data", "--policy", "pr", "--format", "github", "--no-progress"]

EVIL_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("tokenizer code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


@pytest.fixture
def hostile_repo(tmp_path, tiny_tokenizer_dir) -> Path:
    """A checkout whose evil_tok/ loads its tokenizer class from evil.py (auto_map); the marker that
    evil.py writes lies outside the checkout."""
    import shutil

    repo = tmp_path / "pr-head"
    (repo / "data").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "pairs" / "explicit.jsonl", repo / "data" / "train.jsonl")
    tok = repo / "evil_tok"
    shutil.copytree(tiny_tokenizer_dir, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": [None, "evil.EvilTokenizer"]})
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    (tok / "evil.py").write_text(EVIL_CODE.format(marker=str(tmp_path / "MARKER")))
    return repo


def _run(repo: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_MODULES_CACHE": str(repo.parent / "hf-modules"),
           "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "prefdata", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_evil_tokenizer_is_real_when_the_command_line_trusts_it(hostile_repo):
    """The control: the same tokenizer with --trust-remote-code typed by the user runs its code, so the
    marker's absence below means the settings file was refused, not that the trap was broken."""
    done = _run(hostile_repo, [*PR_COMMAND, "--tokenizer", "evil_tok", "--trust-remote-code"])
    assert (hostile_repo.parent / "MARKER").exists(), done.stderr


@pytest.mark.parametrize(("files", "extra", "said"), [
    ({"pyproject.toml": '[tool.prefdata]\ntokenizer = "evil_tok"\ntrust_remote_code = true\n'}, [],
     "pyproject.toml [tool.prefdata] trust_remote_code: `prefdata validate` takes trust_remote_code from its flag "
     "only (--trust-remote-code), never from a settings file a pull request can change"),
    ({"pyproject.toml": "[tool.prefdata.validate]\ntrust_remote_code = true\n"}, ["--tokenizer", "evil_tok"],
     "pyproject.toml [tool.prefdata.validate] trust_remote_code: `prefdata validate` takes trust_remote_code"),
    ({"ci/prefdata.toml": '[tool.prefdata]\ntokenizer = "evil_tok"\n[tool.prefdata.validate]\ntrust_remote_code = true\n'},
     ["--config", "ci/prefdata.toml"], "ci/prefdata.toml [tool.prefdata.validate] trust_remote_code:"),
    ({"ci/prefdata.toml": 'tokenizer = "evil_tok"\ntrust-remote-code = true\n'}, ["--config", "ci/prefdata.toml"],
     "ci/prefdata.toml trust-remote-code:"),
])
def test_a_settings_file_cannot_turn_on_remote_code_in_validate(hostile_repo, files, extra, said):
    for name, text in files.items():
        (hostile_repo / name).parent.mkdir(exist_ok=True)
        (hostile_repo / name).write_text(text)
    done = _run(hostile_repo, [*PR_COMMAND, *extra])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"prefdata validate: error: {said}"), lines
    assert not (hostile_repo.parent / "MARKER").exists()
    assert done.stdout == ""  # nothing was checked, so nothing annotated


def test_a_tokenizer_from_the_settings_file_loads_without_its_code(hostile_repo):
    (hostile_repo / "pyproject.toml").write_text('[tool.prefdata]\ntokenizer = "evil_tok"\n')
    done = _run(hostile_repo, PR_COMMAND)
    assert done.returncode == 2, done.stderr
    assert "custom code" in done.stderr and "is from pyproject.toml [tool.prefdata] tokenizer" in done.stderr
    assert not (hostile_repo.parent / "MARKER").exists()


def test_a_string_false_is_no_permission(hostile_repo):
    """`trust_remote_code = "false"` is truthy in Python: it must be refused, not read as on."""
    (hostile_repo / "pyproject.toml").write_text('[tool.prefdata]\ntrust_remote_code = "false"\n')
    done = _run(hostile_repo, [*PR_COMMAND, "--tokenizer", "evil_tok"])
    assert done.returncode == 2 and "trust_remote_code: expected a boolean" in done.stderr, done.stderr
    assert not (hostile_repo.parent / "MARKER").exists()


@pytest.mark.parametrize(("body", "said"), [
    ('output = "../../home/.bashrc"\n', "output: `prefdata validate` takes output from its flag only (--output)"),
    ('[tool.prefdata.validate]\noutput = "report.html"\n', "takes output from its flag only"),
    ('ray_address = "ray://attacker:10001"\n', "takes ray_address from its flag only (--ray-address)"),
    ('allowed_image_root = ["/"]\n', "takes allowed_image_root from its flag only (--allowed-image-root)"),
    ('tokenizer = "/etc"\n', "tokenizer: '/etc' leads outside the working directory"),
    ('chat_template_file = "../secret.jinja"\n', "chat_template_file: '../secret.jinja' leads outside"),
    ('policy = "/etc/passwd"\n', "policy: '/etc/passwd' leads outside"),
    ('against = "../eval.jsonl"\n', "against: '../eval.jsonl' leads outside"),
    ('baseline = "/tmp/base.json"\n', "baseline: '/tmp/base.json' leads outside"),
    ('decontaminate_against = ["bench.jsonl", "/etc/shadow"]\n', "decontaminate_against: '/etc/shadow' leads outside"),
    ('tokenizer = "link_out"\n', "tokenizer: 'link_out' leads outside"),
])
def test_validate_takes_no_write_target_cluster_or_outside_path_from_a_settings_file(
        body, said, tmp_path, capsys, monkeypatch):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "link_out").symlink_to(tmp_path)  # inside by name, outside once resolved
    table = "" if body.startswith("[") else "[tool.prefdata]\n"
    (checkout / "pyproject.toml").write_text(table + body)
    monkeypatch.chdir(checkout)
    assert main(["validate", "data.jsonl", "--no-progress"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("prefdata validate: error: pyproject.toml [tool.prefdata") \
        and said in lines[0], lines
    assert not (tmp_path / "home").exists()


def test_what_validate_refuses_from_a_file_it_takes_from_its_flag_and_prepare_from_a_file(tmp_path, monkeypatch):
    """The flag wins over the file (nothing of the file is used), the off value is no permission to refuse,
    and prepare (run by the data's owner, not on pull requests) still reads them from files."""
    from prefdata.cli import _settings, build_parser

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.prefdata]\ntrust_remote_code = true\nallowed_image_root = ["/"]\n')
    args = build_parser().parse_args(["validate", "d", "--trust-remote-code", "--allowed-image-root", "imgs"])
    assert _settings(args)["allowed_image_root"] == ["imgs"]
    args = build_parser().parse_args(["prepare", "d", "o", "--tokenizer", "t"])
    assert _settings(args)["trust_remote_code"] is True
    (tmp_path / "pyproject.toml").write_text('[tool.prefdata]\ntrust_remote_code = false\ntokenizer = "org/name"\n')
    args = build_parser().parse_args(["validate", "d"])
    assert _settings(args) == {"trust_remote_code": False, "tokenizer": "org/name"}  # a Hub id is a relative name


def test_the_readme_lists_what_validate_withholds():
    from prefdata.settings.trust import FLAG_ONLY, INSIDE_ONLY

    text = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    section = text[text.index("**Settings files and pull requests.**"):]
    listed = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
    assert listed == set(FLAG_ONLY["validate"])
    for name, why in FLAG_ONLY["validate"].items():
        assert why in section.replace("`validate`", "validate"), name
    assert all(f"`{name}`" in section for name in INSIDE_ONLY["validate"])
