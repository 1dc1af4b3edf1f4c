"""Image pairs through prepare with a processor: exact token counts, image flags, duplicates over image
bytes, OUT's images and manifest, and the same content whatever the number of workers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")

from prefdata.core import flags as F  # noqa: E402
from prefdata.prepare import prepare  # noqa: E402
from prefdata.tokenize.settings import TokenizeSettings  # noqa: E402
from prefdata.tokenize.truncate import truncate_pair  # noqa: E402
from vision_helpers import image_row, png_bytes, write_jsonl  # noqa: E402

IMAGE_TOKENS = 4  # the tiny processor: 28px crops, 14px patches


def _images(directory, **sizes):
    directory.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (directory / f"{name}.png").write_bytes(png_bytes(size, (len(name) * 40 % 255, 90, 30)))


def _prepare(tmp_path, rows, processor, name="out", **kwargs):
    raw = write_jsonl(tmp_path / "data" / "pairs.jsonl", rows)
    out = tmp_path / name
    result = prepare(raw, out, processor=str(processor), progress=False, **{"workers": 1, **kwargs})
    return result, out


def _dropped(out):
    return [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]


def test_token_counts_equal_the_processors_own_expansion(tmp_path, llava_processor_dir):
    import datasets
    from transformers import AutoProcessor

    _images(tmp_path / "data" / "img", wide=(64, 20), tall=(10, 90))
    two = image_row("Compare them.", ["img/wide.png", "img/tall.png"], placeholders=2)
    text_placeholder = image_row("", ["img/tall.png"], placeholders=0)
    text_placeholder["prompt"][0]["content"] = "Look: <image> What is it?"  # the model's own placeholder text
    result, out = _prepare(tmp_path, [two, text_placeholder], llava_processor_dir)
    assert result.rows_out == 2, (out / "dropped.jsonl").read_text()
    processor = AutoProcessor.from_pretrained(str(llava_processor_dir))
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    for row in datasets.load_from_disk(str(out)):
        text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        expected = processor(text=[text], images=row["images"])["input_ids"][0]
        assert row["prompt_ids"] == expected
        assert row["prompt_ids"].count(image_id) == IMAGE_TOKENS * len(row["images"])


def test_image_mismatch_is_an_error_and_the_pair_is_dropped(tmp_path, llava_processor_dir):
    _images(tmp_path / "data" / "img", a=(28, 28))
    rows = [
        image_row("two placeholders, one image", ["img/a.png"], placeholders=2),
        image_row("no placeholder, one image", ["img/a.png"], placeholders=0),
        image_row("ok", ["img/a.png"]),
    ]
    result, out = _prepare(tmp_path, rows, llava_processor_dir)
    assert result.flag_counts.get(F.IMAGE_MISMATCH) == 2 and result.errors == 2 and result.exit_code == 1
    assert [(d["source_line"], d["flags"], d["severity"]) for d in _dropped(out)] == [
        (1, [F.IMAGE_MISMATCH], "error"), (2, [F.IMAGE_MISMATCH], "error"),
    ]


def test_image_truncated_when_the_cut_would_reach_the_image_tokens(tmp_path, llava_processor_dir):
    _images(tmp_path / "data" / "img", a=(28, 28))
    first = image_row("What color is this picture exactly?", ["img/a.png"])  # image first, text after
    last = image_row("", ["img/a.png"], placeholders=0)  # long text first, image at the end
    last["prompt"][0]["content"] = [{"type": "text", "text": "Some words before the picture here. " * 3},
                                    {"type": "image"}, {"type": "text", "text": "Color?"}]
    result, out = _prepare(tmp_path, [first, last], llava_processor_dir, max_prompt_length=16, max_length=24)
    assert result.flag_counts.get(F.IMAGE_TRUNCATED) == 1
    assert [(d["source_line"], d["flags"]) for d in _dropped(out)] == [(1, [F.IMAGE_TRUNCATED])]
    import datasets

    [kept] = datasets.load_from_disk(str(out))
    assert kept["source_line"] == 2 and len(kept["prompt_ids"]) == 16  # cut in its text, left of the image
    assert F.IMAGE_TRUNCATED not in kept["flags"]


def test_a_kept_image_truncated_pair_keeps_every_image_token(tmp_path, llava_processor_dir):
    """Under a policy that only warns, the pair is never half-visible: its prompt is left whole."""
    import datasets

    _images(tmp_path / "data" / "img", a=(28, 28))
    policy = tmp_path / "warn.toml"
    policy.write_text('[flags]\nimage_truncated = "warn"\n', encoding="utf-8")
    _result, out = _prepare(tmp_path, [image_row("What color is this picture exactly?", ["img/a.png"])],
                            llava_processor_dir, max_prompt_length=16, max_length=24, policy=str(policy))
    [row] = datasets.load_from_disk(str(out))
    assert F.IMAGE_TRUNCATED in row["flags"]
    assert row["prompt_ids"].count(row["prompt_ids"][3]) == IMAGE_TOKENS  # <image> x4 right after "<|im_start|>user\n"
    assert len(row["prompt_ids"]) > 16


def test_truncate_pair_protects_image_spans():
    settings = TokenizeSettings(max_length=8, max_prompt_length=4)
    prompt = [1, 9, 9, 9, 2, 3, 4]  # image tokens at [1, 4)
    flagged = truncate_pair(prompt, [5, 6], [7, 8], settings, image_spans=[(1, 4)])
    assert flagged.flags == [F.IMAGE_TRUNCATED]  # left whole: nothing cut, nothing else to say
    assert (flagged.prompt_ids, flagged.chosen_ids, flagged.rejected_ids) == (prompt, [5, 6], [7, 8])
    clear = truncate_pair([2, 3, 4, 1, 9, 9, 9], [5], [6], settings, image_spans=[(4, 7)])
    assert F.IMAGE_TRUNCATED not in clear.flags and clear.prompt_ids == [1, 9, 9, 9]
    plain = truncate_pair(prompt, [5, 6], [7, 8], settings)
    assert plain.prompt_ids == [9, 2, 3, 4] and F.IMAGE_TRUNCATED not in plain.flags


def test_duplicates_take_the_image_bytes_into_account(tmp_path, llava_processor_dir):
    _images(tmp_path / "data" / "img", red=(28, 28), other=(28, 28))
    (tmp_path / "data" / "img" / "copy.png").write_bytes((tmp_path / "data" / "img" / "red.png").read_bytes())
    rows = [
        image_row("What is shown?", ["img/red.png"]),
        image_row("What is shown?", ["img/other.png"]),  # same text, another image: not a duplicate
        image_row("What is shown?", ["img/copy.png"]),  # same bytes under another name: a duplicate
    ]
    (tmp_path / "data" / "img" / "other.png").write_bytes(png_bytes((28, 28), (1, 200, 3)))
    result, out = _prepare(tmp_path, rows, llava_processor_dir)
    import datasets

    flags = {r["source_line"]: r["flags"] for r in datasets.load_from_disk(str(out))}
    assert flags == {1: [], 2: [], 3: [F.DUPLICATE_PAIR]}


def test_workers_give_the_same_content_and_the_manifest_records_the_processor(tmp_path, llava_processor_dir):
    _images(tmp_path / "data" / "img", a=(28, 28), b=(50, 30), c=(20, 44))
    rows = []
    for i in range(60):
        name = "abc"[i % 3]
        rows.append(image_row(f"Question {i} about the picture?", [f"img/{name}.png"], chosen=f"Answer {i}."))
        if i % 7 == 0:
            rows.append({"prompt": [{"role": "user", "content": f"text only {i}"}], "chosen": "yes", "rejected": "no"})
    hashes = []
    for workers in (1, 2):
        result, out = _prepare(tmp_path, rows, llava_processor_dir, name=f"out{workers}", workers=workers, batch_size=7)
        assert result.rows_out == len(rows)
        manifest = json.loads((out / "manifest.json").read_text())
        hashes.append(manifest["content_hash"])
    assert hashes[0] == hashes[1]
    assert manifest["processor"]["class"] == "LlavaProcessor"
    assert manifest["processor"]["image_processor"] == "CLIPImageProcessorPil"
    assert manifest["config"]["processor"] == str(llava_processor_dir)


def test_content_hash_changes_with_the_image_bytes(tmp_path, llava_processor_dir):
    hashes = []
    for color in ((1, 2, 3), (3, 2, 1)):
        (tmp_path / "data" / "img").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / "img" / "a.png").write_bytes(png_bytes((28, 28), color))
        _r, out = _prepare(tmp_path, [image_row("q", ["img/a.png"])], llava_processor_dir, name=f"o{color[0]}")
        hashes.append(json.loads((out / "manifest.json").read_text())["content_hash"])
    assert hashes[0] != hashes[1]


def test_explicit_string_rows_take_their_images_with_the_models_placeholder_text(tmp_path, llava_processor_dir):
    """TRL's standard (non-conversational) image rows: a string prompt with the model's placeholder
    and an `images` column. The images are the pair's (expanded, checked), not a pass-through column
    that a text-only run would silently drop."""
    import datasets
    from transformers import AutoProcessor

    _images(tmp_path / "data" / "img", wide=(64, 20))
    rows = [
        {"prompt": "<image>\nWhat color is it?", "chosen": " Red.", "rejected": " Blue.", "images": ["img/wide.png"]},
        {"prompt": "<image><image>\nCompare.", "chosen": " Same.", "rejected": " Different.", "images": ["img/wide.png"]},
    ]
    result, out = _prepare(tmp_path, rows, llava_processor_dir)
    assert result.rows_out == 1 and result.report["flags"][F.IMAGE_MISMATCH]["count"] == 1
    processor = AutoProcessor.from_pretrained(str(llava_processor_dir))
    row = datasets.load_from_disk(str(out))[0]
    assert row["prompt_ids"] == processor(text=[rows[0]["prompt"]], images=row["images"])["input_ids"][0]
    assert len(row["images"]) == 1

    # Without a processor the row is not tokenized as text alone: it is quarantined with the reason.
    from prefdata.tiny import build_tiny_tokenizer

    build_tiny_tokenizer(tmp_path / "tok")
    from prefdata.core.errors import PrefdataError

    with pytest.raises(PrefdataError, match="row has images: prepare image pairs with --processor"):
        prepare(tmp_path / "data" / "pairs.jsonl", tmp_path / "text-out", tokenizer=str(tmp_path / "tok"),
                progress=False, workers=1)


def test_show_names_the_images_and_collapses_their_token_runs(tmp_path, llava_processor_dir):
    from prefdata.show import show_row

    _images(tmp_path / "data" / "img", wide=(64, 20))
    _result, out = _prepare(tmp_path, [image_row("What color?", ["img/wide.png"])], llava_processor_dir)
    text = show_row(out, row=0)
    assert "images: 1 (64x20 px)" in text
    assert f"<image>×{IMAGE_TOKENS}What color?" in text and "<image><image>" not in text


def test_kept_image_rows_are_written_by_bytes_as_well_as_by_count(tmp_path, llava_processor_dir, monkeypatch):
    """A write batch holds at most about WRITE_BATCH_BYTES of images (not 1,000 rows of them), and the
    dataset is the same as with one batch. One worker: the shard is written in this process, where
    the spy sees the batches."""
    import prefdata.pipeline.shard_stages as stages
    from prefdata.io.writer import DatasetWriter

    _images(tmp_path / "data" / "img", a=(64, 64), bb=(60, 40), ccc=(30, 50))
    rows = [image_row(f"Question {i}?", [f"img/{name}.png"]) for i, name in enumerate(["a", "bb", "ccc"] * 4)]
    whole, whole_out = _prepare(tmp_path, rows, llava_processor_dir, name="whole")
    image_size = max(len(png_bytes(size, (0, 0, 0))) for size in ((64, 64), (60, 40), (30, 50)))
    monkeypatch.setattr(stages, "WRITE_BATCH_BYTES", 2 * image_size)
    sizes: list[int] = []
    real = DatasetWriter.write_rows
    monkeypatch.setattr(DatasetWriter, "write_rows", lambda self, batch: (sizes.append(len(batch)), real(self, batch))[1])
    small, small_out = _prepare(tmp_path, rows, llava_processor_dir, name="small")
    assert small.rows_out == whole.rows_out == 12
    assert sizes and max(sizes) <= 3 and sum(sizes) == 12
    def content(out):
        return json.loads((out / "manifest.json").read_text())["content_hash"]

    assert content(small_out) == content(whole_out)
