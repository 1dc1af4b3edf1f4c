"""OUT/manifest.json: reading, atomic writing, and the fingerprints it records."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError

MANIFEST_NAME = "manifest.json"


def sha256_file(path: str | Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def recorded_tokenizer_path(value: str | Path) -> str:
    """The tokenizer (or processor) as the manifest records it: a local path absolute, so that `show`
    and the commands after prepare find it from any directory; a Hub id as given."""
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else str(value)


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


def shared_tokenizer_fingerprint(tokenizer: Any) -> str:
    """`tokenizer_fingerprint`, computed once per process for the shared tokenizer that
    prefdata.core.tokenizer_cache hands out read only; afresh for any other tokenizer."""
    from prefdata.core.tokenizer_cache import remembered

    return remembered(tokenizer, "fingerprint", tokenizer_fingerprint)


def require_pairs(out_dir: str | Path, command: str) -> dict[str, Any]:
    """OUT's manifest, once OUT is known to be finished and to hold at least one pair; otherwise a
    PrefdataError (one line, exit 2) naming why. `refs` and `train` call it before writing anything,
    so an OUT that cannot be used is refused instead of being rewritten into one nothing can read."""
    out = Path(out_dir)
    if not (out / MANIFEST_NAME).is_file():
        interrupted = any(out.glob(".prefdata-staging-*")) if out.is_dir() else False
        why = "a prepare was interrupted before it finished" if interrupted else "no manifest.json"
        raise PrefdataError(f"{out} is not a finished prepared OUT ({why}): run `prefdata prepare` first")
    try:
        manifest = read_manifest(out)
        kept = int((manifest.get("row_accounting") or {}).get("rows_out", 1))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise PrefdataError(f"{out / MANIFEST_NAME} cannot be read ({type(exc).__name__}: {exc})") from None
    if kept == 0:
        dropped = int((manifest.get("row_accounting") or {}).get("rows_dropped", 0))
        raise PrefdataError(
            f"{out} holds no pair ({dropped:,} dropped by the policy, see {out / 'dropped.jsonl'}): "
            f"`prefdata {command}` has nothing to read; change the policy or the data and rerun `prefdata prepare`"
        )
    if not _lists_data_files(out / "state.json"):
        raise PrefdataError(f"{out}'s dataset lists no data file in state.json: rerun `prefdata prepare` into a new OUT")
    return manifest


def _lists_data_files(state_path: Path) -> bool:
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        return bool(state["_data_files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
