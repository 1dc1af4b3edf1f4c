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
                  bar: Any, vision: Any = None) -> dict[str, Any]:
    """Reference log-probs for every pair in the shard's batches (over the answer tokens only when
    `ids` holds loss starts; with the images of `ids["images"]` through `vision` for image pairs)."""
    import pyarrow as pa

    from prefdata.core.schema import LOSS_MASK_COLUMNS, LOSS_START_COLUMNS
    from prefdata.model.pairs import pair_logps

    rows, chosen, rejected, chosen_count, rejected_count, chosen_public, rejected_public = [], [], [], [], [], [], []
    tokens = shared = 0
    for batch_rows in batches:
        take = pa.array(batch_rows, type=pa.int64())
        prompts = ids["prompt_ids"].take(take).to_pylist()
        chosens = ids["chosen_ids"].take(take).to_pylist()
        rejecteds = ids["rejected_ids"].take(take).to_pylist()
        # `--loss-on answer`: sum (and count) only the tokens after each half's reasoning block.
        starts = [ids[name].take(take).to_pylist() if name in ids else None for name in LOSS_START_COLUMNS]
        # Agent trajectories: only the model's turns (mask 1) are summed and counted.
        masks = [ids[name].take(take).to_pylist() if name in ids else None for name in LOSS_MASK_COLUMNS]
        images = ids["images"].take(take).to_pylist() if vision is not None and "images" in ids else None
        pixels = (images, vision) if vision is not None else None
        out = pair_logps(net, prompts, chosens, rejecteds, layout, pad_token_id, *starts, public=True, pixels=pixels,
                         chosen_loss_masks=masks[0], rejected_loss_masks=masks[1])
        rows.append(np.asarray(batch_rows, dtype=np.int64))
        chosen.append(out.chosen.float().cpu().numpy())
        rejected.append(out.rejected.float().cpu().numpy())
        chosen_count.append(out.chosen_counts.cpu().numpy())
        rejected_count.append(out.rejected_counts.cpu().numpy())
        chosen_public.append(out.chosen_public.float().cpu().numpy())
        rejected_public.append(out.rejected_public.float().cpu().numpy())
        tokens += out.tokens
        shared += out.shared_pairs
        bar.update(out.tokens)  # as the summary counts: a shared prompt once
    return {
        "rows": np.concatenate(rows), "chosen": np.concatenate(chosen).astype(np.float32),
        "rejected": np.concatenate(rejected).astype(np.float32),
        "chosen_count": np.concatenate(chosen_count).astype(np.int64),
        "rejected_count": np.concatenate(rejected_count).astype(np.int64),
        "chosen_public": np.concatenate(chosen_public).astype(np.float32),
        "rejected_public": np.concatenate(rejected_public).astype(np.float32), "tokens": tokens, "shared": shared,
    }


def batch_costs(net: Any, layout: str, lens: dict[str, np.ndarray]) -> tuple[list[int], bool, int]:
    """prefdata.model.pairs.batch_costs, imported when called: importing prefdata.refs loads no torch."""
    from prefdata.model.pairs import batch_costs as costs

    return costs(net, layout, lens)


def compute_shards(net: Any, shards: list[list[list[int]]], todo: list[int], work: Path, ids: dict[str, Any],
                   layout: str, pad_token_id: int, bar: Any, vision: Any = None) -> tuple[int, int]:
    """Compute and save each shard in `todo`; returns the tokens forwarded and the shared pairs."""
    import torch

    kill_after = int(os.environ.get(KILL_AFTER_SHARDS_ENV, "0") or 0)
    tokens = shared = 0
    written = 0
    with torch.inference_mode():
        for s in todo:
            values = compute_shard(net, shards[s], ids, layout, pad_token_id, bar, vision)
            tokens += int(values.pop("tokens"))
            shared += int(values.pop("shared"))
            save_shard(shard_path(work, s), ShardValues(**values))
            written += 1
            if kill_after and written >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
    return tokens, shared
