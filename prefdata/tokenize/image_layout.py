"""Images whose expansion changes shape with their size (Idefics3 / SmolVLM tiles), expanded exactly.

Most processors write an image as fixed text around one run of N image tokens
(prefdata.tokenize.image_scheme). Idefics3 and SmolVLM with image splitting (their default) do not:
an image becomes rows x cols tiles, each `<fake_token_around_image><row_r_col_c>` + N x `<image>`,
a newline after each row, then a global block `\\n<fake_token_around_image><global-img>` + N x
`<image>` + `<fake_token_around_image>`; rows and cols follow the image's size. `SizedLayout` is the
fallback for such processors: each image's expansion TEXT is the one the processor itself builds
for an image of that width x height, cached by size, so the prompt ids are the processor's own.

The text comes from the cheapest exact source the processor offers, tried in turn:
- `rows_cols`: the image processor's own tile count for the size (`get_number_of_image_patches`, no
  pixels) handed to the processor's own text builder (`replace_image_token`): microseconds a size;
- `processor`: the processor run on the placeholder with a blank image of that size (its
  `text_replacement_offsets`, else its decoded ids): the image processor's full work, once a size.
`learn_sized_layout` keeps the first whose text gives the processor's very ids on probe images of
several sizes (tiled and not, square and not), alone and two in one text, and whose expansions
begin and end with an added token, so that each image's ids are the same in any text around it and
truncation can find them; else the processor is refused with one line.

`spans` finds each image's whole expansion in the prompt ids (its ids, verbatim, in order), the
span truncation must never cut (`image_truncated`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefdata.core.errors import PrefdataError, first_line
from prefdata.tokenize.image_scheme import processor_ids

# (width, height), odd and different: a small one (a tile or none), a non-square one and a wide
# strip, so that a real processor splits at least one into several tiles and the rows and
# columns differ between them.
PROBE_SIZES = ((37, 23), (61, 90), (300, 41))

Encode = Callable[[str], list[int]]
Build = Callable[[int, int], str]


@dataclass
class SizedLayout:
    """placeholder -> the processor's own text for an image of that size, cached by size."""

    placeholder: str
    image_token: str
    image_token_id: int
    method: str  # which source builds the text ("rows_cols" or "processor")
    markers: tuple[str, ...]  # added tokens the expansions hold besides the placeholder: typed by hand, a stray
    build: Build = field(repr=False, compare=False)
    encode: Encode = field(repr=False, compare=False)
    probes: dict[str, str] = field(default_factory=dict)  # "WxH" -> text, for the fingerprint
    _texts: dict[tuple[int, int], str] = field(default_factory=dict, repr=False, compare=False)
    _ids: dict[tuple[int, int], list[int]] = field(default_factory=dict, repr=False, compare=False)

    def text(self, width: int, height: int) -> str:
        key = (width, height)
        found = self._texts.get(key)
        if found is None:
            found = self._texts[key] = self.build(width, height)
        return found

    def ids(self, width: int, height: int) -> list[int]:
        """The image's expansion as token ids: the same in any text (learn_sized_layout checks)."""
        key = (width, height)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = self.encode(self.text(width, height))
        return found

    def expand(self, text: str, sizes: Sequence[tuple[int, int]]) -> str:
        """`text` with its i-th placeholder replaced by image i's expansion ((width, height) each)."""
        pieces = text.split(self.placeholder)
        if len(pieces) != len(sizes) + 1:
            raise ValueError(f"{len(pieces) - 1} placeholders for {len(sizes)} images")
        out = [pieces[0]]
        for (width, height), piece in zip(sizes, pieces[1:]):
            out.append(self.text(width, height))
            out.append(piece)
        return "".join(out)

    def spans(self, prompt_ids: Sequence[int], sizes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """[start, end) of each image's expansion in the prompt ids, in order. Should one not be
        found verbatim, the whole prompt is the span: no cut, `image_truncated` (never blind)."""
        spans: list[tuple[int, int]] = []
        position = 0
        for width, height in sizes:
            start = find(prompt_ids, self.ids(width, height), position)
            if start < 0:
                return [(0, len(prompt_ids))]
            position = start + len(self.ids(width, height))
            spans.append((start, position))
        return spans

    def record(self) -> dict[str, Any]:
        """What the manifest and the fingerprint record of the layout."""
        return {"placeholder": self.placeholder, "image_token": self.image_token, "image_token_id": self.image_token_id,
                "per_image_size": self.method, "probes": dict(self.probes)}


def find(ids: Sequence[int], part: Sequence[int], start: int = 0) -> int:
    """The first index >= start where `part` occurs in `ids`, or -1."""
    if not part:
        return start
    first, n = part[0], len(part)
    for i in range(start, len(ids) - n + 1):
        if ids[i] == first and list(ids[i:i + n]) == list(part):
            return i
    return -1


def learn_sized_layout(processor: Any, encode: Encode, added_tokens: dict[str, int]) -> SizedLayout:
    """The first text source that reproduces the processor's ids on the probe images (see the
    module's docstring), or a one-line PrefdataError. `added_tokens`: the tokenizer's added
    vocabulary (text -> id), the tokens it splits out before anything else."""
    from prefdata.io.images import pillow

    name = type(processor).__name__
    placeholder = processor.image_token
    blank = pillow().new
    images = [blank("RGB", size, (127, 64, 200)) for size in PROBE_SIZES]
    try:
        theirs = [processor_ids(processor, placeholder, [image]) for image in images]
        both = f"Look at {placeholder} and at {placeholder}, then say which is bigger."
        theirs_both = processor_ids(processor, both, images[1:])
    except Exception as exc:  # noqa: BLE001 - the processor's own error, in one line
        raise PrefdataError(f"processor {name} failed on a probe image: {first_line(exc)}") from None
    token_id = int(processor.tokenizer.convert_tokens_to_ids(placeholder))
    reasons: list[str] = []
    for method, build in _sources(processor):
        layout = SizedLayout(placeholder=placeholder, image_token=placeholder, image_token_id=token_id, method=method,
                             markers=(), build=build, encode=encode)
        try:
            reason = _check(layout, images, theirs, both, theirs_both, added_tokens)
        except Exception as exc:  # noqa: BLE001 - a source this processor does not offer: the next one
            reason = first_line(exc)
        if reason is None:
            layout.probes = {f"{w}x{h}": layout.text(w, h) for w, h in PROBE_SIZES}
            layout.markers = _markers(layout, added_tokens)
            return layout
        reasons.append(f"{method}: {reason}")
    raise PrefdataError(
        f"processor {name} expands {placeholder!r} neither as prefix + N image tokens + suffix nor reproducibly per "
        f"image size ({'; '.join(reasons)}); prefdata cannot count its tokens exactly"
    )


def _sources(processor: Any) -> list[tuple[str, Build]]:
    sources: list[tuple[str, Build]] = []
    image_processor = processor.image_processor
    if callable(getattr(image_processor, "get_number_of_image_patches", None)) and callable(
            getattr(processor, "replace_image_token", None)):
        def rows_cols(width: int, height: int) -> str:
            _patches, rows, cols = image_processor.get_number_of_image_patches(height, width, {})
            return str(processor.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0))
        sources.append(("rows_cols", rows_cols))
    sources.append(("processor", lambda width, height: _processor_text(processor, width, height)))
    return sources


def _processor_text(processor: Any, width: int, height: int) -> str:
    """The processor's own replacement text for a blank image of this size."""
    from prefdata.io.images import pillow

    image = pillow().new("RGB", (width, height), (127, 64, 200))
    out = processor(text=[processor.image_token], images=[image], add_special_tokens=False,
                    return_text_replacement_offsets=True)
    offsets = out.get("text_replacement_offsets") if hasattr(out, "get") else None
    if offsets and offsets[0]:
        return str(offsets[0][0]["replacement"])
    ids = [int(token) for token in out["input_ids"][0]]
    return str(processor.tokenizer.decode(ids, skip_special_tokens=False))  # checked against its ids at setup


def _check(layout: SizedLayout, images: list[Any], theirs: list[list[int]], both: str,
           theirs_both: list[int], added_tokens: dict[str, int]) -> str | None:
    """Why `layout` is not exact on the probes, or None when it is."""
    for image, ids in zip(images, theirs):
        ours = layout.ids(image.width, image.height)
        if ours != ids:
            return f"an image of {image.width}x{image.height} gives other ids than the processor's"
        if ours[0] not in added_tokens.values() or ours[-1] not in added_tokens.values():
            return "its expansion does not begin and end with an added token (its ids would depend on the text around it)"
    sizes = [(image.width, image.height) for image in images[1:]]
    ours_both = layout.encode(layout.expand(both, sizes))
    if ours_both != theirs_both:
        return "two images in one text give other ids than the processor's"
    spans = layout.spans(ours_both, sizes)
    if [end - start for start, end in spans] != [len(layout.ids(w, h)) for w, h in sizes] or len(spans) != len(sizes):
        return "cannot find each image's tokens in its ids"
    return None


def _markers(layout: SizedLayout, added_tokens: dict[str, int]) -> tuple[str, ...]:
    """The added tokens the probe expansions hold besides the placeholder (a prompt that types one
    has image tokens with no image: `image_mismatch`)."""
    found = {token for token in added_tokens if token != layout.placeholder
             and any(token in text for text in layout.probes.values())}
    return tuple(sorted(found))
