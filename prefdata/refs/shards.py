"""Resumable units of refs work: batches grouped into shards, each saved atomically to
OUT/.refs-work/, split across ranks and merged back into per-row arrays."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from prefdata.core.errors import PrefdataError

SHARD_BATCHES = 8  # batches per resumable shard: small enough to lose little work on a kill


@dataclass
class ShardValues:
    rows: np.ndarray  # int64 row indices into the dataset
    chosen: np.ndarray  # float32 ref_chosen_logps
    rejected: np.ndarray  # float32 ref_rejected_logps
    chosen_count: np.ndarray  # int64
    rejected_count: np.ndarray  # int64
    chosen_public: np.ndarray  # float32 ref_chosen_public_logps (LD-DPO's public length)
    rejected_public: np.ndarray  # float32 ref_rejected_public_logps



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
        missing = [name for name in ShardValues.__dataclass_fields__ if name not in data]
        if missing:  # written by an older prefdata: recompute rather than mix
            raise PrefdataError(f"refs shard {path} lacks {', '.join(missing)}; delete {path.parent} and rerun")
        return ShardValues(**{name: data[name] for name in ShardValues.__dataclass_fields__})


def shard_path(work: Path, shard: int) -> Path:
    return work / f"shard-{shard:06d}.npz"


def merge_shards(work: Path, num_shards: int, num_rows: int) -> ShardValues:
    """All shards into per-row arrays; refuses when a shard is missing or a row is not covered."""
    chosen = np.full(num_rows, np.nan, dtype=np.float32)
    rejected = np.full(num_rows, np.nan, dtype=np.float32)
    chosen_count = np.zeros(num_rows, dtype=np.int64)
    rejected_count = np.zeros(num_rows, dtype=np.int64)
    chosen_public = np.full(num_rows, np.nan, dtype=np.float32)
    rejected_public = np.full(num_rows, np.nan, dtype=np.float32)
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
        chosen_public[part.rows] = part.chosen_public
        rejected_public[part.rows] = part.rejected_public
        seen[part.rows] = True
    if not seen.all():
        raise PrefdataError(f"refs shards in {work} do not cover {int((~seen).sum())} rows; delete {work} and rerun")
    return ShardValues(np.arange(num_rows, dtype=np.int64), chosen, rejected, chosen_count, rejected_count,
                       chosen_public, rejected_public)



def init_process_group() -> None:
    """Gloo is enough: ranks only meet at one barrier before rank 0 merges the shard files."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        dist.init_process_group(backend="gloo", timeout=timedelta(hours=24))


def wait_for_all(work: Path, num_shards: int, rank: int, timeout_s: float = 24 * 3600) -> None:
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
