"""`prefdata refs --engine ray`: reference log-probs with one Ray actor per GPU (or CPU worker).

Each actor loads the model once and runs `compute_refs` as rank r of k: the same length-sorted
batches under the token budget, the same shards (rank r takes shards r, r+k, ...), each saved to
OUT/.refs-work/ as it completes. Rank 0 waits for every shard file, merges, and swaps the new
dataset in, exactly as under torchrun. OUT must therefore be on storage every node sees (NFS, a
shared volume): that is also where the shards live, so a run resumes by shard.

A worker that dies (OOM, a lost node, a preempted GPU) is restarted by Ray and its call retried
(`max_restarts`); the retried call resumes from the shards already saved, so finished work is kept
and the failed shard is computed again, not lost. The actors are the Ray engine's ranks
(prefdata.engine.ray `RayEngine.run_ranks`): placement, restarts and one-line errors live there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from prefdata.engine.ray import RayEngine
from prefdata.io.manifest import require_pairs
from prefdata.refs import KILL_AFTER_SHARDS_ENV, WORK_DIR, RefsResult
from prefdata.settings.commands import RefsSettings
from prefdata.settings.declare import settings_command

# Test hook: the rank-1 actor SIGKILLs itself after its first new shard, once (this marker file
# records that it did), to show that Ray restarts it and the retried call resumes.
KILL_ONCE_ENV = "PREFDATA_RAY_REFS_KILL_ONCE"


class RefsWorker:
    """One reference-model worker: `run` computes this rank's shards (and, on rank 0, merges)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def run(self, out_dir: str, model: str, settings: dict[str, Any]) -> RefsResult:
        from prefdata.refs import compute_refs

        marker = os.environ.get(KILL_ONCE_ENV)
        os.environ.pop(KILL_AFTER_SHARDS_ENV, None)
        if marker and self.rank == 1 and not os.path.exists(marker):
            Path(marker).touch()
            os.environ[KILL_AFTER_SHARDS_ENV] = "1"
        return compute_refs(out_dir, model, rank=self.rank, world_size=self.world_size, **settings)


@settings_command(RefsSettings, positional=("model",))  # settings=RefsSettings(...) or flat keywords
def compute_refs_on_ray(
    out_dir: str | Path,
    settings: RefsSettings,
    *,
    ray_address: str | None = None,
    workers: int | None = None,
    max_restarts: int = 2,
) -> RefsResult:
    """`compute_refs` across a Ray cluster: `workers` actors (default one per GPU, else one per CPU).

    Every actor must be placed at once (rank 0 waits for the others' shards), so `workers` may not
    exceed the cluster's GPUs (or CPUs without GPUs). The other settings are `compute_refs`'s
    (`prefdata.settings.commands.RefsSettings`); the actors run without progress bars."""
    s = settings
    out = Path(out_dir)
    require_pairs(out, "refs")  # before any actor starts or anything is written
    engine = RayEngine(ray_address)
    use_gpu = engine.cluster_gpus() > 0 and s.device != "cpu"
    ranks = engine.rank_slots(workers, use_gpu)
    if not s.resume:  # here, before any rank starts: a rank must never delete shards another has saved
        shutil.rmtree(out / WORK_DIR, ignore_errors=True)

    env = {KILL_ONCE_ENV: os.environ[KILL_ONCE_ENV]} if os.environ.get(KILL_ONCE_ENV) else None
    per_rank = {
        "device": s.device if s.device != "auto" else ("cuda" if use_gpu else "cpu"),
        "dtype": s.dtype, "batch_tokens": s.batch_tokens, "resume": True, "progress": False,
        "trust_remote_code": s.trust_remote_code, "recompute": s.recompute, "layout": s.layout,
        "shard_batches": s.shard_batches, "processor": s.processor,
    }
    results: list[RefsResult] = engine.run_ranks(RefsWorker, ranks, (str(out), str(s.model), per_rank), use_gpu=use_gpu,
                                                 max_restarts=max_restarts, env=env, what="refs")
    merged = results[0]
    merged.tokens = sum(r.tokens for r in results)
    merged.seconds = max(r.seconds for r in results)
    merged.tokens_per_second = merged.tokens / merged.seconds if merged.seconds > 0 else 0.0
    return merged

