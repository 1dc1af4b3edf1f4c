"""JSON decoding for the readers: the reference decoder (duplicate keys refused), its fast orjson
path, and a decoded value turned into a RawRecord with a one-line error when it is not a record.

Also the few things every JSON reader shares: opening a (gzip) file, the size limits, and
clipping raw text for quarantine.jsonl.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from prefdata.core.errors import PrefdataError
from prefdata.core.records import RawRecord

MAX_RAW_TEXT = 64 * 1024  # raw_text kept per record (quarantine.jsonl must stay small)
MAX_RECORD_BYTES = 256 * 1024 * 1024  # a longer line/item is a broken file, not a record
# Levels of arrays and objects in a record (the record itself is level 1). Deeper records are
# quarantined: passing a value to a worker (pickle), rendering it in a template and checking it
# against a tool's schema all recurse, and would end the run with RecursionError instead.
MAX_NESTING = 100
TOO_DEEP = f"nesting too deep (more than {MAX_NESTING} levels of arrays and objects)"
GZIP_ERRORS = (EOFError, zlib.error, OSError)  # gzip.BadGzipFile is an OSError

class _DuplicateKey(ValueError):
    pass


def _pairs_to_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A duplicated key is ambiguous (json keeps the last silently): quarantine instead of guessing.
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"duplicate key {key!r}")
            seen.add(key)
    return result


JSON_DECODER = json.JSONDecoder(object_pairs_hook=_pairs_to_dict)

try:  # a fast parser for the common case; the stdlib decoder above stays the reference
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency, but json alone still works
    _fast_loads = None

_BIG_INT = re.compile(r"\d{19}")  # orjson turns integers beyond 64 bits into floats; json keeps them


# orjson reads an integer beyond 64 bits as a float, at least 2**63 in magnitude; smaller floats
# cannot have been such an integer, so only these make `decode_line` look for long digit runs.
_BIG_FLOAT = 9.2e18


def keys_big_floats(value: Any) -> tuple[int, bool]:
    """(keys of every object, whether any float of magnitude >= _BIG_FLOAT) of a decoded value."""
    keys = 0
    big = False
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            keys += len(item)
            children = item.values()
        elif kind is list:
            children = item
        else:
            big = big or (kind is float and abs(item) >= _BIG_FLOAT)
            continue
        for child in children:
            child_kind = type(child)
            if child_kind is dict or child_kind is list:
                stack.append(child)
            elif child_kind is float and abs(child) >= _BIG_FLOAT:
                big = True
    return keys, big


def nesting_exceeds(value: Any, text: str | None = None, limit: int = MAX_NESTING) -> bool:
    """Whether `value` nests arrays and objects more than `limit` levels deep. Given `text`, its
    JSON, most values are ruled out at C speed: a value cannot nest deeper than it has brackets."""
    if text is not None and text.count("[") + text.count("{") <= limit:
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is not dict and kind is not list:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in (item.values() if kind is dict else item))
    return False


def string_colons(value: Any) -> int:
    """':' characters inside every string (keys included) of a decoded value."""
    colons = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            colons += item.count(":")
        elif kind is dict:
            for key, child in item.items():
                colons += key.count(":")
                stack.append(child)
        elif kind is list:
            stack.extend(item)
    return colons


def decode_line(text: str) -> Any:
    """`JSON_DECODER.decode(text)`, through orjson when it is certain to give the same value.

    orjson keeps the last of duplicated keys silently; every ':' in valid JSON outside strings
    separates a key from its value, so the ':' in the text minus those in the decoded strings
    (plus the `\\u003a` escapes, which the text does not show as ':') equals the number of keys
    exactly when no key was dropped (when the text has no more ':' than keys, no string holds one
    and no key was dropped either) -- anything else goes to the stdlib decoder, which names the
    duplicate. So does everything orjson rejects (NaN, lone surrogates, deep nesting, ...) and
    any float that may have been an integer beyond 64 bits, so errors and values are unchanged.
    """
    if _fast_loads is not None:
        try:
            value = _fast_loads(text)
        except ValueError:
            return JSON_DECODER.decode(text)
        keys, big_floats = keys_big_floats(value)
        if big_floats and _BIG_INT.search(text):
            return JSON_DECODER.decode(text)
        colons = text.count(":")
        if colons == keys:  # no ':' in any string: nothing else to count
            return value
        escaped = text.count("\\u003a") + text.count("\\u003A") if "\\u003" in text else 0
        if colons - string_colons(value) + escaped == keys:
            return value
    return JSON_DECODER.decode(text)


def one_line(exc: BaseException | str) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def clip_text(text: str) -> str:
    if len(text) <= MAX_RAW_TEXT:
        return text
    return text[:MAX_RAW_TEXT] + f"...[truncated, {len(text) - MAX_RAW_TEXT} more characters]"


def _type_name(value: Any) -> str:
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, str):
        return "a JSON string"
    if value is None:
        return "JSON null"
    if isinstance(value, bool):
        return "a JSON boolean"
    return "a JSON number"


# A \uD800-\uDFFF escape: valid JSON syntax, but alone it decodes to a lone surrogate that no
# tokenizer or Arrow column can encode. Escaped pairs (emoji) are fine and combine when decoded.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (ValueError, RecursionError):
        return False
    return False


def decoded_record(name: str, line: int, value: Any, text: str) -> RawRecord:
    """A decoded value with its full source text; anything but an object is a record error."""
    if type(value) is dict:
        if nesting_exceeds(value, text):
            return RawRecord(name, line, error=f"invalid JSON: {TOO_DEEP}", raw_text=clip_text(text))
        if "\\u" in text and _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
            error = "invalid JSON string: lone surrogate escape (\\uD800-\\uDFFF)"
            return RawRecord(name, line, error=error, raw_text=clip_text(text))
        return RawRecord(name, line, value=value, raw_text=clip_text(text))
    return RawRecord(
        name, line, error=f"record is {_type_name(value)}, not a JSON object", raw_text=clip_text(text)
    )


def decode_message(exc: json.JSONDecodeError) -> str:
    return exc.msg.removesuffix(" at")  # "Unterminated string starting at" + our " at ..."


def decode_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {decode_message(exc)} at column {exc.colno}"
    if isinstance(exc, RecursionError):
        return f"invalid JSON: {TOO_DEEP}"
    return f"invalid JSON: {one_line(exc)}"


def open_binary(file: Path, gz: bool) -> BinaryIO:
    try:
        return gzip.open(file, "rb") if gz else open(file, "rb")  # noqa: SIM115
    except OSError as exc:
        raise PrefdataError(f"{file}: cannot open ({one_line(exc)})") from None

