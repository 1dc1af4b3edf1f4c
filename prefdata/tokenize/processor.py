"""Loading a vision-language processor (`--processor DIR`) with Pillow alone.

`AutoProcessor` loads every part a processor declares. Some declare a video processor (Qwen2-VL's
`Qwen2VLVideoProcessor`), which needs torchvision, and a CPU-only torch often has no matching
torchvision. Image pairs never use it: when torchvision is absent and loading failed, the same
processor class is loaded again without its video processor (its tokenizer, its image processor,
which transformers picks in its Pillow form, its settings and chat template, all from the same
directory). A class that reads its video processor's settings even for images (SmolVLM's chat
template reads its frame count and rate) gets a stand-in that has none and refuses videos in one
line. Where torchvision imports, `AutoProcessor` is used as it is.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from prefdata.core.errors import PrefdataError, first_line
from prefdata.io.images import pillow
from prefdata.tokenize.tokenizer import interrupted

_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
_CLASS_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")
_VIDEO = "video_processor"


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
        if interrupted(exc):
            raise KeyboardInterrupt from None
        processor = _without_video_processor(path, trust_remote_code)
        if processor is None:
            raise PrefdataError(f"cannot load processor from {path}: {first_line(exc)}") from None
    if getattr(processor, "tokenizer", None) is None or not getattr(processor, "image_token", None):
        raise PrefdataError(f"processor at {path} has no tokenizer or no image token: not a vision-language processor")
    return processor


def _without_video_processor(path: str, trust_remote_code: bool) -> Any | None:
    """The directory's processor class without its video processor, when torchvision is what is
    missing; None when that does not apply (or does not help either)."""
    if importlib.util.find_spec("torchvision") is not None:
        return None
    processor_class = _processor_class(path)
    attributes = list(_attributes(processor_class)) if processor_class is not None else []
    if _VIDEO not in attributes:
        return None
    kept = [name for name in attributes if name != _VIDEO]
    # Same name, so the manifest and messages say Qwen2VLProcessor; only the parts it loads differ.
    body: dict[str, Any] = {
        "__module__": processor_class.__module__,
        "attributes": kept,  # transformers 4.x reads the class attribute
        "get_attributes": classmethod(lambda cls: list(kept)),  # transformers 5 asks this method
    }
    extra: dict[str, Any] = {}
    if _requires_video_argument(processor_class):  # SmolVLMProcessor: no default for it
        extra[_VIDEO] = None
        body[_VIDEO] = _NoVideoProcessor(processor_class.__name__)
    images_only = type(processor_class.__name__, (processor_class,), body)
    try:
        return images_only.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True, **extra)
    except ImportError as exc:  # a package the class itself needs (SmolVLM: num2words): name it
        raise PrefdataError(f"cannot load processor from {path}: {first_line(exc)}") from None
    except Exception as exc:
        if interrupted(exc):
            raise KeyboardInterrupt from None
        return None


class _NoVideoProcessor:
    """What an images-only processor has where its video processor would be: no frame settings (its
    chat template reads them, images do not use them) and a one-line refusal of videos."""

    num_frames = None
    fps = None
    model_input_names: list[str] = []

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise PrefdataError(f"{self.name} was loaded without its video processor (it needs torchvision): images only")


def _requires_video_argument(processor_class: type) -> bool:
    """Whether the class's constructor takes a video processor with no default."""
    import inspect

    try:
        parameter = inspect.signature(processor_class.__init__).parameters.get(_VIDEO)
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _processor_class(path: str) -> type | None:
    """The processor class a directory names (`processor_class`, else its model type's)."""
    import transformers

    for name in _CLASS_FILES:
        value = _json(os.path.join(path, name)).get("processor_class")
        if isinstance(value, str) and isinstance(getattr(transformers, value, None), type):
            return getattr(transformers, value)
    model_type = _json(os.path.join(path, "config.json")).get("model_type")
    try:
        from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    except ImportError:  # pragma: no cover - every transformers this supports has it
        return None
    value = PROCESSOR_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    found = getattr(transformers, value, None) if isinstance(value, str) else None
    return found if isinstance(found, type) else None


def _attributes(processor_class: type) -> list[str]:
    method = getattr(processor_class, "get_attributes", None)
    if callable(method):
        return list(method())
    return list(getattr(processor_class, "attributes", []))


def _json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def holds_processor(path: str | os.PathLike[str]) -> bool:
    """Whether a directory holds a processor's files (a model directory saved with its processor)."""
    return any(os.path.isfile(os.path.join(path, name)) for name in _PROCESSOR_FILES)
