"""OUT/manifest.json: reading, atomic writing, and the fingerprints it records."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.io.ledger import check_against_files
from prefdata.io.out_paths import arrow_rows, check_out_files, count_lines, out_file

MANIFEST_NAME = "manifest.json"
# Manifest fields commands read, and the JSON types each must have: a tampered field is one line, not a crash.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "row_accounting": (dict,), "content_hash": (str,), "tokenizer": (dict,), "processor": (dict,), "config": (dict,),
    "refs": (dict,), "flag_counts": (dict,), "shards": (list,), "columns": (list,), "files": (list,),
    "format_version": (int,), "selection": (dict,), "selected_from": (dict,),
}
_TOKENIZER_TYPES: dict[str, tuple[type, ...]] = {
    "path": (str,), "fingerprint": (str,), "pad_token_id": (int,), "eos_token_id": (int,), "bos_token_id": (int,),
}


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
    return os.path.abspath(path) if path.exists() else str(value)  # absolute, symlinks as the user named them


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
    """OUT's manifest, read through `out_file` (no symlink, nothing outside OUT) and type-checked
    (`check_manifest_types`). OSError when it is absent; PrefdataError when it is not a manifest."""
    path = out_file(out_dir, MANIFEST_NAME)
    with open(path, encoding="utf-8") as handle:
        try:
            manifest = json.load(handle)
        except ValueError as exc:
            raise PrefdataError(f"{path} is not valid JSON ({exc})") from None
    check_manifest_types(manifest, path)
    return manifest


def check_manifest_types(manifest: Any, path: str | Path) -> None:
    """The fields commands read have their JSON types (null allowed where absent is); the ledger's
    counts are non-negative integers. One line naming the field otherwise."""
    if not isinstance(manifest, dict):
        raise PrefdataError(f"{path} is not a JSON object")

    def refuse(field: str, value: Any, wanted: str) -> None:
        raise PrefdataError(f"{path}: {field} must be {wanted}, not {json.dumps(value)[:60]}")

    for field, types in _FIELD_TYPES.items():
        value = manifest.get(field)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            refuse(field, value, f"a JSON {_json_type(types[0])}")
    for key, value in (manifest.get("row_accounting") or {}).items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            refuse(f"row_accounting.{key}", value, "a non-negative integer")
    for key, value in (manifest.get("flag_counts") or {}).items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            refuse(f"flag_counts.{key}", value, "a non-negative integer")
    for key, types in _TOKENIZER_TYPES.items():
        value = (manifest.get("tokenizer") or {}).get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            refuse(f"tokenizer.{key}", value, f"a JSON {_json_type(types[0])} or null")


def _json_type(python_type: type) -> str:
    return {dict: "object", list: "array", str: "string", int: "integer"}[python_type]


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
    manifest = verify_out(out)
    accounting = manifest["row_accounting"]
    if accounting["rows_out"] == 0:
        raise PrefdataError(
            f"{out} holds no pair ({accounting['rows_dropped']:,} dropped by the policy, see {out / 'dropped.jsonl'}): "
            f"`prefdata {command}` has nothing to read; change the policy or the data and rerun `prefdata prepare`"
        )
    return manifest


def verify_out(out_dir: str | Path) -> dict[str, Any]:
    """A finished OUT handed over by someone else, checked before any command reads it: no file it
    reads is a symlink or lies outside it (prefdata.io.out_paths), its manifest has the types
    commands rely on, and its ledger matches its files (dataset rows, dropped.jsonl and
    quarantine.jsonl lines; a manifest without a ledger gets the one its files give). Returns the
    manifest; one line (exit 2) naming what is wrong otherwise."""
    out = Path(out_dir)
    try:
        manifest = read_manifest(out)
    except OSError as exc:
        raise PrefdataError(f"{out / MANIFEST_NAME} cannot be read ({type(exc).__name__}: {exc})") from None
    files = check_out_files(out)
    rows, dropped = arrow_rows(files), count_lines(out_file(out, "dropped.jsonl"))
    quarantined = count_lines(out_file(out, "quarantine.jsonl"))
    if manifest.get("row_accounting") is None:  # an OUT written elsewhere, with no ledger: its files are the ledger
        manifest["row_accounting"] = {"rows_in": rows + dropped + quarantined, "rows_out": rows,
                                      "rows_dropped": dropped, "rows_quarantined": quarantined}
    # A state.json that lists no data file under a ledger with pairs fails here too: rows_out N but 0 dataset rows.
    check_against_files(manifest["row_accounting"], out, rows=rows, dropped_lines=dropped, quarantine_lines=quarantined)
    return manifest
