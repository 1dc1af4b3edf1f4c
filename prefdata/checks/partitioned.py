"""Dataset-wide checks by hash partitioning, so that no single process holds every row.

Each block of rows' digests (prefdata.checks.digests) is split by key into P parts, and each of P
reducers sees only the keys that hash to it -- every row of a key meets in one reducer, and "first"
is the smallest row index, which is what input order means:

- duplicate_pair: a row whose pair key has a smaller row index elsewhere.
- conflicting_pair: a row whose swapped key (halves differ) is some row's pair key with a smaller
  row index. The swapped key is sent to the partition of that key, as a query.
- duplicate prompt rows: rows minus distinct prompt keys.
- near-duplicate prompts (MinHash): partitions by the raw prompt digest keep the first row of each
  distinct prompt with its signature; then, one band at a time, every band key goes to one
  partition, which sorts its buckets by row and verifies neighbours on the full signature: the
  accepted edges are joined into groups at the end.

The shuffle is the engine's (`shuffle(split, reduce, blocks, partitions)`: on Ray the blocks and
parts stay in the object store); `InProcessShuffle` is the same shuffle in this process. The
shuffles are chained -- blocks -> distinct prompts -> band 1 -> ... -> band 16 -> the answers --
each reducer's output feeding the next split, and the answers found so far ride along in
partition 0 (`Carried`), so only the last shuffle is fetched. Memory in this process: the blocks
(~0.12 KB a pair with distinct prompts: three 8-byte keys, a prompt digest, offsets, a 64-byte
signature), then one copy of them as parts (each block dropped once split, each partition's parts
once reduced), then one signature and row per distinct prompt per band round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from prefdata.checks.digests import DigestBlock, stored_keys
from prefdata.checks.minhash import _mix, accept_threshold, jaccard_estimate
from prefdata.core import flags as F
from prefdata.core.memory import trim_heap

_U64 = np.uint64
BANDS = 16  # of 4 signature bytes each (one uint32 key per band)
LOCAL_PARTITIONS = 16  # in this process: more partitions, smaller sort copies; the answers are the same


def _partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    return (_mix(np.asarray(keys, dtype=np.uint64)) % _U64(partitions)).astype(np.int64)


def _split(partition: np.ndarray, partitions: int, **columns: np.ndarray) -> list[dict[str, np.ndarray]]:
    order = np.argsort(partition, kind="stable")
    bounds = np.searchsorted(partition[order], np.arange(partitions + 1))
    return [{name: column[order[a:b]] for name, column in columns.items()} for a, b in zip(bounds[:-1], bounds[1:])]


# --------------------------------------------------------------------------- duplicates and conflicts


def split_pairs(block: DigestBlock, partitions: int) -> list[dict[str, dict[str, np.ndarray]]]:
    """One block's pair keys, conflict queries and prompt keys, each by the partition of its key."""
    d, rows = block.digests, block.rows
    pair_keys, prompt_keys = stored_keys(d.pair_keys), stored_keys(d.prompt_keys)
    query = np.flatnonzero(d.halves_differ)
    queries = stored_keys(d.swapped_keys[query])
    by_pair = _split(_partition_of(pair_keys, partitions), partitions, key=pair_keys, row=rows)
    by_query = _split(_partition_of(queries, partitions), partitions, key=queries, row=rows[query])
    by_prompt = _split(_partition_of(prompt_keys, partitions), partitions, key=prompt_keys)
    return [{"pairs": a, "queries": b, "prompts": c} for a, b, c in zip(by_pair, by_query, by_prompt)]


@dataclass
class PairPartition:
    """One reducer's answer: the rows to flag and its prompt counts."""

    duplicate_rows: np.ndarray
    conflicting_rows: np.ndarray
    rows: int
    distinct_prompts: int


def _joined(parts: Sequence[dict[str, Any]], name: str, column: str, dtype: Any) -> np.ndarray:
    return np.concatenate([p[name][column] for p in parts]) if parts else np.zeros(0, dtype)


def reduce_pairs(parts: Sequence[dict[str, dict[str, np.ndarray]]]) -> PairPartition:
    """Duplicates (not the smallest row of their key) and conflicts (a smaller row holds the swap)."""
    keys, rows = _joined(parts, "pairs", "key", _U64), _joined(parts, "pairs", "row", np.int64)
    order = np.lexsort((rows, keys))
    keys, rows = keys[order], rows[order]
    del order
    first = np.r_[True, keys[1:] != keys[:-1]] if keys.size else np.zeros(0, dtype=bool)
    unique_keys, first_rows = keys[first], rows[first]
    del keys
    q_keys, q_rows = _joined(parts, "queries", "key", _U64), _joined(parts, "queries", "row", np.int64)
    at = np.minimum(np.searchsorted(unique_keys, q_keys), max(unique_keys.size - 1, 0))
    found = (unique_keys[at] == q_keys) if unique_keys.size else np.zeros(q_keys.size, dtype=bool)
    conflicting = q_rows[found & (first_rows[at] < q_rows)] if unique_keys.size else q_rows[:0]
    distinct_prompts = int(np.unique(_joined(parts, "prompts", "key", _U64)).size)
    return PairPartition(np.sort(rows[~first]), np.sort(conflicting), int(rows.size), distinct_prompts)


# --------------------------------------------------------------------------- near-duplicate prompts


def split_prompts(block: DigestBlock, partitions: int) -> list[dict[str, np.ndarray]]:
    """One block's prompt digests by partition, each with its row, whether it is signed, and the
    signatures of the signed ones (in the part's order)."""
    d = block.digests
    signed = np.zeros(d.prompted.size, dtype=bool)
    signed[d.signed] = True
    at = np.full(d.prompted.size, -1, dtype=np.int64)  # each signed prompt's row in d.signatures
    at[d.signed] = np.arange(d.signed.size)
    parts = _split(_partition_of(d.prompt_digests, partitions), partitions, digest=d.prompt_digests,
                   row=block.prompt_rows, signed=signed, at=at)
    for part in parts:
        part["signature"] = d.signatures[part.pop("at")[part["signed"]]]
    return parts


def reduce_prompts(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, Any]:
    """The first row of each distinct prompt that has words, with its signature, and the counts."""
    if not parts:
        return {"row": np.zeros(0, np.int64), "signature": np.zeros((0, 64), np.uint8), "seen": 0, "distinct": 0}
    digest = np.concatenate([p["digest"] for p in parts])
    row = np.concatenate([p["row"] for p in parts])
    signed = np.concatenate([p["signed"] for p in parts])
    order = np.lexsort((row, digest))
    digest = digest[order]
    first = order[np.r_[True, digest[1:] != digest[:-1]]] if digest.size else order
    del order, digest
    keep = first[signed[first]]  # the firsts that carry a signature
    signature_at = np.cumsum(signed) - 1  # entry -> its row among the parts' signatures, joined
    signatures = np.concatenate([p["signature"] for p in parts])[signature_at[keep]]
    return {"row": row[keep], "signature": signatures, "seen": int(row.size), "distinct": int(first.size)}


def split_block(block: DigestBlock, partitions: int) -> list[dict[str, Any]]:
    """A block's pair keys, conflict queries, prompt keys and prompt digests, each by its partition."""
    return [pairs | {"texts": texts} for pairs, texts in zip(split_pairs(block, partitions),
                                                            split_prompts(block, partitions))]


def reduce_block(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A partition's duplicates, conflicts and counts (carried on), and its distinct prompts."""
    pairs = reduce_pairs(parts)
    firsts = reduce_prompts([p["texts"] for p in parts])
    carried = Carried([pairs.duplicate_rows], [pairs.conflicting_rows], [], pairs.rows, pairs.distinct_prompts,
                      firsts.pop("seen"), firsts.pop("distinct"))
    return firsts | {"carried": carried}


@dataclass
class Carried:
    """What the shuffles pass along to the end in their partition 0: the answers found so far."""

    duplicate_rows: list[np.ndarray] = field(default_factory=list)
    conflicting_rows: list[np.ndarray] = field(default_factory=list)
    edges: list[np.ndarray] = field(default_factory=list)  # (k, 2) verified near-duplicate prompt edges
    rows: int = 0
    distinct_prompts: int = 0
    prompts_seen: int = 0
    distinct_prompt_texts: int = 0

    @staticmethod
    def joined(parts: Sequence[Carried]) -> Carried:
        total = Carried()
        for part in parts:
            total.duplicate_rows += part.duplicate_rows
            total.conflicting_rows += part.conflicting_rows
            total.edges += part.edges
            total.rows += part.rows
            total.distinct_prompts += part.distinct_prompts
            total.prompts_seen += part.prompts_seen
            total.distinct_prompt_texts += part.distinct_prompt_texts
        return total


class BandSplit:
    """Split of the distinct prompts by one band's key, each with its row and whole signature; the
    answers so far go to partition 0."""

    def __init__(self, band: int) -> None:
        self.band = band

    def __call__(self, prompts: dict[str, Any], partitions: int) -> list[dict[str, Any]]:
        signatures = prompts["signature"]
        key = np.ascontiguousarray(signatures[:, 4 * self.band : 4 * self.band + 4]).view(np.uint32).ravel()
        bucket = (np.uint64(self.band) << _U64(32)) | key.astype(np.uint64)
        parts: list[dict[str, Any]] = _split(_partition_of(bucket, partitions), partitions, key=key,
                                             row=prompts["row"], signature=signatures)
        for i, part in enumerate(parts):
            part["carried"] = prompts["carried"] if i == 0 else Carried()
        return parts


class BandEdges:
    """A band's reducer: neighbours by row within each bucket whose whole signatures agree enough
    become edges; its prompts go on to the next band's split."""

    def __init__(self, accept: float) -> None:
        self.accept = accept

    def __call__(self, parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
        carried = Carried.joined([p["carried"] for p in parts])
        if not parts:
            return {"row": np.zeros(0, np.int64), "signature": np.zeros((0, 64), np.uint8), "carried": carried}
        key = np.concatenate([p["key"] for p in parts])
        row = np.concatenate([p["row"] for p in parts])
        signatures = np.concatenate([p["signature"] for p in parts])
        order = np.lexsort((row, key))
        hit = np.flatnonzero(key[order[1:]] == key[order[:-1]])
        if hit.size:
            left, right = order[hit], order[hit + 1]
            accepted = jaccard_estimate((signatures[left] == signatures[right]).mean(axis=1)) >= self.accept
            carried.edges.append(np.stack([row[left[accepted]], row[right[accepted]]], axis=1))
        return {"row": row, "signature": signatures, "carried": carried}


def groups_from_edges(edges: np.ndarray) -> list[list[int]]:
    """Connected components of the edges (only their endpoints: never every row), each sorted."""
    if not edges.size:
        return []
    nodes, index = np.unique(edges.ravel(), return_inverse=True)
    parent = list(range(nodes.size))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for u, v in index.reshape(-1, 2).tolist():
        ru, rv = root(u), root(v)
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    groups: dict[int, list[int]] = {}
    for i, node in enumerate(nodes.tolist()):  # nodes ascend, so each group comes out sorted
        groups.setdefault(root(i), []).append(node)
    return sorted(groups.values(), key=lambda g: g[0])


# --------------------------------------------------------------------------- the whole check


class Shuffler(Protocol):
    def shuffle(self, split: Callable[[Any, int], list[Any]], reduce: Callable[[list[Any]], Any],
                blocks: Sequence[Any], partitions: int, fetch: bool = True) -> list[Any]: ...


class Draining(Sequence[Any]):
    """The caller's list of blocks, emptied as it is iterated: a block is dropped once split."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        return self.items[index]

    def __iter__(self) -> Iterator[Any]:
        self.items.reverse()
        while self.items:
            yield self.items.pop()


class InProcessShuffle:
    """The shuffle in this process: split every block, hand each reducer its parts (dropped once
    reduced)."""

    def shuffle(self, split: Callable[[Any, int], list[Any]], reduce: Callable[[list[Any]], Any],
                blocks: Sequence[Any], partitions: int, fetch: bool = True) -> list[Any]:
        parts: list[list[Any]] = [[] for _ in range(partitions)]
        for block in blocks:
            for i, part in enumerate(split(block, partitions)):
                parts[i].append(part)
        results = []
        for i in range(partitions):
            mine, parts[i] = parts[i], []
            results.append(reduce(mine))
            del mine
            trim_heap()
        return results


@dataclass
class PartitionedResult:
    """The dataset-wide findings."""

    duplicate_rows: np.ndarray  # rows flagged duplicate_pair, ascending
    conflicting_rows: np.ndarray  # rows flagged conflicting_pair, ascending
    rows: int
    distinct_prompts: int  # distinct prompt keys (whitespace-free digests)
    near_duplicate_groups: list[list[int]] = field(default_factory=list)
    prompts_seen: int = 0
    distinct_prompt_texts: int = 0  # distinct raw prompts (MinHash's exact folding)

    @property
    def duplicate_prompt_rows(self) -> int:
        return self.rows - self.distinct_prompts

    def flags_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(duplicate_pair, conflicting_pair) masks of the pairs at row ordinals `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        return member(rows, self.duplicate_rows), member(rows, self.conflicting_rows)


def partitioned_dataset_checks(blocks: list[Any], partitions: int, *, threshold: float = 0.8,
                               num_perm: int = 64, shuffler: Shuffler | None = None) -> PartitionedResult:
    """duplicate_pair, conflicting_pair and near-duplicate prompt groups over `blocks` (DigestBlocks,
    or the engine's references to them) by hash partitioning; see the module doc. `blocks` is
    emptied: each block is dropped once its parts are made, and so is each band's input."""
    shuffler = shuffler or InProcessShuffle()
    prompts = shuffler.shuffle(split_block, reduce_block, Draining(blocks), partitions, fetch=False)
    accept = BandEdges(accept_threshold(threshold, num_perm))
    for band in range(num_perm // 4):
        prompts = shuffler.shuffle(BandSplit(band), accept, Draining(prompts), partitions, fetch=False)
    found: Carried = shuffler.shuffle(_carried_split, Carried.joined, Draining(prompts), 1)[0]
    trim_heap()  # what the rows' pass builds next (the report) can use the pages the shuffle freed
    edges = np.concatenate(found.edges) if found.edges else np.zeros((0, 2), np.int64)
    return PartitionedResult(
        duplicate_rows=np.sort(np.concatenate(found.duplicate_rows)) if found.duplicate_rows else np.zeros(0, np.int64),
        conflicting_rows=np.sort(np.concatenate(found.conflicting_rows)) if found.conflicting_rows
        else np.zeros(0, np.int64),
        rows=found.rows,
        distinct_prompts=found.distinct_prompts,
        near_duplicate_groups=groups_from_edges(edges),
        prompts_seen=found.prompts_seen,
        distinct_prompt_texts=found.distinct_prompt_texts,
    )


def _carried_split(prompts: dict[str, Any], partitions: int) -> list[Carried]:
    return [prompts["carried"]]


def partitioned_on(engine: Any, blocks: list[Any], threshold: float) -> PartitionedResult:
    """The partitioned checks over `blocks` (emptied), shuffled on `engine` when it has a shuffle
    (Ray: 2 partitions per worker), else in this process."""
    if hasattr(engine, "shuffle"):
        return partitioned_dataset_checks(blocks, max(1, 2 * getattr(engine, "workers", 1)), threshold=threshold,
                                          shuffler=engine)
    return partitioned_dataset_checks(blocks, LOCAL_PARTITIONS, threshold=threshold)


def dataset_flags(duplicate: bool, conflicting: bool) -> list[str]:
    """The flag names of one pair's (duplicate_pair, conflicting_pair) answer."""
    if not (duplicate or conflicting):
        return []
    return [F.DUPLICATE_PAIR] * duplicate + [F.CONFLICTING_PAIR] * conflicting


def member(values: np.ndarray, sorted_rows: np.ndarray) -> np.ndarray:
    """Which of `values` are in `sorted_rows` (ascending)."""
    if not sorted_rows.size:
        return np.zeros(values.size, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_rows, values), sorted_rows.size - 1)
    return sorted_rows[at] == values
