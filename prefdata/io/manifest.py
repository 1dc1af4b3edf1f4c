"""OUT/manifest.json: reading, atomic writing, and the fingerprints it records."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"


def sha256_file(path: str | Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees a half-written file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_manifest(out_dir: str | Path) -> dict[str, Any]:
    path = Path(out_dir) / MANIFEST_NAME
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_manifest(out_dir: str | Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(Path(out_dir) / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of what decides token ids: the vocabulary/merges/normalizer (tokenizer.json content),
    special tokens, and the chat template. Independent of where the files live on disk."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode("utf-8"))
    else:  # slow tokenizer: fall back to the vocabulary
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode("utf-8"))
    specials = {
        "bos": tokenizer.bos_token,
        "eos": tokenizer.eos_token,
        "pad": tokenizer.pad_token,
        "added": sorted(str(t) for t in tokenizer.all_special_tokens),
    }
    digest.update(json.dumps(specials, sort_keys=True).encode("utf-8"))
    template = getattr(tokenizer, "chat_template", None)
    digest.update(json.dumps(template, sort_keys=True, default=str).encode("utf-8"))
    return "sha256:" + digest.hexdigest()
