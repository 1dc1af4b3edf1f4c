"""The on-policy signal's model pass: each half's mean per-token log-prob under a given policy.

It runs the same pair forward as `prefdata refs` and `train` (prefdata.model.pairs.pair_logps: one
forward per pair, the prompt shared where the model runs block attention, else packed or padded;
length-sorted batches under a token budget), over the same tokens they score (`--loss-on answer`
starts and per-token loss masks included), so the signal measures what the loss will see. WPO (arXiv 2406.11827) weighs a pair
by exp(mean log-prob of chosen) * exp(mean log-prob of rejected); `on_policy` is the log of that
product's square root, the mean of the two means, so its order is WPO's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from prefdata.core.errors import PrefdataError

DEFAULT_BATCH_TOKENS = 16384


def _load_policy(model: str | Path, expected_fingerprint: str | None, device: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefdata.io.manifest import tokenizer_fingerprint

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        net = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise PrefdataError(f"cannot load the policy from {model}: {str(exc).splitlines()[0]}") from None
    if expected_fingerprint is not None and tokenizer_fingerprint(tokenizer) != expected_fingerprint:
        raise PrefdataError(f"the tokenizer of {model} differs from the one OUT was prepared with: the on_policy "
                            "signal needs the policy OUT's ids were made for")
    target = "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    return net.to(target).eval(), tokenizer


def mean_token_logps(table: Any, model: str | Path, *, tokenizer_fingerprint: str | None, pad_token_id: int,
                     device: str = "auto", batch_tokens: int = DEFAULT_BATCH_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rejected) mean per-token log-probs under `model` for every row of `table` (NaN where a
    half has no scored token)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import torch

    from prefdata.core.schema import LOSS_MASK_COLUMNS, LOSS_START_COLUMNS
    from prefdata.model.bounds import check_pairs_fit_model, source_of
    from prefdata.model.pairs import choose_layout, pair_logps, plan_pair_batches

    if "images" in table.column_names:
        raise PrefdataError("the on_policy signal is not built for image OUTs yet")
    net, _ = _load_policy(model, tokenizer_fingerprint, device)
    check_pairs_fit_model(net, {name: table.column(name) for name in ("prompt_ids", "chosen_ids", "rejected_ids")},
                          source_of(table))  # as refs and train: one line naming the pair, no IndexError
    layout = choose_layout(net, "auto")
    lens = {name: pc.list_value_length(table.column(name)).to_numpy(zero_copy_only=False)
            for name in ("prompt_ids", "chosen_ids", "rejected_ids")}
    batches, _ = plan_pair_batches(net, layout, lens, batch_tokens)
    chosen, rejected = np.full(table.num_rows, np.nan), np.full(table.num_rows, np.nan)
    has_starts = all(name in table.column_names for name in LOSS_START_COLUMNS)
    has_masks = all(name in table.column_names for name in LOSS_MASK_COLUMNS)  # model turns only, as refs sums
    with torch.inference_mode():
        for rows in batches:
            take = pa.array(rows, type=pa.int64())
            ids = [table.column(name).take(take).to_pylist() for name in ("prompt_ids", "chosen_ids", "rejected_ids")]
            starts = [table.column(name).take(take).to_pylist() for name in LOSS_START_COLUMNS] if has_starts else []
            masks = {f"{half}_loss_masks": table.column(f"{half}_loss_mask").take(take).to_pylist()
                     for half in ("chosen", "rejected")} if has_masks else {}
            out = pair_logps(net, *ids, layout, pad_token_id, *starts, **masks)
            halves = ((chosen, out.chosen, out.chosen_counts), (rejected, out.rejected, out.rejected_counts))
            for target, sums, counts in halves:
                counts_f = counts.float().cpu().numpy()
                with np.errstate(divide="ignore", invalid="ignore"):
                    target[rows] = np.where(counts_f > 0, sums.float().cpu().numpy() / counts_f, np.nan)
    return chosen, rejected

