"""Huge texts tokenized a piece at a time, with the ids the whole text would get.

One call of the Rust tokenizer holds ~200 bytes per character of its text while it works (its
normalized string with per-byte alignments, a token string and offsets per token): a 10 MB reasoning
trace took 2 GB, and 3 GB with offsets. A text of HUGE_TEXT_CHARS or more is therefore cut into
pieces of about PIECE_CHARS, each encoded on its own (every piece after the first behind the anchor
special token, so it is tokenized as in the middle of a text, then the anchor's id dropped), and its
ids gathered in an array('i'): 4 bytes a token where a Python list costs ~36. Measured on a 10 MB
trace (9.1 M tokens, tiny tokenizer): 45 MB above base instead of 2,004 MB, and twice as fast.

A cut is made only where the tokenization has a token boundary: at a whitespace character between
two non-whitespace ones, confirmed by tokenizing CUT_WINDOW_CHARS on each side of it both joined
and apart (the same argument as `prompt_boundary_mismatch`'s window: the window's artificial edges
affect both sides alike, so only the cut itself can make them differ). Exact unless one pre-token
longer than the window straddles the cut. A text with no confirmed cut (no whitespace, or a
tokenizer that merges across it) is encoded whole, as before.
"""

from __future__ import annotations

import re
from array import array
from typing import Any, Iterator, Sequence

PIECE_CHARS = 1 << 16  # 64 Ki characters: ~13 MB of tokenizer working memory per piece
HUGE_TEXT_CHARS = 4 * PIECE_CHARS  # below this a text goes into the batched call as before (<= 50 MB)
CUT_WINDOW_CHARS = 256
_CUT_TRIES = 16  # candidate cuts tried near each target before moving a piece length on

# A whitespace character with non-whitespace on both sides: where pre-tokenizers split (GPT-2 style
# regexes put the space in front of the next word; Metaspace splits before its '▁').
_CANDIDATE = re.compile(r"(?<=\S)\s(?=\S)")


def encode_ids(backend: Any, texts: Sequence[str], anchor: str) -> list[Sequence[int]]:
    """Ids of each text, `add_special_tokens=False`: ordinary texts in one batched call (lists),
    huge ones a piece at a time (array('i')). `backend` is the Rust tokenizer; `anchor` a special
    token that encodes to one id and splits the text ('' when the tokenizer has none)."""
    huge = [i for i, text in enumerate(texts) if len(text) >= HUGE_TEXT_CHARS]
    if not huge:
        return [e.ids for e in backend.encode_batch_fast(list(texts), add_special_tokens=False)]
    ids: list[Sequence[int] | None] = [None] * len(texts)
    small = [i for i, text in enumerate(texts) if len(text) < HUGE_TEXT_CHARS]
    for i, encoding in zip(small, backend.encode_batch_fast([texts[i] for i in small], add_special_tokens=False)):
        ids[i] = encoding.ids
    for i in huge:
        ids[i] = encode_huge(backend, texts[i], anchor)
    return ids  # type: ignore[return-value]


def encode_huge(backend: Any, text: str, anchor: str) -> array:
    """The ids of one huge text, encoded piece by piece (see the module doc)."""
    ids = array("i")
    for start, end in piece_bounds(backend, text, anchor):
        ids.extend(_encode_piece(backend, text[start:end], anchor if start else ""))
    return ids


def count_tokens_before(backend: Any, text: str, anchor: str, position: int, skip: int) -> int:
    """How many tokens of `text` start before character `position`, not counting the first `skip`
    tokens (a leading anchor): what `--loss-on answer` needs of a huge completion, without offsets
    for the whole text (only the piece holding `position` is encoded with them)."""
    count = -skip
    for start, end in piece_bounds(backend, text, anchor):
        lead = anchor if start else ""
        if end <= position:
            count += len(_encode_piece(backend, text[start:end], lead))
            continue
        offsets = backend.encode_batch([lead + text[start:end]], add_special_tokens=False)[0].offsets
        if lead:
            offsets = offsets[1:]
        count += sum(1 for begin, _ in offsets if start + begin - len(lead) < position)
        break
    return max(count, 0)


def piece_bounds(backend: Any, text: str, anchor: str) -> Iterator[tuple[int, int]]:
    """[start, end) of each piece of `text`, cut at confirmed token boundaries about PIECE_CHARS apart."""
    start = 0
    target = PIECE_CHARS
    while target < len(text) - CUT_WINDOW_CHARS:
        cut = _confirmed_cut(backend, text, anchor, target)
        if cut is None:
            target += PIECE_CHARS  # no boundary near here: a longer piece
            continue
        yield start, cut
        start, target = cut, cut + PIECE_CHARS
    yield start, len(text)


def _confirmed_cut(backend: Any, text: str, anchor: str, target: int) -> int | None:
    """The first candidate cut from `target` on whose window tokenizes the same joined and apart."""
    limit = min(len(text) - CUT_WINDOW_CHARS, target + PIECE_CHARS)
    for tries, match in enumerate(_CANDIDATE.finditer(text, target, limit)):
        if tries >= _CUT_TRIES:
            break
        cut = match.start()
        left = text[cut - CUT_WINDOW_CHARS : cut]
        right = text[cut : cut + CUT_WINDOW_CHARS]
        joined, alone_left, alone_right = (
            e.ids[1:] if anchor else e.ids
            for e in backend.encode_batch_fast([anchor + left + right, anchor + left, anchor + right],
                                               add_special_tokens=False)
        )
        if joined == alone_left + alone_right:
            return cut
    return None


def _encode_piece(backend: Any, piece: str, anchor: str) -> list[int]:
    """A piece's ids; behind `anchor` (its id then dropped) when the piece is not the text's start."""
    ids = backend.encode_batch_fast([anchor + piece], add_special_tokens=False)[0].ids
    return ids[1:] if anchor else ids
