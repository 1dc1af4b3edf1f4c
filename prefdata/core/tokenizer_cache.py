"""Loading a tokenizer from a local directory once per process.

`prefdata online` runs generate, prepare, refs and train once per round, and each of them loads the
policy's tokenizer: three loads of 12-25 ms per round on a small tokenizer, and more for a real one.
With one optimizer step per round (fully online) that fixed cost weighed as much as the step. The
first load is kept; later calls get a deep copy (about 7 ms), so a caller that changes its
tokenizer (a chat template set from a file, padding side) never changes another caller's.

The cache key includes every file of the directory with its size and modification time: a tokenizer
saved again into the same directory is loaded afresh. Names that are not local directories (the
Hugging Face cache) are not cached. What is computed from a tokenizer handed out read only (its
fingerprint) is kept with it (`remembered`).

A directory that states its tokenizer class is loaded with that class directly where it is the class
AutoTokenizer would pick (prefdata.core.tokenizer_class): AutoTokenizer's model configuration
machinery imports torch, seconds of a short `validate` or `prepare`.
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from typing import Any, Callable

from prefdata.core.directory_state import directory_state

_KEEP = 4  # tokenizers held at once: a run uses the policy's and perhaps a reward model's
_LOADED: OrderedDict[tuple, Any] = OrderedDict()
_REMEMBERED: dict[tuple, dict[str, Any]] = {}  # values computed from a cached tokenizer (`remembered`), by key


def _directory_key(path: str, trust_remote_code: bool, kwargs: dict[str, Any]) -> tuple | None:
    state = directory_state(path)
    return None if state is None else (*state, trust_remote_code, tuple(sorted(kwargs.items())))


def load_pretrained_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False, *, read_only: bool = False,
                              **kwargs: Any) -> Any:
    """`AutoTokenizer.from_pretrained(path, ...)`, loaded from disk once per process for a local
    directory whose files have not changed since; each call returns its own copy, except with
    `read_only`: a caller that only encodes, fingerprints or saves it gets the cached one itself."""
    path = str(path)
    try:
        key = _directory_key(path, trust_remote_code, kwargs)
        hash(key)
    except TypeError:  # unhashable keyword values: load without the cache
        key = None
    if key is not None and key in _LOADED:
        _LOADED.move_to_end(key)
        if read_only:
            return _LOADED[key]
        try:
            return copy.deepcopy(_LOADED[key])
        except Exception:  # a tokenizer that cannot be copied is loaded afresh every time
            del _LOADED[key]
            _REMEMBERED.pop(key, None)
            key = None
    tokenizer = _from_pretrained(path, trust_remote_code, kwargs)
    if key is not None:
        try:
            # A read-only caller never changes it, so it is kept as it is: copying a large vocabulary
            # costs about as much as loading it (about 1 s for Qwen2.5's on 2 cores).
            _LOADED[key] = tokenizer if read_only else copy.deepcopy(tokenizer)  # others may change theirs
        except Exception:
            return tokenizer
        while len(_LOADED) > _KEEP:
            dropped, _ = _LOADED.popitem(last=False)
            _REMEMBERED.pop(dropped, None)
    return tokenizer


def _from_pretrained(path: str, trust_remote_code: bool, kwargs: dict[str, Any]) -> Any:
    from prefdata.core.tokenizer_class import direct_tokenizer_class, import_models_package

    direct = direct_tokenizer_class(path, trust_remote_code, kwargs)
    if direct is not None:
        return direct.from_pretrained(path, **kwargs)
    import_models_package()  # AutoTokenizer lives there: imported without a second walk of its folders
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)


def remembered(tokenizer: Any, what: str, compute: Callable[[Any], Any]) -> Any:
    """`compute(tokenizer)`, kept under `what` for a tokenizer this cache hands out read only (it
    never changes); computed afresh for any other, which its caller may have changed."""
    for key, held in _LOADED.items():
        if held is tokenizer:
            values = _REMEMBERED.setdefault(key, {})
            if what not in values:
                values[what] = compute(tokenizer)
            return values[what]
    return compute(tokenizer)

