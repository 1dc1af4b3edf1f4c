"""The docs' flag tables, made from the declared settings.

A Markdown file holds a generated table between `<!-- flags: COMMAND -->` and `<!-- /flags -->`;
docs/cli.md is the whole reference. `python -m prefdata.settings.tables` rewrites them after a setting
changes; tests/settings/test_settings.py fails while they differ from the declaration.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from prefdata.settings.commands import COMMANDS, Command
from prefdata.settings.options import GROUP_ORDER
from prefdata.settings.declare import declared, with_flags

BLOCK = re.compile(r"(<!-- flags: (?P<command>[a-z-]+) -->\n).*?(<!-- /flags -->)", re.S)
REPO = Path(__file__).resolve().parents[2]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _flag_cell(command: Command, name: str) -> str:
    item = next(item for item in declared(command.settings) if item.name == name)
    spec = item.spec
    shown = item.flag
    if spec.action == "optional-value":
        shown = f"{item.flag} [{spec.metavar}]"
    elif spec.action == "on/off":
        shown = f"{item.flag}` / `--no-{item.flag[2:]}"
    elif spec.choices:
        shown = f"{item.flag} {'|'.join(spec.choices)}"
    elif spec.metavar and spec.action not in ("on", "off"):
        shown = f"{item.flag} {spec.metavar}{' ...' if spec.action == 'many' else ''}"
    return "`" + shown.replace("|", "\\|") + "`"  # a code span: only the table's bar needs escaping


def flag_table(name: str) -> str:
    """One command's flags: flag, TOML key, default, meaning (the `--help` text)."""
    command = COMMANDS[name]
    rows = ["| flag | TOML key | default | meaning |", "| --- | --- | --- | --- |"]
    for item in with_flags(command.settings, GROUP_ORDER):
        default = item.default_words() or ("off" if item.spec.action in ("on", "off") else "")
        flag, meaning = _flag_cell(command, item.name), _cell(item.meaning)
        rows.append(f"| {flag} | `{item.name}` | {_cell(default)} | {meaning} |")
    rows.append("| `--config FILE` | | | TOML settings file (flags override it) |")
    return "\n".join(rows) + "\n"


def _no_flag_table(command: Command) -> str:
    items = [item for item in declared(command.settings) if item.flag is None]
    if not items:
        return ""
    rows = ["Settings with no flag (Python keyword and TOML key only):", "",
            "| TOML key | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{item.name}` | {_cell(item.default_words() or '')} | {_cell(item.spec.help)} |" for item in items]
    return "\n".join(rows) + "\n\n"


def reference() -> str:
    """docs/cli.md: every command's positionals, flags and TOML keys."""
    parts = ["# Command-line reference\n\n",
             "Generated from the declared settings (`prefdata/settings/commands.py`) by "
             "`python -m prefdata.settings.tables`; do not edit by hand. Each flag's TOML key works at the top level "
             "of a config file (every command that has it) and in the command's own table (docs/settings.md); each is "
             "also the keyword of the command's Python function (docs/architecture.md).\n"]
    for command in COMMANDS.values():
        module, function = command.function.split(":")
        parts.append(f"\n## `prefdata {command.name}`\n\n{command.description} Python: `{module}.{function}`.\n\n")
        parts += [f"- `{p.metavar}`: {_cell(p.help)}\n" for p in command.positionals]
        parts.append(f"\n<!-- flags: {command.name} -->\n{flag_table(command.name)}<!-- /flags -->\n\n")
        parts.append(_no_flag_table(command))
    return "".join(parts).rstrip("\n") + "\n"


def rewritten(text: str) -> str:
    """`text` with every generated block made from the declaration."""
    return BLOCK.sub(lambda m: m.group(1) + flag_table(m.group("command")) + m.group(3), text)


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def main() -> int:
    (REPO / "docs" / "cli.md").write_text(reference(), encoding="utf-8")
    for path in documents():
        text = path.read_text(encoding="utf-8")
        if rewritten(text) != text:
            path.write_text(rewritten(text), encoding="utf-8")
            print(f"rewrote the flag tables of {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
