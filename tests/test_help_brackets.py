"""Every synopsis a user reads has balanced brackets (issue 40: the refs synopsis had an unbalanced
one): each command's usage and help as argparse prints them from the declarations, at any terminal
width, and the README's command headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prefdata.cli import build_parser
from prefdata.settings.commands import COMMANDS

REPO = Path(__file__).resolve().parents[1]
PAIRS = ("[]", "()", "{}")


def _balanced(text: str) -> bool:
    stack: list[str] = []
    for char in text:
        if char in "[({":
            stack.append(char)
        elif char in "])}":
            if not stack or "[({"["])}".index(char)] != stack.pop():
                return False
    return not stack


def _subparser(name: str):
    parser = build_parser()
    action = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    return action.choices[name]


@pytest.mark.parametrize("columns", ["60", "80", "200"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_usage_and_help_have_balanced_brackets(command, columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    sub = _subparser(command)
    usage = sub.format_usage()
    assert _balanced(usage), usage
    for option in sub._actions:  # each option's help on its own, as --help prints it
        assert _balanced(option.help or ""), (command, option.option_strings, option.help)


def test_the_readme_command_headings_have_balanced_brackets():
    headings = re.findall(r"^#+ `(prefdata [^`]*)`", (REPO / "README.md").read_text(encoding="utf-8"), re.M)
    assert any(h.startswith("prefdata refs") for h in headings)
    assert [h for h in headings if not _balanced(h)] == []
