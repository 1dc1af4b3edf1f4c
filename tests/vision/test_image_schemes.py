"""Placeholder schemes beyond one `<image>` expanded to N: Qwen2-VL's `<|vision_start|><|image_pad|><|vision_end|>`
whose pad run grows with the image, Gemma 3's `<start_of_image>` expanded to fixed text around a run of
another token, Idefics3's counted run between fake tokens. prepare's prompt ids equal the processor's
own, truncation never cuts into an image's expansion, `image_mismatch` counts placeholders as the
template renders them, and a layout prefdata cannot count is refused with one line."""

from __future__ import annotations

import importlib.util
import json
import shutil

import datasets
import pytest

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.tokenize.image_scheme import ImageScheme, image_spans
from prefdata.tokenize.processor import load_processor
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.vision import VisionPairTokenizer
from vision_helpers import assert_cuts, dropped, image_row, prepare_rows, processor_prompt_ids, write_pngs

SIZES = {"tiny": (10, 10), "wide": (100, 60), "tall": (40, 130), "big": (300, 200)}


def _images(directory):
    write_pngs(directory, SIZES, lambda i: (40 * i, 90, 200 - 40 * i))


def _rows_of_every_layout():
    between = image_row("", ["img/wide.png", "img/tiny.png"], placeholders=0)
    between["prompt"][0]["content"] = [{"type": "text", "text": "First"}, {"type": "image"},
                                       {"type": "text", "text": "then"}, {"type": "image"}, {"type": "text", "text": "?"}]
    return [
        image_row("What is this?", ["img/tiny.png"]),
        image_row("Compare them.", ["img/wide.png", "img/big.png"], placeholders=2),
        image_row("Three of them.", ["img/tall.png", "img/tiny.png", "img/big.png"], placeholders=3),
        between,
    ]


def _runs(ids, token_id):
    """Lengths of the runs of `token_id` in `ids`."""
    runs, length = [], 0
    for token in [*ids, None]:
        if token == token_id:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    return runs


# -- Qwen2-VL: a run whose length depends on the image size -----------------------------------

def test_qwen2vl_ids_equal_the_processors_own_for_every_size_and_image_count(tmp_path, qwen2vl_processor_dir):
    _images(tmp_path / "data" / "img")
    result, out = prepare_rows(tmp_path, _rows_of_every_layout(), qwen2vl_processor_dir)
    assert result.rows_out == 4, (out / "dropped.jsonl").read_text()
    processor = load_processor(str(qwen2vl_processor_dir))
    pad, start = (processor.tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|vision_start|>"))
    lengths = set()
    for row in datasets.load_from_disk(str(out)):
        assert row["prompt_ids"] == processor_prompt_ids(processor, row["prompt"], row["images"])
        runs = _runs(row["prompt_ids"], pad)
        assert len(runs) == len(row["images"]) == row["prompt_ids"].count(start)  # one vision_start/pad/end run each
        lengths.update(runs)
    assert len(lengths) >= 3  # the count follows the image's size: the rows do test a size-dependent grid


def test_qwen2vl_truncation_never_cuts_the_vision_start_pad_end_run(tmp_path, qwen2vl_processor_dir):
    _images(tmp_path / "data" / "img")
    row = image_row("", ["img/big.png"], placeholders=0)
    row["prompt"][0]["content"] = [{"type": "text", "text": "Some words before the picture here. " * 2},
                                   {"type": "image"}, {"type": "text", "text": "Color?"}]
    _result, whole = prepare_rows(tmp_path, [row], qwen2vl_processor_dir, name="whole")
    [full] = datasets.load_from_disk(str(whole))
    ids = full["prompt_ids"]
    tokenizer = load_processor(str(qwen2vl_processor_dir)).tokenizer
    start = ids.index(tokenizer.convert_tokens_to_ids("<|vision_start|>"))
    end = ids.index(tokenizer.convert_tokens_to_ids("<|vision_end|>")) + 1
    # A cut at the vision start keeps the image whole; one token later (the pads kept, their start
    # token lost: the cut a span of image tokens alone would allow) or inside the run must not happen.
    assert_cuts(tmp_path, row, qwen2vl_processor_dir, ids,
                [(start, False), (start + 1, True), ((start + end) // 2, True), (end - 1, True)])


def test_qwen2vl_placeholders_are_counted_as_the_template_renders_them(tmp_path, qwen2vl_processor_dir):
    _images(tmp_path / "data" / "img")
    own_text = image_row("", ["img/wide.png"], placeholders=0)
    own_text["prompt"][0]["content"] = "Look: <|vision_start|><|image_pad|><|vision_end|> What is it?"
    rows = [
        image_row("two placeholders, one image", ["img/tiny.png"], placeholders=2),
        own_text,  # the model's own placeholder text in a string prompt
        image_row("no placeholder, one image", ["img/tiny.png"], placeholders=0),
    ]
    result, out = prepare_rows(tmp_path, rows, qwen2vl_processor_dir)
    assert [(d["source_line"], d["flags"]) for d in dropped(out)] == [(1, [F.IMAGE_MISMATCH]), (3, [F.IMAGE_MISMATCH])]
    [kept] = datasets.load_from_disk(str(out))
    processor = load_processor(str(qwen2vl_processor_dir))
    assert kept["prompt_ids"] == processor_prompt_ids(processor, kept["prompt"], kept["images"])


def test_qwen2vl_loads_with_pillow_alone(qwen2vl_processor_dir):
    """Qwen2VLProcessor also declares a torchvision video processor; image pairs load without it."""
    processor = load_processor(str(qwen2vl_processor_dir))
    assert type(processor).__name__ == "Qwen2VLProcessor"
    if importlib.util.find_spec("torchvision") is None:
        assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"
        assert getattr(processor, "video_processor", None) is None
    tokenizer = VisionPairTokenizer(str(qwen2vl_processor_dir), TokenizeSettings())
    record = tokenizer.processor_record()
    assert (record["class"], record["placeholder"], record["image_token"]) == (
        "Qwen2VLProcessor", "<|image_pad|>", "<|image_pad|>")


# -- Gemma 3: fixed text around a run of another token ---------------------------------------

def test_gemma3_ids_equal_the_processors_own_for_every_size_and_image_count(tmp_path, gemma3_processor_dir):
    _images(tmp_path / "data" / "img")
    own_text = image_row("", ["img/tall.png"], placeholders=0)
    own_text["prompt"][0]["content"] = "Look: <start_of_image> What is it?"
    result, out = prepare_rows(tmp_path, [*_rows_of_every_layout(), own_text], gemma3_processor_dir)
    assert result.rows_out == 5, (out / "dropped.jsonl").read_text()
    processor = load_processor(str(gemma3_processor_dir))
    soft, boi, eoi = (processor.tokenizer.convert_tokens_to_ids(t)
                      for t in ("<image_soft_token>", "<start_of_image>", "<end_of_image>"))
    for row in datasets.load_from_disk(str(out)):
        assert row["prompt_ids"] == processor_prompt_ids(processor, row["prompt"], row["images"])
        images = len(row["images"])
        assert _runs(row["prompt_ids"], soft) == [4] * images
        assert row["prompt_ids"].count(boi) == row["prompt_ids"].count(eoi) == images
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["processor"]["placeholder"] == "<start_of_image>"
    assert manifest["processor"]["image_token"] == "<image_soft_token>"
    assert manifest["processor"]["expansion"] == {"prefix": "\n\n<start_of_image>", "suffix": "<end_of_image>\n\n"}


def test_gemma3_truncation_protects_the_text_around_the_run(tmp_path, gemma3_processor_dir):
    _images(tmp_path / "data" / "img")
    row = image_row("", ["img/wide.png"], placeholders=0)
    row["prompt"][0]["content"] = [{"type": "text", "text": "Some words before the picture here."},
                                   {"type": "image"}, {"type": "text", "text": "Color?"}]
    _result, whole = prepare_rows(tmp_path, [row], gemma3_processor_dir, name="whole")
    [full] = datasets.load_from_disk(str(whole))
    ids = full["prompt_ids"]
    tokenizer = load_processor(str(gemma3_processor_dir)).tokenizer
    boi = ids.index(tokenizer.convert_tokens_to_ids("<start_of_image>"))
    eoi = ids.index(tokenizer.convert_tokens_to_ids("<end_of_image>"))
    assert tokenizer.decode(ids[boi - 2:boi]) == "\n\n"  # the processor's prefix, one token per newline here
    # The "\n\n" before <start_of_image> and after <end_of_image> belong to the image as much as its run.
    assert_cuts(tmp_path, row, gemma3_processor_dir, ids,
                [(boi - 2, False), (boi - 1, True), (boi, True), (eoi + 1, True)], check_dropped=False)


def test_gemma3_image_mismatch_counts_placeholders_and_stray_image_tokens(tmp_path, gemma3_processor_dir):
    _images(tmp_path / "data" / "img")
    stray = image_row("A <image_soft_token> typed in the text.", ["img/tiny.png"])  # a run token with no image
    rows = [image_row("two placeholders, one image", ["img/tiny.png"], placeholders=2), stray,
            image_row("fine", ["img/tiny.png"])]
    result, out = prepare_rows(tmp_path, rows, gemma3_processor_dir)
    assert result.flag_counts.get(F.IMAGE_MISMATCH) == 2 and result.rows_out == 1
    assert [d["source_line"] for d in dropped(out)] == [1, 2]


# -- layouts that are not prefix + N tokens + suffix -------------------------------------------

def _idefics3_processor(out_dir, splitting):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Idefics3ImageProcessorPil"):
        pytest.skip("this transformers has no Idefics3ImageProcessorPil")
    from prefdata.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(out_dir / "_tokenizer")
    tokenizer.add_special_tokens({"additional_special_tokens": [
        "<global-img>", *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]})
    image_processor = transformers.Idefics3ImageProcessorPil(
        do_image_splitting=splitting, size={"longest_edge": 56}, max_image_size={"longest_edge": 28})
    processor = transformers.Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4)
    processor.save_pretrained(str(out_dir))
    shutil.rmtree(out_dir / "_tokenizer")
    return out_dir


def test_a_counted_run_between_fixed_tokens_is_learned(tmp_path):
    """Idefics3 without image splitting: "<fake_token_around_image><global-img>" + 4 x "<image>" +
    "<fake_token_around_image>", and a count (7) that includes the tokens around the run."""
    tokenizer = VisionPairTokenizer(str(_idefics3_processor(tmp_path / "idefics3", splitting=False)), TokenizeSettings())
    tokenizer.setup()
    scheme = tokenizer.scheme
    assert (scheme.prefix, scheme.image_token, scheme.suffix, scheme.run_offset) == (
        "<fake_token_around_image><global-img>", "<image>", "<fake_token_around_image>", 3)


def test_a_layout_that_changes_with_the_image_is_expanded_per_size(tmp_path):
    """Idefics3 splitting images into tiles: rows of runs with markers between them, not one run; it
    gets each image's text per size instead (tests/vision/test_image_tiles.py)."""
    tokenizer = VisionPairTokenizer(str(_idefics3_processor(tmp_path / "idefics3", splitting=True)), TokenizeSettings())
    tokenizer.setup()
    assert tokenizer.scheme is None and tokenizer.layout is not None and tokenizer.layout.method == "rows_cols"


# -- spans on token ids -----------------------------------------------------------------------

def test_image_spans_take_in_a_token_merged_across_the_edge():
    """A tokenizer with "\\n\\n\\n" as one token merges the row's newline with the prefix's two: the span
    starts at that token, so no cut can keep half the prefix."""
    vocab = {1: "<boi>", 2: "<eoi>", 3: "<soft>", 5: "text", 9: "\n\n\n", 8: "\n\n", 6: "!"}
    scheme = ImageScheme(placeholder="<boi>", image_token="<soft>", image_token_id=3, prefix="\n\n<boi>",
                         suffix="<eoi>\n\n", left_window=3, right_window=3)
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    ids = [5, 9, 1, 3, 3, 3, 2, 8, 6, 5, 8, 1, 3, 3, 3, 2, 9, 6]
    assert image_spans(ids, scheme, decode) == [(1, 8), (10, 17)]
    written_by_hand = [5, 3, 3, 5]  # run tokens with none of the processor's text: only the run is the image's
    assert image_spans(written_by_hand, scheme, decode) == [(1, 3)]


def test_image_spans_take_in_as_much_of_the_templates_text_as_the_row_has():
    """Qwen2-VL with add_vision_id renders "Picture 1: <|vision_start|>" at the probe and "Picture 2: ..."
    later: the shared tail (": <|vision_start|>") is protected, the run alone is not the image."""
    vocab = {1: "<vs>", 2: "<ve>", 3: "<pad>", 4: "Picture", 5: " 1", 6: " 2", 7: ":", 8: " "}
    scheme = ImageScheme(placeholder="<pad>", image_token="<pad>", image_token_id=3,
                         before="Picture 1: <vs>", after="<ve>", left_window=6, right_window=2)
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    ids = [4, 5, 7, 8, 1, 3, 3, 2, 4, 6, 7, 8, 1, 3, 2]
    assert image_spans(ids, scheme, decode) == [(0, 8), (10, 15)]


def test_a_plain_text_prompt_with_a_placeholder_and_no_image_is_a_mismatch(tmp_path, gemma3_processor_dir):
    """Explicit string rows are tokenized as written; a placeholder there still needs its image
    (it used to reach the trainer unexpanded: an image token with no image)."""
    rows = [{"prompt": "Look: <start_of_image> what is it?", "chosen": "A cat.", "rejected": "A dog."},
            {"prompt": "No picture here.", "chosen": "Fine.", "rejected": "Bad."}]
    result, out = prepare_rows(tmp_path, rows, gemma3_processor_dir)
    assert [(d["source_line"], d["flags"]) for d in dropped(out)] == [(1, [F.IMAGE_MISMATCH])]
    assert result.rows_out == 1
