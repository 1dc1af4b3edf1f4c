"""Preference rows in two shapes, built from the UltraFeedback sample in ../shared/assets:

- ``uf``: UltraFeedback-style, short prompts and long answers (the rows as they are);
- ``hh``: HH-RLHF-style multi-turn transcripts: each prompt carries earlier Human/Assistant turns
  (taken from other rows), so prompts are long and the two answers short, as in Anthropic HH.

Deterministic: row i of ``hh`` always takes the same turns.
"""

from __future__ import annotations

import json
from pathlib import Path

UF_SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "assets" / "data" / "ultrafeedback-sample" / "train.jsonl"
DATA_STYLES = ("uf", "hh")


def _text(value) -> str:
    return value if isinstance(value, str) else value[-1]["content"]


def _words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


def style_rows(style: str, pairs: int, source: Path = UF_SAMPLE) -> list[dict[str, str]]:
    """`pairs` rows with explicit `prompt`, `chosen`, `rejected` strings in the given style."""
    if style not in DATA_STYLES:
        raise ValueError(f"unknown data style {style!r} (one of {', '.join(DATA_STYLES)})")
    rows = [json.loads(line) for line in source.open(encoding="utf-8") if line.strip()]
    if style == "uf":
        return [{"prompt": _text(r["prompt"]), "chosen": _text(r["chosen"]), "rejected": _text(r["rejected"])}
                for r in rows[:pairs]]
    out = []
    for i in range(pairs):
        earlier = [rows[(i + k) % len(rows)] for k in (101, 202, 303)]  # three earlier turns from other rows
        transcript = "".join(
            f"\n\nHuman: {_words(_text(t['prompt']), 30)}\n\nAssistant: {_words(_text(t['chosen']), 45)}" for t in earlier
        )
        row = rows[i]
        out.append({
            "prompt": f"{transcript}\n\nHuman: {_words(_text(row['prompt']), 30)}\n\nAssistant:",
            "chosen": " " + _words(_text(row["chosen"]), 20),
            "rejected": " " + _words(_text(row["rejected"]), 20),
        })
    return out
