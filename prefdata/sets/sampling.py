"""Seeded, coordination-free subsampling: which of n positions a sample keeps.

Position i of a stream gets the key `mix64(base + i)`, where `base` comes from a seed and a name
(`sample_base`). `mix64` is SplitMix64's finalizer, a bijection of 64-bit integers, so the keys of
distinct positions never tie: "the k smallest keys" is exactly k positions. A worker decides for any
position alone, from (base, threshold) and the position: no coordination, the same answer on any
engine and with any number of workers. Used by mixtures (prefdata.sets.mix: records of a source) and
length balancing (prefdata.sets.balance: pairs of the output).
"""

from __future__ import annotations

import numpy as np
import xxhash

TAKE_ALL = (1 << 64) - 1  # a threshold every key is at or below
TAKE_NONE = -1  # a threshold no key is at or below
_BLOCK = 1 << 20  # positions whose keys are computed at once (8 MiB)


def sample_base(seed: int, name: str) -> int:
    """The key offset of the stream `name` under `seed`: other seeds or names give other samples."""
    return xxhash.xxh3_64_intdigest(f"{seed}\x00{name}".encode("utf-8"))


def mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over uint64 values (wrapping arithmetic): a bijection, well mixed."""
    z = np.asarray(values, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keys_of(base: int, positions: np.ndarray) -> np.ndarray:
    """The keys of `positions` (int64 or uint64) in the stream starting at `base`."""
    with np.errstate(over="ignore"):
        return mix64(np.asarray(positions, dtype=np.int64).astype(np.uint64) + np.uint64(base))


def keep_mask(base: int, threshold: int, first: int, count: int) -> np.ndarray:
    """Which of positions first .. first+count-1 the sample keeps (key <= threshold)."""
    if threshold >= TAKE_ALL:
        return np.ones(count, dtype=bool)
    if threshold < 0:
        return np.zeros(count, dtype=bool)
    return keys_of(base, np.arange(first, first + count, dtype=np.int64)) <= np.uint64(threshold)


def threshold_for(keys: np.ndarray, k: int) -> int:
    """The threshold that keeps exactly the `k` smallest of `keys` (distinct values)."""
    n = len(keys)
    if k <= 0:
        return TAKE_NONE
    if k >= n:
        return TAKE_ALL
    return int(np.partition(np.asarray(keys, dtype=np.uint64), k - 1)[k - 1])


def threshold_of_range(base: int, n: int, k: int) -> int:
    """`threshold_for` the keys of positions 0 .. n-1, in blocks: memory follows min(k, n - k), not n."""
    if k <= 0:
        return TAKE_NONE
    if k >= n:
        return TAKE_ALL
    # Keep the k smallest keys, or (k past the middle) the n - k + 1 largest: the k-th smallest is
    # the smallest of those. Bitwise NOT reverses the order of uint64, so both are "keep the m smallest".
    largest = k > n // 2
    m = n - k + 1 if largest else k
    best = np.zeros(0, dtype=np.uint64)
    block = max(_BLOCK, m)
    for start in range(0, n, block):
        keys = keys_of(base, np.arange(start, min(n, start + block), dtype=np.int64))
        if largest:
            keys = ~keys
        best = np.concatenate([best, keys])
        if len(best) > m:
            best = np.partition(best, m - 1)[:m]
    edge = int(best.max())
    return int(~np.uint64(edge)) if largest else edge
