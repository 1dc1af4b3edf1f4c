"""`prefdata show OUT --row N`: one prepared row with its loss masks made visible.

Masks come from prefdata.tokenize.masks (the module refs and train use), so what `show` prints is
what the loss sees: tokens inside ⟦ ⟧ count toward the loss, the rest (prompt) does not. Each span
is decoded as a whole, in context, so the text is byte-exact (see `decode_spans`). An image row
lists its images and shows each run of image tokens as `<image>×N` (adjacent images make one run,
as the model sees them).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.io.manifest import require_pairs
from prefdata.settings.commands import ShowSettings
from prefdata.settings.declare import takes_settings

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


def _mask_runs(mask: list[int]) -> list[tuple[int, int, bool]]:
    """(start, end, in_loss) for each run of equal mask values."""
    runs: list[tuple[int, int, bool]] = []
    for i, value in enumerate(mask):
        if runs and runs[-1][2] == bool(value):
            runs[-1] = (runs[-1][0], i + 1, bool(value))
        else:
            runs.append((i, i + 1, bool(value)))
    return runs


def decode_spans(tokenizer: Any, ids: list[int], cuts: list[int]) -> list[str]:
    """The text of ids[cuts[i]:cuts[i+1]] for each span, cut out of the decoded whole.

    Decoding a span alone is wrong twice over: SentencePiece drops the space that starts the span's
    first word, and a character whose bytes straddle two tokens (CJK, emoji under byte fallback or
    byte-level BPE) decodes to U+FFFD. So the whole is decoded once, and each cut is placed where
    the decoded prefix ids[:cut] stops agreeing with it; a straddling character goes to the later
    span. The spans join to exactly `decode(ids)`."""
    def decode(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    whole = decode(ids)
    places = [0]
    for cut in cuts[1:-1]:
        prefix = decode(ids[:cut])
        agree = len(os.path.commonprefix([prefix, whole]))
        places.append(max(places[-1], agree))
    places.append(len(whole))
    return [whole[a:b] for a, b in zip(places, places[1:])]


def _render_tokens(tokenizer: Any, ids: list[int], mask: list[int]) -> str:
    """The sequence with the loss spans inside ⟦ ⟧, each span decoded in context (`decode_spans`)."""
    runs = _mask_runs(mask[: len(ids)])
    if tokenizer is not None:
        texts = decode_spans(tokenizer, ids, [start for start, _end, _loss in runs] + [len(ids)])
    else:  # the tokenizer moved: show the ids
        texts = ["".join(f"<{t}>" for t in ids[start:end]) for start, end, _loss in runs]
    return "".join(f"{LOSS_OPEN}{text}{LOSS_CLOSE}" if in_loss else text for text, (_s, _e, in_loss) in zip(texts, runs))


def _collapse_image_runs(text: str, image_token: str | None) -> str:
    """An image's run of N image tokens as `<image>×N`: hundreds of placeholders bury the text."""
    if not image_token:
        return text
    return re.sub(f"(?:{re.escape(image_token)}){{2,}}", lambda m: f"{image_token}×{len(m.group(0)) // len(image_token)}", text)


def _image_line(images: Any) -> str | None:
    """`images: 2 (48x32, 640x480 px)` for an image row; None for a text row."""
    if not images:
        return None
    sizes = [f"{image.width}x{image.height}" if hasattr(image, "width") else "?" for image in images]
    return f"images: {len(images)} ({', '.join(sizes)} px)"


def _load_tokenizer(path: str | None) -> Any:
    """OUT's tokenizer, quietly (no transformers warnings in the view); None when it cannot be loaded."""
    if not path:
        return None
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        return None
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(path)
    except Exception:  # the tokenizer may have moved; ids are still shown
        return None
    finally:
        hf_logging.set_verbosity(before)


@takes_settings(ShowSettings)  # or settings=ShowSettings(...): prefdata.settings
def show_row(out_dir: str | Path, *, row: int | None = None, line: int | None = None) -> str:
    """Text showing a row's source, flags, and both halves with their loss-masked tokens marked."""
    from prefdata.tokenize.masks import build_pair_batch, sequence_masks

    out_path = Path(out_dir)
    manifest = require_pairs(out_path, "show")  # unfinished or pair-less OUT: one line saying which
    index, record = _load_row(out_path, row, line)
    tokenizer = _load_tokenizer((manifest.get("tokenizer") or {}).get("path"))
    pad = int(manifest.get("tokenizer", {}).get("pad_token_id") or 0)
    prompt, chosen, rejected = record["prompt_ids"], record["chosen_ids"], record["rejected_ids"]
    # --loss-on answer: the reasoning stays outside the brackets, as refs and train score it; so do the
    # turns a completion's loss mask keeps out (tool results, user turns): only trained spans are bracketed.
    starts = [record.get("chosen_loss_start")], [record.get("rejected_loss_start")]
    batch = build_pair_batch([prompt], [chosen], [rejected], "right", pad,
                             *(s if s[0] is not None else None for s in starts),
                             [record.get("chosen_loss_mask")], [record.get("rejected_loss_mask")])
    chosen_mask, rejected_mask = sequence_masks(batch)
    lines = [
        f"row {index}  ({record['source_file']}:{record['source_line']})",
        f"flags: {', '.join(record['flags']) or '(none)'}",
        f"tokens: prompt {len(prompt)}, chosen {len(chosen)} (loss {sum(chosen_mask)}), "
        f"rejected {len(rejected)} (loss {sum(rejected_mask)})",
    ]
    image_line = _image_line(record.get("images"))
    lines += [image_line, ""] if image_line else [""]
    image_token = (manifest.get("processor") or {}).get("image_token")
    for name, ids, mask in (("chosen", prompt + chosen, chosen_mask), ("rejected", prompt + rejected, rejected_mask)):
        lines.append(f"--- {name} (loss tokens inside {LOSS_OPEN} {LOSS_CLOSE}) ---")
        lines.append(_collapse_image_runs(_render_tokens(tokenizer, ids, mask), image_token))
        lines.append("")
    for key in ("ref_chosen_logps", "ref_rejected_logps"):
        if key in record:
            lines.append(f"{key}: {record[key]:.4f}")
    return "\n".join(lines).rstrip() + "\n"
