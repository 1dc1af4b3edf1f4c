"""A value read from a settings file, checked against its declared type where it is read.

TOML has types, so a setting gets exactly its own: a boolean is `true`/`false` (the string "false" is
truthy in Python: `trust_remote_code = "false"` would turn remote code on), an integer an integer, a
number a finite number within the bound its flag enforces. The flag's own parser (the one argparse
uses) then checks the range, so a file and the command line refuse the same values. Errors name the
file, table and key the value came from, since a pyproject.toml in the working directory can set a
value the user never typed.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.settings.declare import Declared


def _shown(value: Any) -> str:
    """The value as TOML wrote it, briefly (a hostile file may hold a megabyte in one string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = repr(value)
        return f"the string {text[:60]}{'...' if len(text) > 60 else ''}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, (int, float)):
        return repr(value)
    return f"a {type(value).__name__}"  # TOML dates and times


def _parts(item: Declared) -> set[str]:
    """The declared type's alternatives, None left out: `int | None` -> {"int"}; lists stay whole."""
    text = item.type.replace(" ", "")
    kinds = {"list"} if "list[" in text else set()
    if "dict[" in text:
        kinds.add("dict")
    bare = text.split("list[")[0].split("dict[")[0]
    return kinds | {part for part in bare.split("|") if part and part != "None"}


def _fail(where: str, expected: str, value: Any) -> PrefdataError:
    return PrefdataError(f"{where}: expected {expected}, got {_shown(value)}")


def _parsed(item: Declared, value: Any, where: str) -> Any:
    """The flag's parser on the value's text: the same range check as on the command line."""
    if item.spec.parse is None:
        return value
    # `keep = 300` is a number of pairs, `keep = 0.3` a share: the parser tells them apart by the text
    text = repr(float(value)) if isinstance(value, float) else str(value)
    try:
        parsed = item.spec.parse(text)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise PrefdataError(f"{where}: {exc}") from None
    return parsed


def checked(item: Declared, value: Any, where: str) -> Any:
    """`value` if it has the declared type (and passes the flag's range check), else a one-line
    PrefdataError naming `where` (file, table and key)."""
    parts = _parts(item)
    if item.spec.action in ("on", "off", "on/off") or parts == {"bool"}:
        if not isinstance(value, bool):
            raise _fail(where, "a boolean (true or false, unquoted)", value)
        return value
    if parts == {"int"}:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(where, "an integer", value)
        return _parsed(item, value, where) if item.spec.parse else value
    if parts == {"float"}:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(where, "a number", value)
        if not math.isfinite(value):
            raise _fail(where, "a finite number", value)
        return _parsed(item, value, where) if item.spec.parse else float(value)
    if "str" in parts and parts & {"int", "float"} and item.spec.parse:
        # a number or its text form (--keep 0.3 / "30%", show's --line 2 / "explicit.jsonl:2"): the flag's parser
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise _fail(where, "a number or a string", value)
        return _parsed(item, value, where)
    if "list" in parts:
        if isinstance(value, dict) and "dict" in parts:
            return value
        if isinstance(value, str) and "str" in parts:
            return value
        if isinstance(value, list) and all(isinstance(one, str) for one in value):
            return value
        words = "a table or an array of strings" if "dict" in parts else "a string or an array of strings"
        raise _fail(where, words, value)
    if not isinstance(value, str):
        raise _fail(where, "a string", value)
    if item.spec.choices and value not in item.spec.choices:
        raise PrefdataError(f"{where}: expected one of {', '.join(item.spec.choices)}, got {_shown(value)}")
    return value
