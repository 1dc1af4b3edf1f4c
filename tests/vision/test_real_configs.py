"""Processors assembled from published configuration files (tests/vision/fixtures, see its README):
Qwen2-VL-2B-Instruct's image processor settings and chat template with the real Qwen2.5 tokenizer
(../shared, skipped without it), and llava-1.5-7b-hf's image processor, processor settings and
chat template with the tiny tokenizer. prepare's prompt ids equal the processor's own."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import datasets

from prefdata.prepare import prepare
from prefdata.tiny import build_tiny_tokenizer
from prefdata.tokenize.processor import load_processor
from vision_helpers import image_row, png_bytes, processor_prompt_ids, write_jsonl

FIXTURES = Path(__file__).parent / "fixtures"
SIZES = {"small": (20, 20), "wide": (100, 60), "tall": (50, 170), "photo": (300, 200)}


def _assemble(out: Path, tokenizer_dir: Path, configs: str) -> Path:
    out.mkdir(parents=True)
    for source in [*tokenizer_dir.iterdir(), *(FIXTURES / configs).iterdir()]:
        shutil.copyfile(source, out / source.name)
    return out


def _prepare_rows(tmp_path: Path, processor_dir: Path):
    images = tmp_path / "data" / "img"
    images.mkdir(parents=True)
    for i, (name, size) in enumerate(SIZES.items()):
        (images / f"{name}.png").write_bytes(png_bytes(size, (60 * i, 120, 250 - 60 * i)))
    rows = [
        image_row("Describe the picture.", ["img/small.png"]),
        image_row("Which one is wider?", ["img/wide.png", "img/tall.png"], placeholders=2),
        image_row("And these three?", ["img/photo.png", "img/small.png", "img/tall.png"], placeholders=3),
    ]
    raw = write_jsonl(tmp_path / "data" / "pairs.jsonl", rows)
    result = prepare(raw, tmp_path / "out", processor=str(processor_dir), progress=False, workers=1)
    assert result.rows_out == len(rows), (tmp_path / "out" / "dropped.jsonl").read_text()
    return list(datasets.load_from_disk(str(tmp_path / "out")))


def test_qwen2vl_2b_configs_with_the_real_qwen_tokenizer(tmp_path, shared_tokenizer):
    processor_dir = _assemble(tmp_path / "qwen2-vl", Path(shared_tokenizer("qwen2.5-instruct")), "qwen2-vl-2b-instruct")
    processor = load_processor(str(processor_dir))
    assert type(processor).__name__ == "Qwen2VLProcessor"
    if importlib.util.find_spec("torchvision") is None:  # loaded without its video processor
        assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    counts = []
    for row in _prepare_rows(tmp_path, processor_dir):
        assert row["prompt_ids"] == processor_prompt_ids(processor, row["prompt"], row["images"])
        counts.append(row["prompt_ids"].count(pad))
    # Real bounds (min_pixels 3136, 14px patches merged 2x2): 4 tokens for the smallest image, more as they grow.
    assert counts[0] == 4 and len(set(counts)) == 3


def test_llava_15_configs_with_the_tiny_tokenizer(tmp_path):
    tokenizer = build_tiny_tokenizer(tmp_path / "tokenizer")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
    processor_dir = _assemble(tmp_path / "llava", tmp_path / "tokenizer", "llava-1.5-7b-hf")
    processor = load_processor(str(processor_dir))
    image = processor.tokenizer.convert_tokens_to_ids("<image>")
    for row in _prepare_rows(tmp_path, processor_dir):
        # Its template renders only content parts (a string content would render nothing): the
        # completions are there, and the ids are the processor's own.
        assert row["prompt_ids"] == processor_prompt_ids(processor, row["prompt"], row["images"])
        assert row["prompt_ids"].count(image) == 576 * len(row["images"])  # 336px crops, 14px patches
        assert len(row["chosen_ids"]) > 1 and len(row["rejected_ids"]) > 1
