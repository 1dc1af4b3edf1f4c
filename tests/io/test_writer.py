"""OUT/ writing: datasets compatibility, pass-through typing, and the never-delete-foreign-data rule.

Rows go through the pipeline's write path: DatasetWriter.write_rows, close, then finish_dataset, whose
rewrites of parts typed narrower run rewrite_part (the pipeline's RewritePart stage, here in this process)."""

from __future__ import annotations

import json

import pytest
from datasets import load_from_disk

from prefdata.core.errors import PrefdataError
from prefdata.io.out_dir import MARKER, abandon, prepare_output_dir, publish
from prefdata.io.writer import DatasetWriter, finish_dataset, rewrite_part


def _finish(writer: DatasetWriter) -> None:
    def rewrite(jobs, schema):
        for src, dst, to_encode in jobs:
            rewrite_part(src, dst, schema, to_encode)

    finish_dataset(writer.directory, writer.close(), "abc", None, rewrite)


def _row(i: int, **extra):
    row = {
        "prompt": f"p{i}", "chosen": f"c{i}", "rejected": f"r{i}",
        "prompt_ids": [1, 2, i], "chosen_ids": [3, i], "rejected_ids": [4, i],
        "flags": ["near_duplicate"] if i % 2 else [], "source_file": "a.jsonl", "source_line": i + 1,
    }
    row.update(extra)
    return row


def test_rows_load_back_with_datasets(tmp_path):
    writer = DatasetWriter(tmp_path)
    writer.write_rows([_row(i, score=float(i)) for i in range(5)])
    writer.write_rows([_row(i, score=float(i)) for i in range(5, 7)])
    _finish(writer)
    ds = load_from_disk(str(tmp_path))
    assert len(ds) == 7
    assert ds[6]["chosen_ids"] == [3, 6]
    assert ds[3]["flags"] == ["near_duplicate"]
    assert ds["score"] == [float(i) for i in range(7)]


def test_pass_through_types_widen_across_batches(tmp_path):
    writer = DatasetWriter(tmp_path)
    writer.write_rows([_row(0, meta=None, n=1)])  # null-typed first
    writer.write_rows([_row(1, meta={"a": 1}, n=2)])
    writer.write_rows([_row(2, extra_col="late")])  # a column that appears later
    _finish(writer)
    ds = load_from_disk(str(tmp_path))
    assert ds["meta"] == [None, {"a": 1}, None]
    assert ds["n"] == [1, 2, None]
    assert ds["extra_col"] == [None, None, "late"]


def test_inconsistent_pass_through_becomes_json_text(tmp_path):
    writer = DatasetWriter(tmp_path)
    writer.write_rows([_row(0, score=1), _row(1, score="high")])  # mixed within a batch
    writer.write_rows([_row(2, label=5)])
    writer.write_rows([_row(3, label="five")])  # conflicting across batches
    _finish(writer)
    ds = load_from_disk(str(tmp_path))
    assert [json.loads(v) for v in ds["score"][:2]] == [1, "high"]
    assert ds["label"][2:] == ["5", '"five"']
    assert writer.json_columns == {"score", "label"}


def test_a_column_that_turns_json_later_is_encoded_exactly_once(tmp_path):
    """Strings first (stored as strings), then a batch mixing strings and objects: every value of
    the column ends up JSON-encoded once, the later batch's included (it was encoded twice)."""
    writer = DatasetWriter(tmp_path)
    writer.write_rows([_row(0, meta="early")])
    writer.write_rows([_row(1, meta="mid"), _row(2, meta={"a": [1]})])
    writer.write_rows([_row(3, meta="late")])
    _finish(writer)
    ds = load_from_disk(str(tmp_path))
    assert [json.loads(v) for v in ds["meta"]] == ["early", "mid", {"a": [1]}, "late"]
    assert writer.json_columns == {"meta"}


def test_empty_dataset_is_still_loadable(tmp_path):
    writer = DatasetWriter(tmp_path)
    _finish(writer)
    ds = load_from_disk(str(tmp_path))
    assert len(ds) == 0
    assert "chosen_ids" in ds.column_names


def test_refuses_existing_output_without_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("")
    (out / "manifest.json").write_text("{}")
    with pytest.raises(PrefdataError, match="--overwrite"):
        prepare_output_dir(out, overwrite=False)


def test_never_replaces_a_directory_prefdata_did_not_create(tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.txt").write_text("years of work")
    for overwrite in (False, True):
        with pytest.raises(PrefdataError, match="not created by prefdata"):
            prepare_output_dir(out, overwrite=overwrite)
    assert [p.name for p in out.iterdir()] == ["thesis.txt"]


def test_publish_replaces_previous_output_manifest_last(tmp_path):
    out = tmp_path / "out"
    staging = prepare_output_dir(out, overwrite=False)
    assert staging.parent == out  # nothing is written outside OUT
    (staging / "data.arrow").write_text("v1")
    (staging / "manifest.json").write_text('{"v": 1}')
    publish(staging, out)
    staging = prepare_output_dir(out, overwrite=True)
    (staging / "new.arrow").write_text("v2")
    # until publish, the previous output is whole
    assert (out / "manifest.json").read_text() == '{"v": 1}' and (out / "data.arrow").exists()
    (staging / "manifest.json").write_text('{"v": 2}')
    publish(staging, out)
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "manifest.json", "new.arrow"])
    assert (out / "manifest.json").read_text() == '{"v": 2}'


def test_abandon_removes_what_this_run_created(tmp_path):
    out = tmp_path / "out"
    staging = prepare_output_dir(out, overwrite=False)
    (staging / "half.arrow").write_text("x")
    abandon(staging, out)
    assert not out.exists()


def test_ids_sent_as_arrays_are_stored_like_lists(tmp_path):
    """prepare's workers send ids as array('i'); they are stored exactly as the same ids given as
    lists, including empty id lists and a batch that mixes both kinds (the general path)."""
    from array import array

    def as_arrays(row):
        return {k: array("i", v) if k.endswith("_ids") else v for k, v in row.items()}

    rows = [_row(i) for i in range(4)] + [dict(_row(4), chosen_ids=[], rejected_ids=[2**31 - 1])]
    writer = DatasetWriter(tmp_path)
    writer.write_rows([as_arrays(r) for r in rows])
    writer.write_rows([as_arrays(rows[0]), rows[1]])
    _finish(writer)
    ds = load_from_disk(str(tmp_path))
    for key in ("prompt_ids", "chosen_ids", "rejected_ids"):
        assert ds[key] == [r[key] for r in rows + rows[:2]]
