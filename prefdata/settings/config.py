"""Settings from a TOML file or `[tool.prefdata]` in pyproject.toml.

Precedence: command-line flags > `--config FILE` > `[tool.prefdata]` in ./pyproject.toml > defaults.
A file may set keys for every command at its top level and per command in a table. A `--config` file
takes either layout (or both): plain tables,

    tokenizer = "Qwen/Qwen2.5-0.5B-Instruct"
    [prepare]
    max_length = 2048

or pyproject.toml's (so `--config pyproject.toml` of another project works too):

    [tool.prefdata]
    tokenizer = "Qwen/Qwen2.5-0.5B-Instruct"
    [tool.prefdata.prepare]
    max_length = 2048

A table named after no command (`[prepair]`) and a key no command has are errors that name them;
every value is checked against its declared type where it is read (prefdata.settings.values).
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.settings.commands import COMMANDS as DECLARED
from prefdata.settings.declare import declared, names
from prefdata.settings.trust import Sourced
from prefdata.settings.values import checked

COMMANDS = tuple(DECLARED)
MAX_BYTES = 1 << 20  # a settings file is a few lines; /dev/zero must not be read to the end
# pyproject.toml's own tables: not prefdata's, left alone in a --config file of that layout.
PYPROJECT_TABLES = frozenset({"tool", "project", "build-system", "dependency-groups"})
# A top-level key is shared by the commands that have it: any command's declared setting is fine.
_KNOWN_SHARED = frozenset().union(*(names(command.settings) for command in DECLARED.values()))


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file as a table; a missing, unreadable, oversized, non-UTF-8 or invalid file is one line."""
    if path.is_dir():
        raise PrefdataError(f"config file {path} is a directory, not a TOML file")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise PrefdataError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise PrefdataError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise PrefdataError(f"config file {path} is larger than {MAX_BYTES // (1 << 20)} MiB; a settings file "
                            "is a few lines of TOML")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrefdataError(f"config file {path} is not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PrefdataError(f"config file {path} is not valid TOML: {exc}") from None


def load_settings(command: str, config_file: str | None, allowed: set[str] | None = None,
                  cwd: Path | None = None) -> dict[str, Any]:
    """Settings for `command` from the config file and pyproject.toml, type-checked, validated against
    `allowed` (default: the command's declared settings, prefdata.settings.commands)."""
    return {name: got.value for name, got in load_sourced(command, config_file, allowed, cwd).items()}


def load_sourced(command: str, config_file: str | None, allowed: set[str] | None = None,
                 cwd: Path | None = None) -> dict[str, Sourced]:
    """As load_settings, each value with the file, table and key it came from."""
    if allowed is None:
        allowed = names(DECLARED[command].settings)
    pyproject = (cwd / "pyproject.toml") if cwd else Path("pyproject.toml")
    merged: dict[str, Sourced] = {}
    if pyproject.is_file():
        merged.update(_from_document(command, read_toml(pyproject), str(pyproject), allowed, pyproject=True))
    if config_file:
        merged.update(_from_document(command, read_toml(Path(config_file)), config_file, allowed, pyproject=False))
    items = {item.name: item for item in declared(DECLARED[command].settings)} if command in DECLARED else {}
    for name, got in merged.items():
        if name in items:
            merged[name] = Sourced(checked(items[name], got.value, got.where), got.file, got.table, got.key)
    return merged


def _kind(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), "a value")


def _tool_table(document: dict[str, Any], file: str) -> dict[str, Any] | None:
    """`[tool.prefdata]`, when the file has one; a `tool` or `tool.prefdata` that is no table is an error."""
    if "tool" not in document:
        return None
    tool = document["tool"]
    if not isinstance(tool, dict):
        raise PrefdataError(f"{file}: `tool` must be a table ([tool.prefdata]), got {_kind(tool)}")
    if "prefdata" not in tool:
        near = difflib.get_close_matches("prefdata", [str(key) for key in tool], n=1, cutoff=0.85)  # not tool.prefdata-lint
        if near:
            raise PrefdataError(f"{file}: unknown table [tool.{near[0]}]; did you mean [tool.prefdata]?")
        return None
    table = tool["prefdata"]
    if not isinstance(table, dict):
        raise PrefdataError(f"{file}: `tool.prefdata` must be a table ([tool.prefdata]), got {_kind(table)}")
    return table


def _from_document(command: str, document: dict[str, Any], file: str, allowed: set[str],
                   pyproject: bool) -> dict[str, Sourced]:
    tool = _tool_table(document, file)
    result: dict[str, Sourced] = {}
    if not pyproject:  # a --config file: plain tables, beside pyproject's own (ignored) ones
        plain = {key: value for key, value in document.items() if key not in PYPROJECT_TABLES}
        result.update(_from_table(command, plain, file, "", allowed))
    if tool is not None:
        result.update(_from_table(command, tool, file, "tool.prefdata", allowed))
    return result


def _from_table(command: str, table: dict[str, Any], file: str, prefix: str, allowed: set[str]) -> dict[str, Sourced]:
    """Settings for `command` from one layout's top level (`prefix`) and its `[COMMAND]` table."""
    result: dict[str, Sourced] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in COMMANDS:
            if not isinstance(value, dict):
                label = f"{prefix}.{key}" if prefix else key
                raise PrefdataError(f"{file}: [{label}] must be a table of `prefdata {key}` settings, got {_kind(value)}")
            continue
        if name not in _KNOWN_SHARED:
            _unknown(file, prefix, key, isinstance(value, dict))
        if name in allowed:  # a top-level key that only other commands take is theirs: ignored here
            result[name] = Sourced(value, file, prefix, key)
    section = table.get(command, {})
    label = f"{prefix}.{command}" if prefix else command
    for key, value in section.items():
        name = key.replace("-", "_")
        if name not in allowed:
            near = difflib.get_close_matches(name, sorted(allowed), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise PrefdataError(f"{file}: unknown setting {key!r} in [{label}] for `prefdata {command}`{hint}")
        result[name] = Sourced(value, file, label, key)
    return result


def _unknown(file: str, prefix: str, key: str, is_table: bool) -> None:
    label = f"{prefix}.{key}" if prefix else key
    if is_table:
        near = difflib.get_close_matches(key, COMMANDS, n=1)
        hint = f"did you mean [{prefix + '.' if prefix else ''}{near[0]}]? " if near else ""
        raise PrefdataError(f"{file}: unknown table [{label}]; {hint}a table is named after a command "
                            f"({', '.join(COMMANDS)})")
    near = difflib.get_close_matches(key.replace("-", "_"), sorted(_KNOWN_SHARED), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    where = f" in [{prefix}]" if prefix else ""
    raise PrefdataError(f"{file}: unknown setting {key!r}{where}{hint}")
