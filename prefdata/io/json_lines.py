"""JSON lines: a file read line by line (read1, so a truncated gzip stream gives every complete line
before the break), each non-blank line one record.

`json_line_record` is the one place a line becomes a record; validate's and prepare's chunk
workers (prefdata.io.chunks) use it too.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from prefdata.core.records import RawRecord
from prefdata.io.json_decode import (
    GZIP_ERRORS,
    MAX_RAW_TEXT,
    MAX_RECORD_BYTES,
    clip_text,
    decode_error,
    decode_line,
    decoded_record,
    one_line,
    open_binary,
)

READ_CHUNK = 1 << 20  # bytes read at a time
NUL = b"\x00"


class Truncated(NamedTuple):
    """End marker from `read_lines`: the stream broke; `partial` is the unfinished line."""

    reason: str
    partial: bytes


class Overlong(NamedTuple):
    start: bytes


def read_lines(fh: BinaryIO) -> Iterator[bytes | Truncated | Overlong]:
    """Lines without their newline, read in chunks with read1.

    read1 hands over everything a truncated gzip stream decoded before it failed (readline would
    lose what sits in its buffer), so every complete line before the break is read.
    """
    carry = b""
    skipping = False  # inside a line longer than MAX_RECORD_BYTES
    while True:
        try:
            chunk = fh.read1(READ_CHUNK)
        except GZIP_ERRORS as exc:
            yield Truncated(f"truncated or corrupt gzip stream ({one_line(exc)})", carry)
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
            yield Overlong(carry[:MAX_RAW_TEXT])
            skipping = True
        if skipping:
            carry = b""


def iter_json_lines(file: Path, name: str, gz: bool) -> Iterator[RawRecord]:
    with open_binary(file, gz) as fh:
        line_no = 0
        for line in read_lines(fh):
            line_no += 1
            if type(line) is not bytes:
                yield broken_line(name, line_no, line)
                if isinstance(line, Truncated):
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
            raw_text=clip_text(line.decode("utf-8", "replace").rstrip("\r")),
        )
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RawRecord(
            name,
            line_no,
            error=f"invalid UTF-8 at byte {exc.start + 1} of the line",
            raw_text=clip_text(line.decode("utf-8", "replace").rstrip("\r")),
        )
    text = text.rstrip("\r")
    try:
        value = decode_line(text)
    except (ValueError, RecursionError) as exc:
        return RawRecord(name, line_no, error=decode_error(exc), raw_text=clip_text(text))
    return decoded_record(name, line_no, value, text)


def broken_line(name: str, line_no: int, marker: Truncated | Overlong) -> RawRecord:
    if isinstance(marker, Truncated):
        text = marker.partial.decode("utf-8", "replace")
        return RawRecord(name, line_no, error=marker.reason, raw_text=clip_text(text) or None)
    return RawRecord(
        name,
        line_no,
        error=f"record longer than {MAX_RECORD_BYTES // (1024 * 1024)} MiB",
        raw_text=clip_text(marker.start.decode("utf-8", "replace")),
    )
