"""What the dataset-wide checks need of each pair: 64-bit digests and MinHash signatures, no text.

A worker computes a chunk's `PairDigests` where it checks the pairs; the main process keeps one
`DigestBlock` per chunk or group (the digests and the pairs' row ordinals) until the partitioned
checks (prefdata.checks.partitioned) shuffle them. The blocks are what these checks hold in memory
for the whole input, so they are compact: row ordinals as uint32 offsets from the block's first
row, positions as uint32, and a signature (64 bytes) only for the first row of each distinct raw
prompt in the block (a later copy of a prompt is never in a near-duplicate group).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from prefdata.checks.dataset import _PACK3, _xxh, pair_digests_and_key
from prefdata.checks.minhash import prompt_digest, prompt_signatures
from prefdata.core.records import Pair

NUM_PERM = 64


def stored_keys(keys: np.ndarray) -> np.ndarray:
    """Keys as the checks compare them: uint64, 0 as 1 (0 marks "no key": a 2^-64 coincidence)."""
    keys = np.asarray(keys, dtype=np.uint64)
    return np.where(keys == 0, np.uint64(1), keys)


@dataclass
class PairDigests:
    """What the dataset-wide checks need of a chunk's p pairs (m of them with a prompt)."""

    prompt_keys: np.ndarray  # (p,) uint64, as checks.dataset.pair_digests_and_key
    pair_keys: np.ndarray  # (p,) uint64
    swapped_keys: np.ndarray  # (p,) uint64 pair key with the halves swapped (0 when they are equal)
    halves_differ: np.ndarray  # (p,) bool chosen digest != rejected digest
    prompted: np.ndarray  # (m,) uint32 positions of the pairs with a non-empty prompt
    prompt_digests: np.ndarray  # (m,) uint64 minhash.prompt_digest (the raw text)
    signed: np.ndarray  # (s,) uint32 positions in `prompted` of the signed prompts, ascending
    signatures: np.ndarray  # (s, NUM_PERM) uint8: of the first prompt of each digest here that has a word


def pair_digests(pairs: Sequence[Pair], keys: Sequence[tuple[int, int, int, int]] | None = None) -> PairDigests:
    """The digests of `pairs` (one chunk, in order); `keys`: their pair_digests_and_key, if known."""
    if keys is None:
        keys = [pair_digests_and_key(pair) for pair in pairs]
    key_array = np.array(keys, dtype=np.uint64).reshape(-1, 4)
    swapped = [_xxh(_PACK3(hp, hr, hc)) if hc != hr else 0 for hp, hc, hr, _ in keys]
    prompted = [i for i, pair in enumerate(pairs) if pair.prompt]
    prompts = [pairs[i].prompt for i in prompted]
    digests = np.array([prompt_digest(prompt) for prompt in prompts], dtype=np.uint64)
    # Only the first prompt of each digest here is hashed: a later copy needs no signature.
    firsts = np.sort(np.unique(digests, return_index=True)[1])
    has_words, signatures = prompt_signatures([prompts[i].lower() for i in firsts.tolist()], NUM_PERM)
    return PairDigests(
        prompt_keys=np.ascontiguousarray(key_array[:, 0]),
        pair_keys=np.ascontiguousarray(key_array[:, 3]),
        swapped_keys=np.array(swapped, dtype=np.uint64),
        halves_differ=key_array[:, 1] != key_array[:, 2],
        prompted=np.array(prompted, dtype=np.uint32),
        prompt_digests=digests,
        signed=firsts[has_words].astype(np.uint32),
        signatures=signatures,
    )


@dataclass
class DigestBlock:
    """A block of pairs' digests and their row ordinals (row index in input order, quarantined
    records included): what a map worker sends to the shuffle."""

    first: int  # the row the offsets count from
    offsets: np.ndarray  # (p,) uint32 (int64 past 2^32 rows) row - first, ascending
    digests: PairDigests

    @property
    def rows(self) -> np.ndarray:
        """(p,) int64 row ordinals."""
        return self.offsets.astype(np.int64) + self.first

    @property
    def prompt_rows(self) -> np.ndarray:
        """(m,) int64 rows of the prompts near-duplicate detection sees."""
        return self.offsets[self.digests.prompted].astype(np.int64) + self.first


def _offsets(rows: np.ndarray, first: int) -> np.ndarray:
    offsets = np.asarray(rows, dtype=np.int64) - first
    return offsets.astype(np.uint32) if not offsets.size or int(offsets[-1]) <= 0xFFFFFFFF else offsets


def block_from_digests(rows: np.ndarray, digests: PairDigests) -> DigestBlock:
    """The block of a chunk's `digests` whose pairs are at row ordinals `rows` (ascending)."""
    rows = np.asarray(rows, dtype=np.int64)
    first = int(rows[0]) if rows.size else 0
    return DigestBlock(first, _offsets(rows, first), digests)


def shift_rows(block: DigestBlock, first: int) -> DigestBlock:
    """The block with its row ordinals moved by `first` (a group's rows numbered from 0 -> input order)."""
    return replace(block, first=block.first + first)


def join_blocks(blocks: Sequence[DigestBlock]) -> DigestBlock:
    """One block of consecutive blocks (a worker's group of chunks: one block to shuffle)."""
    blocks = [b for b in blocks if b.offsets.size]
    if not blocks:
        return block_from_digests(np.zeros(0, np.int64), pair_digests([]))
    first = blocks[0].first
    pairs = np.cumsum([0] + [b.offsets.size for b in blocks])
    prompts = np.cumsum([0] + [b.digests.prompted.size for b in blocks])
    d = [b.digests for b in blocks]
    joined = PairDigests(
        prompt_keys=np.concatenate([x.prompt_keys for x in d]),
        pair_keys=np.concatenate([x.pair_keys for x in d]),
        swapped_keys=np.concatenate([x.swapped_keys for x in d]),
        halves_differ=np.concatenate([x.halves_differ for x in d]),
        prompted=np.concatenate([x.prompted.astype(np.int64) + at for x, at in zip(d, pairs)]).astype(np.uint32),
        prompt_digests=np.concatenate([x.prompt_digests for x in d]),
        signed=np.concatenate([x.signed.astype(np.int64) + at for x, at in zip(d, prompts)]).astype(np.uint32),
        signatures=np.concatenate([x.signatures for x in d]),
    )
    return DigestBlock(first, _offsets(np.concatenate([b.rows for b in blocks]), first), joined)


def digest_block(rows: Sequence[int], pairs: Sequence[Pair]) -> DigestBlock:
    """The block of `pairs` at row ordinals `rows` (ascending), computed here."""
    return block_from_digests(np.asarray(list(rows), dtype=np.int64), pair_digests(pairs))
