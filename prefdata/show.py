"""`prefdata show OUT --row N`: one prepared row with its loss masks made visible.

Masks come from prefdata.tokenize.masks (the module refs and train use), so what `show` prints is what the
loss sees: tokens inside ⟦ ⟧ count toward the loss, the rest (prompt) does not.
"""

from __future__ import annotations

from pathlib import Path

from prefdata.errors import PrefdataError
from prefdata.io.manifest import require_pairs

LOSS_OPEN, LOSS_CLOSE = "⟦", "⟧"


def _load_row(out_dir: Path, row: int | None, line: int | None) -> tuple[int, dict]:
    from datasets import load_from_disk

    try:
        dataset = load_from_disk(str(out_dir))
    except (FileNotFoundError, ValueError) as exc:
        raise PrefdataError(f"{out_dir} is not a prepared dataset: {exc}") from None
    if line is not None:
        matches = [i for i, value in enumerate(dataset["source_line"]) if value == line]
        if not matches:
            raise PrefdataError(f"no kept row comes from source line {line} (see dropped.jsonl / quarantine.jsonl)")
        row = matches[0]
    row = 0 if row is None else row
    if not 0 <= row < len(dataset):
        raise PrefdataError(f"--row {row} is out of range: the dataset has {len(dataset)} rows")
    return row, dataset[row]


def _render_tokens(tokenizer, ids: list[int], mask: list[int]) -> str:
    pieces = []
    inside = False
    for token_id, in_loss in zip(ids, mask):
        text = tokenizer.decode([token_id]) if tokenizer is not None else f"<{token_id}>"
        if in_loss and not inside:
            pieces.append(LOSS_OPEN)
        elif not in_loss and inside:
            pieces.append(LOSS_CLOSE)
        inside = bool(in_loss)
        pieces.append(text)
    if inside:
        pieces.append(LOSS_CLOSE)
    return "".join(pieces)


def show_row(out_dir: str | Path, *, row: int | None = None, line: int | None = None) -> str:
    """Text showing a row's source, flags, and both halves with their loss-masked tokens marked."""
    from prefdata.tokenize.masks import build_pair_batch, sequence_masks

    out_path = Path(out_dir)
    manifest = require_pairs(out_path, "show")  # unfinished or pair-less OUT: one line saying which
    index, record = _load_row(out_path, row, line)
    tokenizer = None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(manifest["tokenizer"]["path"])
    except Exception:  # the tokenizer may have moved; ids are still shown
        tokenizer = None
    pad = int(manifest.get("tokenizer", {}).get("pad_token_id") or 0)
    prompt, chosen, rejected = record["prompt_ids"], record["chosen_ids"], record["rejected_ids"]
    batch = build_pair_batch([prompt], [chosen], [rejected], "right", pad)
    chosen_mask, rejected_mask = sequence_masks(batch)
    lines = [
        f"row {index}  ({record['source_file']}:{record['source_line']})",
        f"flags: {', '.join(record['flags']) or '(none)'}",
        f"tokens: prompt {len(prompt)}, chosen {len(chosen)} (loss {sum(chosen_mask)}), "
        f"rejected {len(rejected)} (loss {sum(rejected_mask)})",
        "",
    ]
    for name, ids, mask in (("chosen", prompt + chosen, chosen_mask), ("rejected", prompt + rejected, rejected_mask)):
        lines.append(f"--- {name} (loss tokens inside {LOSS_OPEN} {LOSS_CLOSE}) ---")
        lines.append(_render_tokens(tokenizer, ids, mask))
        lines.append("")
    for key in ("ref_chosen_logps", "ref_rejected_logps"):
        if key in record:
            lines.append(f"{key}: {record[key]:.4f}")
    return "\n".join(lines).rstrip() + "\n"
