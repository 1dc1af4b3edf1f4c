"""Chosen/rejected similarity with a time bound: no single pair can make a check slow.

The measure is the normalized Indel similarity, 1 - edits / (len a + len b) (rapidfuzz
`fuzz.ratio` / 100), on strings or token id sequences. Its cost grows with the product of the two
lengths, and the installed rapidfuzz does not stop early on the length difference even with a
score cutoff (a 6 MB / 5 MB pair took 149 s). So:

- Before any quadratic work, the lengths alone give an upper bound, 1 - |la - lb| / (la + lb)
  (at least |la - lb| insertions or deletions are needed); below the threshold there is nothing
  more to compute.
- Up to EXACT_LIMIT elements (characters or ids) in the two halves together the ratio is exact.
- Beyond it the measure is token-level: each half becomes its sequence of words (split on ASCII
  whitespace) or ids, and the similarity is the Dice overlap of the two multisets of SHINGLE-token
  windows, 2 |A & B| / (|A| + |B|). An edit touches at most SHINGLE windows, so near-copies stay near
  1 and unrelated texts (even over the same vocabulary) near 0; the cost is a few vectorized passes
  and one sort, O(n log n), never a product of the lengths. The result never exceeds the length
  bound. Reports name the rows measured this way (`BOUNDED_METHOD`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rapidfuzz.distance import Indel

EXACT_LIMIT = 65_536  # characters/ids in both halves together compared exactly (~0.1 s worst case)
SHINGLE = 4  # tokens per window of the bounded method
BOUNDED_METHOD = f"overlap of {SHINGLE}-word windows (Dice)"  # beyond EXACT_LIMIT


def length_bound(la: int, lb: int) -> float:
    """Upper bound on the Indel similarity of sequences of lengths la and lb (1.0 when both are empty)."""
    total = la + lb
    return 1.0 if total == 0 else 1.0 - abs(la - lb) / total


def is_bounded(la: int, lb: int) -> bool:
    """Whether halves of these lengths are measured by the bounded (token-window) method."""
    return la + lb > EXACT_LIMIT


def similarity(a: str | Sequence[int], b: str | Sequence[int]) -> float:
    """Normalized Indel similarity in [0, 1]: exact up to EXACT_LIMIT, token windows beyond (module doc)."""
    if not is_bounded(len(a), len(b)):
        return Indel.normalized_similarity(a, b)
    return min(_shingle_similarity(a, b), length_bound(len(a), len(b)))


def at_least(a: str | Sequence[int], b: str | Sequence[int], threshold: float) -> bool:
    """similarity(a, b) >= threshold, doing quadratic work only when the lengths allow it."""
    if length_bound(len(a), len(b)) < threshold:
        return False
    if not is_bounded(len(a), len(b)):
        return Indel.normalized_similarity(a, b, score_cutoff=threshold) >= threshold
    return similarity(a, b) >= threshold


# Wrapping uint64 arithmetic throughout: these are hashes, overflow is the point.
_WINDOW_WEIGHTS = [np.uint64(w) for w in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5)]
_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")] = True
# Tabulation hashing: one fixed random 64-bit value per (position in word mod 64, byte).
_TABLE = np.random.default_rng(20261123).integers(0, 1 << 64, size=64 * 256, dtype=np.uint64)


# Bytes hashed per step: the array operations below hold ~50 bytes per byte of text at once, so a
# 10 MB reasoning trace would cost ~500 MB in one step; in 1 MiB pieces cut at whitespace it is ~50 MB.
_HASH_PIECE = 1 << 20


def _word_hashes(text: str) -> np.ndarray:
    """A 64-bit hash per whitespace-separated word, the same in every process and run, computed
    with array operations over the bytes (no Python loop over words), a piece at a time."""
    data = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    if len(data) <= _HASH_PIECE:
        return _piece_hashes(data)
    pieces: list[np.ndarray] = []
    start = 0
    while start < len(data):
        end = min(start + _HASH_PIECE, len(data))
        if end < len(data):  # end the piece at a whitespace byte, so no word is split
            spaces = np.flatnonzero(_SPACE[data[end : end + _HASH_PIECE]])
            end = end + int(spaces[0]) if len(spaces) else min(end + _HASH_PIECE, len(data))
        pieces.append(_piece_hashes(data[start:end]))
        start = end
    return np.concatenate(pieces)


def _piece_hashes(data: np.ndarray) -> np.ndarray:
    inside = np.concatenate(([False], ~_SPACE[data], [False]))
    edges = np.flatnonzero(inside[1:] != inside[:-1])
    starts, lengths = edges[0::2], edges[1::2] - edges[0::2]
    if len(starts) == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets = np.cumsum(lengths) - lengths  # where each word's bytes begin among the word bytes
    word_bytes = np.flatnonzero(inside[1:-1])
    position = word_bytes - np.repeat(starts, lengths)
    values = _TABLE[((position & 63) << 8) | data[word_bytes]]
    with np.errstate(over="ignore"):
        return np.add.reduceat(values, offsets) ^ lengths.astype(np.uint64)


def _token_hashes(half: str | Sequence[int]) -> np.ndarray:
    if isinstance(half, str):
        return _word_hashes(half)
    with np.errstate(over="ignore"):
        return (np.asarray(half, dtype=np.int64).astype(np.uint64) + np.uint64(1)) * _WINDOW_WEIGHTS[0]


def _shingles(tokens: np.ndarray) -> np.ndarray:
    """Sorted hashes of every SHINGLE-token window (the whole sequence when it is shorter)."""
    count = max(1, len(tokens) - SHINGLE + 1) if len(tokens) else 0
    out = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for offset, weight in enumerate(_WINDOW_WEIGHTS[:SHINGLE]):
            part = tokens[offset : offset + count]
            out[: len(part)] += (part ^ (part >> np.uint64(29))) * weight
    out.sort()
    return out


def _multiset_overlap(a: np.ndarray, b: np.ndarray) -> int:
    """|A & B| for sorted multisets: per common value, the smaller count."""
    ua, ca = np.unique(a, return_counts=True)
    ub, cb = np.unique(b, return_counts=True)
    _common, ia, ib = np.intersect1d(ua, ub, assume_unique=True, return_indices=True)
    return int(np.minimum(ca[ia], cb[ib]).sum())


def _shingle_similarity(a: str | Sequence[int], b: str | Sequence[int]) -> float:
    sa, sb = _shingles(_token_hashes(a)), _shingles(_token_hashes(b))
    if len(sa) + len(sb) == 0:  # whitespace only on both sides: nothing to tell them apart
        return 1.0
    return 2 * _multiset_overlap(sa, sb) / (len(sa) + len(sb))
