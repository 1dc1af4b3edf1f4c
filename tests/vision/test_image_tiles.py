"""Processors that split an image into tiles (Idefics3 / SmolVLM with image splitting): each image
becomes rows x cols `<fake_token_around_image><row_r_col_c>` + N x `<image>` blocks and a global
block, rows and cols following its size. prepare's prompt ids equal the processor's own for every
size and image count, truncation never cuts into a tiled image's expansion, typed markers are a
mismatch, and a layout prefdata cannot reproduce is refused with one line (refs and train with tiles:
test_idefics3_refs_train.py)."""

from __future__ import annotations

import json

import datasets
import pytest
from vision_helpers import assert_cuts, dropped, image_row, prepare_rows, processor_prompt_ids, write_pngs

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.tokenize import image_layout
from prefdata.tokenize.processor import load_processor
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.vision import VisionPairTokenizer

# (width, height) -> (rows, cols) under the tiny processor (longest edge 84 px, 28-px tiles)
SIZES = {"small": ((10, 10), (3, 3)), "wide": ((100, 60), (2, 3)), "tall": ((40, 130), (3, 1)),
         "strip": ((200, 20), (1, 3))}


def _images(directory):
    write_pngs(directory, {name: size for name, (size, _grid) in SIZES.items()}, lambda i: (50 * i, 90, 200 - 40 * i))


def _tiles(ids, tokenizer):
    """The (row, col) markers in `ids`, in order."""
    names = tokenizer.convert_ids_to_tokens(ids)
    return [tuple(int(x) for x in name[len("<row_"):-1].split("_col_")) for name in names if name.startswith("<row_")]


def test_tiled_ids_equal_the_processors_own_for_every_size_and_image_count(tmp_path, idefics3_processor_dir):
    _images(tmp_path / "data" / "img")
    between = image_row("", ["img/wide.png", "img/strip.png"], placeholders=0)
    between["prompt"][0]["content"] = [{"type": "text", "text": "First"}, {"type": "image"},
                                       {"type": "text", "text": "then"}, {"type": "image"}, {"type": "text", "text": "?"}]
    rows = [image_row("What is this?", ["img/small.png"]),
            image_row("Compare them.", ["img/wide.png", "img/tall.png"], placeholders=2),
            image_row("Three of them.", ["img/strip.png", "img/small.png", "img/wide.png"], placeholders=3),
            between]
    result, out = prepare_rows(tmp_path, rows, idefics3_processor_dir)
    assert result.rows_out == 4, (out / "dropped.jsonl").read_text()
    processor = load_processor(str(idefics3_processor_dir))
    grids = {(size, tuple(grid)) for size, grid in SIZES.values()}
    seen = set()
    for row in datasets.load_from_disk(str(out)):
        assert row["prompt_ids"] == processor_prompt_ids(processor, row["prompt"], row["images"])
        tiles = _tiles(row["prompt_ids"], processor.tokenizer)
        expected = []
        for image in row["images"]:
            rows_, cols = next(grid for size, grid in grids if size == image.size)
            expected += [(r, c) for r in range(1, rows_ + 1) for c in range(1, cols + 1)]
            seen.add((rows_, cols))
        assert tiles == expected  # each image split into its own rows x cols
    assert seen == {(3, 3), (2, 3), (3, 1), (1, 3)}  # square, non-square both ways, one row
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["processor"]["expansion"] == {"per_image_size": "rows_cols"}


def test_tiled_truncation_never_cuts_into_the_expansion(tmp_path, idefics3_processor_dir):
    _images(tmp_path / "data" / "img")
    row = image_row("", ["img/wide.png"], placeholders=0)
    row["prompt"][0]["content"] = [{"type": "text", "text": "Some words before the picture here. " * 2},
                                   {"type": "image"}, {"type": "text", "text": "Color?"}]
    _result, whole = prepare_rows(tmp_path, [row], idefics3_processor_dir, name="whole")
    [full] = datasets.load_from_disk(str(whole))
    ids = full["prompt_ids"]
    tokenizer = load_processor(str(idefics3_processor_dir)).tokenizer
    fake = tokenizer.convert_tokens_to_ids("<fake_token_around_image>")
    start = ids.index(fake)
    end = len(ids) - ids[::-1].index(fake)  # the global block's closing fake token, the expansion's last
    # A cut at the first tile keeps the image whole; inside a tile, at a row break, in the global block,
    # or at its last token would train the image half-visible.
    newline_at = start + ids[start:].index(tokenizer.encode("\n", add_special_tokens=False)[0])
    assert_cuts(tmp_path, row, idefics3_processor_dir, ids,
                [(start, False), (start + 1, True), (newline_at, True), (end - 3, True), (end - 1, True)])


def test_tiled_mismatches_count_placeholders_and_typed_markers(tmp_path, idefics3_processor_dir):
    _images(tmp_path / "data" / "img")
    rows = [image_row("two placeholders, one image", ["img/small.png"], placeholders=2),
            image_row("A <global-img> typed in the text.", ["img/small.png"]),  # image tokens with no image
            image_row("fine", ["img/tall.png"])]
    result, out = prepare_rows(tmp_path, rows, idefics3_processor_dir)
    assert [(d["source_line"], d["flags"]) for d in dropped(out)] == [(1, [F.IMAGE_MISMATCH]), (2, [F.IMAGE_MISMATCH])]
    assert result.rows_out == 1


def test_the_processors_own_output_is_the_fallback_when_its_tile_count_disagrees(tmp_path, idefics3_processor_dir,
                                                                                monkeypatch):
    """A tile count that does not match what the image processor does (here: one row short) is
    caught on the probes; the processor's own replacement text for a blank image of the size is used."""
    real = load_processor(str(idefics3_processor_dir)).image_processor.get_number_of_image_patches

    def short(self, height, width, images_kwargs=None):
        patches, rows, cols = real(height, width, images_kwargs)
        return patches, max(rows - 1, 1), cols

    image_processor_class = type(load_processor(str(idefics3_processor_dir)).image_processor)
    monkeypatch.setattr(image_processor_class, "get_number_of_image_patches", short)
    tokenizer = VisionPairTokenizer(str(idefics3_processor_dir), TokenizeSettings())
    tokenizer.setup()
    assert tokenizer.layout is not None and tokenizer.layout.method == "processor"
    _images(tmp_path / "data" / "img")
    _result, out = prepare_rows(tmp_path, [image_row("Compare.", ["img/wide.png", "img/tall.png"], placeholders=2)],
                           idefics3_processor_dir)
    [row] = datasets.load_from_disk(str(out))
    assert row["prompt_ids"] == processor_prompt_ids(load_processor(str(idefics3_processor_dir)), row["prompt"],
                                                     row["images"])


def test_a_layout_whose_ids_depend_on_the_text_around_it_is_refused_in_one_line(idefics3_processor_dir, monkeypatch):
    """An expansion that begins with plain text merges with what precedes it: its ids could not be
    found again for truncation, so the processor is refused rather than truncated blind."""
    processor_class = type(load_processor(str(idefics3_processor_dir)))
    real = processor_class.replace_image_token
    monkeypatch.setattr(processor_class, "replace_image_token",
                        lambda self, inputs, image_idx, **kw: "img " + real(self, inputs, image_idx, **kw))
    tokenizer = VisionPairTokenizer(str(idefics3_processor_dir), TokenizeSettings())
    with pytest.raises(PrefdataError) as refused:
        tokenizer.setup()
    message = str(refused.value)
    assert "\n" not in message and message.startswith("processor Idefics3Processor expands '<image>' neither")
    assert "added token" in message


def test_distinct_sizes_are_built_once(idefics3_processor_dir, monkeypatch):
    tokenizer = VisionPairTokenizer(str(idefics3_processor_dir), TokenizeSettings())
    tokenizer.setup()
    layout = tokenizer.layout
    calls = []
    build = layout.build
    monkeypatch.setattr(layout, "build", lambda w, h: calls.append((w, h)) or build(w, h))
    for _ in range(3):
        layout.expand("<image> and <image>", [(123, 45), (45, 123)])
    assert calls == [(123, 45), (45, 123)]
    assert image_layout.find([1, 2, 3, 2, 3], [2, 3], 2) == 3
