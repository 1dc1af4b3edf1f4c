"""What `validate` refuses to take from a settings file.

validate checks pull requests, and a pull request can change every file of the checkout it runs in:
./pyproject.toml and any `--config` file there. So a setting read from a file must not make validate
run code, write where the file says, or read more than the checkout. The settings below are taken
from the command line only (the workflow's own step, which the pull request's data cannot change);
a settings file that turns one on is an error naming the file and key. An error, not a notice that
ignores the key: the check then fails where someone tried, instead of passing with a line in a CI log
nobody reads. docs/settings.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError


@dataclass(frozen=True)
class Sourced:
    """A setting's value and where in which settings file it was read."""

    value: Any
    file: str
    table: str  # "" at the top level, else e.g. "tool.prefdata.validate"
    key: str  # as written in the file

    @property
    def where(self) -> str:
        return f"{self.file} [{self.table}] {self.key}" if self.table else f"{self.file} {self.key}"


# Never from a settings file, with why (validate).
FLAG_ONLY: dict[str, dict[str, str]] = {"validate": {
    "trust_remote_code": "it runs Python code shipped in the tokenizer or processor directory",
    "allowed_image_root": "it lets image paths in the rows read more of the disk",
    "output": "it chooses a file for validate to write",
    "ray_address": "it connects to a Ray cluster, whose protocol unpickles what the cluster sends",
    "trainer_python": "it names a program for validate to run",
}}

# Files validate reads: from a settings file they must lie inside the working directory (the checkout),
# `..` and symlinks resolved. A bundled name (`pr`) or a Hub id (`org/name`) is a relative name and passes.
INSIDE_ONLY: dict[str, tuple[str, ...]] = {"validate": (
    "tokenizer", "processor", "chat_template_file", "policy", "baseline", "against", "decontaminate_against")}

_OFF = (None, False, "", [], ())


def _inside(value: str, cwd: Path) -> bool:
    root = cwd.resolve()
    where = (cwd / value).resolve()  # an absolute value replaces cwd
    return where == root or root in where.parents


def check_from_files(command: str, from_files: dict[str, Sourced], flags: dict[str, str | None],
                     cwd: Path | None = None) -> None:
    """Refuse what `command` must not take from a settings file. `from_files`: the settings that came from
    a file and were not overridden on the command line; `flags`: each setting's flag, for the message."""
    cwd = cwd or Path.cwd()
    for name, why in FLAG_ONLY.get(command, {}).items():
        got = from_files.get(name)
        if got is not None and got.value not in _OFF:
            raise PrefdataError(
                f"{got.where}: `prefdata {command}` takes {name} from its flag only ({flags.get(name) or name}), "
                f"never from a settings file a pull request can change: {why}")
    for name in INSIDE_ONLY.get(command, ()):
        got = from_files.get(name)
        values = got.value if got is not None and isinstance(got.value, list) else [got.value] if got else []
        for value in values:
            if isinstance(value, str) and value and not _inside(value, cwd):
                raise PrefdataError(
                    f"{got.where}: {value!r} leads outside the working directory; `prefdata {command}` reads only "
                    f"files inside it when a settings file names them (a pull request can change that file): pass "
                    f"{flags.get(name) or name} on the command line instead")
