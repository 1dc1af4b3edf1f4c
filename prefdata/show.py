"""`prefdata show OUT --row N`: one prepared row with its loss masks made visible.

Masks come from prefdata.tokenize.masks (the module refs and train use), so what `show` prints is
what the loss sees: tokens inside ⟦ ⟧ count toward the loss, the rest (prompt) does not. Each span
is decoded as a whole, in context, so the text is byte-exact (see `decode_spans`). An image row
lists its images and shows each run of image tokens as `<image>×N` (adjacent images make one run,
as the model sees them).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.io.manifest import require_pairs
from prefdata.io.out_paths import out_file
from prefdata.settings.commands import ShowSettings
from prefdata.settings.declare import settings_command

LOSS_OPEN, LOSS_CLOSE = "⟦", "⟧"


def _load_row(out_dir: Path, row: int | None, line: int | str | None) -> tuple[int, dict, str]:
    """(row index, record, a note on the other rows from the same source line or "")."""
    from prefdata.io.out_dir import load_out_dataset

    dataset = load_out_dataset(out_dir, "show")  # its files checked: nothing read from outside OUT
    note = ""
    if line is not None:
        file, number = _parse_line(line)
        places = dataset.select_columns(["source_file", "source_line"])
        matches = [(i, f) for i, (f, n) in enumerate(zip(places["source_file"], places["source_line"]))
                   if n == number and (file is None or _same_file(f, file))]
        if not matches:
            raise PrefdataError(_not_kept(out_dir, file, number))
        files = sorted({f for _i, f in matches})
        if len(files) > 1:  # a directory input: line N of each file is another row
            raise PrefdataError(f"source line {number} is in {len(files)} input files ({', '.join(f'{f}:{number}' for f in files)}): "
                                f"pass one as --line FILE:{number}")
        row = matches[0][0]
        if len(matches) > 1:  # a record of scored completions makes several pairs
            note = f"; this line made {len(matches)} pairs: rows {', '.join(str(i) for i, _f in matches)}"
    row = 0 if row is None else row
    if not 0 <= row < len(dataset):
        raise PrefdataError(f"--row {row} is out of range: the dataset has {len(dataset)} rows")
    return row, dataset[row], note


def _parse_line(line: int | str) -> tuple[str | None, int]:
    """(file or None, line number) of `--line N` or `--line FILE:N`."""
    if isinstance(line, int):
        return None, line
    head, colon, tail = str(line).strip().rpartition(":")
    if not tail.isdigit() or (colon and not head):
        raise PrefdataError(f"--line expects a source line N or FILE:N (as reports print it), got {line!r}")
    return (head or None), int(tail)


def _same_file(stored: str, given: str) -> bool:
    """Whether `given` names the stored source_file: equal, or one ends with the other at a path
    separator (`explicit.jsonl` for `data/explicit.jsonl`, and the other way round)."""
    a, b = Path(stored).as_posix(), Path(given).as_posix()
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


def _not_kept(out_dir: Path, file: str | None, number: int) -> str:
    """Why no kept row comes from the line: dropped (with its flags) or quarantined, when OUT says so."""
    where = f"{file}:{number}" if file else f"source line {number}"
    for name, what in (("dropped.jsonl", "flags"), ("quarantine.jsonl", "error")):
        path = out_file(out_dir, name)  # never a symlink, never outside OUT
        if not path.is_file():
            continue
        with open(path, encoding="utf-8") as handle:
            for text in handle:
                try:
                    entry = json.loads(text)
                except ValueError:
                    continue
                if not isinstance(entry, dict):  # a tampered line: not one prefdata wrote
                    continue
                if entry.get("source_line") == number and (file is None or _same_file(str(entry.get("source_file")), file)):
                    why = ", ".join(entry.get("flags") or []) if what == "flags" else entry.get("error")
                    verb = "was dropped" if what == "flags" else "was quarantined"
                    return f"no kept row comes from {where}: {entry.get('source_file')}:{number} {verb} ({why}; see {path})"
    return f"no kept row comes from {where} (see dropped.jsonl / quarantine.jsonl)"


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


def _tokenizer_place(recorded: str, out_dir: Path) -> str:
    """Where the recorded tokenizer is from here. A path is recorded absolute since issue 40; an older
    OUT recorded it as typed, relative to the directory prepare ran in, which is usually OUT's parent
    or one above it. Not found there: the recorded value, as a Hub id (looked up in the local cache)."""
    path = Path(recorded).expanduser()
    if path.is_absolute() or path.exists():
        return str(path)
    for base in Path(out_dir).resolve().parents:
        if (base / path).exists():
            return str(base / path)
    return recorded


def _load_tokenizer(recorded: str | None, out_dir: Path) -> tuple[Any, str]:
    """OUT's tokenizer, quietly (no transformers warnings, no network: a Hub id comes from the local
    cache), and "" ; or None and one line saying why the ids are shown instead."""
    if not recorded:
        return None, "OUT's manifest records no tokenizer: token ids are shown"
    place = _tokenizer_place(recorded, out_dir)
    why = (f"tokenizer {recorded} (from {Path(out_dir) / 'manifest.json'}) is not found from here "
           "(nor in the Hub cache): token ids are shown")
    try:
        from transformers.utils import logging as hf_logging

        from prefdata.core.tokenizer_cache import load_pretrained_tokenizer
    except ImportError:
        return None, "transformers is not installed: token ids are shown"
    if not Path(place).exists() and not _looks_like_hub_id(place):
        return None, why
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Through prefdata's loader: a directory that states its tokenizer class loads without torch.
            return load_pretrained_tokenizer(place, read_only=True, local_files_only=True), ""
    except Exception:  # the tokenizer moved, or a Hub id never downloaded here; ids are still shown
        return None, why
    finally:
        hf_logging.set_verbosity(before)


def _looks_like_hub_id(text: str) -> bool:
    """`name` or `org/name`, as the Hub spells repository ids (not `./x`, `../x`, `a/b/c`)."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", text) is not None and ".." not in text


@settings_command(ShowSettings)  # settings=ShowSettings(...) or flat keywords: prefdata.settings
def show_row(out_dir: str | Path, settings: ShowSettings) -> str:
    """Text showing a row's source, flags, and both halves with their loss-masked tokens marked.
    `line`: a source line N, or `FILE:N` as reports print it (needed when several input files have
    a line N)."""
    from prefdata.tokenize.masks import build_pair_batch, sequence_masks

    out_path = Path(out_dir)
    manifest = require_pairs(out_path, "show")  # unfinished or pair-less OUT: one line saying which
    index, record, note = _load_row(out_path, settings.row, settings.line)
    tokenizer, missing = _load_tokenizer((manifest.get("tokenizer") or {}).get("path"), out_path)
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
        f"row {index}  ({record['source_file']}:{record['source_line']}{note})",
        f"flags: {', '.join(record['flags']) or '(none)'}",
        f"tokens: prompt {len(prompt)}, chosen {len(chosen)} (loss {sum(chosen_mask)}), "
        f"rejected {len(rejected)} (loss {sum(rejected_mask)})",
    ]
    if missing:
        lines.append(missing)
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
