"""Image pairs in: the `images` column in each form, image content parts kept, bad images quarantined."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")

from prefdata.core.errors import RecordError  # noqa: E402
from prefdata.core.records import RawRecord  # noqa: E402
from prefdata.io.formats import normalize_record  # noqa: E402
from prefdata.io.images import ImageAccess, ImageRef, image_refs, load_images  # noqa: E402
from prefdata.prepare import prepare  # noqa: E402
from vision_helpers import image_row, png_bytes, write_jsonl  # noqa: E402


def _pair(row: dict):
    return normalize_record(RawRecord("x.jsonl", 1, value=row))


def test_image_parts_are_kept_in_order_and_the_column_is_the_pairs():
    row = image_row("What color?", ["a.png"])
    row["prompt"][0]["content"].append({"type": "image"})
    row["images"].append({"path": "b.png"})
    pair = _pair(row)
    assert pair.prompt_messages[0]["content"] == [
        {"type": "image"}, {"type": "text", "text": "What color?"}, {"type": "image"},
    ]
    assert pair.images == [ImageRef(path="a.png"), ImageRef(path="b.png")]
    assert pair.image_parts == 2
    assert "images" not in pair.extra  # not a pass-through column any more
    assert pair.prompt == "user: <image>What color?<image>"  # what the text checks see


def test_plain_conversational_rows_are_unchanged():
    pair = _pair({"prompt": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "chosen": "a", "rejected": "b"})
    assert pair.prompt_messages[0]["content"] == "hi" and pair.images is None and pair.image_parts == 0


def test_single_image_column_and_bytes_form():
    data = png_bytes((8, 8), (1, 2, 3))
    row = image_row("x", [])
    del row["images"]
    row["image"] = {"bytes": data, "path": "orig.png"}
    assert _pair(row).images == [ImageRef(path="orig.png", data=data)]


@pytest.mark.parametrize("bad, reason", [
    ([{"type": "image", "image": "a.png"}], "must not carry its image"),
])
def test_inline_image_sources_are_refused(bad, reason):
    row = image_row("x", ["a.png"])
    row["prompt"][0]["content"] = bad
    with pytest.raises(RecordError, match=reason):
        _pair(row)


def test_image_refs_refuse_a_malformed_entry():
    with pytest.raises(RecordError, match="needs 'bytes' or a 'path'"):
        image_refs([{"bytes": None, "path": None}], "images")
    with pytest.raises(RecordError, match="must be a path"):
        image_refs([3], "images")


def test_load_images_reads_decodes_and_names_the_problem(tmp_path):
    (tmp_path / "ok.png").write_bytes(png_bytes((12, 7), (200, 0, 0)))
    (tmp_path / "cut.png").write_bytes(png_bytes((12, 7), (200, 0, 0))[:40])
    [image] = load_images([ImageRef(path="ok.png")], ImageAccess(str(tmp_path / "pairs.jsonl")))
    assert (image.width, image.height, image.format, image.name) == (12, 7, "PNG", "ok.png")
    with pytest.raises(RecordError, match=r"image 0 \(missing.png\): cannot read"):
        load_images([ImageRef(path="missing.png")], ImageAccess(str(tmp_path / "pairs.jsonl")))
    with pytest.raises(RecordError, match=r"image 1 \(cut.png\): cannot decode"):
        load_images([ImageRef(path="ok.png"), ImageRef(path="cut.png")], ImageAccess(str(tmp_path / "pairs.jsonl")))


def test_each_input_form_prepares_with_its_images(tmp_path, llava_processor_dir):
    """Paths relative to the file (JSON lines in a subdirectory), {"path"}, {"bytes"} in Parquet, and a
    save_to_disk dataset with an Image feature: every image reaches OUT, decoded at the right size."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir = tmp_path / "data"
    (data_dir / "img").mkdir(parents=True)
    (data_dir / "img" / "a.png").write_bytes(png_bytes((30, 20), (255, 0, 0)))
    rows = [image_row("one", ["img/a.png"]), image_row("two", [{"path": "img/a.png"}])]
    jsonl = write_jsonl(data_dir / "pairs.jsonl", rows)

    parquet = tmp_path / "pairs.parquet"
    table = pa.Table.from_pylist([image_row("three", [{"bytes": png_bytes((16, 40), (0, 255, 0)), "path": None}])])
    pq.write_table(table, parquet)

    saved = tmp_path / "saved"
    features = datasets.Features({
        "prompt": [{"role": datasets.Value("string"), "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
        "chosen": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
        "rejected": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
        "images": datasets.List(datasets.Image()),
    })
    row = image_row("four", [{"bytes": png_bytes((9, 9), (0, 0, 255)), "path": None}])
    row["prompt"][0]["content"] = [{"type": p["type"], "text": p.get("text")} for p in row["prompt"][0]["content"]]
    datasets.Dataset.from_list([row], features=features).save_to_disk(str(saved))

    sizes = {}
    for name, source in [("jsonl", jsonl), ("parquet", parquet), ("saved", saved)]:
        out = tmp_path / f"out-{name}"
        result = prepare(source, out, processor=str(llava_processor_dir), workers=1, progress=False)
        assert result.rows_quarantined == 0, (out / "quarantine.jsonl").read_text()
        loaded = datasets.load_from_disk(str(out))
        sizes[name] = [[image.size for image in r["images"]] for r in loaded]
    assert sizes == {"jsonl": [[(30, 20)], [(30, 20)]], "parquet": [[(16, 40)]], "saved": [[(9, 9)]]}


def test_missing_and_corrupt_images_quarantine_their_row_only(tmp_path, llava_processor_dir):
    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    (data / "img" / "ok.png").write_bytes(png_bytes((28, 28), (9, 9, 9)))
    (data / "img" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot an image")
    rows = [image_row("ok", ["img/ok.png"]), image_row("gone", ["img/gone.png"]), image_row("bad", ["img/bad.png"])]
    out = tmp_path / "out"
    result = prepare(write_jsonl(data / "pairs.jsonl", rows), out, processor=str(llava_processor_dir),
                     workers=1, progress=False)
    assert (result.rows_in, result.rows_out, result.rows_quarantined) == (3, 1, 2)
    lines = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["source_line"], q["error"].split(":")[0]) for q in lines] == [
        (2, "image 0 (img/gone.png)"), (3, "image 0 (img/bad.png)"),
    ]
    assert "cannot read" in lines[0]["error"] and "cannot decode" in lines[1]["error"]
    assert all("\n" not in q["error"] for q in lines)


def test_a_tokenizer_without_a_processor_quarantines_image_rows_with_the_reason(tmp_path):
    from prefdata.tiny import build_tiny_tokenizer

    build_tiny_tokenizer(tmp_path / "tok")
    (tmp_path / "a.png").write_bytes(png_bytes((8, 8), (1, 1, 1)))
    rows = [image_row("x", ["a.png"]), {"prompt": "plain", "chosen": "a", "rejected": "b"}]
    out = tmp_path / "out"
    result = prepare(write_jsonl(tmp_path / "pairs.jsonl", rows), out, tokenizer=str(tmp_path / "tok"),
                     workers=1, progress=False)
    assert (result.rows_out, result.rows_quarantined) == (1, 1)
    assert "--processor" in json.loads((out / "quarantine.jsonl").read_text())["error"]


def test_validate_without_a_tokenizer_counts_image_parts(tmp_path):
    from prefdata.validate.command import validate

    data = tmp_path / "data"
    data.mkdir()
    (data / "a.png").write_bytes(png_bytes((8, 8), (5, 5, 5)))
    rows = [image_row("two parts", ["a.png"], placeholders=2), image_row("ok", ["a.png"]),
            image_row("one image", ["b.png"])]
    result = validate(write_jsonl(data / "pairs.jsonl", rows), progress=False)
    assert result.report["flags"]["image_mismatch"]["count"] == 1
    assert result.report["flags"]["image_mismatch"]["examples"][0]["source_line"] == 1
    assert result.exit_code == 1  # an error-severity flag
