"""`from_pretrained` for tokenizers, once per distinct set of files in a process.

Loading a tokenizer parses its JSON files: about 40 ms for a 6k vocabulary, far more for 150k. An
online round loads the same tokenizer four times (generate, prepare, refs, train), and a Python
caller may run prepare, refs and train one after another. Loaded tokenizers are kept by the bytes of
the directory's non-weight files (a changed file is a new key, wherever the directory lives) and
each caller gets its own deep copy (about 9 ms), so what one caller sets (a replacement chat
template, padding) never reaches another.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

_KEEP = 4  # distinct tokenizers kept (policy, reward model, reference, one more)
_LOADED: OrderedDict[tuple[str, bool], Any] = OrderedDict()
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx")


def files_digest(directory: str | Path) -> str:
    """SHA-256 over the names and bytes of a directory's files other than model weights."""
    digest = hashlib.sha256()
    for path in sorted(Path(directory).iterdir()):
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False, **kwargs: Any) -> Any:
    """AutoTokenizer.from_pretrained(path), reusing an earlier load of the same files. Raises what
    from_pretrained raises. Only local directories are kept (a Hub name may change under us)."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path) or kwargs:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code, **kwargs)
    key = (files_digest(path), trust_remote_code)
    if key not in _LOADED:
        _LOADED[key] = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        while len(_LOADED) > _KEEP:
            _LOADED.popitem(last=False)
    _LOADED.move_to_end(key)
    return copy.deepcopy(_LOADED[key])
