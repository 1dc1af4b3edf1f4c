"""Image pairs through a processor (`--processor`): placeholders, exact image token counts, spans.

A vision-language processor is a tokenizer plus an image processor plus a rule for how one image
placeholder in the text becomes N image tokens. `VisionPairTokenizer` is `PairTokenizer` with the
processor's tokenizer and chat template, and one more step between rendering and tokenizing: each
placeholder in the rendered prompt is expanded to as many image tokens as the model will see for
that image (`_get_num_multimodal_tokens`, the processor's own count from the image's size), so
token lengths and truncation are exact. Truncation then protects the image tokens
(`truncate_pair`'s `image_spans`: `image_truncated`, never half-visible).

Checked at setup on a probe image: the processor's own expansion (`processor(text, images)`) equals
the placeholder repeated N times. A processor that expands differently (start/end tokens added
around the run, as Gemma 3's) is refused with one line rather than counted wrong.

Only Pillow is needed: transformers picks its Pillow image processors when torchvision is absent.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Sequence

from prefdata import flags as F
from prefdata.errors import PrefdataError, RecordError
from prefdata.io.images import LoadedImage, pillow
from prefdata.records import Pair
from prefdata.tokenize.pairs import PairTokenizer, TokenizeSettings, _interrupted, _Texts

_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
_PROBE_SIZE = (37, 23)  # an odd size, so a size-dependent grid shows a wrong count


def load_processor(path: str, trust_remote_code: bool = False) -> Any:
    """An AutoProcessor from a local directory, or a one-line PrefdataError."""
    if os.path.isfile(path):
        raise PrefdataError(f"--processor takes the processor's directory, not one of its files: {path}")
    if not os.path.isdir(path):
        raise PrefdataError(f"processor directory not found: {path}")
    if not any(os.path.exists(os.path.join(path, name)) for name in _PROCESSOR_FILES):
        raise PrefdataError(f"no processor files ({', '.join(_PROCESSOR_FILES)}) in {path}")
    pillow()  # the [vision] extra, named before transformers' own message
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as exc:  # one line, no traceback
        if _interrupted(exc):
            raise KeyboardInterrupt from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PrefdataError(f"cannot load processor from {path}: {first}") from None
    if getattr(processor, "tokenizer", None) is None or not getattr(processor, "image_token", None):
        raise PrefdataError(f"processor at {path} has no tokenizer or no image token: not a vision-language processor")
    return processor


class VisionPairTokenizer(PairTokenizer):
    """PairTokenizer for image pairs (and plain rows alike) through an AutoProcessor directory."""

    reads_images = True

    def __init__(self, tokenizer_path: str, settings: TokenizeSettings, trust_remote_code: bool = False):
        super().__init__(tokenizer_path, settings, trust_remote_code)
        self.processor: Any = None
        self._image_token = ""
        self._image_ids: frozenset[int] = frozenset()

    def _load_tokenizer(self) -> Any:
        processor = load_processor(self.tokenizer_path, self.trust_remote_code)
        tokenizer = processor.tokenizer
        if getattr(processor, "chat_template", None):  # the processor's template renders image parts
            tokenizer.chat_template = processor.chat_template
        self.processor = processor
        self._image_token = processor.image_token
        self._image_ids = frozenset(
            tokenizer.convert_tokens_to_ids(t) for t in (processor.image_token,) if t in tokenizer.get_vocab()
        )
        if not self._image_ids:
            raise PrefdataError(f"processor at {self.tokenizer_path}: image token {processor.image_token!r} is not in its vocabulary")
        return tokenizer

    def setup(self) -> None:
        if self.tokenizer is not None:
            return
        super().setup()
        self._fingerprint = _combined_fingerprint(self._fingerprint, self.processor)
        self._check_expansion()

    def processor_record(self) -> dict[str, Any]:
        """What the manifest records of the processor."""
        self.setup()
        return {
            "path": self.tokenizer_path,
            "class": type(self.processor).__name__,
            "image_processor": type(self.processor.image_processor).__name__,
            "image_token": self._image_token,
            "fingerprint": self._fingerprint,
        }

    # -- placeholders -----------------------------------------------------------------------

    def _render_rows(self, pairs: list[Pair]) -> list[_Texts | RecordError]:
        rendered = super()._render_rows(pairs)
        for i, (pair, item) in enumerate(zip(pairs, rendered)):
            if isinstance(item, _Texts):
                rendered[i] = self._place_images(pair, item)
        return rendered

    def _place_images(self, pair: Pair, texts: _Texts) -> _Texts | RecordError:
        """Expand each placeholder of the rendered prompt to its image's token count; a row whose
        placeholders and images differ in number is flagged `image_mismatch` (left unexpanded)."""
        token = self._image_token
        if token in texts.chosen or token in texts.rejected:
            return RecordError(f"image placeholder {token!r} in a completion: images must sit in the prompt")
        images: list[LoadedImage] = pair.image_data or []
        placeholders = texts.prompt.count(token)
        if placeholders == 0 and not images:
            return texts
        texts.images = True
        if placeholders != len(images):
            texts.flags = (*texts.flags, F.IMAGE_MISMATCH)
            return texts
        counts = self.image_token_counts(images)
        texts.image_tokens = counts  # the report's tokens per image
        pieces = texts.prompt.split(token)
        expanded = [pieces[0]]
        for count, piece in zip(counts, pieces[1:]):
            expanded.append(token * count)
            expanded.append(piece)
        texts.prompt = "".join(expanded)
        return texts

    def image_token_counts(self, images: Sequence[LoadedImage]) -> list[int]:
        """Tokens the model sees for each image, from the processor's own count for its size."""
        sizes = [(image.height, image.width) for image in images]
        data = self.processor._get_num_multimodal_tokens(image_sizes=sizes)
        counts = data["num_image_tokens"] if isinstance(data, dict) else data.num_image_tokens
        return [int(c) for c in counts]

    def _image_spans(self, prompt_ids: Sequence[int]) -> list[tuple[int, int]]:
        ids, spans, start = self._image_ids, [], -1
        for position, token_id in enumerate(prompt_ids):
            if token_id in ids:
                if start < 0:
                    start = position
            elif start >= 0:
                spans.append((start, position))
                start = -1
        if start >= 0:
            spans.append((start, len(prompt_ids)))
        return spans

    def _check_expansion(self) -> None:
        """The processor's own expansion of one placeholder equals `image_token_counts`'s run."""
        if not hasattr(self.processor, "_get_num_multimodal_tokens"):
            raise PrefdataError(f"processor {type(self.processor).__name__} cannot count image tokens (no _get_num_multimodal_tokens)")
        image = pillow().new("RGB", _PROBE_SIZE, (127, 64, 200))
        probe = LoadedImage(b"", image.width, image.height, "", 0)
        try:
            count = self.image_token_counts([probe])[0]
            theirs = list(self.processor(text=[self._image_token], images=[image])["input_ids"][0])
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PrefdataError(f"processor at {self.tokenizer_path} failed on a probe image: {first}") from None
        ours = list(self.tokenizer(self._image_token * count)["input_ids"])
        if theirs != ours:
            raise PrefdataError(
                f"processor {type(self.processor).__name__} expands {self._image_token!r} differently from a run of "
                f"{count} image tokens; prefdata cannot count its tokens exactly yet"
            )


def _combined_fingerprint(tokenizer_fingerprint: str, processor: Any) -> str:
    """The tokenizer's fingerprint with the image processor's settings and the expansion rule."""
    record = {
        "tokenizer": tokenizer_fingerprint,
        "processor": type(processor).__name__,
        "image_processor": json.loads(processor.image_processor.to_json_string()),
        "image_token": processor.image_token,
        **{name: getattr(processor, name, None) for name in ("patch_size", "num_additional_image_tokens",
                                                              "vision_feature_select_strategy")},
    }
    return "sha256:" + hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode("utf-8")).hexdigest()
