"""How a checked row is stored in OUT/: its dataset row, its dropped.jsonl and quarantine.jsonl
lines, and its digest for the manifest's content hash.

Shared by the main process (the local write path) and the workers that write their own shards
(prefdata.pipeline.shards), so both store the same row the same way.
"""

from __future__ import annotations

import json
from array import array
from typing import Any

import xxhash

from prefdata.core.records import CheckedRow

# Output columns prefdata owns; a pass-through column with one of these names is kept as raw_<name>.
_RESERVED = frozenset(
    {"prompt", "chosen", "rejected", "prompt_ids", "chosen_ids", "rejected_ids", "flags", "source_file", "source_line"}
    | {"ref_chosen_logps", "ref_rejected_logps", "chosen_token_count", "rejected_token_count"}
    | {"ref_chosen_public_logps", "ref_rejected_public_logps"}
    | {"prompt_messages", "chosen_messages", "rejected_messages", "tools"}
    | {"chosen_loss_start", "rejected_loss_start"}
    | {"chosen_loss_mask", "rejected_loss_mask"}
)


def output_row(row: CheckedRow) -> dict[str, Any]:
    pair, tokenized = row.pair, row.tokenized
    assert pair is not None and tokenized is not None
    # Conversational rows keep TRL's message format, so TRL itself renders their chat template;
    # the writer handles datasets that mix them with string rows.
    conversational = pair.is_conversational and pair.prompt_messages is not None
    out: dict[str, Any] = {
        "prompt": pair.prompt_messages if conversational else pair.prompt,
        "chosen": pair.chosen_messages if conversational else pair.chosen,
        "rejected": pair.rejected_messages if conversational else pair.rejected,
        "prompt_ids": tokenized.prompt_ids,
        "chosen_ids": tokenized.chosen_ids,
        "rejected_ids": tokenized.rejected_ids,
        "flags": row.flags,
        "source_file": row.raw.source_file,
        "source_line": row.raw.source_line,
    }
    if pair.tools:  # JSON text, as TRL's DPOTrainer reads a `tools` column (one Arrow type for every row)
        out["tools"] = json.dumps(pair.tools, ensure_ascii=False)
    if tokenized.chosen_loss_start is not None:  # --loss-on answer
        out["chosen_loss_start"] = tokenized.chosen_loss_start
        out["rejected_loss_start"] = tokenized.rejected_loss_start
    if tokenized.chosen_loss_mask is not None:  # a completion holds turns the model did not write
        out["chosen_loss_mask"] = tokenized.chosen_loss_mask
        out["rejected_loss_mask"] = tokenized.rejected_loss_mask
    if pair.image_data is not None:  # image pairs: the checked images themselves, as datasets.Image stores them
        out["images"] = [{"bytes": image.data, "path": image.name} for image in pair.image_data]
    for key, value in pair.extra.items():
        out[f"raw_{key}" if key in _RESERVED else key] = value
    return out


def dropped_record(row: CheckedRow) -> dict[str, Any]:
    if row.outcome == "unpaired":
        return unpaired_record(row)
    pair = row.pair
    assert pair is not None
    record: dict[str, Any] = {
        "source_file": row.raw.source_file,
        "source_line": row.raw.source_line,
        "flags": row.flags,
        "severity": row.severity,
        "prompt": pair.prompt,
        "chosen": pair.chosen,
        "rejected": pair.rejected,
    }
    if pair.benchmark_match is not None and "benchmark_overlap" in row.flags:  # which benchmark item, and where
        record["benchmark_overlap"] = pair.benchmark_match.record()
    if pair.extra:
        record["extra"] = pair.extra
    return record


def unpaired_record(row: CheckedRow) -> dict[str, Any]:
    """The dropped.jsonl line of a record of scored completions that made no pair: its reason
    (`unpaired`: single_completion, ties, below_margin or too_many_pairs, with `detail` for the
    last), its group id, and what it held."""
    scored = row.scored
    assert scored is not None
    return {
        "source_file": row.raw.source_file,
        "source_line": row.raw.source_line,
        "flags": [],
        "severity": None,
        "unpaired": scored.reason,
        **({"detail": scored.detail} if scored.detail else {}),
        "group_id": scored.group_id,
        "prompt": scored.prompt,
        "completions": scored.completion_texts,
        "scores" if scored.scale == "score" else "ranks": scored.scores,
    }


def quarantine_record(row: CheckedRow) -> dict[str, Any]:
    raw = row.raw.raw_text
    if raw is None and row.raw.value is not None:
        raw = json.dumps(row.raw.value, ensure_ascii=False, default=str)
    return {"source_file": row.raw.source_file, "source_line": row.raw.source_line, "error": row.error, "raw": raw}


_ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
_TEXT_COLUMNS = ("prompt", "chosen", "rejected")


def row_digest(row: dict[str, Any]) -> bytes:
    """A digest of one output row that does not depend on batching (for the manifest's content hash).

    Id lists are hashed as raw int32 bytes and the three texts as length-prefixed UTF-8: JSON-encoding
    them cost more than everything else in this loop. The remaining (small) fields go in as JSON."""
    digest = xxhash.xxh3_128()  # not a security boundary: a fast, well-mixed 128-bit digest
    for key in _ID_COLUMNS:
        ids = row[key]
        if not (isinstance(ids, array) and ids.typecode == "i"):  # workers send array('i') already
            ids = array("i", ids)
        digest.update(len(ids).to_bytes(8, "little"))
        digest.update(ids)
    for key in _TEXT_COLUMNS:
        text = row[key] if type(row[key]) is str else json.dumps(row[key], ensure_ascii=False)  # messages
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    images = row.get("images") if "images" in row else None
    if images and type(images[0]) is dict and "bytes" in images[0]:  # image pairs: their bytes, not JSON of them
        for image in images:
            digest.update(len(image["bytes"]).to_bytes(8, "little"))
            digest.update(image["bytes"])
        row = {**row, "images": [image["path"] for image in images]}
    rest = {k: v for k, v in row.items() if k not in _ID_COLUMNS and k not in _TEXT_COLUMNS}
    digest.update(_REST_JSON.encode(rest).encode("utf-8", "surrogatepass"))
    return digest.digest()


# What json.dumps(rest, sort_keys=True, ensure_ascii=False, default=str) builds on every call, made once.
_REST_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str)
