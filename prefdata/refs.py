"""`prefdata refs OUT --model PATH`: reference-model log-probs into Arrow columns.

Flow: check the model's tokenizer against the manifest -> plan length-sorted batches under a token
budget -> compute them in shards (each saved to OUT/.refs-work/, so a killed run resumes) -> merge
-> flag non-finite rows -> write the new dataset beside the old one and swap it in with renames ->
update the manifest last. Under torchrun, rank r computes shards r, r+k, ...; rank 0 merges.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prefdata import flags as F
from prefdata.errors import PrefdataError
from prefdata.io.manifest import read_manifest, sha256_file, tokenizer_fingerprint, write_manifest
from prefdata.io.lock import holding_out_lock, is_rank_zero

REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps", "chosen_token_count", "rejected_token_count")
WORK_DIR = ".refs-work"
SWAP_JOURNAL = "swap.json"
SHARD_BATCHES = 8  # batches per resumable shard: small enough to lose little work on a kill
WORK_FORMAT = 1
# Test hook: SIGKILL this process right after it has written this many new shards (kill -9 test).
KILL_AFTER_SHARDS_ENV = "PREFDATA_REFS_KILL_AFTER_SHARDS"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass
class RefsResult:
    out_dir: str
    rows: int
    tokens: int  # real tokens forwarded by this process (resumed shards not counted)
    seconds: float  # wall time of the forward passes in this process
    tokens_per_second: float
    non_finite_rows: int
    shards_total: int
    shards_resumed: int
    layout: str
    device: str
    dtype: str
    rank: int = 0
    merged: bool = True  # False on ranks other than 0, which only compute shards

    def summary(self) -> str:
        if not self.merged:
            return f"rank {self.rank}: computed its shards ({self.tokens} tokens, {self.tokens_per_second:.0f} tokens/s)"
        line = (
            f"refs: {self.rows} pairs, {self.tokens} tokens in {self.seconds:.1f}s "
            f"({self.tokens_per_second:.0f} tokens/s, {self.layout} batches, {self.dtype} on {self.device})"
        )
        if self.shards_resumed:
            line += f"; resumed {self.shards_resumed}/{self.shards_total} shards"
        if self.non_finite_rows:
            line += f"; {self.non_finite_rows} rows flagged {F.NON_FINITE_REF_LOGPS}"
        return line + f"; wrote {self.out_dir}/"


@dataclass
class ShardValues:
    rows: np.ndarray  # int64 row indices into the dataset
    chosen: np.ndarray  # float32 ref_chosen_logps
    rejected: np.ndarray  # float32 ref_rejected_logps
    chosen_count: np.ndarray  # int64
    rejected_count: np.ndarray  # int64


# ---------------------------------------------------------------- planning (pure, unit-tested)


def pair_costs(prompt_lens: np.ndarray, chosen_lens: np.ndarray, rejected_lens: np.ndarray) -> list[int]:
    """Padded token cost of a pair in a right/left pair batch: both halves padded to the longer."""
    return (2 * (prompt_lens + np.maximum(chosen_lens, rejected_lens))).astype(np.int64).tolist()


def plan_shards(batches: list[list[int]], shard_batches: int = SHARD_BATCHES) -> list[list[list[int]]]:
    """Consecutive groups of batches; each group is one resumable unit of work."""
    return [batches[i : i + shard_batches] for i in range(0, len(batches), shard_batches)]


def shards_for_rank(num_shards: int, rank: int, world_size: int) -> list[int]:
    """Rank r takes shards r, r + k, r + 2k, ... (k = world size)."""
    return list(range(rank, num_shards, world_size))


def save_shard(path: Path, values: ShardValues) -> None:
    """Write atomically: a shard file either exists complete or not at all."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        np.savez(handle, **asdict(values))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_shard(path: Path) -> ShardValues:
    with np.load(path) as data:
        return ShardValues(**{name: data[name] for name in ShardValues.__dataclass_fields__})


def shard_path(work: Path, shard: int) -> Path:
    return work / f"shard-{shard:06d}.npz"


def merge_shards(work: Path, num_shards: int, num_rows: int) -> ShardValues:
    """All shards into per-row arrays; refuses when a shard is missing or a row is not covered."""
    chosen = np.full(num_rows, np.nan, dtype=np.float32)
    rejected = np.full(num_rows, np.nan, dtype=np.float32)
    chosen_count = np.zeros(num_rows, dtype=np.int64)
    rejected_count = np.zeros(num_rows, dtype=np.int64)
    seen = np.zeros(num_rows, dtype=bool)
    for shard in range(num_shards):
        path = shard_path(work, shard)
        if not path.is_file():
            raise PrefdataError(f"refs shard {shard} is missing in {work}: a rank did not finish; rerun to resume")
        part = load_shard(path)
        chosen[part.rows] = part.chosen
        rejected[part.rows] = part.rejected
        chosen_count[part.rows] = part.chosen_count
        rejected_count[part.rows] = part.rejected_count
        seen[part.rows] = True
    if not seen.all():
        raise PrefdataError(f"refs shards in {work} do not cover {int((~seen).sum())} rows; delete {work} and rerun")
    return ShardValues(np.arange(num_rows, dtype=np.int64), chosen, rejected, chosen_count, rejected_count)


# ---------------------------------------------------------------- fingerprints


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


def _ids_digest(table: Any) -> str:
    """Hash of the token-id columns (what refs reads), so resumed shards belong to the same data."""
    digest = hashlib.sha256()
    for name in ("prompt_ids", "chosen_ids", "rejected_ids"):
        column = table.column(name).combine_chunks()
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(column.offsets.to_numpy()).tobytes())
        digest.update(np.ascontiguousarray(column.values.to_numpy()).astype(np.int64).tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------- dataset swap


def _data_files(out: Path) -> list[str]:
    state = json.loads((out / "state.json").read_text(encoding="utf-8"))
    return [entry["filename"] for entry in state["_data_files"]]


def _finish_swap(out: Path) -> None:
    """Complete (or redo) a dataset swap that a killed run left half done; idempotent."""
    journal_path = out / WORK_DIR / SWAP_JOURNAL
    if not journal_path.is_file():
        return
    journal = json.loads(journal_path.read_text(encoding="utf-8"))
    staged = Path(journal["staged"])
    for name in ("dataset_info.json", "state.json"):
        if (staged / name).is_file():
            os.replace(staged / name, out / name)
    keep = set(journal["new_files"])
    for name in journal["old_files"]:
        if name not in keep and (out / name).is_file():
            (out / name).unlink()
    shutil.rmtree(staged, ignore_errors=True)
    journal_path.unlink()


def _swap_dataset(out: Path, dataset: Any) -> None:
    """Save `dataset` inside OUT, then switch OUT's dataset to it with renames.

    The new data files get fresh names next to the old ones; the switch is the rename of
    state.json/dataset_info.json, recorded in a journal first so a kill in between is finished by
    the next run; the old data files are deleted last.
    """
    work = out / WORK_DIR
    staged = work / f"dataset-{secrets.token_hex(4)}"
    dataset.save_to_disk(str(staged))
    tag = secrets.token_hex(4)
    state = json.loads((staged / "state.json").read_text(encoding="utf-8"))
    new_files = []
    for i, entry in enumerate(state["_data_files"]):
        name = f"data-refs-{tag}-{i:05d}-of-{len(state['_data_files']):05d}.arrow"
        os.replace(staged / entry["filename"], out / name)
        entry["filename"] = name
        new_files.append(name)
    (staged / "state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")
    journal = {"staged": str(staged), "new_files": new_files, "old_files": _data_files(out)}
    (work / SWAP_JOURNAL).write_text(json.dumps(journal), encoding="utf-8")
    _finish_swap(out)


# ---------------------------------------------------------------- the command


def _resolve_device(device: str, local_rank: int) -> str:
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


def _resolve_dtype(dtype: str, device: str) -> str:
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in ("float32", "bfloat16"):
        raise PrefdataError(f"--dtype must be auto, float32 or bfloat16, not {dtype!r}")
    return dtype


def _load_tokenizer_checked(model_dir: Path, manifest: dict[str, Any], trust_remote_code: bool) -> str:
    from transformers import AutoTokenizer

    expected = (manifest.get("tokenizer") or {}).get("fingerprint")
    if not expected:
        raise PrefdataError("the manifest has no tokenizer fingerprint: prepare OUT with `prefdata prepare --tokenizer`")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise PrefdataError(f"cannot load a tokenizer from {model_dir} to check it: {str(exc).splitlines()[0]}") from None
    found = tokenizer_fingerprint(tokenizer)
    if found != expected:
        raise PrefdataError(
            f"the tokenizer of {model_dir} ({found[:19]}) differs from the one OUT was prepared with "
            f"({expected[:19]}): refusing to score token ids it would read differently"
        )
    return found


def _distributed() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


@holding_out_lock("refs", when=is_rank_zero)  # one writer per OUT (rank 0 writes for all ranks)
def compute_refs(
    out_dir: str | Path,
    model: str,
    device: str = "auto",
    dtype: str = "auto",
    batch_tokens: int = 16384,
    resume: bool = True,
    progress: bool = True,
    trust_remote_code: bool = False,
    *,
    layout: str = "auto",
    shard_batches: int = SHARD_BATCHES,
    rank: int | None = None,
    world_size: int | None = None,
) -> RefsResult:
    """Add reference log-probs and completion token counts to the prepared dataset in `out_dir`.

    `layout` (auto|right|left|packed) and `shard_batches` are for tests and benchmarks; auto packs
    only where the attention kernel makes packing pay (varlen flash kernels), else pads sorted rows.
    `rank`/`world_size` default to torchrun's environment.
    """
    import datasets
    import torch

    from prefdata.model.logprobs import packing_is_efficient, plan_batches, supports_packing

    out = Path(out_dir)
    model_dir = Path(model)
    if not (out / "manifest.json").is_file() or not (out / "state.json").is_file():
        raise PrefdataError(f"{out} is not a prepared OUT directory (no manifest.json/state.json): run `prefdata prepare`")
    if not model_dir.is_dir():
        raise PrefdataError(f"--model {model} is not a local model directory")
    if batch_tokens <= 0:
        raise PrefdataError("--batch-tokens must be positive")
    env_rank, env_world, local_rank = _distributed()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if world_size > 1 and "MASTER_ADDR" in os.environ:
        _init_process_group()

    manifest = read_manifest(out)
    if rank == 0:
        _finish_swap(out)  # a previous run killed mid-swap
    from prefdata.schema import check_out

    check_out(out, tokens_only=True)  # the part of OUT's contract refs reads, before loading a model
    tok_fp = _load_tokenizer_checked(model_dir, manifest, trust_remote_code)
    pad_token_id = int((manifest.get("tokenizer") or {}).get("pad_token_id") or 0)

    device_name = _resolve_device(device, local_rank)
    dtype_name = _resolve_dtype(dtype, device_name)
    from transformers import AutoModelForCausalLM

    try:
        net = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype_name), trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise PrefdataError(f"cannot load a causal LM from {model_dir}: {str(exc).splitlines()[0]}") from None
    net.to(device_name).eval()

    if layout == "auto":
        layout = "packed" if packing_is_efficient(net) else "right"
    if layout == "packed" and not supports_packing(net):
        layout = "right"  # correctness first: this attention implementation does not honour packing
    if layout not in ("right", "left", "packed"):
        raise PrefdataError(f"unknown layout {layout!r}")

    try:
        dataset = datasets.load_from_disk(str(out))
    except (OSError, ValueError) as exc:
        raise PrefdataError(f"cannot open the dataset in {out}: {exc}") from None
    missing = [c for c in ("prompt_ids", "chosen_ids", "rejected_ids") if c not in dataset.column_names]
    if missing:
        raise PrefdataError(f"{out} has no {', '.join(missing)} column: prepare it with a tokenizer")
    import pyarrow.compute as pc

    table = dataset.data.table
    ids = {name: table.column(name).combine_chunks() for name in ("prompt_ids", "chosen_ids", "rejected_ids")}
    lens = {name: pc.list_value_length(col).to_numpy(zero_copy_only=False) for name, col in ids.items()}
    costs = pair_costs(lens["prompt_ids"], lens["chosen_ids"], lens["rejected_ids"])
    batches = plan_batches(costs, batch_tokens)
    shards = plan_shards(batches, shard_batches)
    num_rows = len(dataset)

    fingerprint = model_fingerprint(model_dir, net.config, dtype_name)
    settings = {
        "work_format": WORK_FORMAT,
        "model": fingerprint,
        "device_type": device_name.split(":")[0],
        "batch_tokens": batch_tokens,
        "layout": layout,
        "shard_batches": shard_batches,
        "pad_token_id": pad_token_id,
        "ids_sha256": _ids_digest(table),
    }
    settings_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    work = out / WORK_DIR / settings_hash
    if rank == 0:
        for stale in (out / WORK_DIR).glob("*") if (out / WORK_DIR).is_dir() else []:
            if stale.is_dir() and stale.name != settings_hash and not stale.name.startswith("dataset-"):
                shutil.rmtree(stale, ignore_errors=True)  # shards computed under other settings
        if not resume:
            shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    (work / "settings.json").write_text(json.dumps(settings, indent=2, sort_keys=True), encoding="utf-8")

    mine = shards_for_rank(len(shards), rank, world_size)
    todo = [s for s in mine if not (resume and shard_path(work, s).is_file())]
    row_tokens = 2 * lens["prompt_ids"] + lens["chosen_ids"] + lens["rejected_ids"]

    def shard_tokens(shard_ids: list[int]) -> int:
        rows = [r for s in shard_ids for b in shards[s] for r in b]
        return int(row_tokens[rows].sum()) if rows else 0

    total_tokens = shard_tokens(mine)
    done_tokens = total_tokens - shard_tokens(todo)
    kill_after = int(os.environ.get(KILL_AFTER_SHARDS_ENV, "0") or 0)

    from tqdm.auto import tqdm

    bar = tqdm(total=total_tokens, initial=done_tokens, unit="tok", unit_scale=True, desc="refs",
               disable=not progress, smoothing=0.1)
    tokens = 0
    start = time.perf_counter()
    written = 0
    with torch.inference_mode():
        for s in todo:
            values = _compute_shard(net, shards[s], ids, layout, pad_token_id, bar)
            tokens += int(values.pop("tokens"))
            save_shard(shard_path(work, s), ShardValues(**values))
            written += 1
            if kill_after and written >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
    if device_name.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    bar.close()
    result = RefsResult(
        out_dir=str(out), rows=num_rows, tokens=tokens, seconds=seconds,
        tokens_per_second=tokens / seconds if seconds > 0 else 0.0, non_finite_rows=0,
        shards_total=len(shards), shards_resumed=len(mine) - len(todo), layout=layout,
        device=device_name, dtype=dtype_name, rank=rank, merged=rank == 0,
    )
    if world_size > 1:
        _wait_for_all(work, len(shards), rank)
    if rank != 0:
        return result

    merged = merge_shards(work, len(shards), num_rows)
    non_finite = ~(np.isfinite(merged.chosen) & np.isfinite(merged.rejected))
    result.non_finite_rows = int(non_finite.sum())
    new = _with_ref_columns(dataset, merged, non_finite)
    _swap_dataset(out, new)

    manifest = read_manifest(out)  # fresh copy: keep every key other stages wrote
    manifest["refs"] = {
        "model": {"path": str(model_dir.resolve()), **fingerprint},
        "settings": {"device": device_name, "dtype": dtype_name, "batch_tokens": batch_tokens, "layout": layout,
                     "world_size": world_size, "settings_hash": settings_hash},
        "tokenizer_fingerprint_checked": tok_fp,
        "computed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": num_rows,
        "non_finite_rows": result.non_finite_rows,
        "columns": list(REF_COLUMNS),
    }
    write_manifest(out, manifest)
    shutil.rmtree(out / WORK_DIR, ignore_errors=True)
    return result


def _compute_shard(net: Any, batches: list[list[int]], ids: dict[str, Any], layout: str, pad_token_id: int,
                   bar: Any) -> dict[str, Any]:
    """Reference log-probs for every pair in the shard's batches."""
    import pyarrow as pa

    from prefdata.model.logprobs import sequence_logps
    from prefdata.tokenize.masks import build_pair_batch

    rows, chosen, rejected, chosen_count, rejected_count = [], [], [], [], []
    tokens = 0
    for batch_rows in batches:
        take = pa.array(batch_rows, type=pa.int64())
        prompts = ids["prompt_ids"].take(take).to_pylist()
        chosens = ids["chosen_ids"].take(take).to_pylist()
        rejecteds = ids["rejected_ids"].take(take).to_pylist()
        batch = build_pair_batch(prompts, chosens, rejecteds, layout, pad_token_id)
        logps, counts = sequence_logps(net, batch)
        n = len(batch_rows)
        logps, counts = logps.cpu().numpy(), counts.cpu().numpy()
        rows.append(np.asarray(batch_rows, dtype=np.int64))
        chosen.append(logps[:n])
        rejected.append(logps[n:])
        chosen_count.append(counts[:n])
        rejected_count.append(counts[n:])
        real = batch.num_tokens
        tokens += real
        bar.update(real)
    return {
        "rows": np.concatenate(rows), "chosen": np.concatenate(chosen).astype(np.float32),
        "rejected": np.concatenate(rejected).astype(np.float32),
        "chosen_count": np.concatenate(chosen_count).astype(np.int64),
        "rejected_count": np.concatenate(rejected_count).astype(np.int64), "tokens": tokens,
    }


def _init_process_group() -> None:
    """Gloo is enough: ranks only meet at one barrier before rank 0 merges the shard files."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        dist.init_process_group(backend="gloo", timeout=timedelta(hours=24))


def _wait_for_all(work: Path, num_shards: int, rank: int, timeout_s: float = 24 * 3600) -> None:
    """Under torchrun: a barrier when torch.distributed is up; else rank 0 waits for the shard files
    (other ranks just leave)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        return
    if rank != 0:
        return
    deadline = time.monotonic() + timeout_s
    while not all(shard_path(work, s).is_file() for s in range(num_shards)):
        if time.monotonic() > deadline:
            raise PrefdataError(f"timed out waiting for other ranks' refs shards in {work}")
        time.sleep(2.0)


def _with_ref_columns(dataset: Any, values: ShardValues, non_finite: np.ndarray) -> Any:
    """The dataset with (re)computed ref columns and the non-finite flag set exactly where due;
    every other column keeps its place and content."""
    from datasets import List, Value

    old = [c for c in REF_COLUMNS if c in dataset.column_names]
    if old:
        dataset = dataset.remove_columns(old)
    order = list(dataset.column_names)
    if "flags" in order:
        flags = dataset.data.table.column("flags").to_pylist()
        dataset = dataset.remove_columns("flags")
    else:
        flags = [[] for _ in range(len(dataset))]
        order.append("flags")
    new_flags = []
    for row_flags, bad in zip(flags, non_finite.tolist()):
        kept = [f for f in (row_flags or []) if f != F.NON_FINITE_REF_LOGPS]
        new_flags.append(kept + [F.NON_FINITE_REF_LOGPS] if bad else kept)
    dataset = dataset.add_column("flags", new_flags, feature=List(Value("string")))
    dataset = dataset.add_column("ref_chosen_logps", values.chosen, feature=Value("float32"))
    dataset = dataset.add_column("ref_rejected_logps", values.rejected, feature=Value("float32"))
    dataset = dataset.add_column("chosen_token_count", values.chosen_count, feature=Value("int64"))
    dataset = dataset.add_column("rejected_token_count", values.rejected_count, feature=Value("int64"))
    return dataset.select_columns(order + list(REF_COLUMNS))
