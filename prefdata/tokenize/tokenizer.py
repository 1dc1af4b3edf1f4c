"""The tokenizer itself: a fast (Rust) tokenizer loaded from a local directory, and what tokenizing
learns from it once (the anchor token that splits a completion from its prompt, the special ids the
tokenizer puts before a text)."""

from __future__ import annotations

import os
from typing import Any

from prefdata.core.errors import PrefdataError, first_line

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def load_tokenizer(path: str, trust_remote_code: bool = False, *, read_only: bool = False) -> Any:
    """Load a fast Hugging Face tokenizer from a local directory (or a name already in the HF cache).
    `read_only`: the caller never changes it, so it may get the process's cached one itself
    (prefdata.core.tokenizer_cache), not a copy."""
    path = str(path)
    if os.path.isfile(path):  # e.g. tok/vocab.json: the files come as a set, from their directory
        parent = os.path.dirname(path) or "."
        raise PrefdataError(f"--tokenizer takes the tokenizer's directory, not one of its files: pass {parent} instead of {path}")
    if os.path.isdir(path):
        if not any(os.path.exists(os.path.join(path, name)) for name in _TOKENIZER_FILES):
            raise PrefdataError(f"no tokenizer files ({', '.join(_TOKENIZER_FILES)}) in {path}")
    elif os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1:
        raise PrefdataError(f"tokenizer directory not found: {path}")
    try:
        from prefdata.core.tokenizer_cache import load_pretrained_tokenizer

        # A name that is not a local directory is only looked up in the local HF cache: preparing
        # data never downloads anything.
        local = path if os.path.isdir(path) else _cached_snapshot(path, trust_remote_code)
        if local is not None:
            tokenizer = load_pretrained_tokenizer(local, trust_remote_code=trust_remote_code, read_only=read_only)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as exc:  # any loading failure is a usage error: one line, no traceback
        if interrupted(exc):  # transformers' lazy imports wrap a Ctrl-C in RuntimeError
            raise KeyboardInterrupt from None
        first = first_line(exc)
        raise PrefdataError(f"cannot load tokenizer from {path}: {first}") from None
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "_tokenizer", None) is None:
        raise PrefdataError(
            f"tokenizer at {path} has no fast (Rust) version; prefdata needs a tokenizer.json-backed tokenizer"
        )
    return tokenizer


def _cached_snapshot(name: str, trust_remote_code: bool) -> str | None:
    """The HF cache's snapshot directory of `name` where loading from it gives what AutoTokenizer
    gives for the name (the class is read from its files, prefdata.core.tokenizer_class): it is then
    loaded like a local directory, without torch. None otherwise (not cached, a name AutoTokenizer
    treats specially): AutoTokenizer loads the name itself."""
    import fnmatch

    from prefdata.core.tokenizer_class import AUTO_BACKEND_NAMES, direct_tokenizer_class

    if trust_remote_code or any(fnmatch.fnmatch(name.lower(), pattern) for pattern in AUTO_BACKEND_NAMES):
        return None
    try:
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download(name, local_files_only=True)
    except Exception:  # not cached, not a repo name: AutoTokenizer says why in its own words
        return None
    return snapshot if direct_tokenizer_class(snapshot) is not None else None


def interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is somewhere in the chain of causes of `exc`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def pick_anchor(tokenizer: Any) -> str:
    """A special token that splits the text without eating neighbouring whitespace (no lstrip or
    rstrip) and encodes to exactly one id; the EOS when it qualifies. '' when none does."""
    backend = tokenizer._tokenizer
    candidates = sorted(
        tokenizer.added_tokens_decoder.values(),
        key=lambda t: (t.content != tokenizer.eos_token, t.content),
    )
    for token in candidates:
        if not token.special or token.lstrip or token.rstrip or token.normalized:
            continue
        ids = backend.encode(token.content + "x", add_special_tokens=False).ids
        if len(ids) >= 2 and ids[0] == tokenizer.convert_tokens_to_ids(token.content):
            return token.content
    return ""


def leading_special_ids(tokenizer: Any) -> list[int]:
    """The ids the tokenizer's post-processor puts before a single text (BOS where it adds one).

    Trailing ones (an EOS some tokenizers append) are not put after a prompt: the prompt continues
    with the completion, which gets its own EOS.
    """
    backend = tokenizer._tokenizer
    probe = "prefdata probe"
    bare = backend.encode(probe, add_special_tokens=False).ids
    full = backend.encode(probe, add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return list(full[:start])
    return []
