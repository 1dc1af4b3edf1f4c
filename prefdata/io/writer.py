"""Writes OUT/'s files: the Arrow dataset (datasets.save_to_disk layout), dropped.jsonl, quarantine.jsonl.

They are written into the staging directory (prefdata.io.out_dir), which `publish` swaps in. The
columns' Arrow types, and how a column of values becomes an array, are prefdata.io.columns.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from prefdata.io.columns import (
    CORE_COLUMNS,
    CORE_SCHEMA,
    IMAGES_TYPE,
    MESSAGE_COLUMNS,
    MESSAGE_NAMES,
    MESSAGES_TYPE,
    TEXT_COLUMNS,
    all_strings,
    column_array,
    content_parts,
    has_parts,
    is_messages_type,
    json_text_array,
    split_messages,
    wider_messages_type,
)
from prefdata.io.handoff import describe
from prefdata.io.messages import text_of

# Rows in a single Arrow file before starting the next shard (keeps files a manageable size).
ROWS_PER_SHARD = 500_000


def jsonl_line(record: dict[str, Any]) -> str:
    """One JSON-lines line of dropped.jsonl / quarantine.jsonl, newline included."""
    return json.dumps(record, ensure_ascii=False, default=str) + "\n"


class JsonlWriter:
    """dropped.jsonl / quarantine.jsonl, joined from the workers' parts (lines made by `jsonl_line`)."""

    def __init__(self, path: Path):
        self.path = path
        self._handle = open(path, "w", encoding="utf-8")
        self.count = 0

    def append_file(self, path: str | Path, lines: int) -> None:
        """Append a file of `lines` lines made by `jsonl_line` (a worker's part), then delete it."""
        self._handle.flush()
        with open(path, "rb") as part:
            shutil.copyfileobj(part, self._handle.buffer)
        self.count += lines
        os.unlink(path)

    def close(self) -> None:
        self._handle.close()


class DatasetWriter:
    """Streams rows into Arrow IPC stream files in the `datasets.save_to_disk` layout.

    Pass-through columns are typed per batch; when a later batch needs a wider type, the parts
    written so far are cast to the unified schema by `finish_dataset` (one streaming pass, rare).
    A column whose types cannot be unified is stored as JSON text and listed in `json_columns`.

    Text columns: string rows are strings, conversational rows TRL's message lists. An Arrow column
    has one type, so a dataset mixing both ("mixed") stores every text column as a string (messages
    rendered "role: content" as for the text checks) and keeps the messages of conversational rows
    in `prompt_messages`/`chosen_messages`/`rejected_messages` (null on string rows).
    """

    def __init__(self, directory: Path, prefix: str = "part"):
        self.directory = directory
        self.prefix = prefix  # of the part files' names (workers writing shards side by side differ here)
        # (file, schema, rows, columns already JSON-encoded when this part was written)
        self.parts: list[Part] = []
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._schema: pa.Schema | None = None
        self._rows_in_part = 0
        self.json_columns: set[str] = set()
        self.rows = 0
        self.text_kinds: set[str] = set()  # "strings" / "messages" seen so far

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        kinds = {"messages" if type(row.get("prompt")) is list else "strings" for row in rows}
        self.text_kinds |= kinds
        if len(self.text_kinds) > 1:
            rows = [split_messages(row) for row in rows]
        names = list(CORE_SCHEMA.names)
        extra = sorted({key for row in rows for key in row} - CORE_COLUMNS)
        names.extend(extra)
        json_before = len(self.json_columns)
        arrays = []
        for name in names:
            values = [row.get(name) for row in rows]
            array = json_text_array(values) if name in self.json_columns else column_array(name, values)
            if array.type == pa.string() and name not in CORE_COLUMNS and not all_strings(values):
                self.json_columns.add(name)
            arrays.append(array)
        table = pa.Table.from_arrays(arrays, names=names)
        if len(self.json_columns) != json_before:
            # A column turned JSON here: the open part holds it unencoded and is re-encoded by
            # finish_dataset, so these rows (encoded already) start a part of their own.
            self._close_part()
        self._write_table(table)
        self.rows += len(rows)

    def _write_table(self, table: pa.Table) -> None:
        if self._writer is not None and self._rows_in_part + table.num_rows > ROWS_PER_SHARD:
            self._close_part()
        if self._writer is not None and not table.schema.equals(self._schema):
            cast = _try_cast(table, self._schema)
            if cast is None:
                self._close_part()
            else:
                table = cast
        if self._writer is None:
            path = self.directory / f"{self.prefix}-{len(self.parts):05d}.arrow"
            self._schema = table.schema
            self._writer = pa.ipc.new_stream(str(path), table.schema)
            self.parts.append((path, table.schema, 0, frozenset(self.json_columns)))
        self._writer.write_table(table)
        self._rows_in_part += table.num_rows
        path, schema, rows, encoded = self.parts[-1]
        self.parts[-1] = (path, schema, rows + table.num_rows, encoded)

    def _close_part(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        self._schema = None
        self._rows_in_part = 0

    def close(self) -> "WrittenParts":
        """Close the open part; what was written, for `finish_dataset` (here or in another process)."""
        self._close_part()
        return WrittenParts(list(self.parts), self.json_columns, self.text_kinds, self.rows)


Part = tuple[Path, pa.Schema, int, frozenset[str]]  # (file, schema, rows, columns JSON-encoded in it)


def text_columns_of(text_kinds: set[str]) -> str:
    return "mixed" if len(text_kinds) > 1 else next(iter(text_kinds), "strings")


@dataclass
class WrittenParts:
    """The Arrow parts one or more DatasetWriters wrote, in dataset order, not yet one dataset.

    Picklable: a worker that wrote a shard returns it to the main process, which joins them all
    (`joined`) and finishes the dataset once (`finish_dataset`)."""

    parts: list[Part]
    json_columns: set[str]
    text_kinds: set[str]
    rows: int

    @property
    def text_columns(self) -> str:
        return text_columns_of(self.text_kinds)

    @classmethod
    def joined(cls, written: list["WrittenParts"]) -> "WrittenParts":
        return cls(
            [part for w in written for part in w.parts],
            set().union(*(w.json_columns for w in written)),
            set().union(*(w.text_kinds for w in written)),
            sum(w.rows for w in written),
        )


Rewrite = Callable[[list[tuple[Path, Path, set[str]]], pa.Schema], None]


def finish_dataset(
    directory: Path, written: WrittenParts, fingerprint: str, settings: dict[str, Any] | None, rewrite: Rewrite,
) -> tuple[pa.Schema, list[dict[str, Any]]]:
    """Unify the parts' schemas, name them data-XXXXX-of-YYYYY.arrow in order, and write datasets'
    state.json and dataset_info.json into `directory`.

    A part whose schema or JSON encoding differs from the final one is rewritten by `rewrite`, given
    the (part, final file, columns to JSON-encode) jobs and the schema (the pipeline hands them to its
    workers, which run `rewrite_part`); the others are only renamed. `fingerprint` (a content
    hash) becomes the datasets fingerprint, so caches keyed on it never confuse two different
    outputs written to the same OUT. `settings` travel in the DatasetInfo (prefdata.io.handoff),
    with `text_columns` added. `written.json_columns` gains the columns that could not be unified.
    Returns the schema and the data files in order, as the manifest lists them ({"file", "rows"})."""
    parts = written.parts
    if not parts:  # no rows kept: still a loadable, empty dataset with the core columns
        path = directory / "part-00000.arrow"
        with pa.ipc.new_stream(str(path), CORE_SCHEMA) as stream:
            stream.write_table(CORE_SCHEMA.empty_table())
        parts = [(path, CORE_SCHEMA, 0, frozenset())]
    schema = _final_schema(parts, written)
    total = len(parts)
    data_files, shards, jobs = [], [], []
    for index, (path, part_schema, rows, encoded) in enumerate(parts):
        final_path = directory / f"data-{index:05d}-of-{total:05d}.arrow"
        to_encode = (written.json_columns - encoded) & set(part_schema.names)
        if part_schema.equals(schema) and not to_encode:
            os.replace(path, final_path)
        else:
            jobs.append((path, final_path, to_encode))
        data_files.append({"filename": final_path.name})
        shards.append({"file": final_path.name, "rows": rows})
    if jobs:
        rewrite(jobs, schema)
        for path, _final, _encode in jobs:
            path.unlink()
    description = describe({**settings, "text_columns": written.text_columns}) if settings is not None else ""
    write_datasets_metadata(directory, schema, data_files, fingerprint, description)
    return schema, shards


def _final_schema(parts: list[Part], written: WrittenParts) -> pa.Schema:
    fields: dict[str, pa.Field] = {}
    mixed = len(written.text_kinds) > 1
    for _path, schema, _rows, _encoded in parts:
        for field in schema:
            if field.name in TEXT_COLUMNS or field.name in MESSAGE_NAMES:
                kind = field.type
                if field.name in TEXT_COLUMNS and mixed:
                    kind = pa.string()
                    message_name = MESSAGE_COLUMNS[field.name]
                    if is_messages_type(field.type):  # a messages part: its type decides *_messages
                        known = fields.get(message_name)
                        wide = field.type if known is None else wider_messages_type(known.type, field.type)
                        fields[message_name] = pa.field(message_name, wide)
                    else:
                        fields.setdefault(message_name, pa.field(message_name, MESSAGES_TYPE))
                known = fields.get(field.name)
                if known is not None and is_messages_type(known.type) and is_messages_type(kind):
                    kind = wider_messages_type(known.type, kind)
                fields[field.name] = pa.field(field.name, kind)
                continue
            if field.name in written.json_columns:
                fields[field.name] = pa.field(field.name, pa.string())
                continue
            known = fields.get(field.name)
            if known is None or known.type == field.type:
                fields.setdefault(field.name, field)
                continue
            try:
                merged = pa.unify_schemas([pa.schema([known]), pa.schema([field])], promote_options="permissive")
                fields[field.name] = merged.field(field.name)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                written.json_columns.add(field.name)
                fields[field.name] = pa.field(field.name, pa.string())
    ordered = list(CORE_SCHEMA.names) + sorted(set(fields) - CORE_COLUMNS)
    return pa.schema([fields[name] for name in ordered])


def _try_cast(table: pa.Table, schema: pa.Schema) -> pa.Table | None:
    """Cast `table` to `schema` when it only lacks columns or has null-typed ones; else None."""
    if set(table.schema.names) - set(schema.names):
        return None
    columns = []
    for field in schema:
        if field.name not in table.schema.names:
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if column.type == field.type:
            columns.append(column)
        elif column.type == pa.null():
            columns.append(pa.nulls(table.num_rows, field.type))
        else:
            return None
    return pa.Table.from_arrays(columns, schema=schema)


def rewrite_part(src: Path, dst: Path, schema: pa.Schema, to_encode: set[str]) -> None:
    with pa.ipc.open_stream(str(src)) as reader, pa.ipc.new_stream(str(dst), schema) as writer:
        for batch in reader:
            columns = []
            for field in schema:
                if field.name not in batch.schema.names:
                    base = field.name.removesuffix("_messages")
                    if MESSAGE_COLUMNS.get(base) == field.name and is_messages_type(batch.schema.field(base).type):
                        columns.append(_cast(batch.column(base), field.type))  # a messages part of a mixed dataset
                    else:
                        columns.append(pa.nulls(batch.num_rows, field.type))
                    continue
                column = batch.column(field.name)
                if field.name in TEXT_COLUMNS and field.type == pa.string() and column.type != field.type:
                    # messages in a mixed dataset
                    column = pa.array([text_of(v, field.name != "prompt") for v in column.to_pylist()], pa.string())
                elif field.name in to_encode:
                    column = json_text_array(column.to_pylist())
                elif column.type != field.type and is_messages_type(field.type) and has_parts(field.type):
                    # string contents in a dataset with image pairs: one text part each
                    column = pa.array(content_parts(column.to_pylist()) or column.to_pylist(), field.type)
                elif column.type != field.type:
                    column = _cast(column, field.type)
                columns.append(column)
            writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=schema))


def _cast(column: Any, target: pa.DataType) -> Any:
    """`column.cast(target)`; where pyarrow cannot cast, through Python values. pyarrow before 17
    cannot cast a struct to one with more fields (messages without `tool_calls` in one shard, with
    them in another), which `pa.array` fills with nulls in every release."""
    try:
        return column.cast(target)
    except (pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.array(column.to_pylist(), target)


def write_datasets_metadata(
    directory: Path, schema: pa.Schema, data_files: list[dict[str, str]], fingerprint: str, description: str = ""
) -> None:
    """The two small JSON files that make `datasets.load_from_disk(OUT)` work."""
    info = {"citation": "", "description": description, "features": features_dict(schema), "homepage": "",
            "license": ""}
    state = {
        "_data_files": data_files,
        "_fingerprint": fingerprint,
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (directory / "dataset_info.json").write_text(json.dumps(info, indent=2, sort_keys=True), encoding="utf-8")
    (directory / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")


# Arrow types datasets describes as Value(dtype): the dtype is the type's own name, but for these.
_VALUE_NAMES = {"float": "float32", "double": "float64", "halffloat": "float16"}
_VALUE_TYPES = frozenset(
    [pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.bool_(), pa.null(), pa.int8(), pa.int16(),
     pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(), pa.float16(), pa.float32(),
     pa.float64()]
)


def features_dict(schema: pa.Schema) -> dict[str, Any]:
    """`datasets.Features.from_arrow_schema(schema).to_dict()` (images as `List(Image())`, which
    load_from_disk decodes on access), built by hand for the types prepare writes: importing datasets
    costs prepare ~0.6 s of start-up (issue 45). Other types (and schemas carrying datasets' own
    metadata) still ask datasets."""
    features = {field.name: _feature(field.type) for field in schema}
    if schema.metadata or any(feature is None for feature in features.values()):
        from datasets import Features

        features = Features.from_arrow_schema(schema).to_dict()
    if "images" in schema.names and schema.field("images").type == IMAGES_TYPE:
        features["images"] = {"_type": "List", "feature": {"_type": "Image"}}
    return features


def _feature(kind: pa.DataType) -> dict[str, Any] | None:
    if kind in _VALUE_TYPES:
        return {"_type": "Value", "dtype": _VALUE_NAMES.get(str(kind), str(kind))}
    if pa.types.is_struct(kind):
        fields = {field.name: _feature(field.type) for field in kind}
        return None if any(feature is None for feature in fields.values()) else fields
    if pa.types.is_list(kind):
        item = _feature(kind.value_type)
        return None if item is None else {"_type": "List", "feature": item}
    return None
