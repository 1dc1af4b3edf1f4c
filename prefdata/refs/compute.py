"""The forward passes of `refs`: reference log-probs for every pair of a shard's batches."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np

from prefdata.refs.shards import ShardValues, save_shard, shard_path

# Test hook: SIGKILL this process right after it has written this many new shards (kill -9 test).
KILL_AFTER_SHARDS_ENV = "PREFDATA_REFS_KILL_AFTER_SHARDS"


def compute_shard(net: Any, batches: list[list[int]], ids: dict[str, Any], layout: str, pad_token_id: int,
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


def compute_shards(net: Any, shards: list[list[list[int]]], todo: list[int], work: Path, ids: dict[str, Any],
                   layout: str, pad_token_id: int, bar: Any) -> int:
    """Compute and save each shard in `todo`; returns the real tokens forwarded."""
    import torch

    kill_after = int(os.environ.get(KILL_AFTER_SHARDS_ENV, "0") or 0)
    tokens = 0
    written = 0
    with torch.inference_mode():
        for s in todo:
            values = compute_shard(net, shards[s], ids, layout, pad_token_id, bar)
            tokens += int(values.pop("tokens"))
            save_shard(shard_path(work, s), ShardValues(**values))
            written += 1
            if kill_after and written >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
    return tokens
