"""A compact map from 64-bit digests to int64 values (or a set of digests): sorted numpy runs.

The dataset-wide checks keep one entry per distinct pair or prompt, so this is the memory that grows
with the data. An open-addressing table at load <= 1/2 costs 32-64 bytes an entry (2.6 slots of 16 B
at 200k keys); here the keys sit in a few sorted runs with no empty slots: 16 bytes an entry for a
map, 8 for a set, plus a bounded buffer.

- Runs: sorted uint64 keys (and their values), disjoint. A new run merges into the last one while
  that is less than FACTOR times bigger, so run sizes fall geometrically (a handful of runs) and a
  key is copied O(FACTOR) times per level. A lookup is one `searchsorted` per run.
- Keys inserted one at a time (`setdefault`) wait in a small dict, sorted into a run when it fills
  or before any vectorized call.
Key 0 is stored as 1 (a 2^-64 coincidence), as before: keys must already be well-mixed hashes.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

_U64 = np.uint64
FACTOR = 8  # a new run merges into the last one while that is less than FACTOR times bigger
PENDING = 4096  # single-key inserts held in a dict before they become a run


def _stored_keys(keys: np.ndarray) -> np.ndarray:
    """Keys as the table stores them: uint64, 0 as 1."""
    keys = np.asarray(keys, dtype=np.uint64)
    return np.where(keys == 0, _U64(1), keys)


def first_occurrences(keys: np.ndarray) -> np.ndarray:
    """Mask of the positions holding the first occurrence of their key (as U64Table stores it)."""
    keys = _stored_keys(keys)
    first = np.zeros(keys.size, dtype=bool)
    first[np.unique(keys, return_index=True)[1]] = True
    return first


class U64Table:
    """Map from 64-bit keys to int64 values, first value wins (see the module doc).

    `values=False` keeps only the keys (a set): `get` then answers 0 for a stored key.
    `capacity` is accepted for compatibility and ignored (nothing is preallocated)."""

    def __init__(self, capacity: int = 0, *, values: bool = True) -> None:
        del capacity
        self._with_values = values
        self._keys: list[np.ndarray] = []
        self._views: list[memoryview] = []  # of self._keys, for single-key lookups
        self._vals: list[np.ndarray] = []
        self._pending: dict[int, int] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def nbytes(self) -> int:
        """Bytes of the stored entries (a pending entry counted as a stored one)."""
        width = 16 if self._with_values else 8
        return width * len(self._pending) + sum(k.nbytes for k in self._keys) + sum(v.nbytes for v in self._vals)

    def get(self, key: int) -> int | None:
        key = key or 1
        found = self._pending.get(key)
        if found is not None:
            return found
        # bisect over memoryviews: a C loop over Python ints, no numpy call per key and run.
        for i, run in enumerate(self._views):
            at = bisect_left(run, key)
            if at < len(run) and run[at] == key:
                return self._vals[i].item(at) if self._with_values else 0
        return None

    def setdefault(self, key: int, value: int) -> int | None:
        """The value already stored for `key`, or None after storing `value` for it."""
        key = key or 1
        found = self.get(key)
        if found is not None:
            return found
        self._pending[key] = value if self._with_values else 0
        self._len += 1
        if len(self._pending) >= PENDING:
            self._flush()
        return None

    def get_many(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found, values) for an array of keys: `get` for each, vectorized (0 where not found)."""
        self._flush()
        keys = _stored_keys(keys)
        found = np.zeros(keys.size, dtype=bool)
        values = np.zeros(keys.size, dtype=np.int64)
        for i, run in enumerate(self._keys):
            at = run.searchsorted(keys)
            inside = at < run.size
            hit = np.zeros(keys.size, dtype=bool)
            hit[inside] = run[at[inside]] == keys[inside]
            found |= hit
            if self._with_values:
                values[hit] = self._vals[i][at[hit]]
        return found, values

    def setdefault_many(self, keys: np.ndarray, values: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
        """`setdefault` for each key in order, vectorized: whether each key was already stored
        (by an earlier call or an earlier position in `keys`). First value wins, as in `setdefault`.
        `first`: `first_occurrences(keys)`, when the caller has it already."""
        keys = _stored_keys(keys)
        if first is None:
            first = first_occurrences(keys)
        at = np.flatnonzero(first)
        stored, _ = self.get_many(keys[at])
        existed = np.ones(keys.size, dtype=bool)
        existed[at] = stored
        new = at[~stored]
        if new.size:
            new_values = np.asarray(values, dtype=np.int64)[new] if self._with_values else None
            self._add_run(keys[new], new_values)
            self._len += int(new.size)
        return existed

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, {}
            keys = np.fromiter(pending.keys(), dtype=np.uint64, count=len(pending))
            values = np.fromiter(pending.values(), dtype=np.int64, count=len(pending)) if self._with_values else None
            self._add_run(keys, values)

    def _add_run(self, keys: np.ndarray, values: np.ndarray | None) -> None:
        """Add distinct keys, none stored yet, as a sorted run; merge runs down to geometric sizes."""
        order = np.argsort(keys)
        keys = keys[order]
        values = values[order] if values is not None else None
        self._views = []  # release the buffer exports before the runs are replaced
        while self._keys and self._keys[-1].size < FACTOR * keys.size:
            last_keys = self._keys.pop()
            last_values = self._vals.pop() if values is not None else None
            # np.insert at sorted positions: one O(n) pass, no sort of the merged run.
            where = last_keys.searchsorted(keys)
            keys = np.insert(last_keys, where, keys)
            if values is not None:
                values = np.insert(last_values, where, values)
            del last_keys, last_values
        self._keys.append(keys)
        self._views = [run.data.cast("B").cast("Q") for run in self._keys]
        if values is not None:
            self._vals.append(values)
