"""Image statistics in the report (report.json `images` and every renderer), the same on every path
(prepare row by row and with worker writes, validate in bulk and row by row, validate of a prepared
OUT), and `validate --processor`: the same exact token counts as prepare."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")

from prefdata.cli import main  # noqa: E402
from prefdata.core import flags as F  # noqa: E402
from prefdata.core.errors import PrefdataError  # noqa: E402
from prefdata.prepare import prepare  # noqa: E402
from prefdata.report.images import ImageStats  # noqa: E402
from prefdata.report.render_html import render_html  # noqa: E402
from prefdata.report.render_markdown import render_markdown  # noqa: E402
from prefdata.report.render_text import render_text  # noqa: E402
from prefdata.validate.command import validate  # noqa: E402
from vision_helpers import image_row, png_bytes, write_jsonl  # noqa: E402

SIZES = {"a": (30, 20), "b": (64, 48), "c": (16, 40)}


@pytest.fixture()
def image_data(tmp_path):
    """Five pairs with images (one holds two; one shows a copy of another's image under another name), a
    text-only pair, and a pair whose image is missing (quarantined: it counts nowhere)."""
    img = tmp_path / "data" / "img"
    img.mkdir(parents=True)
    data = {name: png_bytes(size, (40 * len(name), 90, 30 + i)) for i, (name, size) in enumerate(SIZES.items())}
    for name, content in data.items():
        (img / f"{name}.png").write_bytes(content)
    (img / "copy.png").write_bytes(data["a"])
    rows = [
        image_row("What is in the first picture?", ["img/a.png"]),
        image_row("Compare the two pictures.", ["img/a.png", "img/b.png"], placeholders=2),
        image_row("What is in the tall picture?", ["img/c.png"]),
        {"prompt": [{"role": "user", "content": "A question without a picture."}], "chosen": "Yes.", "rejected": "No."},
        image_row("Describe the copied picture.", ["img/copy.png"]),
        image_row("This picture is gone.", ["img/gone.png"]),
    ]
    raw = write_jsonl(tmp_path / "data" / "pairs.jsonl", rows)
    return raw, data


def _expected(data) -> dict:
    a, b, c = (len(data[name]) for name in "abc")
    return {
        "rows": 4, "images": 5, "unique_images": 3, "bytes": 3 * a + b + c, "unique_bytes": a + b + c,
        "rows_by_image_count": {"0": 1, "1": 3, "2": 1},
        "width": {"count": 5, "min": 16, "median": 30, "max": 64, "mean": 34.0},  # 30 30 64 16 30
        "height": {"count": 5, "min": 20, "median": 20, "max": 48, "mean": 29.6},  # 20 20 48 40 20
    }


def test_prepare_reports_image_statistics_in_every_renderer(tmp_path, image_data, llava_processor_dir):
    raw, data = image_data
    out = tmp_path / "out"
    result = prepare(raw, out, processor=str(llava_processor_dir), workers=1, progress=False)
    assert (result.rows_out, result.rows_quarantined) == (5, 1)
    images = json.loads((out / "report.json").read_text())["images"]
    assert images == {**_expected(data), "tokens_per_image": {"count": 5, "min": 4, "median": 4, "max": 4, "mean": 4.0}}

    text = render_text(result.report)
    assert "images: 5 images in 4 of 5 pairs (3 unique;" in text
    assert "width 16 / 30 / 64, height 20 / 20 / 48 px; tokens per image 4 / 4 / 4" in text
    assert "pairs with 0 / 1 / 2 images: 1 / 3 / 1" in text
    markdown = (out / "report.md").read_text()
    assert "### Images" in markdown and "| width (px) | 16 | 30 | 64 | 34 |" in markdown
    assert "| tokens per image | 4 | 4 | 4 | 4 |" in markdown and "| pairs | 1 | 3 | 1 |" in markdown
    html = (out / "report.html").read_text()
    assert "<h2>Images</h2>" in html and "5 images in 4 of 5 pairs" in html


def test_a_text_only_report_has_no_image_section(tmp_path):
    raw = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}])
    report = validate(raw, progress=False, workers=1, format="json", output=str(tmp_path / "r.json")).report
    assert "images" not in report
    assert "images" not in render_text(report) and "Images" not in render_markdown(report)
    assert "<h2>Images</h2>" not in render_html(report)


@pytest.mark.parametrize("prepare_workers", [1, 2])
def test_the_statistics_do_not_depend_on_the_path(tmp_path, image_data, llava_processor_dir, prepare_workers):
    """prepare with one worker or two, validate with one worker or two: one section."""
    raw, data = image_data
    result = prepare(raw, tmp_path / "out", processor=str(llava_processor_dir), workers=prepare_workers,
                     progress=False)
    tokens = result.report["images"].pop("tokens_per_image")
    assert result.report["images"] == _expected(data) and tokens["count"] == 5
    for workers in (1, 2):  # 2: the bulk text path, which reads the images in its workers too
        report = validate(raw, progress=False, workers=workers, format="json", output=str(tmp_path / "r.json")).report
        assert report["images"] == {**_expected(data), "tokens_per_image": None}, workers
        assert report["quarantine"]["reasons"][0]["reason"].startswith("image 0 (img/gone.png): cannot read")


def test_image_stats_add_one_by_one_equals_in_bulk():
    from prefdata.io.images import LoadedImage
    from prefdata.report.images import ImageFactsCollector

    rows = [[LoadedImage(b"x" * (i + 1), 10 + i, 20 - i, "PNG", i % 3)] * (1 + i % 2) for i in range(9)]
    tokens = [[i] * len(images) if i % 4 else None for i, images in enumerate(rows)]
    single, bulk, collector = ImageStats(), ImageStats(), ImageFactsCollector()
    for images, counted in zip(rows, tokens):
        single.add(images, counted)
        collector.add(images, counted)
    bulk.add_facts(collector.facts())
    assert single.to_dict(12) == bulk.to_dict(12)
    section = single.to_dict(12)
    assert section["rows_by_image_count"] == {"0": 3, "1": 5, "2": 4} and section["unique_images"] == 3
    assert section["tokens_per_image"]["count"] == 13 - 3  # rows 0, 4 and 8 (an image each) were not counted
    assert ImageStats().to_dict(5) is None and ImageFactsCollector().facts() is None


def test_validate_with_a_processor_counts_tokens_as_prepare_does(tmp_path, image_data, llava_processor_dir):
    raw, _data = image_data
    settings = {"max_length": 40, "max_prompt_length": 30}
    prepared = prepare(raw, tmp_path / "out", processor=str(llava_processor_dir), workers=1, progress=False,
                       **settings).report
    checked = validate(raw, processor=str(llava_processor_dir), progress=False, workers=2, format="json",
                       output=str(tmp_path / "r.json"), **settings).report
    assert checked["lengths"]["unit"] == "tokens"
    for key in ("lengths", "truncation", "images"):
        assert checked[key] == prepared[key], key
    assert checked["flags"][F.IMAGE_TRUNCATED]["count"] == prepared["flags"][F.IMAGE_TRUNCATED]["count"] > 0
    assert checked["tokenizer"] == str(llava_processor_dir) and checked["meta"]["processor"] == str(llava_processor_dir)


def test_processor_and_tokenizer_exclude_each_other(tmp_path, image_data, llava_processor_dir, capsys):
    raw, _data = image_data
    with pytest.raises(PrefdataError, match="exclude each other"):
        validate(raw, tokenizer=str(llava_processor_dir), processor=str(llava_processor_dir), progress=False)
    # the CLI's parser refuses the pair first, as it does every exclusive pair of flags (usage: [--tokenizer | --processor])
    with pytest.raises(SystemExit) as info:
        main(["validate", str(raw), "--processor", str(llava_processor_dir), "--tokenizer", str(llava_processor_dir)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("usage")]
    assert info.value.code == 2 and len(errors) == 1 and "--tokenizer: not allowed with argument --processor" in errors[0]


def test_validate_of_a_prepared_image_out(tmp_path, llava_processor_dir):
    """The stored images are read (never written to), give the same statistics, and count in duplicates:
    the same question over another image is not a duplicate on the re-check either."""
    img = tmp_path / "data" / "img"
    img.mkdir(parents=True)
    (img / "red.png").write_bytes(png_bytes((28, 28), (200, 0, 0)))
    (img / "blue.png").write_bytes(png_bytes((50, 30), (0, 0, 200)))
    rows = [image_row("What color?", ["img/red.png"]), image_row("What color?", ["img/blue.png"]),
            image_row("What color?", ["img/red.png"])]
    out = tmp_path / "out"
    prepared = prepare(write_jsonl(tmp_path / "data" / "pairs.jsonl", rows), out, processor=str(llava_processor_dir),
                       workers=1, progress=False).report
    before = sorted(p.name for p in out.iterdir())
    plain = validate(out, progress=False, format="json", output=str(tmp_path / "plain.json")).report
    counted = validate(out, processor=str(llava_processor_dir), progress=False, format="json",
                       output=str(tmp_path / "counted.json")).report
    assert sorted(p.name for p in out.iterdir()) == before
    assert plain["images"] == {**prepared["images"], "tokens_per_image": None}
    assert counted["images"] == prepared["images"]
    assert plain["flags"][F.DUPLICATE_PAIR]["count"] == prepared["flags"][F.DUPLICATE_PAIR]["count"] == 1
    assert [e["source_line"] for e in plain["flags"][F.DUPLICATE_PAIR]["examples"]] == [3]
    # Another processor's counts would not describe OUT's ids: refused in one line (exit 2), as refs does.
    from prefdata.tiny import build_tiny_llava_processor

    build_tiny_llava_processor(tmp_path / "other", image_size=42)  # 9 tokens per image, not 4
    with pytest.raises(PrefdataError, match="differs from the one .* was prepared with"):
        validate(out, processor=str(tmp_path / "other"), progress=False, format="json",
                 output=str(tmp_path / "other.json"))


def test_validate_refuses_a_processor_for_a_text_out(tmp_path, tiny_model_dir, llava_processor_dir):
    out = tmp_path / "out"
    prepare(write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Hi", "chosen": "Hello.", "rejected": "No."}]), out,
            tokenizer=str(tiny_model_dir), workers=1, progress=False)
    with pytest.raises(PrefdataError, match="was not prepared with one"):
        validate(out, processor=str(llava_processor_dir), progress=False)
