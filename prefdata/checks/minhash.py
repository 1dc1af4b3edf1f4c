"""Near-duplicate prompts across a large dataset: MinHash signatures (the banding and the groups:
prefdata.checks.partitioned).

Similarity is the Jaccard index of the sets of word 3-grams of two prompts (lower-cased; a "word" is a
run of ASCII letters/digits or non-ASCII bytes, so punctuation and whitespace do not matter).
Prompts with fewer than three words use one shingle made of the words they have.

Per batch, everything is numpy over the whole batch -- no per-prompt Python work beyond `lower()`:
1. word hashes: one polynomial hash per word from a prefix-power table over the batch's UTF-8 bytes;
2. shingles: adjacent word hashes combined and mixed (splitmix64);
3. signatures: one-permutation hashing (each shingle hash picks one of `num_perm` bins by its top
   bits and offers its low 32 bits to that bin's minimum, `np.minimum.at`), then rotation
   densification fills empty bins. Only 8 bits of each minimum are kept (b-bit MinHash): 64 bytes
   per distinct prompt.
The groups band the signatures (16 bands of 4 bytes = one uint32 per band), find the prompts that
collide in a band, verify each candidate pair on the full signature, and join verified pairs into
connected components.

Accuracy with the defaults (64 permutations, 16 bands): a pair at Jaccard 0.8 collides in some band
with probability > 0.999 and passes verification (estimate >= threshold - 1.5 sigma) ~93% of the
time; more similar pairs almost always. Pairs at Jaccard <= 0.6 are accepted ~2% of the time.

Exact duplicates (the same prompt string) are folded first: only the first row of each distinct
prompt is hashed and can appear in a cluster (prompts differing only in case, whitespace or
punctuation have Jaccard 1 and do cluster); exact duplicate prompts are counted by the
dataset-wide checks. Results depend only on input order, never on batch size; every hash is a fixed
function (no random seed to carry).
"""

from __future__ import annotations

import math

import numpy as np
import xxhash

_xxh = xxhash.xxh3_64_intdigest

_U64 = np.uint64
_MIX1, _MIX2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_POLY = 0x100000001B3  # odd, so it has an inverse mod 2^64
_POLY_INV = pow(_POLY, -1, 1 << 64)

# Bytes that belong to words (after lower()): ASCII letters and digits, and every non-ASCII byte.
_WORD_BYTE = np.zeros(256, dtype=bool)
_WORD_BYTE[ord("a") : ord("z") + 1] = True
_WORD_BYTE[ord("0") : ord("9") + 1] = True
_WORD_BYTE[0x80:] = True
_WORD_TABLE = _WORD_BYTE.astype(np.uint8).tobytes()  # bytes.translate table: 1 on word bytes


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, vectorized (uint64 arithmetic wraps, as intended)."""
    z = (z ^ (z >> _U64(30))) * _MIX1
    z = (z ^ (z >> _U64(27))) * _MIX2
    return z ^ (z >> _U64(31))


class _Powers:
    """P^k and P^-k mod 2^64 for k < n, grown on demand (one cumprod per doubling).

    One pair of tables per process, shared by every finder and thread: `tables` is replaced in one
    assignment, so a reader never sees a forward table without its matching inverse."""

    def __init__(self) -> None:
        self.tables = (np.ones(0, dtype=_U64), np.ones(0, dtype=_U64))

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        tables = self.tables
        if n <= tables[0].size:
            return tables
        size = max(n, 2 * tables[0].size, 1 << 16)
        self.tables = tables = (_power_table(_POLY, size), _power_table(_POLY_INV, size))
        return tables


def _power_table(base: int, size: int) -> np.ndarray:
    table = np.full(size, base, dtype=_U64)
    table[0] = 1
    return np.cumprod(table, dtype=_U64)


def accept_threshold(threshold: float, num_perm: int) -> float:
    """The estimate a verified pair needs: 1.5 standard deviations of the estimate below `threshold`."""
    return threshold - 1.5 * math.sqrt(threshold * (1 - threshold) / num_perm)


def jaccard_estimate(matches: np.ndarray) -> np.ndarray:
    """Jaccard estimates from the share of equal signature bytes (b-bit MinHash: unrelated minima
    agree in their low 8 bits 1/256 of the time)."""
    return (matches - 1 / 256) / (1 - 1 / 256)


def prompt_digest(prompt: str) -> int:
    """The exact-duplicate key of a prompt (its raw text): only the first row of each is hashed."""
    return _xxh(prompt.encode("utf-8", "surrogatepass"))


_POWERS = _Powers()  # per process: worker processes compute signatures too
SLICE_CHARS = 1 << 16  # characters of prompt text hashed per array pass (see prompt_signatures)


def prompt_signatures(texts: list[str], num_perm: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(mask of texts with at least one word, uint8 signatures of those texts) for lower-cased texts.

    A text's signature depends on that text alone, never on the batch it is computed in, so batches
    may be hashed anywhere (another thread or process) and merged later. Hashed a slice of about
    SLICE_CHARS at a time: the work arrays take ~50 bytes per byte of text, and the power tables
    (16 bytes per byte, kept for the process) grow to the largest slice."""
    if len(texts) > 1 and sum(map(len, texts)) > SLICE_CHARS:
        slices, start, size = [], 0, 0
        for end, text in enumerate(texts):
            size += len(text) + 1
            if size > SLICE_CHARS or end == len(texts) - 1:
                slices.append(_signatures_of_slice(texts[start : end + 1], num_perm))
                start, size = end + 1, 0
        return np.concatenate([m for m, _ in slices]), np.concatenate([sig for _, sig in slices])
    return _signatures_of_slice(texts, num_perm)


def _signatures_of_slice(texts: list[str], num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    bin_bits = num_perm.bit_length() - 1
    joined = "\n".join(texts)
    encoded = joined.encode("utf-8", "surrogatepass")
    data = np.frombuffer(encoded, dtype=np.uint8)
    # Text boundaries in bytes: each text is followed by one "\n" (never part of a word).
    byte_lens = np.fromiter((len(t.encode("utf-8", "surrogatepass")) for t in texts), np.int64, len(texts)) \
        if not joined.isascii() else np.fromiter(map(len, texts), np.int64, len(texts))
    text_start = np.concatenate(([0], np.cumsum(byte_lens + 1)[:-1]))

    # 1 on word bytes, 0 elsewhere, with a non-word byte on either side: edges are word bounds.
    marks = np.frombuffer(b"\0".join((b"", encoded, b"")).translate(_WORD_TABLE), dtype=np.int8)
    edges = np.flatnonzero(np.diff(marks))  # alternately a word's start and its end
    word_start, word_end = edges[0::2], edges[1::2]
    n_texts = len(texts)
    if word_start.size == 0:
        return np.zeros(n_texts, dtype=bool), np.zeros((0, num_perm), dtype=np.uint8)

    # Word hash = sum over its bytes of byte * P^(k - start): prefix sums of byte * P^k, shifted
    # back by P^-start. All uint64 arithmetic wraps mod 2^64.
    fwd, inv = _POWERS.get(data.size + 1)
    with np.errstate(over="ignore"):
        # Non-word bytes need no masking: a word's range [start, end) holds only word bytes.
        prefix = np.empty(data.size + 1, dtype=_U64)
        prefix[0] = 0
        np.multiply(data, fwd[: data.size], out=prefix[1:], dtype=_U64)
        np.cumsum(prefix[1:], out=prefix[1:])
        words = _mix((prefix[word_end] - prefix[word_start]) * inv[word_start])
    del prefix

    doc = np.searchsorted(text_start, word_start, side="right") - 1
    counts = np.bincount(doc, minlength=n_texts)
    has_words = counts > 0
    n = words.size
    nxt1 = np.zeros(n, dtype=_U64)
    nxt2 = np.zeros(n, dtype=_U64)
    same1 = doc[1:] == doc[:-1]
    nxt1[:-1] = np.where(same1, words[1:], 0)
    same2 = doc[2:] == doc[:-2]
    nxt2[:-2] = np.where(same2, words[2:], 0)
    first_word = np.concatenate(([0], np.cumsum(counts)[:-1]))
    valid = np.zeros(n, dtype=bool)
    valid[:-2] = same2  # a full 3-gram starts here
    short = has_words & (counts < 3)
    valid[first_word[short]] = True  # one shingle of all the words of a short prompt
    with np.errstate(over="ignore"):
        # Word hashes are already mixed: an order-sensitive combination and one more mix suffice.
        shingles = _mix(words * _U64(0x9E3779B97F4A7C15) + ((nxt1 << _U64(17)) | (nxt1 >> _U64(47))) + nxt2 * _U64(0xD6E8FEB86659FD93))
    shingles = shingles[valid]
    shingle_doc = doc[valid]

    # One-permutation hashing: the top bits of a shingle's hash pick one of num_perm bins, the
    # low 32 bits are its value, each bin keeps its minimum. O(shingles), not O(shingles x perms).
    compact = np.cumsum(has_words) - 1  # text index -> signature row
    n_docs = int(has_words.sum())
    k = num_perm
    bins = (shingles >> _U64(64 - bin_bits)).astype(np.int64)
    cell = compact[shingle_doc] * k + bins
    values = (shingles & _U64(0xFFFFFFFF)).astype(np.uint32)
    mins = np.full(n_docs * k, 0xFFFFFFFF, dtype=np.uint32)
    np.minimum.at(mins, cell, values)
    filled = np.zeros(n_docs * k, dtype=bool)
    filled[cell] = True
    mins = mins.reshape(n_docs, k)
    filled = filled.reshape(n_docs, k)
    _densify(mins, filled)
    return has_words, (mins & np.uint32(0xFF)).astype(np.uint8)


def _densify(mins: np.ndarray, filled: np.ndarray) -> None:
    """Rotation densification (Shrivastava & Li 2014): an empty bin takes the value of the next
    filled bin to its right (circularly), plus an offset per hop so borrowed values differ from
    their source. The rule depends only on which bins are filled, so two prompts with equal
    shingle sets still get equal signatures. Vectorized over the rows, one column at a time."""
    if filled.all():
        return
    n, k = mins.shape
    filled_t = np.ascontiguousarray(filled.T)
    # Right to left: the nearest filled column at or after each one, counting past the end into
    # the next turn (every row has a filled bin: its first one, one turn later, starts the scan).
    nearest = (np.argmax(filled, axis=1) + k).astype(np.uint8)
    next_filled = np.empty((k, n), dtype=np.uint8)
    for column in range(k - 1, -1, -1):
        np.copyto(nearest, np.uint8(column), where=filled_t[column])
        next_filled[column] = nearest
    empty = np.flatnonzero(~filled_t.ravel())  # (column, row) cells to fill, column-major
    column, row = np.divmod(empty, n)
    source = next_filled.ravel()[empty]
    hops = (source - column).astype(np.uint32)
    borrowed = mins[row, source & np.uint8(k - 1)] ^ (hops * np.uint32(0x9E3779B1))
    # Non-linear mix: with a plain offset, two sparse prompts whose few values agree mod 256
    # would agree in every borrowed bin too (the stored 8 bits are the low bits).
    borrowed *= np.uint32(0x85EBCA6B)
    borrowed ^= borrowed >> np.uint32(13)
    borrowed *= np.uint32(0xC2B2AE35)
    borrowed ^= borrowed >> np.uint32(16)
    mins[row, column] = borrowed
