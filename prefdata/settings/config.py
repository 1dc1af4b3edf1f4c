"""Settings from a TOML file or `[tool.prefdata]` in pyproject.toml.

Precedence: command-line flags > `--config FILE` > `[tool.prefdata]` in ./pyproject.toml > defaults.
A file may set keys for every command at its top level and per command in a table:

    [tool.prefdata]
    tokenizer = "Qwen/Qwen2.5-0.5B-Instruct"
    [tool.prefdata.prepare]
    max_length = 2048
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.settings.commands import COMMANDS as DECLARED
from prefdata.settings.declare import names

COMMANDS = tuple(DECLARED)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise PrefdataError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise PrefdataError(f"config file {path} is not valid TOML: {exc}") from None


def load_settings(command: str, config_file: str | None, allowed: set[str] | None = None,
                  cwd: Path | None = None) -> dict[str, Any]:
    """Settings for `command` from the config file and pyproject.toml, validated against `allowed`
    (default: the command's declared settings, prefdata.settings.commands)."""
    if allowed is None:
        allowed = names(DECLARED[command].settings)
    merged: dict[str, Any] = {}
    pyproject = (cwd or Path.cwd()) / "pyproject.toml"
    sources: list[tuple[str, dict[str, Any]]] = []
    if pyproject.is_file():
        table = _read_toml(pyproject).get("tool", {}).get("prefdata")
        if table:
            sources.append((f"{pyproject} [tool.prefdata]", table))
    if config_file:
        sources.append((config_file, _read_toml(Path(config_file))))
    for origin, table in sources:
        merged.update(_settings_for(command, table, allowed, origin))
    return merged


def _settings_for(command: str, table: dict[str, Any], allowed: set[str], origin: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in table.items():
        if key in COMMANDS:
            continue
        name = key.replace("-", "_")
        # Top-level keys are shared; a key no command of this run knows is still a typo worth naming.
        if name in allowed:
            result[name] = value
        elif not isinstance(value, dict):
            _check_known_anywhere(name, origin)
    section = table.get(command, {})  # keys for this command only
    if not isinstance(section, dict):
        raise PrefdataError(f"{origin}: [{command}] must be a table")
    for key, value in section.items():
        name = key.replace("-", "_")
        if name not in allowed:
            raise PrefdataError(f"{origin}: unknown setting {key!r} for `prefdata {command}`")
        result[name] = value
    return result


# A top-level key is shared by the commands that have it: any command's declared setting is fine.
_KNOWN_SHARED = frozenset().union(*(names(command.settings) for command in DECLARED.values()))


def _check_known_anywhere(name: str, origin: str) -> None:
    if name not in _KNOWN_SHARED:
        raise PrefdataError(f"{origin}: unknown setting {name!r}")
