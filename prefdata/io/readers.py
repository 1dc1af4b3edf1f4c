"""Read raw records from preference-data files, streaming, without ever raising on a bad record.

Supported inputs: `.jsonl`, `.jsonl.gz`, `.json.gz`, `.json` (a top-level array, or JSON lines
despite the name), `.parquet`, `.arrow`, a directory of those (recursive, sorted), and a
`datasets.save_to_disk` directory (`state.json`, or `dataset_dict.json` with splits).

Per-record problems (bad JSON, invalid UTF-8, NUL bytes, a non-object value, a truncated gzip tail)
become a `RawRecord` with a one-line `error`; file-level problems (missing path, unsupported
extension, empty input, unreadable parquet) raise `PrefdataError`. Memory does not grow with the
number of rows: lines, JSON array items and Arrow record batches are read one at a time.
"""

from __future__ import annotations

import codecs
import gzip
import json
import logging
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from prefdata.errors import PrefdataError
from prefdata.records import RawRecord

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet", ".arrow")
MAX_RAW_TEXT = 64 * 1024  # raw_text kept per record (quarantine.jsonl must stay small)
MAX_RECORD_BYTES = 256 * 1024 * 1024  # a longer line/item is a broken file, not a record
ARRAY_CHUNK = 1 << 20  # bytes read at a time from a JSON array file
BATCH_ROWS = 1000  # rows converted to Python at a time from Arrow/Parquet
_DATASET_META = frozenset({"state.json", "dataset_info.json", "dataset_dict.json"})
_GZIP_ERRORS = (EOFError, zlib.error, OSError)  # gzip.BadGzipFile is an OSError
NUL = b"\x00"


# ---------------------------------------------------------------------------------------------
# Discovery


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return None


def _is_dataset_dir(path: Path) -> bool:
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def _dataset_arrow_files(path: Path) -> list[Path]:
    """The Arrow shards of a `save_to_disk` dataset, in the order `state.json` lists them."""
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrefdataError(f"{path}: unreadable datasets state.json ({_one_line(exc)})") from None
    files = [path / name for name in names]
    for file in files:
        if not file.is_file():
            raise PrefdataError(f"{path}: state.json lists {file.name}, which does not exist")
    return files


def _dataset_dict_files(path: Path) -> list[Path]:
    try:
        splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrefdataError(f"{path}: unreadable dataset_dict.json ({_one_line(exc)})") from None
    files: list[Path] = []
    for split in splits:
        files.extend(_walk(path / str(split)))
    return files


def _walk(directory: Path, seen: set[Path] | None = None) -> list[Path]:
    seen = set() if seen is None else seen
    real = directory.resolve()
    if real in seen:  # a symlink loop: each directory is read once
        return []
    seen.add(real)
    if _is_dataset_dir(directory):
        return _dataset_arrow_files(directory)
    if (directory / "dataset_dict.json").is_file():
        return _dataset_dict_files(directory)
    files: list[Path] = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.startswith("."):  # .git, .cache, editor files
            continue
        if entry.is_dir():
            files.extend(_walk(entry, seen))
        elif _kind(entry) is not None and entry.name not in _DATASET_META:
            files.append(entry)
        else:
            log.warning("skipping %s: not a supported data file (%s)", entry, ", ".join(SUFFIXES))
    return files


def list_input_files(path: str | Path) -> list[Path]:
    """The data files behind `path`, in the deterministic order records are read.

    A file is returned as is (if its extension is supported); a directory is walked recursively in
    sorted order (hidden entries and unsupported files skipped); a `save_to_disk` dataset gives its
    Arrow shards. Raises PrefdataError for a missing path, an unsupported extension, or a directory
    without any supported file.
    """
    root = Path(path)
    if not root.exists():
        raise PrefdataError(f"{path}: no such file or directory")
    if root.is_dir():
        files = _walk(root)
        if not files:
            raise PrefdataError(
                f"{path}: directory has no supported data files ({', '.join(SUFFIXES)})"
            )
        return files
    if _kind(root) is None:
        raise PrefdataError(
            f"{path}: unsupported file type (expected one of {', '.join(SUFFIXES)})"
        )
    return [root]


def iter_raw_records(path: str | Path) -> Iterator[RawRecord]:
    """Yield every record under `path` as a RawRecord, in a deterministic order.

    `source_file` is `path` itself for a single file, else the path relative to the directory.
    Raises PrefdataError (lazily, when iterated) for file-level problems, including an input
    with no records at all. Empty files inside a directory that has records elsewhere are fine.
    """
    root = Path(path)
    files = list_input_files(root)
    single = not root.is_dir()
    count = 0
    for file in files:
        name = str(path) if single else file.relative_to(root).as_posix()
        for record in _iter_file(file, name):
            count += 1
            yield record
    if count == 0:
        what = "empty file" if single else "no records in any file"
        raise PrefdataError(f"{path}: {what} (nothing to read)")


def _iter_file(file: Path, name: str) -> Iterator[RawRecord]:
    kind = _kind(file)
    if kind == ".parquet":
        yield from _iter_parquet(file, name)
    elif kind == ".arrow":
        yield from _iter_arrow(file, name)
    else:
        yield from _iter_json_file(file, name, gz=kind.endswith(".gz"), array_name=kind != ".jsonl")


# ---------------------------------------------------------------------------------------------
# JSON decoding helpers


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


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs_to_dict)

try:  # a fast parser for the common case; the stdlib decoder above stays the reference
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency, but json alone still works
    _fast_loads = None

_BIG_INT = re.compile(r"\d{19}")  # orjson turns integers beyond 64 bits into floats; json keeps them


# orjson reads an integer beyond 64 bits as a float, at least 2**63 in magnitude; smaller floats
# cannot have been such an integer, so only these make `_decode_line` look for long digit runs.
_BIG_FLOAT = 9.2e18


def _keys_big_floats(value: Any) -> tuple[int, bool]:
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


def _string_colons(value: Any) -> int:
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


def _decode_line(text: str) -> Any:
    """`_DECODER.decode(text)`, through orjson when it is certain to give the same value.

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
            return _DECODER.decode(text)
        keys, big_floats = _keys_big_floats(value)
        if big_floats and _BIG_INT.search(text):
            return _DECODER.decode(text)
        colons = text.count(":")
        if colons == keys:  # no ':' in any string: nothing else to count
            return value
        escaped = text.count("\\u003a") + text.count("\\u003A") if "\\u003" in text else 0
        if colons - _string_colons(value) + escaped == keys:
            return value
    return _DECODER.decode(text)


def _one_line(exc: BaseException | str) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def _clip(text: str) -> str:
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


def _record(name: str, line: int, value: Any, text: str) -> RawRecord:
    """A decoded value with its full source text; anything but an object is a record error."""
    if type(value) is dict:
        if "\\u" in text and _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
            error = "invalid JSON string: lone surrogate escape (\\uD800-\\uDFFF)"
            return RawRecord(name, line, error=error, raw_text=_clip(text))
        return RawRecord(name, line, value=value, raw_text=_clip(text))
    return RawRecord(
        name, line, error=f"record is {_type_name(value)}, not a JSON object", raw_text=_clip(text)
    )


def _msg(exc: json.JSONDecodeError) -> str:
    return exc.msg.removesuffix(" at")  # "Unterminated string starting at" + our " at ..."


def _decode_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid JSON: {_msg(exc)} at column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "invalid JSON: nesting too deep"
    return f"invalid JSON: {_one_line(exc)}"


# ---------------------------------------------------------------------------------------------
# JSON lines / JSON arrays


def _open_binary(file: Path, gz: bool) -> BinaryIO:
    try:
        return gzip.open(file, "rb") if gz else open(file, "rb")  # noqa: SIM115
    except OSError as exc:
        raise PrefdataError(f"{file}: cannot open ({_one_line(exc)})") from None


def _sniff(file: Path, gz: bool, array_name: bool) -> bytes:
    """The start of the first non-blank line (BOM stripped): JSON lines or a JSON array?

    Only a `.json` starting with '{' and a `.jsonl` starting with '[' need the whole first line
    (does it parse alone?); otherwise the first byte decides, so a minified array or a huge first
    record is never read whole here. read1 lets a truncated gzip stream show its beginning.
    """
    data = b""
    with _open_binary(file, gz) as fh:
        while len(data) < MAX_RECORD_BYTES:
            try:
                part = fh.read1(1 << 16)
            except gzip.BadGzipFile:
                if not data:
                    raise PrefdataError(f"{file}: not a gzip file") from None
                break
            except _GZIP_ERRORS:
                break  # truncated or corrupt: the readers report it as a record error
            if not part:
                break
            if not data and part.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise PrefdataError(f"{file}: file is UTF-16 encoded; prefdata reads UTF-8")
            data += part
            head = data.removeprefix(codecs.BOM_UTF8).lstrip()
            if head and head[:1] != (b"{" if array_name else b"["):
                return head[:1]  # the first byte decides; only these two cases need the line
            if head and b"\n" in head:
                break
    return data.removeprefix(codecs.BOM_UTF8).lstrip().split(b"\n", 1)[0]


def _iter_json_file(file: Path, name: str, gz: bool, array_name: bool) -> Iterator[RawRecord]:
    head = _sniff(file, gz, array_name)
    if head.startswith(b"["):
        # `.json` starting with '[' is an array; so is a `.jsonl` whose first line is not a
        # complete value (a pretty-printed array misnamed).
        if array_name or not _parses(head):
            yield from _iter_json_array(file, name, gz)
            return
    elif array_name and head and not head.startswith(b"{"):
        raise PrefdataError(f"{file}: not a JSON array or JSON lines of objects")
    elif array_name and head.startswith(b"{") and not _parses(head):
        yield from _iter_json_document(file, name, gz)  # one pretty-printed object
        return
    yield from _iter_json_lines(file, name, gz)


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _iter_json_document(file: Path, name: str, gz: bool) -> Iterator[RawRecord]:
    """A `.json` file holding one (pretty-printed) object: one record."""
    if not gz and file.stat().st_size > MAX_RECORD_BYTES:
        raise PrefdataError(f"{file}: a single JSON object larger than 256 MiB; use JSON lines")
    with _open_binary(file, gz) as fh:
        try:
            data = fh.read(MAX_RECORD_BYTES + 1)
        except _GZIP_ERRORS as exc:
            yield RawRecord(name, 1, error=f"truncated or corrupt gzip stream ({_one_line(exc)})")
            return
    text = data.removeprefix(codecs.BOM_UTF8).decode("utf-8", "replace")
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        yield RawRecord(name, 1, error=_decode_error(exc), raw_text=_clip(text))
        return
    yield _record(name, 1, value, text)


class _Truncated(NamedTuple):
    """End marker from `_read_lines`: the stream broke; `partial` is the unfinished line."""

    reason: str
    partial: bytes


class _Overlong(NamedTuple):
    start: bytes


def _read_lines(fh: BinaryIO) -> Iterator[bytes | _Truncated | _Overlong]:
    """Lines without their newline, read in chunks with read1.

    read1 hands over everything a truncated gzip stream decoded before it failed (readline would
    lose what sits in its buffer), so every complete line before the break is read.
    """
    carry = b""
    skipping = False  # inside a line longer than MAX_RECORD_BYTES
    while True:
        try:
            chunk = fh.read1(ARRAY_CHUNK)
        except _GZIP_ERRORS as exc:
            yield _Truncated(f"truncated or corrupt gzip stream ({_one_line(exc)})", carry)
            return
        if not chunk:
            if carry and not skipping:
                yield carry  # a last line without a trailing newline
            return
        lines = (carry + chunk).split(b"\n")
        carry = lines.pop()
        for line in lines:
            if skipping:
                skipping = False  # the newline ending the overlong line
                continue
            yield line
        if len(carry) > MAX_RECORD_BYTES and not skipping:
            yield _Overlong(carry[:MAX_RAW_TEXT])
            skipping = True
        if skipping:
            carry = b""


def _iter_json_lines(file: Path, name: str, gz: bool) -> Iterator[RawRecord]:
    with _open_binary(file, gz) as fh:
        line_no = 0
        for line in _read_lines(fh):
            line_no += 1
            if type(line) is not bytes:
                yield _broken_line(name, line_no, line)
                if isinstance(line, _Truncated):
                    return
                continue
            if line_no == 1 and line.startswith(codecs.BOM_UTF8):
                line = line[3:]
            if not line.strip():
                continue  # blank lines are not records
            yield json_line_record(name, line_no, line)


def json_line_record(name: str, line_no: int, line: bytes) -> RawRecord:
    """The record on one non-blank JSON line (BOM already dropped): its value, or a one-line error
    for NUL bytes, invalid UTF-8 or JSON that does not decode."""
    if NUL in line:
        return RawRecord(
            name,
            line_no,
            error=f"NUL byte at column {line.index(NUL) + 1}",
            raw_text=_clip(line.decode("utf-8", "replace").rstrip("\r")),
        )
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RawRecord(
            name,
            line_no,
            error=f"invalid UTF-8 at byte {exc.start + 1} of the line",
            raw_text=_clip(line.decode("utf-8", "replace").rstrip("\r")),
        )
    text = text.rstrip("\r")
    try:
        value = _decode_line(text)
    except (ValueError, RecursionError) as exc:
        return RawRecord(name, line_no, error=_decode_error(exc), raw_text=_clip(text))
    return _record(name, line_no, value, text)


def _broken_line(name: str, line_no: int, marker: _Truncated | _Overlong) -> RawRecord:
    if isinstance(marker, _Truncated):
        text = marker.partial.decode("utf-8", "replace")
        return RawRecord(name, line_no, error=marker.reason, raw_text=_clip(text) or None)
    return RawRecord(
        name,
        line_no,
        error=f"record longer than {MAX_RECORD_BYTES // (1024 * 1024)} MiB",
        raw_text=_clip(marker.start.decode("utf-8", "replace")),
    )


# Structural characters for skipping a malformed array item without decoding it.
_STRUCTURAL = re.compile(r'["{}\[\],]')
_STRING_END = re.compile(r'["\\]')
_WS = re.compile(r"[ \t\r\n]*")
_BAD_UTF8 = re.compile("[\udc80-\udcff]")  # surrogateescape marks for undecodable bytes


class _ArrayStream:
    """Incremental reader of a top-level JSON array: one item at a time via raw_decode.

    Text is decoded with surrogateescape so invalid UTF-8 only spoils the item that contains it.
    The buffer holds roughly one chunk plus the current item, whatever the file size.
    """

    def __init__(self, fh: BinaryIO):
        self.fh = fh
        self.decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.gzip_error: str | None = None
        self.lines_before = 0  # newlines in text already dropped from buf
        self.first = True
        self.has_bad_utf8 = False  # whether any chunk so far held invalid UTF-8 (rare: skip scans)

    def fill(self, at_least: int = ARRAY_CHUNK) -> bool:
        """Read more text; False at end of input."""
        if self.eof:
            return False
        # read1 in a loop: a truncated gzip stream still hands over what it decoded before failing.
        parts: list[bytes] = []
        got = 0
        while got < at_least:
            try:
                part = self.fh.read1(at_least - got)
            except _GZIP_ERRORS as exc:
                self.gzip_error = _one_line(exc)
                break
            if not part:
                break
            parts.append(part)
            got += len(part)
        data = b"".join(parts)
        text = self.decoder.decode(data, final=not data)
        if not self.has_bad_utf8 and not text.isascii():
            try:
                text.encode("utf-8")  # fails only on surrogateescape marks: undecodable bytes
            except UnicodeEncodeError:
                self.has_bad_utf8 = True
        if self.first:
            text = text.removeprefix("\ufeff")
            self.first = False
        self.buf += text
        if not data:
            self.eof = True
        return bool(data) or bool(text)

    def compact(self) -> None:
        """Drop consumed text; only between items, so no position held by a caller moves."""
        if self.pos > ARRAY_CHUNK and self.pos > len(self.buf) // 2:
            self.lines_before += self.buf.count("\n", 0, self.pos)
            self.buf = self.buf[self.pos :]
            self.pos = 0

    def skip_ws(self) -> bool:
        """Advance past whitespace; False if the input ends first."""
        if self.pos < len(self.buf) and self.buf[self.pos] not in " \t\r\n":
            return True  # the common case: no whitespace between items
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return True
            if not self.fill():
                return False

    def where(self, pos: int) -> str:
        line = self.lines_before + self.buf.count("\n", 0, pos) + 1
        col = pos - self.buf.rfind("\n", 0, pos)
        return f"line {line} column {col}"

    def decode_item(self) -> tuple[Any, int] | Exception:
        """Decode the value at pos, reading more input while it may be incomplete."""
        want = ARRAY_CHUNK
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                near_end = exc.pos >= len(self.buf) - 16 or exc.msg.startswith("Unterminated")
                if near_end and not self.eof and len(self.buf) - self.pos < MAX_RECORD_BYTES:
                    self.fill(want)
                    want *= 2
                    continue
                return exc
            except (ValueError, RecursionError) as exc:
                return exc
            if end >= len(self.buf) and not self.eof:
                # A number at the buffer end may continue in the next chunk.
                self.fill(want)
                continue
            return value, end

    def skip_item(self) -> int:
        """End position of a malformed item: the next ',' or ']' outside its own brackets.

        Best effort: a closer pops back to its matching opener, so one unclosed bracket inside
        an item does not swallow the rest of the file.
        """
        stack: list[str] = []
        pos = self.pos
        while True:
            match = _STRUCTURAL.search(self.buf, pos)
            if match is None:
                if len(self.buf) - self.pos > MAX_RECORD_BYTES or not self.fill():
                    return len(self.buf)
                continue
            char, pos = match.group(), match.start()
            if char == '"':
                end = self._string_end(pos + 1)
                if end is None:
                    if len(self.buf) - self.pos > MAX_RECORD_BYTES or not self.fill():
                        return len(self.buf)
                    continue  # rescan this string with more text
                pos = end
            elif char in "{[":
                stack.append(char)
                pos += 1
            elif char == ",":
                if not stack:
                    return pos
                pos += 1
            else:
                opener = "{" if char == "}" else "["
                if opener not in stack:
                    if char == "]":
                        return pos  # the array's own ']'
                    pos += 1  # a stray '}' is part of the bad item
                    continue
                while stack.pop() != opener:
                    pass
                pos += 1

    def _string_end(self, pos: int) -> int | None:
        while True:
            match = _STRING_END.search(self.buf, pos)
            if match is None:
                return None
            if match.group() == '"':
                return match.end()
            pos = match.end() + 1  # skip the escaped character


def _iter_json_array(file: Path, name: str, gz: bool) -> Iterator[RawRecord]:
    with _open_binary(file, gz) as fh:
        stream = _ArrayStream(fh)
        if not stream.skip_ws():
            return  # empty file
        stream.pos += 1  # the '[' (checked by the sniffer)
        index = 0
        after_comma = False
        missing_comma = False
        while True:
            stream.compact()
            if not stream.skip_ws():
                reason = "file ends before the closing ']' (truncated JSON array)"
                if stream.gzip_error:
                    reason = f"truncated or corrupt gzip stream ({stream.gzip_error})"
                yield RawRecord(name, index + 1, error=reason)
                return
            char = stream.buf[stream.pos]
            if char == "]":
                if after_comma:
                    yield RawRecord(
                        name,
                        index + 1,
                        error=f"invalid JSON: trailing comma before ']' at {stream.where(stream.pos)}",
                    )
                stream.pos += 1
                if stream.skip_ws():
                    at = stream.where(stream.pos)
                    yield RawRecord(
                        name, index + 1, error=f"invalid JSON: extra data after the array at {at}"
                    )
                return
            index += 1
            start = stream.pos
            result = (
                ValueError("missing ',' before this item")
                if missing_comma
                else stream.decode_item()
            )
            if isinstance(result, Exception):
                end = stream.skip_item()
                text = stream.buf[start:end]
                if stream.eof and end >= len(stream.buf) and stream.gzip_error:
                    error = f"truncated or corrupt gzip stream ({stream.gzip_error})"
                elif isinstance(result, json.JSONDecodeError):
                    error = f"invalid JSON: {_msg(result)} at {stream.where(result.pos)}"
                else:
                    error = _decode_error(result) + f" at {stream.where(start)}"
                yield RawRecord(name, index, error=error, raw_text=_clip(text.strip()))
                if end >= len(stream.buf) and stream.eof:
                    return  # the bad item runs to the end of input: one record for the tail
                stream.pos = end
            else:
                value, end = result
                text = stream.buf[start:end]
                bad_match = _BAD_UTF8.search(text) if stream.has_bad_utf8 else None
                if bad_match:
                    bad = bad_match.start()
                    yield RawRecord(
                        name,
                        index,
                        error=f"invalid UTF-8 at {stream.where(start + bad)}",
                        raw_text=_clip(text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")),
                    )
                else:
                    yield _record(name, index, value, text)
                stream.pos = end
            if not stream.skip_ws():
                continue  # reported as truncated at the top of the loop
            char = stream.buf[stream.pos]
            after_comma = char == ","
            missing_comma = char not in ",]"
            if after_comma:
                stream.pos += 1


# ---------------------------------------------------------------------------------------------
# Arrow / Parquet


def _iter_batches(batches: Iterator[Any], name: str, label: str) -> Iterator[RawRecord]:
    index = 0
    try:
        for batch in batches:
            for start in range(0, batch.num_rows, BATCH_ROWS):
                for row in batch.slice(start, BATCH_ROWS).to_pylist():
                    index += 1
                    yield RawRecord(name, index, value=row)
    except Exception as exc:  # noqa: BLE001 - a corrupt page must not become a traceback
        yield RawRecord(
            name, index + 1, error=f"unreadable {label} data after row {index} ({_one_line(exc)})"
        )


def _iter_parquet(file: Path, name: str) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise PrefdataError(f"{file}: cannot open as parquet ({_one_line(exc)})") from None
    with parquet:
        yield from _iter_batches(parquet.iter_batches(batch_size=BATCH_ROWS), name, "parquet")


def _iter_arrow(file: Path, name: str) -> Iterator[RawRecord]:
    """Arrow IPC: the stream format (what `save_to_disk` writes) or the file format."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(file))
        try:
            reader = pa.ipc.open_stream(source)
            batches = iter(reader)
        except pa.ArrowInvalid:
            source.seek(0)
            file_reader = pa.ipc.open_file(source)
            batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
    except Exception as exc:  # noqa: BLE001
        raise PrefdataError(f"{file}: cannot open as Arrow ({_one_line(exc)})") from None
    with source:
        yield from _iter_batches(batches, name, "Arrow")
