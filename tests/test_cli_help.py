"""Every flag of every command explains itself in --help."""

from __future__ import annotations

import argparse

from prefdata.cli import build_parser


def _undocumented(parser: argparse.ArgumentParser, command: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _undocumented(sub, name)
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{command} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_flag_and_argument_of_every_command_has_a_help_line():
    assert _undocumented(build_parser(), "prefdata") == []


def test_train_help_explains_the_loss_settings(capsys):
    import pytest

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # help wraps with the terminal width
    for flag, words in (("--loss", "preference loss"), ("--beta", "KL"), ("--lr", "learning rate"), ("--epochs", "passes")):
        assert flag in text and words in text
