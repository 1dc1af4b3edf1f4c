"""The tokenizer class `AutoTokenizer` would pick for a local tokenizer directory, found without
AutoTokenizer.

`AutoTokenizer.from_pretrained` first loads the model configuration, and transformers' configuration
module imports torch (through its RoPE helpers): about 2-3 s of a 50-row `validate --tokenizer` or
`prepare` on a 2-core machine, for a class name that `tokenizer_config.json` already states. Here
that name is resolved the way AutoTokenizer resolves it. A model directory's `config.json` counts
only through its `model_type`: where transformers maps that type to the declared class, or to none,
AutoTokenizer keeps the declared class; the map is read from transformers' own source
(tokenization_auto.py, without importing it). None is returned for every case where AutoTokenizer's
choice depends on anything else (a model type mapped to another class, remote code, Mistral's own
format, a class transformers does not export); the caller then uses AutoTokenizer itself.
tests/test_startup.py checks that the class and the ids are the same as AutoTokenizer's for every
shared tokenizer, alone and in a model directory.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import sys
from functools import lru_cache
from pathlib import Path
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
    name = _declared_class(path)
    if name is None or name.startswith("MistralCommon"):
        return None
    if any(fnmatch.fnmatch(path.lower(), pattern) for pattern in AUTO_BACKEND_NAMES):
        return None
    import transformers
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    base = name.removesuffix("Fast")
    model_type = _model_type(path)
    if model_type is _UNKNOWN:
        return None
    hub_wrong = False  # AutoTokenizer's MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
    if model_type:
        known = _auto_tables(os.path.dirname(transformers.__file__))
        if known is None:
            return None
        mapping, wrong = known
        hub_wrong = model_type in wrong
        mapped = mapping.get(model_type, "TokenizersBackend" if hub_wrong else None)
        if mapped is _UNKNOWN or (mapped is not None and mapped.removesuffix("Fast") != base):
            return None  # the model type's own class may replace the declared one
    if base in ("BloomTokenizer", "TokenizersBackend"):
        return TokenizersBackend
    if (base == "LlamaTokenizer" and not hub_wrong
            and TokenizersBackend._tokenizer_json_has_byte_level(path, local_files_only=True)):
        return TokenizersBackend  # AutoTokenizer's rule: LlamaTokenizer hardcodes Metaspace
    import_models_package()  # where the model-specific classes live
    found = getattr(transformers, base, None) or getattr(transformers, base + "Fast", None)
    if not isinstance(found, type):
        return None
    if found.__name__ == "PythonBackend":  # PreTrainedTokenizer(Fast): AutoTokenizer loads the Rust backend
        return TokenizersBackend
    if not found.__module__.startswith("transformers.") or not issubclass(found, TokenizersBackend):
        return None
    return found


_UNKNOWN: Any = object()


def import_models_package() -> None:
    """Import `transformers.models` (every model's tokenizer class lives under it) without walking
    its folders a second time.

    `import transformers` builds its lazy table by reading every file under transformers/models
    (560 folders); importing `transformers.models` then walks them again, about 0.3 s on 2 cores,
    because the walk's cache (an lru_cache of 128) is smaller than the folders and the two calls name
    the same folder differently (a Path to it, then the str path of its __init__.py). While the
    package is imported here the second call is answered with the first call's result: the same
    function of the same folder (recomputed, as before, if the cache no longer holds it)."""
    if "transformers.models" in sys.modules:
        return
    import transformers

    try:
        from transformers.utils import import_utils

        walk = import_utils.create_import_structure_from_path
    except (ImportError, AttributeError):  # another transformers layout: import it as it comes
        walk = None
    if walk is None:
        import transformers.models  # noqa: F401
        return
    first = Path(transformers.__file__).parent / "models"  # the key transformers/__init__.py used
    second = {os.path.normpath(first), os.path.normpath(first / "__init__.py")}

    def keyed(module_path: Any) -> Any:
        if isinstance(module_path, (str, Path)) and os.path.normpath(module_path) in second:
            return walk(first)
        return walk(module_path)

    import_utils.create_import_structure_from_path = keyed
    try:
        import transformers.models  # noqa: F401
    finally:
        import_utils.create_import_structure_from_path = walk


def _model_type(path: str) -> Any:
    """config.json's model_type: None without a config (or without the key), _UNKNOWN where
    AutoTokenizer would read more of it (remote code, a model_name)."""
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        return None
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return _UNKNOWN
    if not isinstance(config, dict) or "auto_map" in config or "model_name" in config:
        return _UNKNOWN
    model_type = config.get("model_type")
    if model_type is None or model_type == "":
        return None
    return model_type if isinstance(model_type, str) else _UNKNOWN


def _entry(node: ast.expr) -> Any:
    """A TOKENIZER_MAPPING_NAMES value: a class name, or `"X" if is_tokenizers_available() else None`
    (tokenizers is installed: prefdata needs it); _UNKNOWN for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if (isinstance(node, ast.IfExp) and isinstance(node.body, ast.Constant) and isinstance(node.body.value, str)
            and isinstance(node.test, ast.Call) and isinstance(node.test.func, ast.Name)
            and node.test.func.id == "is_tokenizers_available"):
        return node.body.value
    return _UNKNOWN


@lru_cache(maxsize=1)
def _auto_tables(package_dir: str) -> tuple[dict[str, Any], frozenset[str]] | None:
    """TOKENIZER_MAPPING_NAMES and MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS as written in
    transformers' tokenization_auto.py (importing it imports torch); None if they cannot be read."""
    try:
        with open(os.path.join(package_dir, "models", "auto", "tokenization_auto.py"), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return None
    mapping: dict[str, Any] | None = None
    wrong: frozenset[str] | None = None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if not isinstance(target, ast.Name) or node.value is None:
            continue
        if target.id == "TOKENIZER_MAPPING_NAMES" and isinstance(node.value, ast.Call) and node.value.args:
            pairs = node.value.args[0]
            if not isinstance(pairs, ast.List):
                return None
            mapping = {}
            for pair in pairs.elts:
                if not (isinstance(pair, ast.Tuple) and len(pair.elts) == 2 and isinstance(pair.elts[0], ast.Constant)):
                    return None
                mapping[pair.elts[0].value] = _entry(pair.elts[1])
        elif target.id == "MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS":
            try:
                wrong = frozenset(ast.literal_eval(node.value))
            except ValueError:
                return None
    if mapping is None or wrong is None:
        return None
    return mapping, wrong
