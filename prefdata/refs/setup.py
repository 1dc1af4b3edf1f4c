"""What `refs` checks and records before computing: device and dtype, the tokenizer against the
manifest, the model's fingerprint, the digest of the token ids, and torchrun's ranks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from prefdata.core.directory_state import directory_state
from prefdata.core.errors import PrefdataError
from prefdata.io.manifest import sha256_file, tokenizer_fingerprint
from prefdata.refs.swap import REF_COLUMNS

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def model_fingerprint(model_dir: Path, config: Any, dtype: str) -> dict[str, Any]:
    """Architecture, sha256 of every weight file, dtype: what decides the reference log-probs."""
    weights = {
        p.name: sha256_file(p) for p in sorted(model_dir.iterdir()) if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
    }
    archs = getattr(config, "architectures", None) or []
    return {
        "architecture": archs[0] if archs else type(config).__name__,
        "model_type": getattr(config, "model_type", None),
        "weights_sha256": weights,
        "dtype": dtype,
    }


def ids_digest(table: Any) -> str:
    """Hash of the token-id columns and loss starts (what refs reads), so resumed shards belong to the
    same data."""
    from prefdata.core.schema import LOSS_START_COLUMNS

    digest = hashlib.sha256()
    for name in ("prompt_ids", "chosen_ids", "rejected_ids"):
        column = table.column(name).combine_chunks()
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(column.offsets.to_numpy()).tobytes())
        digest.update(np.ascontiguousarray(column.values.to_numpy()).astype(np.int64).tobytes())
    for name in LOSS_START_COLUMNS:
        if name in table.column_names:
            digest.update(name.encode())
            digest.update(table.column(name).to_numpy().astype(np.int64).tobytes())
    return digest.hexdigest()



def resolve_device(device: str, local_rank: int) -> str:
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise PrefdataError(f"--device must be auto, cpu or cuda, not {device!r}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise PrefdataError("--device cuda was asked for but no CUDA GPU is available")
        return f"cuda:{local_rank}"
    return "cpu"


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in ("float32", "bfloat16"):
        raise PrefdataError(f"--dtype must be auto, float32 or bfloat16, not {dtype!r}")
    return dtype


# Tokenizer fingerprints by the bytes of the files they come from: online rounds check the same
# reference tokenizer every round, and hashing files is cheaper than loading a tokenizer.
_FINGERPRINTS: dict[tuple[str, bool], str] = {}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx")


def files_digest(directory: Path) -> str:
    """SHA-256 over the names and bytes of a model directory's files other than weights."""
    digest = hashlib.sha256()
    for path in sorted(Path(directory).iterdir()):
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load_tokenizer_checked(model_dir: Path, manifest: dict[str, Any], trust_remote_code: bool) -> str:
    from prefdata.core.tokenizer_cache import load_pretrained_tokenizer

    expected = (manifest.get("tokenizer") or {}).get("fingerprint")
    if not expected:
        raise PrefdataError("the manifest has no tokenizer fingerprint: prepare OUT with `prefdata prepare --tokenizer`")
    key = (files_digest(model_dir), trust_remote_code)
    found = _FINGERPRINTS.get(key)
    if found is None:
        try:
            tokenizer = load_pretrained_tokenizer(model_dir, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise PrefdataError(f"cannot load a tokenizer from {model_dir} to check it: {str(exc).splitlines()[0]}") from None
        found = _FINGERPRINTS[key] = tokenizer_fingerprint(tokenizer)
    if found != expected:
        raise PrefdataError(
            f"the tokenizer of {model_dir} ({found[:19]}) differs from the one OUT was prepared with "
            f"({expected[:19]}): refusing to score token ids it would read differently"
        )
    return found


def distributed_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))



def load_reference_model(model_dir: Path, dtype_name: str, device_name: str, trust_remote_code: bool,
                         vision: bool = False) -> Any:
    """The reference model in eval mode on its device (`vision`: a vision-language model)."""
    import torch
    from transformers import AutoModelForCausalLM

    if vision:
        from prefdata.model.vision_model import load_vision_language_model

        net = load_vision_language_model(model_dir, getattr(torch, dtype_name), trust_remote_code)
        return net.to(device_name).eval()
    try:
        net = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype_name), trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise PrefdataError(f"cannot load a causal LM from {model_dir}: {str(exc).splitlines()[0]}") from None
    return net.to(device_name).eval()


def choose_layout(net: Any, layout: str, vision: Any = None) -> str:
    """auto: shared padding-free blocks where the model supports them (see model/pairs.py); right
    padding for a model whose image tokens attend each other both ways (`vision.type_ids_key`)."""
    from prefdata.model.pairs import choose_layout as choose

    try:
        return choose(net, layout, vision)
    except ValueError as exc:
        raise PrefdataError(str(exc)) from None


def checked_vision(out: Path, model_dir: Path, processor: str | None, manifest: dict[str, Any],
                   trust_remote_code: bool) -> tuple[Any, str]:
    """For an image OUT: the pixel-input settings of its processor and the processor's fingerprint
    (prefdata.model.vision_model.checked_processor); (None, "") for a text OUT."""
    from prefdata.model.vision_model import checked_processor

    checked = checked_processor(out, model_dir, processor, manifest, trust_remote_code)
    return (None, "") if checked is None else (checked[0], checked[2])


def open_ids(out: Path, images: bool = False) -> tuple[Any, dict[str, Any], dict[str, np.ndarray]]:
    """The dataset in OUT, its token-id columns (Arrow) and their lengths; `images`: also the images
    column (memory-mapped, read per batch), after refusing rows kept with `image_mismatch`."""
    import pyarrow.compute as pc

    from prefdata.core.schema import LOSS_MASK_COLUMNS, LOSS_START_COLUMNS, has_loss_masks, has_loss_starts

    from prefdata.io.out_dir import load_out_dataset

    dataset = load_out_dataset(out, "refs")  # its files checked: nothing read from outside OUT
    missing = [c for c in ("prompt_ids", "chosen_ids", "rejected_ids") if c not in dataset.column_names]
    if missing:
        raise PrefdataError(f"{out} has no {', '.join(missing)} column: prepare it with a tokenizer")
    table = dataset.data.table
    ids = {name: table.column(name).combine_chunks() for name in ("prompt_ids", "chosen_ids", "rejected_ids")}
    lens = {name: pc.list_value_length(col).to_numpy(zero_copy_only=False) for name, col in ids.items()}
    if has_loss_starts(dataset.column_names):  # `--loss-on answer`: refs sum only the answer tokens
        ids.update({name: table.column(name).combine_chunks() for name in LOSS_START_COLUMNS})
    if has_loss_masks(dataset.column_names):  # turns the model did not write: refs sum only the trained ones
        ids.update({name: table.column(name).combine_chunks() for name in LOSS_MASK_COLUMNS})
    if images:
        from prefdata.model.vision_model import refuse_mismatched_rows

        refuse_mismatched_rows(table, out)
        if "images" in dataset.column_names:
            ids["images"] = table.column("images")  # chunked and mapped: `take` reads a batch's rows only
    return dataset, ids, lens


def early_fingerprint(model_dir: Path, dtype: str, trust_remote_code: bool) -> dict[str, Any] | None:
    """`model_fingerprint` from the model's config alone (no weights loaded), so a rerun can be
    recognised before loading the model; None when the config cannot be read (the model loader
    then reports why)."""
    from transformers import AutoConfig

    state = directory_state(model_dir)
    key = None if state is None else (*state, dtype, trust_remote_code)
    if key is not None and key in _EARLY_FINGERPRINTS:
        return _EARLY_FINGERPRINTS[key]
    try:
        config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None
    found = model_fingerprint(model_dir, config, dtype)
    if key is not None:
        _EARLY_FINGERPRINTS[key] = found
    return found


# Fingerprints of model directories whose files have not changed since (name, size, mtime, inode):
# `prefdata online` runs refs every round against the same reference, and hashing its weights again
# each time cost a real model seconds per round.
_EARLY_FINGERPRINTS: dict[tuple, dict[str, Any]] = {}


def held_refs(manifest: dict[str, Any], fingerprint: dict[str, Any], device_type: str) -> dict[str, Any] | None:
    """The manifest's refs entry when OUT already holds refs from this model (same weights,
    architecture and dtype) on this kind of device: the values a rerun would compute again.
    Batch size and layout only reorder the arithmetic, so they do not count as a change."""
    refs = manifest.get("refs")
    if not isinstance(refs, dict):
        return None
    if not set(REF_COLUMNS) <= set(refs.get("columns") or []):  # an older OUT: no public-length sums yet
        return None
    model = {key: value for key, value in (refs.get("model") or {}).items() if key != "path"}
    device = str((refs.get("settings") or {}).get("device", "")).split(":")[0]
    return refs if model == fingerprint and device == device_type else None
