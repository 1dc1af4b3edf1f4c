"""Image pairs through a processor (`--processor`): placeholders, exact image token counts, spans.

A vision-language processor is a tokenizer plus an image processor plus a rule for how one image
placeholder in the text becomes N image tokens. `VisionPairTokenizer` is `PairTokenizer` with the
processor's tokenizer and chat template, and one more step between rendering and tokenizing: each
placeholder in the rendered prompt (or in a plain-text prompt) is expanded the way the processor
expands it, with as many image tokens as the model will see for that image
(`_get_num_multimodal_tokens`, the processor's own count from the image's size), so token lengths
and truncation are exact. Truncation then protects each image's whole expansion
(`truncate_pair`'s `image_spans`: `image_truncated`, never half-visible).

The rule is learned at setup from the processor's own output (prefdata.tokenize.image_scheme):
placeholder -> prefix + N x image token + suffix, which covers one `<image>` expanded to N (LLaVA),
`<|vision_start|><|image_pad|><|vision_end|>` with a grid that depends on the image size
(Qwen2-VL), and fixed text around the run (Gemma 3: `<start_of_image>` becomes "\\n\\n<start_of_image>" +
N x `<image_soft_token>` + "<end_of_image>\\n\\n"). A processor whose expansion changes shape with the
image (Idefics3 / SmolVLM splitting images into rows x cols tiles) gets each image's text as the
processor itself builds it for that size, cached by size (prefdata.tokenize.image_layout). A
processor that neither rule reproduces exactly is refused with one line rather than counted wrong.

Only Pillow is needed: transformers picks its Pillow image processors when torchvision is absent,
and a processor that also wants a torchvision video processor loads without it
(prefdata.tokenize.processor).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Sequence

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError, RecordError, first_line
from prefdata.core.records import Message, Pair
from prefdata.io.images import LoadedImage
from prefdata.io.manifest import recorded_tokenizer_path
from prefdata.tokenize.image_layout import SizedLayout, learn_sized_layout
from prefdata.tokenize.image_scheme import (
    ImageScheme,
    LayoutRefused,
    image_spans,
    learn_image_scheme,
    template_unit,
)
from prefdata.tokenize.pairs import PairTokenizer, _Texts
from prefdata.tokenize.processor import holds_processor, load_processor
from prefdata.tokenize.settings import TokenizeSettings

__all__ = ["VisionPairTokenizer", "holds_processor", "load_processor", "processor_fingerprint"]


class VisionPairTokenizer(PairTokenizer):
    """PairTokenizer for image pairs (and plain rows alike) through an AutoProcessor directory."""

    reads_images = True

    def __init__(self, tokenizer_path: str, settings: TokenizeSettings, trust_remote_code: bool = False):
        super().__init__(tokenizer_path, settings, trust_remote_code)
        self.processor: Any = None
        self.scheme: ImageScheme | None = None
        self.layout: SizedLayout | None = None  # instead of `scheme`, for layouts that change with the image

    def _load_tokenizer(self) -> Any:
        return self._adopt(load_processor(self.tokenizer_path, self.trust_remote_code))

    def _adopt(self, processor: Any) -> Any:
        """Take `processor` as this tokenizer's: its tokenizer under its chat template, checked."""
        tokenizer = processor.tokenizer
        if getattr(processor, "chat_template", None):  # the processor's template renders image parts
            tokenizer.chat_template = processor.chat_template
        if processor.image_token not in tokenizer.get_vocab():
            raise PrefdataError(
                f"processor at {self.tokenizer_path}: image token {processor.image_token!r} is not in its vocabulary")
        self.processor = processor
        return tokenizer

    def setup(self) -> None:
        if self.tokenizer is not None:
            return
        super().setup()
        unit = ""  # what the template renders for an image part, around the placeholder
        if self.tokenizer.chat_template:
            unit = template_unit(lambda messages: self._render([messages], generation_prompt=False)[0])
        try:
            if not hasattr(self.processor, "_get_num_multimodal_tokens"):
                raise LayoutRefused(f"processor {type(self.processor).__name__} cannot count image tokens")
            self.scheme = learn_image_scheme(self.processor, unit, self._counts, self._encode, self._decode)
        except LayoutRefused:
            self.layout = learn_sized_layout(self.processor, self._encode, dict(self.tokenizer.get_added_vocab()))
        rule = self.scheme.record() if self.scheme is not None else self.layout.record()  # type: ignore[union-attr]
        self._fingerprint = _combined_fingerprint(self.fingerprint(), self.processor, rule)

    def processor_record(self) -> dict[str, Any]:
        """What the manifest records of the processor."""
        self.setup()
        rule = self.scheme or self.layout
        assert rule is not None
        expansion = ({"prefix": self.scheme.prefix, "suffix": self.scheme.suffix} if self.scheme is not None
                     else {"per_image_size": self.layout.method})  # type: ignore[union-attr]
        return {
            "path": recorded_tokenizer_path(self.tokenizer_path),  # absolute: refs/train find it from anywhere
            "class": type(self.processor).__name__,
            "image_processor": type(self.processor.image_processor).__name__,
            "image_token": rule.image_token,
            "placeholder": rule.placeholder,
            "expansion": expansion,
            "fingerprint": self._fingerprint,
        }

    # -- placeholders -----------------------------------------------------------------------

    def _render(self, conversations: list[list[Message]], generation_prompt: bool,
                tools: list[Any] | None = None) -> list[str]:
        """Every message's text as content parts, as TRL hands them to a vision-language template:
        some render only parts (LLaVA-1.5's loops over `content | selectattr('type', ...)`, so a
        string content would vanish); the others render a text part as they render the string."""
        return super()._render([[_as_parts(m) for m in c] for c in conversations], generation_prompt, tools)

    def _render_rows(self, pairs: list[Pair]) -> list[_Texts | RecordError]:
        rendered = super()._render_rows(pairs)
        for i, (pair, item) in enumerate(zip(pairs, rendered)):
            if isinstance(item, _Texts):
                rendered[i] = self._place_images(pair, item)
        return rendered

    def _plain_texts(self, pair: Pair) -> _Texts | RecordError:
        texts = super()._plain_texts(pair)
        return self._place_images(pair, texts) if isinstance(texts, _Texts) else texts

    def _place_images(self, pair: Pair, texts: _Texts) -> _Texts | RecordError:
        """Expand each placeholder of the prompt the way the processor does; a row whose
        placeholders and images differ in number, or whose text holds the image token itself (a
        run the model would fill with no image), is flagged `image_mismatch` (left unexpanded)."""
        rule = self.scheme or self.layout
        assert rule is not None
        for marker in dict.fromkeys((rule.placeholder, rule.image_token)):
            if marker in texts.chosen or marker in texts.rejected:
                return RecordError(f"image placeholder {marker!r} in a completion: images must sit in the prompt")
        images: list[LoadedImage] = pair.image_data or []
        placeholders = texts.prompt.count(rule.placeholder)
        strays = self.layout.markers if self.layout is not None else (
            (rule.image_token,) if rule.image_token != rule.placeholder else ())
        stray = any(marker in texts.prompt for marker in strays)
        if placeholders == 0 and not images and not stray:
            return texts
        texts.images = True
        if placeholders != len(images) or stray:
            texts.flags = (*texts.flags, F.IMAGE_MISMATCH)
            return texts
        if self.layout is None:
            texts.image_tokens = self.image_token_counts(images)  # the report's tokens per image
            texts.prompt = self.scheme.expand(texts.prompt, texts.image_tokens)  # type: ignore[union-attr]
            return texts
        texts.image_sizes = [(image.width, image.height) for image in images]
        try:
            texts.prompt = self.layout.expand(texts.prompt, texts.image_sizes)
            texts.image_tokens = self.image_token_counts(images)
        except Exception as exc:  # noqa: BLE001 - a size the processor cannot lay out: this row, one line
            first = first_line(exc)
            return RecordError(f"the processor cannot lay out an image of size {texts.image_sizes}: {first}")
        return texts

    def image_token_counts(self, images: Sequence[LoadedImage]) -> list[int]:
        """The processor's own count for each image's size: its run of image tokens (and, for a
        processor whose count takes in the text around the run, that text: `scheme.run_offset`); for
        a layout that changes with the image, the tokens of its whole expansion."""
        self.setup()
        if self.layout is not None:
            return [len(self.layout.ids(image.width, image.height)) for image in images]
        return self._counts([(image.height, image.width) for image in images])

    def _counts(self, sizes: list[tuple[int, int]]) -> list[int]:
        data = self.processor._get_num_multimodal_tokens(image_sizes=sizes)
        counts = data["num_image_tokens"] if isinstance(data, dict) else data.num_image_tokens
        return [int(c) for c in counts]

    def _image_spans(self, prompt_ids: Sequence[int], row: _Texts) -> list[tuple[int, int]]:
        if self.layout is not None:
            return self.layout.spans(prompt_ids, row.image_sizes or [])
        assert self.scheme is not None
        return image_spans(prompt_ids, self.scheme, self._decode)

    def _encode(self, text: str) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=False))


class _GivenProcessor(VisionPairTokenizer):
    """VisionPairTokenizer over a processor already in memory (a trainer's), for its fingerprint."""

    def __init__(self, processor: Any):
        super().__init__(str(getattr(processor.tokenizer, "name_or_path", "") or "<processor>"), TokenizeSettings())
        self._given = processor

    def _load_tokenizer(self) -> Any:
        return self._adopt(self._given)


def processor_fingerprint(processor: Any) -> str:
    """The fingerprint `prepare --processor` records, for a processor already loaded (refs, train and
    the TRL hand-off compare it with OUT's): the same tokenizer, template, settings and learned
    expansion rule, computed on a copy so the caller's processor is left as it was."""
    return _GivenProcessor(copy.deepcopy(processor)).fingerprint()


def _as_parts(message: Message) -> Message:
    content = message.get("content")
    return {**message, "content": [{"type": "text", "text": content}]} if isinstance(content, str) else message


def _combined_fingerprint(tokenizer_fingerprint: str, processor: Any, rule: dict[str, Any]) -> str:
    """The tokenizer's fingerprint with the image processor's settings, the processor's own
    settings (Gemma 3's image_seq_length, LLaVA's patch_size...) and the expansion rule."""
    record = {
        "tokenizer": tokenizer_fingerprint,
        "processor": type(processor).__name__,
        "image_processor": json.loads(processor.image_processor.to_json_string()),
        "settings": _processor_settings(processor),
        "scheme": rule,
    }
    return "sha256:" + hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _processor_settings(processor: Any) -> dict[str, Any]:
    """The processor's own scalar settings (what processor_config.json holds besides its parts)."""
    try:
        settings = processor.to_dict()
    except Exception:  # an old or custom processor: its known settings by name
        settings = {name: getattr(processor, name, None) for name in (
            "patch_size", "num_additional_image_tokens", "vision_feature_select_strategy", "image_seq_length")}
    return {name: value for name, value in settings.items()
            if isinstance(value, (str, int, float, bool)) or value is None}
