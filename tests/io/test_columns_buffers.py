"""Columns built from their buffers (no pa.array, so no pandas import: issue 45) are the arrays
pa.array builds, down to the bytes of the Arrow IPC stream OUT stores; values they do not take as
is still go through pa.array."""

from __future__ import annotations

import io
from array import array

import pyarrow as pa
import pytest

from prefdata.io.columns import ID_TYPE, _from_buffers, _plain_type, column_array, json_text_array, messages_type

CASES = {
    "strings": (["a", "ünï 🙂", "", None, "x" * 100], pa.string()),
    "no nulls": (["a", "b"], pa.string()),
    "ints": ([1, None, -(2**63), 2**63 - 1], pa.int64()),
    "int32": ([3, None, 7], pa.int32()),
    "floats": ([1.5, None, float("inf"), -0.0], pa.float64()),
    "bools": ([True, False, None, True] * 5, pa.bool_()),
    "flags": ([["a", "b"], [], None, ["c"]], pa.list_(pa.string())),
    "ids": ([[1, 2, 3], [], [4]], ID_TYPE),
    "mask": ([[0, 1, 1], None], pa.list_(pa.int8())),
    "struct": ([{"s": 1.0, "t": "x", "l": [1]}, None, {"s": None, "t": "y", "l": None}],
               pa.struct([("s", pa.float64()), ("t", pa.string()), ("l", pa.list_(pa.int64()))])),
    "nested struct": ([{"a": {"b": True}}, None, {"a": None}], pa.struct([("a", pa.struct([("b", pa.bool_())]))])),
    "messages": ([[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], None, [],
                  [{"role": "user"}]], messages_type()),
    "tool calls": ([[{"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
        [{"role": "tool", "content": "x"}]], messages_type({"tool_calls"})),
}


def _stream_bytes(array: pa.Array) -> bytes:
    sink = io.BytesIO()
    table = pa.table({"c": array})
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return sink.getvalue()


@pytest.mark.parametrize("name", sorted(CASES))
def test_built_from_buffers_equals_pa_array_byte_for_byte(name):
    values, kind = CASES[name]
    built = _from_buffers(values, kind)
    assert built is not None, "expected the buffers path to take these values"
    built.validate(full=True)
    expected = pa.array(values, type=kind)
    assert built.equals(expected)
    assert built.to_pylist() == expected.to_pylist()
    assert _stream_bytes(built) == _stream_bytes(expected)


@pytest.mark.parametrize("values", [
    ["a", None], [1, 2, None], [0.5], [True, None], [{"a": 1, "b": "x"}, None, {"a": 2, "b": "y"}],
])
def test_pass_through_columns_get_the_type_pa_array_infers(values):
    assert _plain_type(values) == pa.array(values).type
    assert column_array("extra", values).equals(pa.array(values))


@pytest.mark.parametrize("values", [
    [1, 2.5], [True, 1], [{"a": 1}, {"b": 1}], [None, None], [[1, 2]], [{"a": None}], [2**64], [{"a": 2**64}],
])
def test_values_pa_array_must_decide_are_left_to_it(values):
    try:
        expected = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        expected = json_text_array(values)
    assert column_array("extra", values).equals(expected)


def test_values_of_another_python_type_go_through_pa_array():
    assert _from_buffers([1, "a"], pa.string()) is None
    assert _from_buffers([1.0], pa.int64()) is None
    assert _from_buffers([2**70], pa.int64()) is None
    assert _from_buffers(["\ud800"], pa.string()) is None  # a lone surrogate: pa.array's error, as before
    assert _from_buffers([{"role": "user", "extra": 1}], messages_type().value_type) is None
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        column_array("source_line", ["not a number"])


def test_ids_sent_as_arrays_build_the_same_column():
    values = [array("i", [1, 2, 3]), array("i"), array("i", [2**31 - 1])]
    assert column_array("prompt_ids", values).equals(pa.array([list(v) for v in values], type=ID_TYPE))


def test_a_row_written_alone_keeps_its_ids_without_a_copy_and_in_order(tmp_path, monkeypatch) -> None:
    """A huge row (a 10 MB reasoning trace is 9 M ids) is written in a batch of its own, and its ids
    become the Arrow column in place: the write holds one copy of them, not two. The rows, their
    order and the ids are what batching them together gives."""
    import datasets

    from prefdata.io.writer import DatasetWriter, finish_dataset, rewrite_part
    from prefdata.pipeline import shard_stages

    huge = array("i", range(50))
    column = column_array("chosen_ids", [huge])
    assert column.values.buffers()[1].address == huge.buffer_info()[0]  # the row's own memory

    monkeypatch.setattr(shard_stages, "ALONE_IDS", 40)
    batches: list[int] = []

    def row(i: int, n: int) -> dict:
        return {"prompt": f"p{i}", "chosen": "c", "rejected": "r", "prompt_ids": array("i", [i]),
                "chosen_ids": array("i", range(n)), "rejected_ids": array("i", [2]), "flags": [],
                "source_file": "f", "source_line": i + 1}

    rows = [row(0, 3), row(1, 3), row(2, 50), row(3, 3)]
    writer = DatasetWriter(tmp_path, prefix="shard")
    real = writer.write_rows
    monkeypatch.setattr(writer, "write_rows", lambda batch: (batches.append(len(batch)), real(batch)))
    pending = shard_stages.PendingRows(writer, batch_size=8)
    for r in rows:
        pending.add(r)
    pending.flush()
    assert batches == [2, 1, 1]  # the rows before it, the huge row alone, the rows after it
    finish_dataset(tmp_path, writer.close(), "x", None,
                   lambda jobs, schema: [rewrite_part(src, dst, schema, enc) for src, dst, enc in jobs])
    stored = datasets.load_from_disk(str(tmp_path))
    assert [list(r["chosen_ids"]) for r in stored] == [list(r["chosen_ids"]) for r in rows]
    assert stored["prompt"] == ["p0", "p1", "p2", "p3"]
