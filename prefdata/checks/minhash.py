"""Near-duplicate prompts across a large dataset: MinHash signatures + LSH banding, streaming.

Similarity is the Jaccard index of the sets of word 3-grams of two prompts (lower-cased; a "word" is a
run of ASCII letters/digits or non-ASCII bytes, so punctuation and whitespace do not matter).
Prompts with fewer than three words use one shingle made of the words they have.

Per batch, everything is numpy over the whole batch -- no per-prompt Python work beyond `lower()`:
1. word hashes: one polynomial hash per word from a prefix-power table over the batch's UTF-8 bytes;
2. shingles: adjacent word hashes combined and mixed (splitmix64);
3. signatures: one-permutation hashing (each shingle hash picks one of `num_perm` bins by its top
   bits and offers its low 32 bits to that bin's minimum, `np.minimum.at`), then rotation
   densification fills empty bins. Only 8 bits of each minimum are kept (b-bit MinHash): 64 bytes
   per distinct prompt, the only state that grows with the data besides its row id (4 bytes) and
   the exact duplicate set (8 bytes per distinct prompt, `digest_table.U64Table`).
`clusters()` bands the signatures (16 bands of 4 bytes = one uint32 per band), sorts each band
column to find collisions, verifies each candidate pair on the full signature, and joins verified
pairs into connected components.

Accuracy with the defaults (64 permutations, 16 bands): a pair at Jaccard 0.8 collides in some band
with probability > 0.999 and passes verification (estimate >= threshold - 1.5 sigma) ~93% of the
time; more similar pairs almost always. Pairs at Jaccard <= 0.6 are accepted ~2% of the time.

Exact duplicates (the same prompt string) are folded first: only the first row of each distinct
prompt is hashed and can appear in a cluster (prompts differing only in case, whitespace or
punctuation have Jaccard 1 and do cluster); exact duplicate prompts are reported
by `checks.dataset.DatasetWideChecks`. Results depend only on input order, never on batch size; every hash is a fixed function (no random seed to carry).
"""

from __future__ import annotations

import math
import mmap
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Sequence

import numpy as np
import xxhash

from prefdata.checks.dataset import U64Table

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


class NearDuplicatePrompts:
    """Streaming near-duplicate prompt finder (see the module doc)."""

    def __init__(
        self, threshold: float = 0.8, *, num_perm: int = 64, bands: int = 16, background: bool = True
    ) -> None:
        if num_perm % bands or (num_perm // bands) != 4:
            raise ValueError("num_perm must be 4 * bands (one uint32 per band)")
        if not 0.0 < threshold <= 1.0:
            raise ValueError("threshold must be in (0, 1]")
        self.threshold = threshold
        self.num_perm = num_perm
        self.bands = bands
        if num_perm & (num_perm - 1):
            raise ValueError("num_perm must be a power of two")
        # Accept a verified pair down to 1.5 standard deviations of the 64-sample estimate below the
        # threshold, so pairs right at the threshold are found ~93% of the time.
        self._accept = accept_threshold(threshold, num_perm)
        self._exact = U64Table(values=False)  # raw-prompt digests seen (a set: 8 B each)
        self._signatures_of = _Rows((num_perm,), np.uint8)  # of the distinct prompts with words
        self._ids = _Rows((), np.uint32)  # their row ids (int64 once one does not fit)
        self.prompts_seen = 0
        self.distinct_prompts = 0
        self._pending: deque[Future[None]] = deque()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="minhash") if background else None

    def __del__(self) -> None:
        if getattr(self, "_executor", None) is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def nbytes(self) -> int:
        """Bytes held by the signature and exact-duplicate tables."""
        self._drain()
        return self._exact.nbytes + self._signatures_of.nbytes + self._ids.nbytes

    def add_batch(self, row_ids: Sequence[int], prompts: Sequence[str]) -> None:
        """Add prompts with the row ids that `clusters()` will report for them.

        With `background=True` the batch is hashed on one worker thread (numpy releases the GIL, so
        this overlaps with the caller's own per-row checks); batches are still processed strictly in
        order, so results are identical. At most two batches wait, which keeps memory flat.
        """
        if len(row_ids) != len(prompts):
            raise ValueError("row_ids and prompts differ in length")
        if self._executor is None:
            self._add_batch(row_ids, prompts)
            return
        while len(self._pending) >= 2:
            self._pending.popleft().result()  # re-raises a worker error here
        self._pending.append(self._executor.submit(self._add_batch, list(row_ids), list(prompts)))

    def _drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def _add_batch(self, row_ids: Sequence[int], prompts: Sequence[str]) -> None:
        self.prompts_seen += len(prompts)
        new_ids: list[int] = []
        new_texts: list[str] = []
        setdefault = self._exact.setdefault
        for row_id, prompt in zip(row_ids, prompts):
            # Raw-text digest: cheap, and whitespace/case variants still meet at Jaccard 1 below.
            if setdefault(_xxh(prompt.encode("utf-8", "surrogatepass")), row_id) is None:
                new_ids.append(row_id)
                new_texts.append(prompt.lower())
        if not new_texts:
            return
        self.distinct_prompts += len(new_texts)
        has_words, signatures = self._signatures(new_texts)
        self._signatures_of.append(signatures)
        self._append_ids(np.asarray(new_ids, dtype=np.int64)[has_words])

    def add_signatures(
        self,
        row_ids: np.ndarray,
        digests: np.ndarray,
        signature_rows: np.ndarray,
        signatures: np.ndarray,
        first: np.ndarray | None = None,
    ) -> None:
        """`add_batch` for prompts already hashed elsewhere (e.g. in worker processes), in input order.

        `digests[i]` is `prompt_digest` of prompt i; `signature_rows[i]` its row in `signatures`
        (from `prompt_signatures` of the lower-cased prompt), or -1 when it has no word or is not
        the first of its digest in this batch (a later copy needs no signature); `first`:
        `checks.dataset.first_occurrences(digests)`, when known. Same state as `add_batch` with
        the same prompts."""
        self._drain()
        self.prompts_seen += len(row_ids)
        new = ~self._exact.setdefault_many(digests, row_ids, first)
        if not new.any():
            return
        self.distinct_prompts += int(new.sum())
        rows = signature_rows[new]
        signed = rows >= 0
        self._signatures_of.append(signatures[rows[signed]])
        self._append_ids(np.asarray(row_ids, dtype=np.int64)[new][signed])

    def _append_ids(self, ids: np.ndarray) -> None:
        """Row ids as uint32 (4 B each) while they fit, else the whole column as int64."""
        if self._ids.dtype == np.uint32 and ids.size and (int(ids.min()) < 0 or int(ids.max()) > 0xFFFFFFFF):
            wide = _Rows((), np.int64)
            wide.append(self._ids.joined().astype(np.int64))
            self._ids = wide
        self._ids.append(ids)

    def _signatures(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(mask of texts with at least one word, uint8 signatures of those texts)."""
        return prompt_signatures(texts, self.num_perm)

    def clusters(self) -> list[list[int]]:
        """Groups of >= 2 row ids whose prompts are near-duplicates, each sorted; groups sorted."""
        self._drain()
        sigs = self._signatures_of.joined()
        ids = self._ids.joined()  # uint32 (or int64): lexsort and tolist() below take either
        n = ids.size
        if n < 2:
            return []
        band_keys = sigs.view(np.uint32)  # (n, bands): 4 signature bytes per band
        # Band by band: candidate pairs (neighbours in sort order with equal band keys) are verified
        # on the whole signature at once and merged into the component labels, so memory stays
        # O(rows + one band's candidates) even when a large group of prompts collides.
        labels = np.arange(n, dtype=np.int64)
        for band in range(self.bands):
            order, sorted_column = _stable_order(band_keys[:, band])
            hit = np.flatnonzero(sorted_column[1:] == sorted_column[:-1])
            if not hit.size:
                continue
            u, v = order[hit], order[hit + 1]
            keep = labels[u] != labels[v]  # already joined: nothing to verify
            u, v = u[keep], v[keep]
            accepted = np.zeros(u.size, dtype=bool)
            step = 1 << 13  # candidates verified at a time: ~1 MB of gathered signatures, not 8
            for lo in range(0, u.size, step):
                hi = lo + step
                matches = (sigs[u[lo:hi]] == sigs[v[lo:hi]]).mean(axis=1)
                # b-bit estimate: equal bytes happen by chance 1/256 of the time for unrelated minima.
                accepted[lo:hi] = jaccard_estimate(matches) >= self._accept
            labels = _components(labels, u[accepted], v[accepted])
        order = np.lexsort((ids, labels))
        sorted_ids, sorted_labels = ids[order], labels[order]
        # Only components with two or more members become lists (most prompts are alone).
        starts = np.flatnonzero(np.r_[True, sorted_labels[1:] != sorted_labels[:-1]])
        ends = np.r_[starts[1:], n]
        multi = ends - starts > 1
        result = [sorted_ids[a:b].tolist() for a, b in zip(starts[multi].tolist(), ends[multi].tolist())]
        result.sort(key=lambda g: g[0])
        return result


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


class _Rows:
    """An array growing by rows, kept in blocks of about BLOCK_BYTES (each its own allocation, given
    back to the system when dropped): no regrowth copies, and joining holds one block more than the
    result, not two copies of everything."""

    BLOCK_BYTES = 1 << 20  # joined() holds one block more than the result: keep that small

    def __init__(self, row_shape: tuple[int, ...], dtype: type) -> None:
        self.row_shape = row_shape
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * math.prod(row_shape)
        self.block_rows = max(1, self.BLOCK_BYTES // self.row_bytes)
        self.blocks: list[np.ndarray] = []
        self.filled = 0  # rows used in the last block
        self.rows = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the rows held (the last block's unused tail not counted)."""
        return self.rows * self.row_bytes

    def append(self, rows: np.ndarray) -> None:
        done = 0
        while done < len(rows):
            if not self.blocks or self.filled == len(self.blocks[-1]):
                self.blocks.append(_blank((self.block_rows, *self.row_shape), self.dtype))
                self.filled = 0
            take = min(len(rows) - done, len(self.blocks[-1]) - self.filled)
            self.blocks[-1][self.filled : self.filled + take] = rows[done : done + take]
            self.filled += take
            self.rows += take
            done += take

    def joined(self) -> np.ndarray:
        """All rows as one array (which then becomes the only block)."""
        if len(self.blocks) == 1 and self.filled == len(self.blocks[0]):
            return self.blocks[0]
        result = _blank((self.rows, *self.row_shape), self.dtype)
        at = 0
        blocks, self.blocks = self.blocks, []
        while blocks:
            block = blocks.pop(0)  # dropped once copied
            take = min(len(block), self.rows - at)
            result[at : at + take] = block[:take]
            at += take
            del block
        self.blocks, self.filled = [result], self.rows
        return result


def _blank(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array in its own anonymous mapping: given back to the system when dropped.
    (From malloc, a dropped block can stay in the heap, and joining the blocks would then hold
    them all beside their copy at the end of the run.)"""
    nbytes = max(1, math.prod(shape) * np.dtype(dtype).itemsize)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=math.prod(shape)).reshape(shape)


def _stable_order(column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(np.argsort(column, kind="stable"), column sorted) for a uint32 column: key and index packed
    into one uint64 and sorted plainly, several times faster than a stable argsort."""
    if column.size >= 1 << 32:  # pragma: no cover - the index would not fit
        order = np.argsort(column, kind="stable")
        return order, column[order]
    # In place, and temporaries a slice at a time: this runs once per band over every distinct
    # prompt at the end of the run, where the process's memory peaks (12 bytes a prompt, not 28).
    packed = column.astype(np.uint64)
    packed <<= _U64(32)
    step = 1 << 16
    for lo in range(0, packed.size, step):
        packed[lo : lo + step] |= np.arange(lo, min(lo + step, packed.size), dtype=np.uint64)
    packed.sort()
    if sys.byteorder == "little":  # the high half of each uint64 is its second uint32
        sorted_column = packed.view(np.uint32)[1::2].copy()
    else:  # pragma: no cover
        sorted_column = (packed >> _U64(32)).astype(np.uint32)
    packed &= _U64(0xFFFFFFFF)
    return packed.view(np.int64), sorted_column


def _components(labels: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Merge edges (u, v) into component labels, where every node points straight at its
    component's root (its smallest member). Vectorized union-find: hook the larger root under the
    smaller, then pointer-jump until every node points at a root; repeat until no edge spans two
    components (a few rounds on real graphs)."""
    while u.size:
        root_u, root_v = labels[u], labels[v]
        spans = root_u != root_v
        if not spans.any():
            break
        root_u, root_v = root_u[spans], root_v[spans]
        u, v = u[spans], v[spans]
        low = np.minimum(root_u, root_v)
        np.minimum.at(labels, root_u, low)
        np.minimum.at(labels, root_v, low)
        while True:  # pointer jumping: follow labels to their roots
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped
    return labels
