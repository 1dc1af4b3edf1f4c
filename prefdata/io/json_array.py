"""JSON arrays (one record per item, read incrementally) and a `.json` file holding one object.

Memory holds about one read chunk plus the current item, whatever the file size; a malformed item
becomes one record with a one-line error and reading goes on after it.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from prefdata.core.errors import PrefdataError
from prefdata.core.records import RawRecord
from prefdata.io.json_decode import (
    GZIP_ERRORS,
    JSON_DECODER,
    MAX_RECORD_BYTES,
    clip_text,
    decode_error,
    decode_message,
    decoded_record,
    one_line,
    open_binary,
)

ARRAY_CHUNK = 1 << 20  # bytes read at a time from a JSON array file


def iter_json_document(file: Path, name: str, gz: bool) -> Iterator[RawRecord]:
    """A `.json` file holding one (pretty-printed) object: one record."""
    if not gz and file.stat().st_size > MAX_RECORD_BYTES:
        raise PrefdataError(f"{file}: a single JSON object larger than 256 MiB; use JSON lines")
    with open_binary(file, gz) as fh:
        try:
            data = fh.read(MAX_RECORD_BYTES + 1)
        except GZIP_ERRORS as exc:
            yield RawRecord(name, 1, error=f"truncated or corrupt gzip stream ({one_line(exc)})")
            return
    text = data.removeprefix(codecs.BOM_UTF8).decode("utf-8", "replace")
    try:
        value = JSON_DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        yield RawRecord(name, 1, error=decode_error(exc), raw_text=clip_text(text))
        return
    yield decoded_record(name, 1, value, text)



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
        # `line_of`'s running count: newlines in the whole text before buf[_counted] (each newline
        # is counted once, so numbering every record costs one pass over the text).
        self._newlines = 0
        self._counted = 0
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
            except GZIP_ERRORS as exc:
                self.gzip_error = one_line(exc)
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
            self.line_of(self.pos)
            self.lines_before = self._newlines
            self.buf = self.buf[self.pos :]
            self.pos = 0
            self._counted = 0

    def line_of(self, pos: int) -> int:
        """1-based line of buf[pos], for a `pos` at or after the last one asked about."""
        self._newlines += self.buf.count("\n", self._counted, pos)
        self._counted = pos
        return self._newlines + 1

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
                value, end = JSON_DECODER.raw_decode(self.buf, self.pos)
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


def iter_json_array(file: Path, name: str, gz: bool) -> Iterator[RawRecord]:
    """Each item as a record at the line where it starts (so annotations and reports point at the
    item, as they do for JSON lines); a problem outside any item at the line where it is."""
    with open_binary(file, gz) as fh:
        stream = _ArrayStream(fh)
        if not stream.skip_ws():
            return  # empty file
        stream.pos += 1  # the '[' (checked by the sniffer)
        after_comma = False
        missing_comma = False
        while True:
            stream.compact()
            if not stream.skip_ws():
                reason = "file ends before the closing ']' (truncated JSON array)"
                if stream.gzip_error:
                    reason = f"truncated or corrupt gzip stream ({stream.gzip_error})"
                yield RawRecord(name, stream.line_of(stream.pos), error=reason)
                return
            char = stream.buf[stream.pos]
            if char == "]":
                if after_comma:
                    yield RawRecord(
                        name,
                        stream.line_of(stream.pos),
                        error=f"invalid JSON: trailing comma before ']' at {stream.where(stream.pos)}",
                    )
                stream.pos += 1
                if stream.skip_ws():
                    at = stream.where(stream.pos)
                    yield RawRecord(
                        name, stream.line_of(stream.pos), error=f"invalid JSON: extra data after the array at {at}"
                    )
                return
            start = stream.pos
            line = stream.line_of(start)
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
                    error = f"invalid JSON: {decode_message(result)} at {stream.where(result.pos)}"
                else:
                    error = decode_error(result) + f" at {stream.where(start)}"
                yield RawRecord(name, line, error=error, raw_text=clip_text(text.strip()))
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
                        line,
                        error=f"invalid UTF-8 at {stream.where(start + bad)}",
                        raw_text=clip_text(text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")),
                    )
                else:
                    yield decoded_record(name, line, value, text)
                stream.pos = end
            if not stream.skip_ws():
                continue  # reported as truncated at the top of the loop
            char = stream.buf[stream.pos]
            after_comma = char == ","
            missing_comma = char not in ",]"
            if after_comma:
                stream.pos += 1
