"""Read raw records from preference-data files, streaming, without ever raising on a bad record.

Supported inputs: `.jsonl`, `.jsonl.gz`, `.json.gz`, `.json` (a top-level array, or JSON lines
despite the name), `.parquet`, `.arrow`, a directory of those (recursive, sorted), and a
`datasets.save_to_disk` directory (`state.json`, or `dataset_dict.json` with splits).

Per-record problems (bad JSON, invalid UTF-8, NUL bytes, a non-object value, a truncated gzip tail)
become a `RawRecord` with a one-line `error`; file-level problems (missing path, unsupported
extension, empty input, unreadable parquet) raise `PrefdataError`. Memory does not grow with the
number of rows: lines, JSON array items and Arrow record batches are read one at a time.

The formats themselves live in json_lines, json_array and arrow; this module finds the files and
dispatches each to its reader.
"""

from __future__ import annotations

import codecs
import gzip
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from prefdata.core.errors import PrefdataError
from prefdata.core.records import RawRecord
from prefdata.io.arrow import iter_arrow, iter_parquet
from prefdata.io.json_array import iter_json_array, iter_json_document
from prefdata.io.json_decode import GZIP_ERRORS, MAX_RECORD_BYTES, one_line, open_binary
from prefdata.io.json_lines import iter_json_lines
from prefdata.io.out_paths import name_parts

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet", ".arrow")
_DATASET_META = frozenset({"state.json", "dataset_info.json", "dataset_dict.json"})


# ---------------------------------------------------------------------------------------------
# Discovery


def input_kind(path: Path) -> str | None:
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
        raise PrefdataError(f"{path}: unreadable datasets state.json ({one_line(exc)})") from None
    files = [path.joinpath(*name_parts(path, str(name))) for name in names]  # `../x.arrow` would read elsewhere
    for file in files:
        if not file.is_file():
            raise PrefdataError(f"{path}: state.json lists {file.name}, which does not exist")
    return files


def _dataset_dict_files(path: Path) -> list[Path]:
    try:
        splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrefdataError(f"{path}: unreadable dataset_dict.json ({one_line(exc)})") from None
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
        elif input_kind(entry) is not None and entry.name not in _DATASET_META:
            files.append(entry)
        else:
            if entry not in _SKIPPED:  # a run lists its input more than once (checks, then reading)
                _SKIPPED.add(entry)
                log.warning("skipping %s: not a supported data file (%s)", entry, ", ".join(SUFFIXES))
    return files


_SKIPPED: set[Path] = set()  # unsupported files already named, so each "skipping" line shows once


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
    if input_kind(root) is None:
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
        for record in iter_file(file, name):
            count += 1
            yield record
    if count == 0:
        what = "empty file" if single else "no records in any file"
        raise PrefdataError(f"{path}: {what} (nothing to read)")


def iter_file(file: Path, name: str) -> Iterator[RawRecord]:
    kind = input_kind(file)
    if kind == ".parquet":
        yield from iter_parquet(file, name)
    elif kind == ".arrow":
        yield from iter_arrow(file, name)
    else:
        yield from _iter_json_file(file, name, gz=kind.endswith(".gz"), array_name=kind != ".jsonl")


def sniff_head(file: Path, gz: bool, array_name: bool) -> bytes:
    """The start of the first non-blank line (BOM stripped): JSON lines or a JSON array?

    Only a `.json` starting with '{' and a `.jsonl` starting with '[' need the whole first line
    (does it parse alone?); otherwise the first byte decides, so a minified array or a huge first
    record is never read whole here. read1 lets a truncated gzip stream show its beginning.
    """
    data = b""
    with open_binary(file, gz) as fh:
        while len(data) < MAX_RECORD_BYTES:
            try:
                part = fh.read1(1 << 16)
            except gzip.BadGzipFile:
                if not data:
                    raise PrefdataError(f"{file}: not a gzip file") from None
                break
            except GZIP_ERRORS:
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
    head = sniff_head(file, gz, array_name)
    if head.startswith(b"["):
        # `.json` starting with '[' is an array; so is a `.jsonl` whose first line is not a
        # complete value (a pretty-printed array misnamed).
        if array_name or not parses_as_json(head):
            yield from iter_json_array(file, name, gz)
            return
    elif array_name and head and not head.startswith(b"{"):
        raise PrefdataError(f"{file}: not a JSON array or JSON lines of objects")
    elif array_name and head.startswith(b"{") and not parses_as_json(head):
        yield from iter_json_document(file, name, gz)  # one pretty-printed object
        return
    yield from iter_json_lines(file, name, gz)


def parses_as_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True
