"""What a model can take of OUT's pairs: token ids inside its embedding, sequences inside its positions.

`refs` and `train` read OUTs that others hand over: an id past the embedding ends in an IndexError deep
in the forward (or a device-side assert on GPU), and a 10^6-token pair asks the attention for a
terabyte. Both are refused here in one line naming the pair, before any forward.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from prefdata.core.errors import PrefdataError

# The longest sequence accepted from a model whose config states no position limit: past it one
# pair's forward (its attention mask alone is length² entries) outgrows any accelerator.
DEFAULT_MAX_LENGTH = 131_072
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def position_limit(model: Any) -> int | None:
    """The longest sequence the model's config says it takes (a vision-language model's text config
    included), stretched by its RoPE scaling where that extends it (YaRN keeps max_position_embeddings
    at the original length), or None when it states none."""
    config = getattr(model, "config", None)
    for part in (config, getattr(config, "text_config", None)):
        for key in _POSITION_KEYS:
            value = getattr(part, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return max(value, _scaled_length(part, value))
    return None


def _scaled_length(config: Any, length: int) -> int:
    """The length RoPE scaling reaches: original length x factor (0 without scaling)."""
    scaling = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    if not isinstance(scaling, dict) or not isinstance(scaling.get("factor"), (int, float)):
        return 0
    original = scaling.get("original_max_position_embeddings")
    base = original if isinstance(original, int) and original > 0 else length
    return int(base * max(float(scaling["factor"]), 1.0))


def embedding_rows(model: Any) -> int | None:
    """How many token ids the model's input embedding holds (None when it has no plain one)."""
    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    rows = getattr(embedding, "num_embeddings", None)
    return int(rows) if isinstance(rows, int) else None


def check_pairs_fit_model(model: Any, ids: dict[str, Any], where: Callable[[int], str]) -> None:
    """PrefdataError (one line naming the first pair, by `where(row)`) when a pair holds a token id the
    model's embedding does not, or a half longer than the model's positions take. `ids`: the three id
    columns (Arrow list arrays, one entry per dataset row)."""
    import pyarrow.compute as pc

    vocabulary = embedding_rows(model)
    if vocabulary is not None:
        for name in ("prompt_ids", "chosen_ids", "rejected_ids"):
            found = _first_id_at_least(ids[name], vocabulary)
            if found is not None:
                row, token = found
                raise PrefdataError(
                    f"the pair at {where(row)} holds token id {token} in {name}, outside the model's embedding of "
                    f"{vocabulary} ids: prepare the data with this model's tokenizer")
    limit = position_limit(model) or DEFAULT_MAX_LENGTH
    lengths = {name: pc.list_value_length(ids[name]).to_numpy(zero_copy_only=False).astype(np.int64)
               for name in ("prompt_ids", "chosen_ids", "rejected_ids")}
    # Each half runs as prompt + completion (a shared prompt keeps its positions for both halves).
    longest = lengths["prompt_ids"] + np.maximum(lengths["chosen_ids"], lengths["rejected_ids"])
    if len(longest) and int(longest.max()) > limit:
        row = int(np.argmax(longest > limit))
        source = "its config's position limit" if position_limit(model) else "prefdata's limit for a model with none"
        raise PrefdataError(
            f"the pair at {where(row)} is {int(longest[row]):,} tokens long (prompt + completion), "
            f"beyond the {limit:,} the model takes ({source}): prepare it again with --max-length")


def _first_id_at_least(column: Any, bound: int) -> tuple[int, int] | None:
    """(row, id) of the first id >= `bound` in a list column, chunk by chunk (a memory-mapped column is
    never copied whole), or None."""
    import pyarrow.compute as pc

    first_row = 0
    for chunk in getattr(column, "chunks", [column]):
        flat = pc.list_flatten(chunk)
        if len(flat) and pc.max(flat).as_py() >= bound:
            position = int(np.argmax(pc.greater_equal(flat, bound).to_numpy(zero_copy_only=False)))
            row = int(pc.list_parent_indices(chunk).to_numpy(zero_copy_only=False)[position])
            return first_row + row, int(flat[position].as_py())
        first_row += len(chunk)
    return None


def source_of(table: Any) -> Callable[[int], str]:
    """`file:line` of a row of OUT's Arrow table, for errors that name a pair (`row N` without source
    columns)."""
    if not {"source_file", "source_line"} <= set(table.column_names):
        return lambda row: f"row {row}"
    files, lines = table.column("source_file"), table.column("source_line")
    return lambda row: f"{files[row].as_py()}:{lines[row].as_py()}"
