"""How a processor writes one image into the text, learned from the processor itself.

A chat template renders an image part as text around the processor's placeholder
(`processor.image_token`): LLaVA renders `<image>`, Qwen2-VL `<|vision_start|><|image_pad|><|vision_end|>`
(placeholder `<|image_pad|>`), Gemma 3 `<start_of_image>`. The processor then replaces each
placeholder by a run of N image tokens, N from the image's size, with fixed text around the run:
none for LLaVA and Qwen2-VL, "\\n\\n<start_of_image>" before and "<end_of_image>\\n\\n" after for
Gemma 3 (whose run token, `<image_soft_token>`, is not its placeholder).

`learn_image_scheme` learns that fixed text from the processor's own output on probe images of
two different sizes, requires it to be the same for both, and checks that the rule reproduces the
processor's ids exactly for two images in one text. N is the processor's own count
(`_get_num_multimodal_tokens`), less a constant where that count includes the fixed text (Idefics3
counts its `<fake_token_around_image><global-img>` too). A processor that lays images out otherwise
(Idefics3 / SmolVLM splitting an image into tiles with row and column markers) raises
`LayoutRefused`: prefdata.tokenize.image_layout then builds each image's text per size, or the
processor is refused with one line rather than counted wrong.

`image_spans` finds each image's whole expansion in token ids (the template's own text around the
placeholder where the row has it, the fixed text, the run), the span truncation must never cut.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from prefdata.core.errors import PrefdataError, first_line

# Odd, different sizes: a grid that depends on the size shows a different count for each.
PROBE_SIZES = ((37, 23), (61, 90))
_PROBE_TEXT = "Q"  # a text part no template renders as anything but itself

Encode = Callable[[str], list[int]]
Decode = Callable[[Sequence[int]], str]


class LayoutRefused(PrefdataError):
    """The processor's expansion is not prefix + N x image token + suffix (its layout, not a failure)."""


@dataclass(frozen=True)
class ImageScheme:
    """placeholder -> prefix + N x image_token + suffix, and what surrounds a placeholder."""

    placeholder: str  # what the processor replaces, once per image (`processor.image_token`)
    image_token: str  # the token repeated N times
    image_token_id: int
    run_offset: int = 0  # the processor's count minus the run's length (its count may include prefix and suffix)
    prefix: str = ""  # fixed text the processor writes before the run
    suffix: str = ""  # ... and after it
    before: str = ""  # what the chat template renders right before the placeholder (<|vision_start|>)
    after: str = ""  # ... and right after it (<|vision_end|>)
    left_window: int = 1  # tokens enough to hold before + prefix, with one to spare
    right_window: int = 1  # tokens enough to hold suffix + after, with one to spare

    def expand(self, text: str, counts: Sequence[int]) -> str:
        """`text` with its i-th placeholder replaced by image i's expansion (one count per placeholder)."""
        pieces = text.split(self.placeholder)
        if len(pieces) != len(counts) + 1:
            raise ValueError(f"{len(pieces) - 1} placeholders for {len(counts)} images")
        out = [pieces[0]]
        for count, piece in zip(counts, pieces[1:]):
            out.append(self.prefix + self.image_token * (count - self.run_offset) + self.suffix)
            out.append(piece)
        return "".join(out)

    def record(self) -> dict[str, Any]:
        """What the manifest and the fingerprint record of the rule."""
        return {name: value for name, value in asdict(self).items() if not name.endswith("_window")}


def template_unit(render: Callable[[list[dict[str, Any]]], str]) -> str:
    """What the chat template renders for one `{"type": "image"}` part ("" if it renders none or
    fails): the difference between a user turn with the image and the same turn without it."""
    def turn(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": content}]

    try:
        plain = render(turn([{"type": "text", "text": _PROBE_TEXT}]))
        with_image = render(turn([{"type": "image"}, {"type": "text", "text": _PROBE_TEXT}]))
    except Exception:  # a template that cannot render image parts: the placeholder stands alone
        return ""
    head = len(os.path.commonprefix([plain, with_image]))
    tail = len(os.path.commonprefix([plain[head:][::-1], with_image[head:][::-1]]))
    return with_image[head:len(with_image) - tail]


def learn_image_scheme(processor: Any, unit: str, counts: Callable[[list[tuple[int, int]]], list[int]],
                       encode: Encode, decode: Decode) -> ImageScheme:
    """The processor's expansion rule, from its own output on the probe images.

    `unit` is what the template renders for an image part (`template_unit`); `counts` gives the
    image tokens for (height, width) sizes; `encode`/`decode` are the tokenizer's, without added
    special tokens."""
    from prefdata.io.images import pillow

    name = type(processor).__name__
    placeholder = processor.image_token
    images = [pillow().new("RGB", size, (127, 64, 200)) for size in PROBE_SIZES]
    try:
        numbers = counts([(image.height, image.width) for image in images])
        theirs = [processor_ids(processor, placeholder, [image]) for image in images]
    except Exception as exc:
        raise PrefdataError(f"processor {name} failed on a probe image: {first_line(exc)}") from None
    found = _run_token(theirs, numbers)
    if found is None:
        raise LayoutRefused(
            f"processor {name} does not expand {placeholder!r} to one run of image tokens that follows its count "
            f"({numbers} for images of two sizes); prefdata cannot count its tokens exactly"
        )
    token_id, offset = found
    edges = {_edges(ids, token_id, count - offset, decode) for ids, count in zip(theirs, numbers)}
    if len(edges) != 1:
        raise LayoutRefused(
            f"processor {name} writes different text around the image tokens for images of different sizes "
            f"(not one fixed prefix and suffix); prefdata cannot count its tokens exactly"
        )
    (prefix, suffix), = edges
    image_token = decode([token_id])
    at = unit.find(placeholder)
    before, after = (unit[:at], unit[at + len(placeholder):]) if at >= 0 and unit.count(placeholder) == 1 else ("", "")
    scheme = ImageScheme(
        placeholder=placeholder, image_token=image_token, image_token_id=token_id, run_offset=offset,
        prefix=prefix, suffix=suffix, before=before, after=after, left_window=len(encode(before + prefix)) + 1,
        right_window=len(encode(suffix + after)) + 1,
    )
    _check_in_context(processor, scheme, images, numbers, encode, decode)
    return scheme


def image_spans(prompt_ids: Sequence[int], scheme: ImageScheme, decode: Decode) -> list[tuple[int, int]]:
    """[start, end) of each image's expansion in the prompt ids: its run of image tokens, the fixed
    prefix and suffix, and the template's text around the placeholder where the row has it. Images
    written back to back with nothing around them (LLaVA's `<image><image>`) make one span."""
    spans: list[tuple[int, int]] = []
    position, n = 0, len(prompt_ids)
    while position < n:
        if prompt_ids[position] != scheme.image_token_id:
            position += 1
            continue
        end = position
        while end < n and prompt_ids[end] == scheme.image_token_id:
            end += 1
        spans.append((_left_edge(prompt_ids, position, scheme, decode), _right_edge(prompt_ids, end, scheme, decode)))
        position = end
    return spans


# -- learning ---------------------------------------------------------------------------------

def processor_ids(processor: Any, text: str, images: list[Any]) -> list[int]:
    """The processor's own ids for `text` with `images`: what every learned rule is checked against."""
    out = processor(text=[text], images=images, add_special_tokens=False)
    return [int(token) for token in out["input_ids"][0]]


def _run_token(probes: list[list[int]], counts: list[int]) -> tuple[int, int] | None:
    """(token, offset): the token that appears in one contiguous run of `count - offset` in each
    probe, one offset for all. The processor's count is the run itself for most processors (offset
    0) and the whole expansion for some (Idefics3 counts its fake and global tokens too). Preferred:
    the smallest offset, then the longest run; a tie (a 1-token run beside a 1-token prefix) is
    ambiguous."""
    found: list[tuple[int, int, int]] = []
    for token in dict.fromkeys(probes[0]):
        runs = [_one_run(ids, token) for ids in probes]
        offsets = {count - run for count, run in zip(counts, runs)}
        if min(runs) > 0 and len(offsets) == 1 and min(offsets) >= 0:
            found.append((min(offsets), -runs[0], token))
    found.sort()
    if not found or (len(found) > 1 and found[0][:2] == found[1][:2]):
        return None
    offset, _run, token = found[0]
    return token, offset


def _one_run(ids: list[int], token: int) -> int:
    """The length of `token`'s run in `ids` when all its occurrences are one run, else -1."""
    where = [i for i, value in enumerate(ids) if value == token]
    return len(where) if where and where[-1] - where[0] + 1 == len(where) else -1


def _edges(ids: list[int], token: int, count: int, decode: Decode) -> tuple[str, str]:
    start = ids.index(token)
    return decode(ids[:start]), decode(ids[start + count:])


def _check_in_context(processor: Any, scheme: ImageScheme, images: list[Any], numbers: list[int],
                      encode: Encode, decode: Decode) -> None:
    """The rule gives the processor's very ids for two images of different sizes in one text, and
    finds both images' spans in them."""
    unit = scheme.before + scheme.placeholder + scheme.after
    text = f"Look at {unit} and at {unit}, then say which is bigger."
    name = type(processor).__name__
    try:
        theirs = processor_ids(processor, text, images)
    except Exception as exc:
        raise PrefdataError(f"processor {name} failed on two probe images: {first_line(exc)}") from None
    ours = encode(scheme.expand(text, numbers))
    if ours != theirs:
        raise LayoutRefused(
            f"processor {name} expands {scheme.placeholder!r} differently in a text with two images than "
            f"prefix + N image tokens + suffix; prefdata cannot count its tokens exactly"
        )
    spans = image_spans(ours, scheme, decode)
    if len(spans) != len(images) or not all(
        _covers(ours, span, scheme, count - scheme.run_offset, decode) for span, count in zip(spans, numbers)
    ):
        raise LayoutRefused(f"processor {name}: cannot find each image's tokens in its ids; refusing to truncate blind")


def _covers(ids: list[int], span: tuple[int, int], scheme: ImageScheme, run: int, decode: Decode) -> bool:
    """The span holds the image's whole text, and no token less would."""
    left, right = scheme.before + scheme.prefix, scheme.suffix + scheme.after
    whole = left + scheme.image_token * run + right
    start, end = span
    return (whole in decode(ids[start:end])
            and not (left and whole in decode(ids[start + 1:end]))
            and not (right and whole in decode(ids[start:end - 1])))


# -- spans ------------------------------------------------------------------------------------

def _left_edge(ids: Sequence[int], start: int, scheme: ImageScheme, decode: Decode) -> int:
    """Where the image's text begins: before the prefix, and before the template's own text in
    front of the placeholder (as much of it as this row has: "Picture 2: " may differ from the
    probe's "Picture 1: ")."""
    if not (scheme.prefix or scheme.before):
        return start
    window = decode(ids[max(0, start - scheme.left_window):start])
    if not window.endswith(scheme.prefix):
        return start  # written without the processor: nothing of ours to protect
    head = window[:len(window) - len(scheme.prefix)]
    shared = len(os.path.commonprefix([head[::-1], scheme.before[::-1]]))
    need = len(scheme.prefix) + shared
    edge = start
    while edge > 0 and len(decode(ids[edge:start])) < need:
        edge -= 1  # the fewest tokens that hold the text; a token merged across the edge comes along
    return edge


def _right_edge(ids: Sequence[int], end: int, scheme: ImageScheme, decode: Decode) -> int:
    """Where the image's text ends: after the suffix and the template's own text after the
    placeholder. Decoded from the run's last token on, so no decoder strips a leading space."""
    if not (scheme.suffix or scheme.after):
        return end
    anchor = len(scheme.image_token)
    window = decode(ids[end - 1:end + scheme.right_window])[anchor:]
    if not window.startswith(scheme.suffix):
        return end
    tail = window[len(scheme.suffix):]
    need = len(scheme.suffix) + len(os.path.commonprefix([tail, scheme.after]))
    edge = end
    while edge < len(ids) and len(decode(ids[end - 1:edge])) - anchor < need:
        edge += 1
    return edge
