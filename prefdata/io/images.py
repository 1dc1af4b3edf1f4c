"""The `images` column of image preference pairs: what a row may give, and reading it in a worker.

A row names its images as `datasets.Image` stores them, or as paths:

- a path string, relative to the input file's directory (or absolute);
- `{"path": ...}` (read from disk) or `{"bytes": ...}` (the encoded file itself), as a dataset saved
  with an Image feature holds them; when both are given the bytes win, as in `datasets`;
- the encoded file's bytes themselves (a plain binary column of Parquet or Arrow input).

Arrow and Parquet input give these shapes as they store them: a `datasets.Image` column
(struct<bytes, path>) reads as the dict, a list of them (`List(Image())`, `Sequence(Image())`) as
a list of dicts, a binary column as bytes; one image (an `image` column) is a list of one.

`image_refs` only checks the shape (cheap, in normalize); `load_images` reads and fully decodes
each image (Pillow, the `[vision]` extra) where the row is tokenized, i.e. in the engine's workers,
so the main process never holds image bytes it does not write. A missing or undecodable image
raises RecordError: its row is quarantined with that one-line reason.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any

import xxhash

from prefdata.errors import PrefdataError, RecordError, first_line

IMAGE_COLUMNS = ("images", "image")  # TRL's `images`; a single `image` is a list of one


@dataclass(frozen=True)
class ImageRef:
    """Where one image comes from: its bytes, or a path (as written in the row)."""

    path: str | None = None
    data: bytes | None = None


@dataclass
class LoadedImage:
    """One decoded image: its encoded bytes (what OUT stores), size and content digest."""

    data: bytes
    width: int
    height: int
    format: str
    digest: int  # xxh3-64 of the bytes: duplicate detection takes the image itself into account
    name: str | None = None  # the file name it was read from, kept as the Image feature's `path`


def inline_image_bytes(value: Any) -> int:
    """Encoded image bytes a raw record holds in its image column (Arrow and Parquet input), 0 for
    none: what a chunk of such records weighs beyond its text (prefdata.io.chunks)."""
    if type(value) is not dict:
        return 0
    column = value.get("images")
    if column is None:
        column = value.get("image")
        if column is None:
            return 0
    total = 0
    for item in column if type(column) is list else (column,):
        data = item.get("bytes") if type(item) is dict else item
        if isinstance(data, (bytes, bytearray, memoryview)):
            total += len(data)
    return total


def image_refs(value: Any, field: str) -> list[ImageRef]:
    """The images of a row's image column, or RecordError naming what is wrong with it."""
    items = value if type(value) is list else [value]
    refs: list[ImageRef] = []
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        if type(item) is str:
            refs.append(ImageRef(path=item))
        elif isinstance(item, (bytes, bytearray, memoryview)):
            refs.append(ImageRef(data=bytes(item)))
        elif type(item) is dict:
            data, path = item.get("bytes"), item.get("path")
            if isinstance(data, (bytes, bytearray, memoryview)):
                refs.append(ImageRef(path=path if type(path) is str else None, data=bytes(data)))
            elif type(path) is str and path:
                refs.append(ImageRef(path=path))
            else:
                raise RecordError(f"field {where!r}: an image needs 'bytes' or a 'path'")
        else:
            raise RecordError(
                f"field {where!r}: an image must be a path, its bytes or {{'bytes'/'path'}}, got {type(item).__name__}"
            )
    return refs


def image_base(images_from: str | None, source_file: str) -> str:
    """The directory a row's relative image paths start from: the input file's own directory.
    `images_from` is the input given to prepare (a file or a directory of files)."""
    if images_from and os.path.isdir(images_from):
        return os.path.join(images_from, os.path.dirname(source_file))
    return os.path.dirname(images_from or source_file)


def load_pair_images(pairs: list[Any], images_from: str | None) -> None:
    """Read the images of each image pair (`Pair.images` set) into `Pair.image_data`, in a worker;
    RecordError for the first missing or broken one (its record is quarantined)."""
    for pair in pairs:
        if pair.images is not None:
            pair.image_data = load_images(pair.images, image_base(images_from, pair.source_file))


def load_images(refs: list[ImageRef], base: str) -> list[LoadedImage]:
    """Read and fully decode each image (in a worker); RecordError for a missing or broken one."""
    image_module = pillow()
    loaded: list[LoadedImage] = []
    for i, ref in enumerate(refs):
        data = ref.data
        if data is None:
            path = ref.path if os.path.isabs(ref.path or "") else os.path.join(base, ref.path or "")
            try:
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError as exc:
                raise RecordError(f"image {i} ({ref.path}): cannot read: {exc.strerror or type(exc).__name__}") from None
        try:
            with image_module.open(io.BytesIO(data)) as image:
                image.load()  # a full decode: a truncated file fails here, not in the trainer
                width, height, kind = image.width, image.height, image.format or ""
        except Exception as exc:  # Pillow raises several types for broken data
            first = first_line(exc)
            name = ref.path or "bytes"
            raise RecordError(f"image {i} ({name}): cannot decode: {first[:120]}") from None
        name = os.path.basename(ref.path) if ref.path else None
        loaded.append(LoadedImage(data, width, height, kind, xxhash.xxh3_64_intdigest(data), name))
    return loaded


def stored_images(values: list[dict[str, Any]]) -> list[LoadedImage]:
    """The images of a row of a prepared OUT (`prepare` decoded and checked them): each one's size
    and format from its file's header, no pixels decoded; RecordError for one that cannot be read."""
    image_module = pillow()
    loaded: list[LoadedImage] = []
    for i, value in enumerate(values):
        data, path = value.get("bytes"), value.get("path")
        try:
            with image_module.open(io.BytesIO(data)) as image:
                width, height, kind = image.width, image.height, image.format or ""
        except Exception as exc:  # Pillow raises several types for broken data
            first = first_line(exc)
            raise RecordError(f"stored image {i} ({path or 'bytes'}): cannot read: {first[:120]}") from None
        loaded.append(LoadedImage(data, width, height, kind, xxhash.xxh3_64_intdigest(data), path))
    return loaded


def pillow() -> Any:
    """PIL.Image, or a one-line usage error naming the extra that provides it."""
    try:
        from PIL import Image
    except ImportError:
        raise PrefdataError("image pairs need Pillow: pip install 'prefdata[vision]'") from None
    return Image
