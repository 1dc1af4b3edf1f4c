"""Arrow image columns as input: the layouts `datasets` and Parquet writers give images, read from Parquet
files and `save_to_disk` directories, prepared end to end with the tiny LLaVA processor."""

from __future__ import annotations

import os

import pytest

datasets = pytest.importorskip("datasets")
pytest.importorskip("PIL", reason="image pairs need Pillow (the [vision] extra)")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from prefdata.prepare import prepare  # noqa: E402
from vision_helpers import png_bytes  # noqa: E402

IMAGE_TOKENS = 4  # the tiny processor: one <image> expands to 4 tokens
SIZES = [(30, 20), (16, 40), (9, 9)]  # one image per row, each its own size
PROMPT = datasets.List({"role": datasets.Value("string"),
                        "content": datasets.List({"type": datasets.Value("string"), "text": datasets.Value("string")})})
TURN = datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})


def _rows(images: list, image_field: bool = False) -> list[dict]:
    """TRL's conversational image rows as Arrow stores them: every part has every field, unused ones null
    (`image_field`: the parts also have an `image` field, as some exports write them)."""
    rows = []
    extra = {"image": None} if image_field else {}
    for i, image in enumerate(images):
        parts = [{"type": "image", "text": None, **extra}, {"type": "text", "text": f"What is in picture {i}?", **extra}]
        rows.append({"prompt": [{"role": "user", "content": parts}], "chosen": [{"role": "assistant", "content": "A"}],
                     "rejected": [{"role": "assistant", "content": f"B{i}"}], "images": image})
    return rows


def _pngs() -> list[bytes]:
    return [png_bytes(size, (40 * i, 90, 30)) for i, size in enumerate(SIZES)]


# (column, feature, value of one image's bytes) for the layouts a `datasets` Dataset writes.
DATASET_LAYOUTS = {
    "image_feature": ("image", datasets.Image(), lambda data: {"bytes": data, "path": None}),
    "list_of_images": ("images", datasets.List(datasets.Image()), lambda data: [{"bytes": data, "path": None}]),
    "sequence_of_images": ("images", datasets.Sequence(datasets.Image()), lambda data: [{"bytes": data, "path": None}]),
    "binary_column": ("image", datasets.Value("binary"), lambda data: data),
    "list_of_binary": ("images", datasets.List(datasets.Value("binary")), lambda data: [data]),
}


def _dataset(layout: str) -> "datasets.Dataset":
    column, feature, value = DATASET_LAYOUTS[layout]
    rows = _rows([value(data) for data in _pngs()])
    for row in rows:
        row[column] = row.pop("images")
    features = datasets.Features({"prompt": PROMPT, "chosen": TURN, "rejected": TURN, column: feature})
    return datasets.Dataset.from_list(rows, features=features)


def _prepared_sizes(source, out, processor, workers: int = 1) -> list[list[tuple[int, int]]]:
    result = prepare(source, out, processor=str(processor), workers=workers, progress=False)
    assert result.rows_quarantined == 0, (out / "quarantine.jsonl").read_text()
    assert result.rows_out == len(SIZES)
    from transformers import AutoTokenizer

    image_id = AutoTokenizer.from_pretrained(str(processor)).convert_tokens_to_ids("<image>")
    sizes = []
    for row in datasets.load_from_disk(str(out)):
        assert row["prompt_ids"].count(image_id) == IMAGE_TOKENS * len(row["images"])
        sizes.append([image.size for image in row["images"]])
    return sizes


@pytest.mark.parametrize("layout", sorted(DATASET_LAYOUTS))
def test_parquet_image_columns_prepare_with_their_images(tmp_path, llava_processor_dir, layout):
    path = tmp_path / "pairs.parquet"
    _dataset(layout).to_parquet(str(path))
    sizes = _prepared_sizes(path, tmp_path / "out", llava_processor_dir)
    assert sizes == [[size] for size in SIZES]


@pytest.mark.parametrize("layout", sorted(DATASET_LAYOUTS))
def test_saved_dataset_image_columns_prepare_with_their_images(tmp_path, llava_processor_dir, layout):
    saved = tmp_path / "saved"
    _dataset(layout).save_to_disk(str(saved))
    sizes = _prepared_sizes(saved, tmp_path / "out", llava_processor_dir)
    assert sizes == [[size] for size in SIZES]


def test_parquet_written_by_pyarrow_large_binary_and_paths(tmp_path, llava_processor_dir):
    """Plain pyarrow writers: large_binary bytes, and Image structs that hold only a path (relative to the
    file), with content parts that carry a null `image` field."""
    (tmp_path / "img").mkdir()
    pngs = _pngs()
    for i, data in enumerate(pngs):
        (tmp_path / "img" / f"{i}.png").write_bytes(data)
    binary = pa.Table.from_pylist(_rows(pngs))
    binary = binary.set_column(binary.schema.get_field_index("images"), "images",
                               pa.array(pngs, type=pa.large_binary()))
    pq.write_table(binary, tmp_path / "binary.parquet")
    paths = _rows([[{"bytes": None, "path": f"img/{i}.png"}] for i in range(len(pngs))], image_field=True)
    pq.write_table(pa.Table.from_pylist(paths), tmp_path / "paths.parquet")
    for name in ("binary", "paths"):
        sizes = _prepared_sizes(tmp_path / f"{name}.parquet", tmp_path / f"out-{name}", llava_processor_dir)
        assert sizes == [[size] for size in SIZES], name


def test_images_are_decoded_in_the_workers_only(tmp_path, llava_processor_dir, monkeypatch):
    """Parquet rows travel to the workers as bytes: the main process never decodes an image."""
    from prefdata.io import images as image_io

    seen = tmp_path / "pids"
    original = image_io.load_images

    def recording(refs, access, source_file=""):
        with open(seen, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")
        return original(refs, access, source_file)

    monkeypatch.setattr(image_io, "load_images", recording)
    path = tmp_path / "pairs.parquet"
    _dataset("list_of_images").to_parquet(str(path))
    sizes = _prepared_sizes(path, tmp_path / "out", llava_processor_dir, workers=2)
    assert sizes == [[size] for size in SIZES]
    pids = set(seen.read_text().split())
    assert pids and str(os.getpid()) not in pids


def test_a_hub_split_with_an_image_column_streams_its_bytes(tmp_path, llava_processor_dir, monkeypatch):
    """A Hub dataset id (a local directory laid out like a Hub repo): its Image column is not decoded
    by `datasets` in this process; the rows prepare with their images."""
    import datasets.config
    import huggingface_hub.constants

    data = tmp_path / "org" / "pics" / "data"
    data.mkdir(parents=True)
    _dataset("list_of_images").to_parquet(str(data / "train-00000-of-00001.parquet"))
    (tmp_path / "org" / "pics" / "README.md").write_text("# image pairs\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    sizes = _prepared_sizes("org/pics:train", tmp_path / "out", llava_processor_dir)
    assert sizes == [[size] for size in SIZES]


def test_image_rows_read_here_travel_in_chunks_weighed_by_their_bytes(tmp_path):
    """Parquet rows are read by the main process and sent to the workers: a chunk holds about
    max_bytes of encoded images, however many rows max_lines allows (text rows are not weighed)."""
    from prefdata.io.chunks import iter_chunks
    from prefdata.io.images import inline_image_bytes

    path = tmp_path / "pairs.parquet"
    pngs = [png_bytes((40, 40), (i, 255 - i, 7 * i % 255)) for i in range(0, 240, 8)]  # 30 images
    pq.write_table(pa.Table.from_pylist(_rows([[{"bytes": data, "path": None}] for data in pngs])), path)
    limit = 3 * len(pngs[0])
    chunks = list(iter_chunks(path, max_lines=1000, max_bytes=limit))
    weights = [[inline_image_bytes(record.value) for record in chunk.records] for chunk in chunks]
    assert [w for chunk in weights for w in chunk] == [len(data) for data in pngs]  # every row, in order
    assert len(chunks) > 5 and all(sum(chunk[:-1]) < limit for chunk in weights)
    text = tmp_path / "text.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(50)]), text)
    assert len(list(iter_chunks(text, max_lines=1000, max_bytes=limit))) == 1
