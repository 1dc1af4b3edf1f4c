"""Benchmark: `prefdata prepare --processor` vs TRL's own vision preprocessing, on the same image rows.

Same rows, same processor, same process (the image set and processor are made first, not timed):
  (a) prefdata: `prefdata.prepare.prepare(..., processor=DIR)` end to end: read JSONL, normalize, read
      and fully decode every image (in the worker processes), count each image's tokens with the
      processor, render the chat template, tokenize, truncate, every check (image_mismatch,
      image_truncated, duplicates over the image bytes, ...), write the Arrow dataset with the image
      bytes, manifest and reports. It makes no pixel values: those come at refs / train time.
  (b) TRL: what TRL 1.16 does per row before the model, over every row once: a `datasets.Dataset` of
      the rows with an `images` column of `datasets.Image` (paths, decoded on access, as the Trainer's
      dataloader reads them) and `DataCollatorForVisionPreference` over batches of --batch rows
      (chat template + `processor(text, images)`, which also makes the pixel values, and the
      completion masks). TRL does this again every epoch; prefdata's prepare runs once.
Two rows say where the time goes (not comparisons):
  (c) pixel values alone: the processor on the same batches' images (twice per batch, for the chosen
      and rejected copies, as TRL's collator passes them).
  (d) the hand-off's batches: `prefdata.trl.collator.ImagePairCollator` over OUT (the stored ids
      plus pixel values, the image processor once per batch), what `prefdata.trl.DPOTrainer` runs
      per batch at train time in place of (b).

The processor: LLaVA-1.5's layout (a CLIP image processor, 336 px crops, 14 px patches: 576 image
tokens per image, Pillow only) on Qwen2.5's tokenizer from ../shared with one `<image>` token added,
and a ChatML template that renders image parts. The rows: the UltraFeedback sample's texts, one image
per row (two on every fifth row), Pillow-made images of four sizes written as JPEG and PNG files.

Usage: python bench/bench_vision.py [--rows 300] [--batch 8] [--repeat 2] [--max-length 2048]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import warnings
from pathlib import Path

from bench_prepare import DEFAULT_DATA, DEFAULT_TOKENIZER, REPO, Timer  # bench/ is on sys.path: these run as scripts

SIZES = [(640, 480), (336, 336), (1024, 768), (480, 640)]
IMAGE_SIZE, PATCH_SIZE = 336, 14


def build_processor(tokenizer_dir: Path, out: Path) -> Path:
    """LLaVA-1.5's image layout on the given tokenizer, saved as a processor directory."""
    from transformers import AutoTokenizer, CLIPImageProcessorPil, LlavaProcessor

    from prefdata.tiny import LLAVA_CHATML_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.chat_template = LLAVA_CHATML_TEMPLATE
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                            crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=LLAVA_CHATML_TEMPLATE)
    processor.save_pretrained(str(out))
    return out


def make_image(index: int, size: tuple[int, int]):
    """A distinct picture: a colour gradient with noise and a few shapes (photo-like file sizes)."""
    from PIL import Image, ImageDraw

    rng = random.Random(index)
    width, height = size
    base = Image.linear_gradient("L").resize(size)
    noise = Image.effect_noise(size, 40)
    channels = [Image.blend(base, noise, rng.uniform(0.2, 0.6)) for _ in range(3)]
    image = Image.merge("RGB", channels)
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x, y = rng.randrange(width), rng.randrange(height)
        draw.ellipse([x, y, x + rng.randrange(20, 200), y + rng.randrange(20, 200)],
                     fill=tuple(rng.randrange(256) for _ in range(3)))
    return image


def write_image_set(source: Path, rows: int, root: Path) -> tuple[Path, list[dict]]:
    """pairs.jsonl (TRL's conversational layout) beside img/, and the rows as written."""
    texts = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    (root / "img").mkdir(parents=True)
    written, counter = [], 0
    for i in range(rows):
        text = texts[i % len(texts)]
        paths = []
        for _ in range(2 if i % 5 == 4 else 1):
            size = SIZES[counter % len(SIZES)]
            name = f"img/{counter:05d}.{'png' if counter % 4 == 3 else 'jpg'}"
            image = make_image(counter, size)
            if name.endswith(".jpg"):
                image.save(root / name, quality=90)
            else:
                image.save(root / name)
            paths.append(name)
            counter += 1
        content = [{"type": "image"}] * len(paths) + [{"type": "text", "text": text["prompt"]}]
        written.append({"prompt": [{"role": "user", "content": content}],
                        "chosen": [{"role": "assistant", "content": text["chosen"]}],
                        "rejected": [{"role": "assistant", "content": text["rejected"]}], "images": paths})
    raw = root / "pairs.jsonl"
    raw.write_text("".join(json.dumps(row) + "\n" for row in written), encoding="utf-8")
    return raw, written


def trl_dataset(rows: list[dict], root: Path):
    """The rows as a TRL user hands them to DPOTrainer: images as a datasets.Image list (decoded on access)."""
    import datasets

    dataset = datasets.Dataset.from_list([{**row, "images": [str(root / p) for p in row["images"]]} for row in rows])
    return dataset.cast_column("images", datasets.List(datasets.Image()))


def time_trl(dataset, processor_dir: Path, batch: int, max_length: int) -> tuple[float, float]:
    """DataCollatorForVisionPreference over every row once, in the Trainer's batches (images decoded by
    the dataset on access, as the dataloader reads them)."""
    from transformers import AutoProcessor
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    collator = DataCollatorForVisionPreference(processor=AutoProcessor.from_pretrained(str(processor_dir)), max_length=max_length)
    with Timer() as timer:
        for start in range(0, len(dataset), batch):
            out = collator(dataset.__getitems__(list(range(start, min(start + batch, len(dataset))))))
            assert out["pixel_values"].shape[0] > 0
    return timer.times


def time_pixels(dataset, processor_dir: Path, batch: int) -> tuple[float, float]:
    """The pixel part of (b) alone: the processor on each batch's images, twice, as TRL passes them."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(processor_dir))
    with Timer() as timer:
        for start in range(0, len(dataset), batch):
            rows = dataset.__getitems__(list(range(start, min(start + batch, len(dataset)))))
            processor(images=[row["images"] for row in rows] * 2, return_tensors="pt")
    return timer.times


def time_handoff(out: Path, processor_dir: Path, batch: int, max_length: int) -> tuple[float, float]:
    """The hand-off's per-batch work at train time: ImagePairCollator over OUT's rows."""
    import datasets
    from transformers import AutoProcessor

    from prefdata.trl.collator import ImagePairCollator

    processor = AutoProcessor.from_pretrained(str(processor_dir))
    dataset = datasets.load_from_disk(str(out)).select_columns(["prompt_ids", "chosen_ids", "rejected_ids", "images"])
    collator = ImagePairCollator(processor=processor, pad_token_id=processor.tokenizer.pad_token_id or 0, max_length=max_length)
    with Timer() as timer:
        for start in range(0, len(dataset), batch):
            collator(dataset.__getitems__(list(range(start, min(start + batch, len(dataset))))))
    return timer.times


def time_prefdata(raw: Path, out: Path, processor_dir: Path, max_length: int) -> tuple[tuple[float, float], object]:
    from prefdata.prepare import prepare

    with Timer() as timer:
        result = prepare(raw, out, processor=str(processor_dir), max_length=max_length, overwrite=True, progress=False)
    return timer.times, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300, help="image rows (one image each, two on every fifth)")
    parser.add_argument("--batch", type=int, default=8, help="rows per TRL collator batch (a per-device batch size)")
    parser.add_argument("--max-length", type=int, default=2048, help="the same for prefdata and TRL's collator")
    parser.add_argument("--repeat", type=int, default=2, help="rounds; each method keeps its best wall time")
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    args = parser.parse_args()
    source = Path(args.data)
    if not source.exists() or not Path(args.tokenizer).is_dir():
        sys.exit(f"needs {source} and {args.tokenizer} (../shared)")
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("trl").setLevel(logging.ERROR)
    from datasets import disable_progress_bars

    disable_progress_bars()

    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:
        root = Path(tmp)
        processor_dir = build_processor(Path(args.tokenizer), root / "processor")
        raw, rows = write_image_set(source, args.rows, root / "data")
        images = sum(len(row["images"]) for row in rows)
        image_mib = sum(p.stat().st_size for p in (root / "data" / "img").iterdir()) / 2**20
        dataset = trl_dataset(rows, root / "data")
        results: dict[str, tuple[float, float]] = {}

        def best(name: str, timing: tuple[float, float]) -> None:
            if name not in results or timing[0] < results[name][0]:  # other load only ever slows a run
                results[name] = timing

        # Each method warmed up on a few rows so imports and processor loading don't count.
        warm_raw, _ = write_image_set(source, 10, root / "warm")
        time_prefdata(warm_raw, root / "warm-out", processor_dir, args.max_length)
        time_trl(trl_dataset(rows[:10], root / "data"), processor_dir, args.batch, args.max_length)
        names = ("prefdata prepare --processor (end to end)", "TRL DataCollatorForVisionPreference over every row",
                 "  of which pixel values alone (processor on the images, twice per batch)",
                 "  prefdata.trl ImagePairCollator over OUT (train-time batches)")
        result = None
        for _ in range(args.repeat):  # the methods alternate, so slow spells hit each of them
            timing, result = time_prefdata(raw, root / "out", processor_dir, args.max_length)
            best(names[0], timing)
            best(names[1], time_trl(dataset, processor_dir, args.batch, args.max_length))
            best(names[2], time_pixels(dataset, processor_dir, args.batch))
            best(names[3], time_handoff(root / "out", processor_dir, args.batch, args.max_length))

    import transformers
    import trl

    n = args.rows
    print(f"\n{n} rows, {images} images ({image_mib:.1f} MiB of JPEG/PNG files, sizes "
          f"{', '.join(f'{w}x{h}' for w, h in SIZES)}), 576 image tokens per image, Qwen2.5 tokenizer + LLaVA-1.5 "
          f"image layout, max_length {args.max_length}, TRL batches of {args.batch}, trl {trl.__version__}, "
          f"transformers {transformers.__version__}, {os.cpu_count()} CPUs, best wall of {args.repeat} rounds")
    print(f"prefdata kept {result.rows_out} of {n} pairs, flags {dict(sorted(result.flag_counts.items()))}\n")
    print("| method | wall s | pairs/s (wall) | CPU s | pairs per CPU-s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (wall, cpu) in results.items():
        print(f"| {name} | {wall:.1f} | {n / wall:.0f} | {cpu:.1f} | {n / cpu:.0f} |")
    ours, theirs = results[names[0]], results[names[1]]
    print(f"\nwall: prefdata prepare / TRL vision preprocessing = {theirs[0] / ours[0]:.2f}x; "
          f"CPU: {theirs[1] / ours[1]:.2f}x")
    print("(TRL's collator also makes pixel values, and runs again every epoch; prefdata's prepare decodes and "
          "checks every image and counts its tokens, once, and makes pixel values at refs / train time.)")


if __name__ == "__main__":
    main()
