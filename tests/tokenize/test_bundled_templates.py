"""Bundled chat templates (prefdata/templates, package data): found by name from any directory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from prefdata.core.errors import PrefdataError
from prefdata.templates import bundled_template_names, bundled_template_text
from prefdata.tokenize.template import TemplateSettings

REPO = Path(__file__).resolve().parents[2]


def test_every_bundled_template_is_declared_package_data():
    """A pip-installed prefdata has a template only if pyproject's package-data names it."""
    names = bundled_template_names()
    assert "deepseek-r1-keep-reasoning" in names
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["prefdata"]
    for name in names:
        assert any(fnmatch(f"templates/{name}.jinja", g) for g in globs), name


def test_a_name_reads_the_bundled_template_and_a_file_of_that_name_wins(tmp_path, monkeypatch):
    bundled = bundled_template_text("deepseek-r1-keep-reasoning")
    assert bundled and "<think>" in bundled
    assert TemplateSettings(chat_template_file="deepseek-r1-keep-reasoning").chat_template_text == bundled
    assert TemplateSettings(chat_template_file="deepseek-r1-keep-reasoning.jinja").chat_template_text == bundled
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deepseek-r1-keep-reasoning").write_text("{{ 'mine' }}")
    assert TemplateSettings(chat_template_file="deepseek-r1-keep-reasoning").chat_template_text == "{{ 'mine' }}"


def test_an_unknown_template_names_the_bundled_ones():
    with pytest.raises(PrefdataError, match="no such file: nope.jinja .*deepseek-r1-keep-reasoning"):
        TemplateSettings(chat_template_file="nope.jinja")
    with pytest.raises(PrefdataError, match="no such file"):  # a path is a path, never a name
        TemplateSettings(chat_template_file="docs/deepseek-r1-keep-reasoning")


def test_prepare_finds_the_bundled_template_by_name_from_another_directory(tmp_path, tiny_tokenizer_dir):
    raw = tmp_path / "pairs.jsonl"
    row = {"prompt": [{"role": "user", "content": "2+3?"}],
           "chosen": [{"role": "assistant", "content": "5", "reasoning_content": "2 plus 3 is 5."}],
           "rejected": [{"role": "assistant", "content": "6", "reasoning_content": "2 plus 3 is 6."}]}
    raw.write_text(json.dumps(row) + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "prefdata", "prepare", str(raw), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir,
         "--chat-template-file", "deepseek-r1-keep-reasoning", "--no-progress"],
        cwd=elsewhere, capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    text = bundled_template_text("deepseek-r1-keep-reasoning")
    assert json.dumps(manifest).count("sha256:" + hashlib.sha256(text.encode()).hexdigest()) >= 1


def test_a_bundled_template_is_offered_only_for_the_template_it_was_made_for(shared_tokenizer):
    """deepseek-r1-keep-reasoning fits DeepSeek-R1's template, none of the other tokenizers in ../shared."""
    from transformers import AutoTokenizer

    from prefdata.templates import MADE_FOR, bundled_templates_for

    assert set(MADE_FOR) == set(bundled_template_names())  # each says what it was made for
    names = ["deepseek-r1-distill-qwen", "qwen2.5-instruct", "smollm3-3b", "smollm2-135m-instruct", "mistral-7b-instruct-v0.3",
             "phi-3-mini-4k-instruct", "cogito-v1-preview-qwen-14b", "gpt2"]
    fits = {name: bundled_templates_for(AutoTokenizer.from_pretrained(shared_tokenizer(name)).chat_template) for name in names}
    assert fits == {name: (["deepseek-r1-keep-reasoning"] if name == "deepseek-r1-distill-qwen" else []) for name in names}
    assert bundled_templates_for({"default": bundled_template_text("deepseek-r1-keep-reasoning")}) == ["deepseek-r1-keep-reasoning"]
    assert bundled_templates_for(None) == []
