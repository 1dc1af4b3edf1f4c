"""Raw input cut into chunks of consecutive records: the work units of `prepare` and `validate`
(prefdata.engine.local runs their stages on them in worker processes).

JSON lines (the common case) travel as the lines' bytes: the main process only splits the file into
lines (`json_lines.read_lines`, so truncated gzip streams and overlong lines read the same), and the
worker parses them. Every other input (JSON arrays, a single JSON document, Parquet, Arrow) is read
by `readers` in the main process and travels as RawRecords. A chunk never spans two files.

`chunk_records` turns a chunk back into exactly the RawRecords `readers.iter_raw_records` yields
for those lines. Its fast path takes orjson's value straight from the bytes when the reader would
keep it too, and leaves `raw_text` unset (only quarantined rows need it; `exact_record` re-reads
one record with it).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

from prefdata.core.errors import PrefdataError
from prefdata.core.records import RawRecord
from prefdata.io.images import inline_image_bytes
from prefdata.io.json_decode import keys_big_floats, open_binary, string_colons
from prefdata.io.json_lines import Overlong, Truncated, broken_line, json_line_record, read_lines
from prefdata.io.readers import input_kind, iter_file, list_input_files, parses_as_json, sniff_head

try:
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency; without it every line is exact
    _fast_loads = None

CHUNK_LINES = 2048  # records per chunk of non-JSON-lines input (or lines, where the main process splits them)
CHUNK_BYTES = 4 << 20  # bytes of JSON lines per chunk
LONG_LINE = 16 << 20  # a line longer than this is read by the main process (json_lines.read_lines)
_LONG_DIGITS = re.compile(rb"\d{19}")  # where orjson may have read an integer beyond 64 bits as a float

LineItem = Union[bytes, Truncated, Overlong]


@dataclass
class RangeChunk:
    """Bytes [start, end) of an uncompressed JSON-lines file, whole lines: the worker reads them
    itself, so the main process never touches the data. Its lines are numbered from 1 within the
    chunk (where it starts in the file is known once the chunks before it are counted)."""

    source_file: str
    path: str
    start: int
    end: int
    selection: "RecordSelection | None" = None  # a mixture's sample of the chunk's records (sets.mix)


@dataclass
class LinesChunk:
    """Consecutive lines of a JSON-lines file: `items[i]` is line `first_line + i` (or a marker
    for a broken stream or an overlong line, as `json_lines.read_lines` yields them)."""

    source_file: str
    first_line: int
    items: list[LineItem]
    selection: "RecordSelection | None" = None


@dataclass
class RecordsChunk:
    """Consecutive records already read (non-JSON-lines input)."""

    source_file: str
    records: list[RawRecord]
    selection: "RecordSelection | None" = None


Chunk = Union[RangeChunk, LinesChunk, RecordsChunk]


@dataclass(frozen=True)
class RecordSelection:
    """Which records of a chunk a mixture samples (prefdata.sets.mix), and the source they belong to.

    The chunk's records are positions `first`, `first + 1`, ... of their source; the sample keeps
    those whose key (prefdata.sets.sampling) is at or below `threshold` (prefdata.sets.mix
    `sampled_positions`). Set by the main process, which counted the records of the chunks before
    this one; the worker decides each record alone."""

    source: str  # the mixture's name for the source: the `source` column
    base: int
    threshold: int
    first: int


def iter_chunks(
    path: str | Path, max_lines: int | None = None, max_bytes: int | None = None, label: str | None = None
) -> Iterator[Chunk]:
    """Every record under `path` in `iter_raw_records` order, as chunks of about `max_bytes` bytes
    or `max_lines` lines (default CHUNK_BYTES, CHUNK_LINES); records read here (Parquet, Arrow) are
    weighed by the encoded images they hold, so image rows travel in chunks of about `max_bytes`.
    `label`: what a single file is called in `source_file` (default `path`), and the prefix of a
    directory's relative file names.

    File-level problems raise PrefdataError when reached, as `iter_raw_records` does; an input
    without any record is for the caller to detect (it sees the records, this only sees lines)."""
    max_lines = max_lines or CHUNK_LINES
    max_bytes = max_bytes or CHUNK_BYTES
    root = Path(path)
    files = list_input_files(root)
    single = not root.is_dir()
    for file in files:
        relative = file.relative_to(root).as_posix()
        name = (label or str(path)) if single else (f"{label.rstrip('/')}/{relative}" if label else relative)
        if not _is_json_lines(file):
            batch: list[RawRecord] = []
            size = 0  # encoded image bytes in the batch: image rows make smaller chunks
            for record in iter_file(file, name):
                batch.append(record)
                size += inline_image_bytes(record.value)
                if len(batch) >= max_lines or size >= max_bytes:
                    yield RecordsChunk(name, batch)
                    batch, size = [], 0
            if batch:
                yield RecordsChunk(name, batch)
        elif input_kind(file).endswith(".gz") or not file.is_file():  # type: ignore[union-attr]
            # Compressed (or not a regular file): no byte ranges; the main process splits the lines.
            yield from _line_chunks(file, name, 0, max_lines, max_bytes)
        else:
            yield from _range_chunks(file, name, max_lines, max_bytes)


def _is_json_lines(file: Path) -> bool:
    """Whether `readers.iter_file` reads `file` as JSON lines (the same decision, same errors)."""
    kind = input_kind(file)
    if kind in (".parquet", ".arrow") or kind is None:
        return False
    gz, array_name = kind.endswith(".gz"), kind != ".jsonl"
    head = sniff_head(file, gz, array_name)
    if head.startswith(b"["):
        return not (array_name or not parses_as_json(head))
    if array_name and head and not head.startswith(b"{"):
        raise PrefdataError(f"{file}: not a JSON array or JSON lines of objects")
    return not (array_name and head.startswith(b"{") and not parses_as_json(head))


def _range_chunks(file: Path, name: str, max_lines: int, max_bytes: int) -> Iterator[Chunk]:
    """Chunks of about `max_bytes` ending at a newline. A line longer than LONG_LINE switches the
    rest of the file to the main process's line reader (json_lines.read_lines knows overlong lines)."""
    with open_binary(file, False) as fh:
        size = fh.seek(0, 2)
        start = 0
        while start < size:
            end = _next_line_start(fh, start + max_bytes, size, LONG_LINE)
            if end is None:
                lines_before = _count_newlines(fh, start)
                yield from _line_chunks(file, name, lines_before, max_lines, max_bytes)
                return
            yield RangeChunk(name, str(file), start, end)
            start = end


def _next_line_start(fh: BinaryIO, offset: int, size: int, limit: int) -> int | None:
    """The start of the first line beginning at or after `offset` (`size` at the end); None when
    no newline comes within `limit` bytes."""
    if offset >= size:
        return size
    fh.seek(offset - 1)  # a newline right before `offset` ends the chunk there
    scanned = 0
    while True:
        block = fh.read(1 << 16)
        if not block:
            return size
        at = block.find(b"\n")
        if at >= 0:
            return offset + scanned + at if scanned + at <= limit else None
        scanned += len(block)
        if scanned > limit:
            return None


def _count_newlines(fh: BinaryIO, end: int) -> int:
    fh.seek(0)
    count = done = 0
    while done < end:
        block = fh.read(min(1 << 20, end - done))
        if not block:
            break
        count += block.count(b"\n")
        done += len(block)
    return count


def _line_chunks(file: Path, name: str, skip: int, max_lines: int, max_bytes: int) -> Iterator[LinesChunk]:
    """Lines from `json_lines.read_lines`, after the first `skip`, shipped as bytes."""
    with open_binary(file, input_kind(file).endswith(".gz")) as fh:  # type: ignore[union-attr]
        first, items, size = 1, [], 0
        for item in read_lines(fh):
            if first + len(items) <= skip:
                first += 1
                continue
            items.append(item)
            size += len(item) if type(item) is bytes else 0
            if isinstance(item, Truncated):
                break  # the reader stops at a broken stream
            if len(items) >= max_lines or size >= max_bytes:
                yield LinesChunk(name, first, items)
                first, items, size = first + len(items), [], 0
        if items:
            yield LinesChunk(name, first, items)


# ----------------------------------------------------------------------------- records of a chunk


def range_data(chunk: RangeChunk) -> bytes:
    """The bytes of a RangeChunk."""
    with open(chunk.path, "rb") as fh:
        fh.seek(chunk.start)
        return fh.read(chunk.end - chunk.start)


def line_count(data: bytes) -> int:
    """Lines in a RangeChunk's data, as `json_lines.read_lines` counts them (blank ones included)."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def chunk_records(chunk: Chunk, data: bytes | None = None) -> Iterator[tuple[RawRecord, int, int]]:
    """(record, offset, length) for the chunk's records in order (blank lines are not records),
    through the fast path. A RangeChunk's records (in `data`, from `range_data`) are numbered from
    1, and offset and length say where their line is in `data` (0, 0 for other chunks)."""
    if isinstance(chunk, RecordsChunk):
        for record in chunk.records:
            yield record, 0, 0
        return
    name = chunk.source_file
    if isinstance(chunk, LinesChunk):
        line_no = chunk.first_line
        for item in chunk.items:
            record = line_record(name, line_no, item, fast=True, file_start=line_no == 1)
            if record is not None:
                yield record, 0, 0
            line_no += 1
        return
    data = data if data is not None else range_data(chunk)
    view = memoryview(data)  # orjson reads a line in place: no copy of it
    size, start, line_no = len(data), 0, 1
    while start < size:
        end = data.find(b"\n", start)
        end = size if end < 0 else end
        value = _fast_value(data, view, start, end)
        if value is not None:
            yield RawRecord(name, line_no, value=value), start, end - start
        else:
            file_start = chunk.start == 0 and start == 0
            record = line_record(name, line_no, data[start:end], fast=False, file_start=file_start)
            if record is not None:
                yield record, start, end - start
        start, line_no = end + 1, line_no + 1


def record_count(chunk: Chunk) -> int:
    """How many records `chunk_records` yields for the chunk, without parsing them: every line but
    blank ones (a file's leading BOM aside), or every record already read."""
    if isinstance(chunk, RecordsChunk):
        return len(chunk.records)
    if isinstance(chunk, LinesChunk):
        count = 0
        for line_no, item in enumerate(chunk.items, start=chunk.first_line):
            if type(item) is not bytes:
                count += 1  # a broken stream or an overlong line: a record (with an error)
            else:
                count += bool(_without_bom(item, line_no == 1).strip())
        return count
    lines = range_data(chunk).split(b"\n")
    if chunk.start == 0 and lines:
        lines[0] = _without_bom(lines[0], True)
    return sum(1 for line in lines if line.strip())


def _without_bom(line: bytes, file_start: bool) -> bytes:
    return line[3:] if file_start and line.startswith(codecs.BOM_UTF8) else line


def exact_record(
    chunk: Chunk,
    position: int,
    source_line: int,
    span: tuple[int, int] | None = None,
    file: BinaryIO | None = None,
    data: bytes | None = None,
) -> RawRecord:
    """Record `position` of the chunk (at `source_line`), exactly as `iter_raw_records` yields it.
    A RangeChunk's record is cut from its `data` when given, else read again from the file (`file`,
    if open already): `span` is its line's (offset in the chunk, length)."""
    if isinstance(chunk, RecordsChunk):
        return chunk.records[position]
    if isinstance(chunk, RangeChunk):
        assert span is not None
        item: LineItem
        if data is not None:
            item = data[span[0] : span[0] + span[1]]
        else:
            fh = file if file is not None else open(chunk.path, "rb")
            try:
                fh.seek(chunk.start + span[0])
                item = fh.read(span[1])
            finally:
                if file is None:
                    fh.close()
        file_start = chunk.start == 0 and span[0] == 0
    else:
        item = chunk.items[source_line - chunk.first_line]
        file_start = source_line == 1
    record = line_record(chunk.source_file, source_line, item, fast=False, file_start=file_start)
    assert record is not None, "a blank line is not a record"
    return record


class LineNumbers:
    """Places a RangeChunk's lines (numbered from 1 within it) in its file, chunk after chunk in
    input order: the order-dependent part of reading byte ranges."""

    def __init__(self) -> None:
        self.next_line = 1  # of the next RangeChunk of the current file

    def offset(self, chunk: Chunk, line_count: int) -> int:
        """What to add to the chunk's line numbers; `line_count`: its lines (`line_count(data)`)."""
        if not isinstance(chunk, RangeChunk):
            return 0
        if chunk.start == 0:
            self.next_line = 1
        offset = self.next_line - 1
        self.next_line += line_count
        return offset


def line_record(name: str, line_no: int, item: LineItem, *, fast: bool, file_start: bool) -> RawRecord | None:
    """The record on one line (None for a blank line): `json_lines.iter_json_lines`, one line.
    `file_start`: this is the file's first line (where a BOM is dropped)."""
    if type(item) is not bytes:
        return broken_line(name, line_no, item)  # type: ignore[arg-type]
    line = item
    if file_start and line.startswith(codecs.BOM_UTF8):
        line = line[3:]
    if not line.strip():
        return None
    if fast:
        value = _fast_value(line, line, 0, len(line))
        if value is not None:
            return RawRecord(name, line_no, value=value)
    return json_line_record(name, line_no, line)


def _fast_value(data: bytes, view: bytes | memoryview, start: int, end: int) -> dict | None:
    """orjson's reading of the line data[start:end] (through `view`, without a copy) when the reader
    would read that very object from it, else None (the reader's own way decides).

    orjson refuses everything the reader turns into an error before decoding (a blank line, a BOM
    on a later line, NUL bytes, invalid UTF-8, lone surrogate escapes); of what it accepts, only
    duplicated keys (orjson keeps the last one silently, the reader refuses them) and integers
    beyond 64 bits (orjson makes them floats) read differently. Every ':' outside strings separates
    a key from its value, so the ':' in the line, less those inside strings (which show as ':' or
    as a \\u003a escape), equal the number of keys exactly when none was dropped; ':' is one byte
    in UTF-8, so the bytes can be counted."""
    if _fast_loads is None:
        return None
    try:
        value = _fast_loads(view[start:end])
    except ValueError:
        return None
    if type(value) is not dict:
        return None
    for item in value.values():
        if type(item) is not str:
            keys, big_floats = keys_big_floats(value)
            break
    else:  # a flat object of strings, the common row: no walk needed
        keys, big_floats = len(value), False
    if big_floats and _LONG_DIGITS.search(data, start, end):
        return None
    colons = data.count(b":", start, end)
    if colons != keys:  # some string holds a ':' (or a key was dropped): count those in strings
        escaped = 0
        if data.find(b"\\u003", start, end) >= 0:
            escaped = data.count(b"\\u003a", start, end) + data.count(b"\\u003A", start, end)
        if colons - string_colons(value) + escaped != keys:
            return None
    return value
