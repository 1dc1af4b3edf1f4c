"""Reading every supported file type: records in order, line numbers, per-record errors, file errors."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.core.errors import PrefdataError
from prefdata.io.json_decode import MAX_RAW_TEXT
from prefdata.io.readers import iter_raw_records, list_input_files

ROWS = [{"prompt": f"p{i}", "chosen": f"c{i}", "rejected": f"r{i}", "id": i} for i in range(5)]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _read(path) -> list:
    return list(iter_raw_records(path))


def _values(records) -> list:
    return [r.value for r in records]


def _errors(records) -> list[tuple[int, str]]:
    return [(r.source_line, r.error) for r in records if r.error is not None]


# --- every file type -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz", "d.json.gz"])
def test_json_lines_plain_and_gzip(tmp_path, name):
    data = _jsonl(ROWS)
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    records = _read(path)
    assert _values(records) == ROWS
    assert [r.source_line for r in records] == [1, 2, 3, 4, 5]
    assert {r.source_file for r in records} == {str(path)}
    assert all(r.error is None for r in records)


@pytest.mark.parametrize("indent", [None, 2])
def test_json_array_plain_and_pretty(tmp_path, indent):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS, indent=indent))
    records = _read(path)
    assert _values(records) == ROWS
    # The line where each record starts: all on line 1 in a one-line array; with indent=2 each
    # record spans 6 lines after the '[' line.
    assert [r.source_line for r in records] == ([1] * 5 if indent is None else [2, 8, 14, 20, 26])


def _item_start_lines(text: str) -> list[int]:
    """Independent oracle: the line of each top-level item's first character."""
    decoder, lines, pos = json.JSONDecoder(), [], text.index("[") + 1
    while True:
        while text[pos] in " \t\r\n,":
            pos += 1
        if text[pos] == "]":
            return lines
        lines.append(text.count("\n", 0, pos) + 1)
        _value, pos = decoder.raw_decode(text, pos)


def test_json_array_records_keep_the_line_they_start_on(tmp_path, monkeypatch):
    """Multi-line records of varied sizes, a small read chunk so the buffer is compacted many
    times: every record (and a quarantined one) is numbered by its first line."""
    import prefdata.io.json_array as JA

    monkeypatch.setattr(JA, "ARRAY_CHUNK", 512)
    rows = [{"prompt": "p" * (i * 37 % 300), "chosen": ["x\ny"] * (i % 4), "rejected": {"k": i}} for i in range(400)]
    text = json.dumps(rows, indent=2).replace('"k": 7\n', '"k": 7 oops\n', 1)  # one bad record
    path = tmp_path / "d.json"
    path.write_text(text)
    records = _read(path)
    assert [r.source_line for r in records] == _item_start_lines(text.replace(" oops", ""))
    bad = [r for r in records if r.error]
    assert len(bad) == 1 and bad[0].error.startswith("invalid JSON")
    assert bad[0].source_line == _item_start_lines(text.replace(" oops", ""))[7]


def test_json_array_line_of_the_llamafactory_demo(shared_data):
    """The issue's file: record 83 (1-based) starts at line 1934 (line 1374 is inside record 58)."""
    path = shared_data("llamafactory-demo/dpo_en_demo.json")
    records = _read(path)
    lines = [r.source_line for r in records]
    assert lines == _item_start_lines(path.read_text(encoding="utf-8"))
    assert lines[82] == 1934 and lines[57] == 1354


def test_json_array_gzip(tmp_path):
    path = tmp_path / "d.json.gz"
    path.write_bytes(gzip.compress(json.dumps(ROWS).encode()))
    assert _values(_read(path)) == ROWS


def test_json_lines_misnamed_json_are_read_as_lines(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(_jsonl(ROWS))
    records = _read(path)
    assert _values(records) == ROWS
    assert [r.source_line for r in records] == [1, 2, 3, 4, 5]


def test_pretty_printed_array_misnamed_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS, indent=2))
    assert _values(_read(path)) == ROWS


def test_json_array_items_spanning_read_chunks(tmp_path, monkeypatch):
    # Tiny chunks force every item (and numbers) to straddle buffer refills.
    import prefdata.io.json_array as json_array

    monkeypatch.setattr(json_array, "ARRAY_CHUNK", 7)
    rows = [{"n": 12345678901234, "s": "é" * 20 + "\\", "f": 1.5e10}] * 10 + ROWS
    path = tmp_path / "d.json"
    path.write_text(json.dumps(rows, ensure_ascii=False))
    assert _values(_read(path)) == rows


def test_parquet_read_in_batches(tmp_path, monkeypatch):
    import prefdata.io.arrow as arrow

    monkeypatch.setattr(arrow, "BATCH_ROWS", 2)
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=3)
    records = _read(path)
    assert _values(records) == ROWS
    assert [r.source_line for r in records] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_large_rows_are_converted_a_few_at_a_time_and_none_is_lost(tmp_path, monkeypatch, kind):
    """Image rows carry their encoded images: a slice holds about SLICE_BYTES, not 1,000 rows."""
    import prefdata.io.arrow as arrow

    monkeypatch.setattr(arrow, "SLICE_BYTES", 3 * 10_000)
    rows = [{**row, "images": [{"bytes": bytes([i]) * 10_000, "path": None}]} for i, row in enumerate(ROWS * 3)]
    table = pa.Table.from_pylist(rows)
    assert arrow.rows_per_slice(table.nbytes, table.num_rows) == 2  # ~10 KB a row, 30 KB a slice
    assert arrow.rows_per_slice(0, 0) == arrow.BATCH_ROWS and arrow.rows_per_slice(10**9, 10) == 1
    steps: list[int] = []
    real = arrow.rows_per_slice
    monkeypatch.setattr(arrow, "rows_per_slice", lambda nbytes, num_rows: steps.append(real(nbytes, num_rows)) or steps[-1])
    path = tmp_path / f"d.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        with pa.ipc.new_stream(str(path), table.schema) as writer:
            writer.write_table(table)
    records = _read(path)
    assert _values(records) == rows
    assert [r.source_line for r in records] == list(range(1, len(rows) + 1))
    assert steps and max(steps) <= 3


def test_parquet_nested_columns(tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}]}
    ]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert _values(_read(path)) == rows


def test_save_to_disk_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = ROWS * 3
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"), num_shards=2)
    files = list_input_files(tmp_path / "ds")
    assert [f.suffix for f in files] == [".arrow", ".arrow"]
    records = _read(tmp_path / "ds")
    assert _values(records) == rows
    assert records[0].source_file == files[0].name  # relative to the input directory


def test_save_to_disk_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:2])}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    records = _read(tmp_path / "dd")
    assert len(records) == 7
    assert {r.source_file.split("/")[0] for r in records} == {"train", "test"}


def test_directory_of_mixed_files_sorted_and_recursive(tmp_path):
    (tmp_path / "b.jsonl").write_bytes(_jsonl(ROWS[:2]))
    (tmp_path / "a.json").write_text(json.dumps(ROWS[2:3]))
    (tmp_path / "sub").mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[3:]), tmp_path / "sub" / "c.parquet")
    (tmp_path / "sub" / "d.jsonl.gz").write_bytes(gzip.compress(_jsonl(ROWS[:1])))
    (tmp_path / "README.md").write_text("not data")  # skipped
    (tmp_path / ".hidden.jsonl").write_text("garbage")  # skipped
    (tmp_path / "empty.jsonl").write_text("")  # no records, but the directory has some
    records = _read(tmp_path)
    assert [r.source_file for r in records] == [
        "a.json",
        "b.jsonl",
        "b.jsonl",
        "sub/c.parquet",
        "sub/c.parquet",
        "sub/d.jsonl.gz",
    ]
    assert _values(records) == [ROWS[2], ROWS[0], ROWS[1], ROWS[3], ROWS[4], ROWS[0]]
    assert _read(tmp_path) == records  # deterministic


# --- line handling ---------------------------------------------------------------------------


def test_bom_crlf_blank_lines_and_missing_final_newline(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + b'{"a": 1}\r\n' + b"\r\n" + b"   \n" + b'{"a": 2}\r\n' + b'{"a": 3}'
    )
    records = _read(path)
    assert _values(records) == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert [r.source_line for r in records] == [1, 4, 5]  # blank lines count, are not records


def test_bom_before_json_array(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(b"\xef\xbb\xbf\n  " + json.dumps(ROWS).encode())
    assert _values(_read(path)) == ROWS


# --- per-record errors never raise -----------------------------------------------------------


def test_bad_lines_become_one_line_error_records(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(
        b'{"a": 1}\n'
        b'{"a": 1 "b": 2}\n'  # 2: malformed
        b'{"a": "\xff"}\n'  # 3: invalid UTF-8
        b'{"a": \x00}\n'  # 4: NUL byte
        b"[1, 2]\n"  # 5: not an object
        b'{"a": 1, "a": 2}\n'  # 6: duplicate key
        b'{"a": 1,}\n'  # 7: trailing comma
        + b"[" * 100_000 + b"\n"  # 8: nested too deep
        + b'{"a": 9}\n'
    )
    records = _read(path)
    assert [r.source_line for r in records] == list(range(1, 10))
    errors = dict(_errors(records))
    assert set(errors) == {2, 3, 4, 5, 6, 7, 8}
    assert errors[2] == "invalid JSON: Expecting ',' delimiter at column 9"
    assert errors[3].startswith("invalid UTF-8")
    assert errors[4].startswith("NUL byte")
    assert errors[5] == "record is a JSON array, not a JSON object"
    assert errors[6] == "invalid JSON: duplicate key 'a'"
    assert errors[8] == "invalid JSON: nesting too deep (more than 100 levels of arrays and objects)"
    for record in records:
        if record.error:
            assert "\n" not in record.error
            assert record.raw_text is not None and record.value is None
    assert records[-1].value == {"a": 9}


def test_raw_text_is_truncated(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": ' + '"x' * 100_000 + "\n")
    (record,) = _read(path)
    assert record.error
    assert len(record.raw_text) < MAX_RAW_TEXT + 100
    assert "truncated" in record.raw_text


def test_json_array_bad_items_are_isolated(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(
        b'[{"a": 1},\n{"b": 2 "c": 3},\n5,\n{"e": [1, 2, },\n{"f": "\xff"},\n{"g": 1}\n{"h": 1},\n{"i": 1}]'
    )
    records = _read(path)
    assert [r.source_line for r in records] == list(range(1, 9))  # each item's own line, bad ones too
    assert [r.value for r in records if r.error is None] == [{"a": 1}, {"g": 1}, {"i": 1}]
    errors = dict(_errors(records))
    assert errors[2].startswith("invalid JSON: Expecting ',' delimiter at line 2")
    assert errors[3] == "record is a JSON number, not a JSON object"
    assert errors[5].startswith("invalid UTF-8")
    assert "missing ','" in errors[7]


def test_json_array_trailing_comma_and_truncation(tmp_path):
    path = tmp_path / "trailing.json"
    path.write_text('[{"a": 1},\n {"a": 2},\n]')
    records = _read(path)
    assert _values(records)[:2] == [{"a": 1}, {"a": 2}]
    assert _errors(records) == [(3, "invalid JSON: trailing comma before ']' at line 3 column 1")]

    path = tmp_path / "truncated.json"
    path.write_text('[{"a": 1}, {"a": 2}, {"a": "unfinis')
    records = _read(path)
    assert _values(records)[:2] == [{"a": 1}, {"a": 2}]
    assert len(records) == 3 and records[2].error.startswith("invalid JSON: Unterminated string")


@pytest.mark.parametrize("name", ["d.jsonl.gz", "d.json.gz"])
def test_truncated_gzip_yields_rows_then_one_error(tmp_path, name):
    rows = [{"i": i, "text": f"row {i} " * 20} for i in range(5000)]
    data = _jsonl(rows) if name == "d.jsonl.gz" else json.dumps(rows).encode()
    compressed = gzip.compress(data)
    path = tmp_path / name
    path.write_bytes(compressed[: len(compressed) // 2])
    records = _read(path)
    good = [r for r in records if r.error is None]
    assert len(good) > 100
    assert _values(good) == rows[: len(good)]
    assert [r.error is not None for r in records] == [False] * len(good) + [True]
    assert records[-1].error.startswith("truncated or corrupt gzip stream")


def test_large_record_streams(tmp_path):
    big = {"prompt": "p", "chosen": "x" * 5_000_000, "rejected": "y"}
    path = tmp_path / "d.json"
    path.write_text(json.dumps([ROWS[0], big, ROWS[1]]))
    records = _read(path)
    assert _values(records) == [ROWS[0], big, ROWS[1]]
    assert all(len(r.raw_text) < MAX_RAW_TEXT + 100 for r in records)


# --- file-level errors raise PrefdataError with one line -------------------------------------


def _file_error(path) -> str:
    with pytest.raises(PrefdataError) as info:
        _read(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_file_level_errors(tmp_path):
    assert "no such file" in _file_error(tmp_path / "missing.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    assert "unsupported file type" in _file_error(tmp_path / "data.csv")
    (tmp_path / "empty.jsonl").write_text("")
    assert "empty file" in _file_error(tmp_path / "empty.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n\n  \n")
    assert "empty file" in _file_error(tmp_path / "blank.jsonl")
    (tmp_path / "empty.json").write_text("[]")
    assert "empty file" in _file_error(tmp_path / "empty.json")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    assert "cannot open as parquet" in _file_error(tmp_path / "bad.parquet")
    (tmp_path / "fake.jsonl.gz").write_bytes(b'{"a": 1}\n')
    assert "not a gzip file" in _file_error(tmp_path / "fake.jsonl.gz")
    (tmp_path / "scalar.json").write_text('"hello"')
    assert "not a JSON array" in _file_error(tmp_path / "scalar.json")
    (tmp_path / "utf16.jsonl").write_bytes('{"a": 1}\n'.encode("utf-16"))
    assert "UTF-16" in _file_error(tmp_path / "utf16.jsonl")
    nodata = tmp_path / "nodata"
    nodata.mkdir()
    (nodata / "notes.txt").write_text("x")
    assert "no supported data files" in _file_error(nodata)


def test_empty_parquet_is_an_empty_file(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    assert "empty file" in _file_error(path)


# --- real data ---------------------------------------------------------------------------------


def test_real_files_read_completely(shared_data):
    assert len(_read(shared_data("ultrafeedback-sample/train.jsonl"))) == 1000
    assert len(_read(shared_data("llamafactory-demo/dpo_en_demo.json"))) == 300
    orca = shared_data("orca-dpo-pairs/validation.jsonl")
    assert not orca.read_bytes().endswith(b"\n")  # the last line has no trailing newline
    records = _read(orca)
    assert len(records) == 284
    assert all(r.error is None for r in records)
    assert records[-1].source_line == 284


def test_memory_does_not_hold_all_rows(tmp_path):
    # A generator: reading the first record does not parse the rest of the file.
    path = tmp_path / "d.jsonl"
    path.write_bytes(_jsonl(ROWS) + b"{broken\n")
    iterator = iter_raw_records(path)
    assert next(iterator).value == ROWS[0]


@pytest.mark.parametrize("name", ["big.jsonl", "big.json", "big.jsonl.gz", "big.parquet"])
def test_peak_memory_does_not_grow_with_rows(tmp_path, name):
    import tracemalloc

    rows = [{"prompt": f"question {i}", "chosen": "c" * 150, "rejected": "r" * 150} for i in range(40_000)]
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5000)
    elif name.endswith(".json"):
        path.write_text(json.dumps(rows))
    else:
        data = _jsonl(rows)
        path.write_bytes(gzip.compress(data, compresslevel=1) if name.endswith(".gz") else data)
    del rows
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_raw_records(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 40_000
    assert peak < 8 * 1024 * 1024  # the file holds ~13 MB of text


def test_directory_symlink_loop_is_read_once(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jsonl").write_bytes(_jsonl(ROWS[:1]))
    try:
        (tmp_path / "a" / "loop").symlink_to(tmp_path, target_is_directory=True)
    except OSError:
        pytest.skip("symlinks not supported here")
    assert [r.source_file for r in _read(tmp_path)] == ["a/x.jsonl"]


# -- the orjson fast path must give exactly what the stdlib decoder gives --------------------------

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('ab:" \\\u00e9\n{}[],'), max_size=12),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet=st.sampled_from("ab:c"), max_size=4), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_fast_decoding_equals_the_stdlib_decoder(value) -> None:
    """Integers beyond 64 bits (which orjson would turn into floats), floats, ':' inside strings:
    the fast path returns the same value, of the same types, as the reference decoder."""
    from prefdata.io.json_decode import JSON_DECODER, decode_line

    text = json.dumps(value)
    fast, reference = decode_line(text), JSON_DECODER.decode(text)
    assert fast == reference
    assert json.dumps(fast) == json.dumps(reference)  # same types too (int stays int, not float)


def test_integers_beyond_64_bits_stay_exact(tmp_path) -> None:
    path = tmp_path / "big.jsonl"
    row = {"prompt": "p", "chosen": "c", "rejected": "r", "id": 2**70 + 1, "score": 0.5, "neg": -(2**64) - 3, "edge": -(2**63) - 1, "max": 2**64 - 1}
    path.write_text(json.dumps(row) + "\n")
    assert _values(_read(path)) == [row]


def test_a_record_deeper_than_the_nesting_limit_is_quarantined_and_the_next_one_read(tmp_path):
    """150 levels parse under Python's recursion limit, but later stages (pickling to a worker, the
    template, the tool-schema check) recurse over the record: it costs that record, named as too deep."""
    from prefdata.io.json_decode import MAX_NESTING

    deep = {"prompt": "p", "chosen": "c", "rejected": "r", "metadata": json.loads("[" * 150 + "]" * 150)}
    fine = {"prompt": "p", "chosen": "c", "rejected": "r", "metadata": json.loads("[" * 30 + "]" * 30)}
    path = tmp_path / "d.jsonl"
    path.write_bytes(_jsonl([deep, fine]))
    records = _read(path)
    assert dict(_errors(records)) == {1: f"invalid JSON: nesting too deep (more than {MAX_NESTING} levels of arrays and objects)"}
    assert records[1].value == fine
