"""The texts made from the checks (prefdata.checks.units): core/flags.py, the default policy's `[flags]`
table and the flag table of docs/checks.md.

`python -m prefdata.checks.generated` writes them (as `python -m prefdata.settings.tables` writes the
settings' tables); tests/checks/test_units.py fails while a file differs from what these functions make,
so a check's words are written once, in its unit.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

from prefdata.checks.units import CHECKS, Check

FLAGS_MODULE = "prefdata/core/flags.py"
DEFAULT_POLICY = "prefdata/policies/default.toml"
PR_POLICY = "prefdata/policies/pr.toml"
FLAG_TABLE_PAGE = "docs/checks.md"  # the page that holds the flag table (moved out of the README, issue 44)
# docs/checks.md's table sits between these two lines.
TABLE = re.compile(r"(<!-- checks -->\n).*?(<!-- /checks -->)", re.S)
_POLICY_FLAGS = re.compile(r"(\[flags\]\n).*?(\n\[thresholds\])", re.S)


def flags_module() -> str:
    """core/flags.py: each flag's name as a constant, ALL_FLAGS in the checks' order, TOKEN_FLAGS."""
    lines = [
        '"""Stable flag names, generated from the checks (prefdata/checks/units/, one module per check, with its',
        "meaning, default severity and hint) by `python -m prefdata.checks.generated`: do not edit by hand. Policies,",
        'reports and tests refer to these constants."""',
        "",
    ]
    lines += [f'{check.name.upper()} = "{check.name}"' for check in CHECKS]
    lines += ["", "ALL_FLAGS: tuple[str, ...] = ("]
    lines += [f"    {check.name.upper()}," for check in CHECKS]
    lines += [")", "", "# Flags that need token ids (only computed when a tokenizer is given or the rows are pre-tokenized).",
              "TOKEN_FLAGS = frozenset({"]
    lines += [f"    {check.name.upper()}," for check in CHECKS if check.tokens]
    lines += ["})", ""]
    return "\n".join(lines)


def _policy_line(check: Check) -> str:
    line = f'{check.name} = "{check.severity}"'
    return f"{line}  # {check.note}" if check.note else line


def default_policy(text: str) -> str:
    """default.toml's `text` with its `[flags]` table made from the checks (the rest stays as written)."""
    table = "\n".join(_policy_line(check) for check in CHECKS) + "\n"
    return _POLICY_FLAGS.sub(lambda m: m.group(1) + table + m.group(2), text, count=1)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def readme_table(pr_policy: str) -> str:
    """docs/checks.md's flag table: flag, meaning, default severity (and pr.toml's where it differs)."""
    strict = tomllib.loads(pr_policy).get("flags", {})
    rows = ["| flag | meaning | default |", "| --- | --- | --- |"]
    for check in CHECKS:
        default = check.severity
        if strict.get(check.name, check.severity) != check.severity:
            default += f" (`pr.toml`: {strict[check.name]})"
        rows.append(f"| `{check.name}` | {_cell(check.doc or check.meaning)} | {default} |")
    return "\n".join(rows) + "\n"


def readme(text: str, pr_policy: str) -> str:
    """`text` (a Markdown file) with its flag table made from the checks."""
    return TABLE.sub(lambda m: m.group(1) + readme_table(pr_policy) + m.group(2), text)


def main() -> int:
    """Write core/flags.py, default.toml's `[flags]` and docs/checks.md's flag table from the checks."""
    repo = Path(__file__).resolve().parents[2]
    pr_policy = (repo / PR_POLICY).read_text(encoding="utf-8")
    made: dict[str, Callable[[str], str]] = {
        FLAGS_MODULE: lambda text: flags_module(), DEFAULT_POLICY: default_policy,
        FLAG_TABLE_PAGE: lambda text: readme(text, pr_policy),
    }
    for name, make in made.items():
        path = repo / name
        text = path.read_text(encoding="utf-8")
        if make(text) != text:
            path.write_text(make(text), encoding="utf-8")
            print(f"rewrote {name} from the checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
