"""OUT's columns in Arrow: the core columns' fixed types (the output contract), TRL's message lists
(with the fields chat templates read, and content parts for image pairs), the images, and a column
of Python values as one Arrow array (values Arrow cannot type consistently become JSON text).
"""

from __future__ import annotations

import json
from array import array
from typing import Any

import numpy as np
import pyarrow as pa

from prefdata.io.messages import text_of

ID_TYPE = pa.list_(pa.int32())

# Core columns and their fixed Arrow types (the output contract). Pass-through columns follow.
CORE_SCHEMA = pa.schema(
    [
        ("prompt", pa.string()),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("prompt_ids", ID_TYPE),
        ("chosen_ids", ID_TYPE),
        ("rejected_ids", ID_TYPE),
        ("flags", pa.list_(pa.string())),
        ("source_file", pa.string()),
        ("source_line", pa.int64()),
    ]
)
CORE_COLUMNS = frozenset(CORE_SCHEMA.names)
# Conversational rows keep TRL's message format in the text columns (see `DatasetWriter`): role and
# content, plus the other fields a chat template reads where the data has them (records.Message).
_TOOL_CALL_TYPE = pa.struct(
    [("id", pa.string()), ("type", pa.string()),
     ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))]
)
MESSAGE_FIELD_TYPES: dict[str, pa.DataType] = {
    "role": pa.string(),
    "content": pa.string(),
    "reasoning_content": pa.string(),
    "tool_calls": pa.list_(_TOOL_CALL_TYPE),
    "tool_call_id": pa.string(),
    "name": pa.string(),
}


# Image pairs: content as TRL's list of parts ({"type": "text", "text"} / {"type": "image"}), and
# the images as datasets.Image stores them (a list of {bytes, path}; `load_from_disk` decodes them).
CONTENT_PARTS_TYPE = pa.list_(pa.struct([("type", pa.string()), ("text", pa.string())]))
IMAGES_TYPE = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


def messages_type(fields: Any = (), parts: bool = False) -> pa.DataType:
    """The message-list type with role, content and the optional `fields`, in a fixed order (so that
    parts written with different fields unify by adding null fields). `parts`: content is a list
    of parts (a dataset with image pairs stores every content that way)."""
    wanted = {"role", "content", *fields}
    return pa.list_(pa.struct([
        (name, CONTENT_PARTS_TYPE if parts and name == "content" else kind)
        for name, kind in MESSAGE_FIELD_TYPES.items() if name in wanted
    ]))


def has_parts(kind: pa.DataType) -> bool:
    return any(f.name == "content" and f.type == CONTENT_PARTS_TYPE for f in kind.value_type)


def content_parts(values: list[Any]) -> list[Any] | None:
    """A messages column's values with every content as a list of parts, when some message has
    image parts; else None (the common case: one pass of type checks, nothing copied)."""
    if not any(type(m.get("content")) is list for messages in values for m in messages or ()):
        return None
    return [None if messages is None else [_message_parts(m) for m in messages] for messages in values]


def _message_parts(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if type(content) is list:
        return message
    return {**message, "content": [] if content is None else [{"type": "text", "text": content}]}


MESSAGES_TYPE = messages_type()


def _message_fields(values: list[Any]) -> set[str]:
    """The optional message fields used in a column's message lists (most rows have none)."""
    found: set[str] = set()
    for messages in values:
        for message in messages or ():
            if len(message) > 2:
                found.update(message)
    return found & MESSAGE_FIELD_TYPES.keys()


def is_messages_type(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) and pa.types.is_struct(kind.value_type)


def wider_messages_type(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    return messages_type({f.name for f in a.value_type} | {f.name for f in b.value_type}, has_parts(a) or has_parts(b))


TEXT_COLUMNS = ("prompt", "chosen", "rejected")
MESSAGE_COLUMNS = {name: f"{name}_messages" for name in TEXT_COLUMNS}  # used by mixed datasets only
MESSAGE_NAMES = frozenset(MESSAGE_COLUMNS.values())
_ID_COLUMNS = frozenset({"prompt_ids", "chosen_ids", "rejected_ids"})
_LOSS_START_COLUMNS = frozenset({"chosen_loss_start", "rejected_loss_start"})  # --loss-on answer
# Per-token loss masks of completions holding turns the model did not write (null on the other rows).
LOSS_MASK_TYPE = pa.list_(pa.int8())
_LOSS_MASK_COLUMNS = frozenset({"chosen_loss_mask", "rejected_loss_mask"})


def _ids_array(values: list[Any]) -> pa.Array | None:
    """list<int32> column straight from array('i') rows (what prepare's workers send): offsets and
    one concatenated buffer, no per-id conversion. None when some row is not such an array."""
    if not all(isinstance(v, array) and v.typecode == "i" for v in values):
        return None
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(ids) for ids in values], out=offsets[1:])
    # One buffer of the final size, each row copied in once (bytes.join sizes it first; growing a
    # buffer by extend() reallocates, and for one huge row, a 10 MB reasoning trace of 9 M ids, held
    # two copies at once). One C call instead of a numpy slice assignment per row: ~6x faster.
    # A row written alone (PendingRows does so for a huge one) is wrapped as it is: no copy at all.
    flat = np.frombuffer(values[0] if len(values) == 1 else b"".join(values), dtype=np.int32)
    items = pa.Array.from_buffers(pa.int32(), len(flat), [None, pa.py_buffer(flat)])
    return pa.Array.from_buffers(ID_TYPE, len(values), [None, pa.py_buffer(offsets)], children=[items])


def column_array(name: str, values: list[Any]) -> pa.Array:
    """Arrow array for a column; values Arrow cannot type consistently are kept as JSON text."""
    if name in _ID_COLUMNS:
        fast = _ids_array(values)
        if fast is not None:
            return fast
    if (name in TEXT_COLUMNS and values and all(type(v) is list for v in values)) or name in MESSAGE_NAMES:
        parts = content_parts(values)
        if parts is not None:
            return pa.array(parts, type=messages_type(_message_fields(parts), parts=True))
        return pa.array(values, type=messages_type(_message_fields(values)))
    if name == "images" and any(type(v) is list and v and type(v[0]) is dict and "bytes" in v[0] for v in values):
        return pa.array(values, type=IMAGES_TYPE)
    if name in CORE_COLUMNS:
        return _typed_array(values, CORE_SCHEMA.field(name).type)
    if name in _LOSS_START_COLUMNS:
        return _typed_array(values, pa.int32())
    if name in _LOSS_MASK_COLUMNS:
        return _typed_array(values, LOSS_MASK_TYPE)
    kind = _plain_type(values)
    built = None if kind is None else _from_buffers(values, kind)
    if built is not None:
        return built
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return json_text_array(values)


def json_text_array(values: list[Any]) -> pa.Array:
    return _typed_array(
        [None if v is None else json.dumps(v, ensure_ascii=False, sort_keys=True, default=str) for v in values],
        pa.string(),
    )


# Columns built from their buffers, without pa.array: pyarrow imports pandas (~0.7 s) the first time
# pa.array meets anything but an Arrow array, and a small prepare pays it in full (issue 45). Only
# values of exactly the Python type each Arrow type takes; anything else goes to pa.array, which
# decides (converts or refuses) as before.
_PY_TYPES: dict[pa.DataType, tuple[type, Any]] = {
    pa.string(): (str, None), pa.int64(): (int, np.int64), pa.int32(): (int, np.int32),
    pa.int8(): (int, np.int8), pa.float64(): (float, np.float64), pa.bool_(): (bool, np.bool_),
}


def _typed_array(values: list[Any], kind: pa.DataType) -> pa.Array:
    built = _from_buffers(values, kind)
    return built if built is not None else pa.array(values, type=kind)


def _plain_type(values: list[Any]) -> pa.DataType | None:
    """The type pa.array infers for `values` where that is plain (one Python scalar type, or dicts with
    the same keys in the same order over such values); None where pa.array must decide."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    first = type(present[0])
    if any(type(v) is not first for v in present):
        return None
    if first is dict:
        keys = list(present[0])
        if not keys or any(list(v) != keys for v in present):
            return None
        fields = [(key, _plain_type([None if v is None else v[key] for v in values])) for key in keys]
        return None if any(kind is None for _, kind in fields) else pa.struct(fields)
    return {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}.get(first)


# A struct's null row: pa.array gives its fields an empty value (0, "", []), not a null.
_EMPTY = object()


def _validity(values: list[Any]) -> tuple[pa.Buffer | None, int]:
    missing = np.fromiter((v is None for v in values), dtype=np.bool_, count=len(values))
    nulls = int(missing.sum())
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(~missing, bitorder="little")), nulls


def _from_buffers(values: list[Any], kind: pa.DataType) -> pa.Array | None:
    """`values` as an array of `kind`, or None where some value is not what `kind` takes as is."""
    count = len(values)
    bitmap, nulls = _validity(values)
    if pa.types.is_struct(kind):
        names = [field.name for field in kind]
        if any(v is not None and v is not _EMPTY and (type(v) is not dict or not v.keys() <= set(names))
               for v in values):
            return None
        children = [_from_buffers([_EMPTY if v is None or v is _EMPTY else v.get(name) for v in values],
                                  kind.field(name).type) for name in names]
        if any(child is None for child in children):
            return None
        return pa.Array.from_buffers(kind, count, [bitmap], null_count=nulls, children=children)
    if pa.types.is_list(kind):
        lists = [() if v is None or v is _EMPTY else v for v in values]
        if any(type(v) is not list for v in lists if v != ()):
            return None
        child = _from_buffers([item for v in lists for item in v], kind.value_type)
        offsets = _offsets([len(v) for v in lists])
        if child is None or offsets is None:
            return None
        return pa.Array.from_buffers(kind, count, [bitmap, offsets], null_count=nulls, children=[child])
    py_type, dtype = _PY_TYPES.get(kind, (None, None))
    if py_type is None or any(v is not None and v is not _EMPTY and type(v) is not py_type for v in values):
        return None
    if py_type is str:
        return _strings(values, count, bitmap, nulls)
    try:
        data = np.array([py_type() if v is None or v is _EMPTY else v for v in values], dtype=dtype)
    except OverflowError:
        return None
    if py_type is bool:
        data = np.packbits(data, bitorder="little")
    return pa.Array.from_buffers(kind, count, [bitmap, pa.py_buffer(data)], null_count=nulls)


def _offsets(lengths: Any) -> pa.Buffer | None:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:  # over 2 GiB in one batch: pa.array splits or refuses
        return None
    return pa.py_buffer(offsets.astype(np.int32))


def _strings(values: list[Any], count: int, bitmap: pa.Buffer | None, nulls: int) -> pa.Array | None:
    try:
        encoded = [v.encode() if type(v) is str else b"" for v in values]
    except UnicodeEncodeError:  # a lone surrogate: pa.array reports it
        return None
    offsets = _offsets(np.fromiter(map(len, encoded), dtype=np.int64, count=count))
    if offsets is None:
        return None
    return pa.Array.from_buffers(pa.string(), count, [bitmap, offsets, pa.py_buffer(b"".join(encoded))],
                                 null_count=nulls)


def split_messages(row: dict[str, Any]) -> dict[str, Any]:
    """A mixed dataset's row: text columns as strings, messages (if any) in the *_messages columns."""
    if type(row.get("prompt")) is not list:
        return row
    row = dict(row)
    for name in TEXT_COLUMNS:
        row[MESSAGE_COLUMNS[name]] = row[name]
        row[name] = text_of(row[name], completion=name != "prompt")
    return row


def all_strings(values: list[Any]) -> bool:
    return all(v is None or isinstance(v, str) for v in values)
