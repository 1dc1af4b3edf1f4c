"""The `images` column of image preference pairs: what a row may give, and reading it in a worker.

A row names its images as `datasets.Image` stores them, or as paths:

- a path string, relative to the input file's directory (or absolute);
- `{"path": ...}` (read from disk) or `{"bytes": ...}` (the encoded file itself), as a dataset saved
  with an Image feature holds them; when both are given the bytes win, as in `datasets`, and the
  path is never opened;
- the encoded file's bytes themselves (a plain binary column of Parquet or Arrow input).

Arrow and Parquet input give these shapes as they store them: a `datasets.Image` column
(struct<bytes, path>) reads as the dict, a list of them (`List(Image())`, `Sequence(Image())`) as
a list of dicts, a binary column as bytes; one image (an `image` column) is a list of one.

`image_refs` only checks the shape (cheap, in normalize); `load_images` reads and fully decodes
each image (Pillow, the `[vision]` extra) where the row is tokenized, i.e. in the engine's workers,
so the main process never holds image bytes it does not write. A missing or undecodable image
raises RecordError: its row is quarantined with that one-line reason.

Paths come from the data, so they are untrusted (`validate` runs on strangers' pull requests): a
path is read only when its real path (`..` and symlinks resolved, before any open) lies under the
input file's directory (a directory input: that directory) or a root the user allowed
(`ImageAccess`). An image whose header gives more than `max_image_pixels` is refused undecoded.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from dataclasses import dataclass
from typing import Any

import xxhash

from prefdata.core.errors import PrefdataError, RecordError, first_line

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


# Pillow's own decompression-bomb threshold (Image.MAX_IMAGE_PIXELS): about 256 MiB decoded at 24 bits
# a pixel. A 48-megapixel phone photo passes; every vision processor prefdata knows resizes far below
# it anyway (Qwen2-VL's max_pixels is 12.8 M), so a larger image only costs memory. Policy key:
# [thresholds] max_image_pixels.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485


@dataclass(frozen=True)
class ImageAccess:
    """Where a run may read image files from: nothing is read from outside the data (docs/images.md,
    "Image preference pairs": paths are data, so they are not trusted).

    `data`: the input prepare or validate was given (a file, a directory of files, a mix file's
    directory with `mix`), None for a Hub dataset (no local data: every path is refused).
    `allowed_roots`: further directories the user named (--allowed-image-root).
    `max_pixels`: images above it are refused from their header, never decoded."""

    data: str | None = None
    mix: bool = False
    allowed_roots: tuple[str, ...] = ()
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def roots_for(self, source_file: str) -> tuple[str | None, tuple[str, ...]]:
        """The directory a row's relative paths start from, and the directories its paths may
        resolve into (real paths, symlinks resolved): the input file's own directory (a directory
        input: that directory), then the allowed roots."""
        base: str | None = None
        data_root: str | None = None
        if self.data is not None:
            if self.mix:  # a mix file's rows name their file relative to the mix file
                file = os.path.join(self.data, source_file)
                base = data_root = os.path.dirname(file) if os.path.isfile(file) else None
            elif os.path.isdir(self.data):
                base, data_root = os.path.join(self.data, os.path.dirname(source_file)), self.data
            else:
                base = data_root = os.path.dirname(self.data) or "."
        roots = tuple(os.path.realpath(root) for root in ((data_root,) if data_root else ()) + self.allowed_roots)
        return base, roots


def image_access(data: str | os.PathLike[str] | None, mix: bool, allowed_roots: Any, max_pixels: int) -> ImageAccess:
    """The ImageAccess of a run; PrefdataError for an allowed root that is no directory.
    `allowed_roots`: None, one directory or a list of them (--allowed-image-root, repeatable)."""
    if allowed_roots is None:
        allowed_roots = []
    elif isinstance(allowed_roots, (str, os.PathLike)):
        allowed_roots = [allowed_roots]
    roots: list[str] = []
    for root in allowed_roots:
        if not os.path.isdir(root):
            raise PrefdataError(f"--allowed-image-root {root}: not a directory")
        roots.append(os.path.realpath(root))
    return ImageAccess(str(data) if data is not None else None, mix, tuple(roots), int(max_pixels))


def load_pair_images(pairs: list[Any], access: ImageAccess) -> None:
    """Read the images of each image pair (`Pair.images` set) into `Pair.image_data`, in a worker;
    RecordError for the first refused, missing or broken one (its record is quarantined)."""
    for pair in pairs:
        if pair.images is not None:
            pair.image_data = load_images(pair.images, access, pair.source_file)


def load_images(refs: list[ImageRef], access: ImageAccess, source_file: str = "") -> list[LoadedImage]:
    """Read and fully decode each image (in a worker); RecordError for a refused, missing or broken one."""
    image_module = pillow()
    base, roots = access.roots_for(source_file)
    loaded: list[LoadedImage] = []
    for i, ref in enumerate(refs):
        data = ref.data
        if data is None:
            data = _read_inside(i, ref.path or "", base, roots, access)
        width, height, kind = _decode(image_module, data, f"image {i} ({ref.path or 'bytes'})", access.max_pixels)
        name = os.path.basename(ref.path) if ref.path else None
        loaded.append(LoadedImage(data, width, height, kind, xxhash.xxh3_64_intdigest(data), name))
    return loaded


def _read_inside(i: int, written: str, base: str | None, roots: tuple[str, ...], access: ImageAccess) -> bytes:
    """The bytes of the file a row names, after checking, before any open, that its real path
    (symlinks and `..` resolved) lies under one of `roots`: a path found in the data never reaches
    outside it. RecordError naming the path otherwise."""
    where = f"image {i} ({written})"
    if "\x00" in written:
        raise RecordError(f"{where}: not a valid path")
    joined = written if os.path.isabs(written) else (os.path.join(base, written) if base else None)
    real = os.path.realpath(joined) if joined is not None else None
    if real is None or not any(_is_under(real, root) for root in roots):
        place = "the input file's directory" if base else "any local directory (the input has none)"
        raise RecordError(f"{where}: the path leads outside {place}; not read "
                          "(name a directory with --allowed-image-root to allow it)")
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):  # a FIFO or a device would block or never end
            raise RecordError(f"{where}: not a regular file")
        with open(real, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise RecordError(f"{where}: cannot read: {exc.strerror or type(exc).__name__}") from None


def _is_under(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _decode(image_module: Any, data: bytes, where: str, max_pixels: int) -> tuple[int, int, str]:
    """Width, height and format of encoded image `data`, fully decoded (a truncated file fails here,
    not in the trainer), unless its header says it is above `max_pixels`: then RecordError, and not
    one pixel decoded (Pillow's open reads the header only)."""
    previous = image_module.MAX_IMAGE_PIXELS
    image_module.MAX_IMAGE_PIXELS = max_pixels  # Pillow's own bomb check (warn above, error above 2x) at our limit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", image_module.DecompressionBombWarning)
            with image_module.open(io.BytesIO(data)) as image:
                width, height, kind = image.width, image.height, image.format or ""
                _check_pixels(where, width, height, max_pixels)
                image.load()
    except RecordError:
        raise
    except image_module.DecompressionBombError:
        raise RecordError(f"{where}: more than {max_pixels:,} pixels (max_image_pixels); not decoded") from None
    except image_module.UnidentifiedImageError:
        raise RecordError(f"{where}: cannot decode: {_sniff(data)}") from None
    except Exception as exc:  # Pillow raises several types for broken data
        raise RecordError(f"{where}: cannot decode: {first_line(exc)[:120]}") from None
    finally:
        image_module.MAX_IMAGE_PIXELS = previous
    return width, height, kind


def _check_pixels(where: str, width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise RecordError(f"{where}: {width} x {height} = {width * height:,} pixels, above max_image_pixels "
                          f"{max_pixels:,} (policy [thresholds]); not decoded")


_SIGNATURES = ((b"\x89PNG", "PNG"), (b"\xff\xd8", "JPEG"), (b"GIF8", "GIF"), (b"RIFF", "WebP"), (b"BM", "BMP"))


def _sniff(data: bytes) -> str:
    """A few words on what bytes that are no image look like, never the bytes themselves."""
    if not data:
        return "an empty file"
    for magic, kind in _SIGNATURES:
        if data.startswith(magic):
            return f"a cut or damaged {kind} file ({len(data):,} bytes)"
    head = data[:512]
    try:
        head.decode("utf-8")
        text = b"\x00" not in head
    except UnicodeDecodeError as exc:
        text = exc.start >= len(head) - 3 and b"\x00" not in head  # a character cut at the end still reads as text
    what = "text" if text else "data with no known image header"
    return f"not an image file ({len(data):,} bytes of {what})"


def stored_images(values: list[dict[str, Any]], max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> list[LoadedImage]:
    """The images of a row of a prepared OUT (`prepare` decoded and checked them): each one's size
    and format from its file's header, no pixels decoded; RecordError for one that cannot be read
    or is above `max_pixels`. Only the stored bytes are read, never a path."""
    image_module = pillow()
    loaded: list[LoadedImage] = []
    for i, value in enumerate(values):
        data, path = value.get("bytes"), value.get("path")
        where = f"stored image {i} ({path or 'bytes'})"
        if not isinstance(data, bytes):
            raise RecordError(f"{where}: no stored bytes")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", image_module.DecompressionBombWarning)
                with image_module.open(io.BytesIO(data)) as image:
                    width, height, kind = image.width, image.height, image.format or ""
            _check_pixels(where, width, height, max_pixels)
        except RecordError:
            raise
        except image_module.DecompressionBombError:
            raise RecordError(f"{where}: more than {max_pixels:,} pixels (max_image_pixels)") from None
        except Exception as exc:  # Pillow raises several types for broken data
            first = first_line(exc)
            raise RecordError(f"{where}: cannot read: {first[:120]}") from None
        loaded.append(LoadedImage(data, width, height, kind, xxhash.xxh3_64_intdigest(data), path))
    return loaded


def pillow() -> Any:
    """PIL.Image, or a one-line usage error naming the extra that provides it."""
    try:
        from PIL import Image
    except ImportError:
        raise PrefdataError("image pairs need Pillow: pip install 'prefdata[vision]'") from None
    return Image
