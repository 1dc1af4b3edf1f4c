"""The tokenizer class `AutoTokenizer` would pick for a local tokenizer directory, found without
AutoTokenizer.

`AutoTokenizer.from_pretrained` first loads the model configuration, and transformers' configuration
module imports torch (through its RoPE helpers): about 2-3 s of a 50-row `validate --tokenizer` or
`prepare` on a 2-core machine, for a class name that `tokenizer_config.json` already states. Here
that name is resolved the way AutoTokenizer resolves it for a directory holding no `config.json`
(a tokenizer saved on its own), and None is returned for every case where AutoTokenizer's choice
depends on anything else: a model's `config.json`, remote code, Mistral's own format, a class
transformers does not export. The caller then uses AutoTokenizer itself. tests/test_startup.py
checks that the class and the ids are the same as AutoTokenizer's for every shared tokenizer.
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import Any

# transformers.models.auto.tokenization_auto.MODEL_IDS_TO_TOKENIZERS_BACKEND (5.x): names that
# AutoTokenizer loads as TokenizersBackend whatever they declare. A path matching one is left to
# AutoTokenizer; tests/test_startup.py fails when transformers' list grows past this copy.
AUTO_BACKEND_NAMES = (
    "deepseek-ai/deepseek-r1-distill-llama-*",
    "deepseek-ai/deepseek-coder-*",
    "allenai/dolma2-tokenizer",
    "google/umt5-small",
    "naver-clova-ix/donut-*",
    "salesforce/blip2-opt-*",
    "salesforce/blip2-flan-t5-*",
    "salesforce/instructblip-flan-t5-*",
    "stepfun-ai/step-3.7-*",
)

# Keywords AutoTokenizer reads itself (or that change which class it picks): left to it.
_AUTO_ONLY_KWARGS = {"config", "tokenizer_type", "use_fast", "mistral_format", "gguf_file", "subfolder", "revision"}


def _declared_class(path: str) -> str | None:
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or "auto_map" in config:  # remote code: AutoTokenizer decides
        return None
    name = config.get("tokenizer_class")
    return name if isinstance(name, str) and name else None


def direct_tokenizer_class(path: str, trust_remote_code: bool = False, kwargs: dict[str, Any] | None = None) -> Any:
    """The class AutoTokenizer would load `path` with, or None where only AutoTokenizer can tell."""
    if trust_remote_code or not os.path.isdir(path) or _AUTO_ONLY_KWARGS.intersection(kwargs or {}):
        return None
    if os.path.exists(os.path.join(path, "config.json")):  # a model directory: its model_type has a say
        return None
    name = _declared_class(path)
    if name is None or name.startswith("MistralCommon"):
        return None
    if any(fnmatch.fnmatch(path.lower(), pattern) for pattern in AUTO_BACKEND_NAMES):
        return None
    import transformers
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    base = name.removesuffix("Fast")
    if base in ("BloomTokenizer", "TokenizersBackend"):
        return TokenizersBackend
    if base == "LlamaTokenizer" and TokenizersBackend._tokenizer_json_has_byte_level(path, local_files_only=True):
        return TokenizersBackend  # AutoTokenizer's rule: LlamaTokenizer hardcodes Metaspace
    found = getattr(transformers, base, None) or getattr(transformers, base + "Fast", None)
    if not isinstance(found, type):
        return None
    if found.__name__ == "PythonBackend":  # PreTrainedTokenizer(Fast): AutoTokenizer loads the Rust backend
        return TokenizersBackend
    if not found.__module__.startswith("transformers.") or not issubclass(found, TokenizersBackend):
        return None
    return found
