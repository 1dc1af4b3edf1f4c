"""Dataset-wide checks by hash partitioning, so that no single process holds every row.

The local checks (`dataset.DatasetWideChecks`, `minhash.NearDuplicatePrompts`) keep one table of
every distinct pair and prompt in one process. Here the same answers come from a shuffle: each
block of rows is split by key into P parts, and each of P reducers sees only the keys that hash
to it -- every row of a key meets in one reducer, and "first" is the smallest row index, which is
what input order means. The results are exactly the local ones (a test compares them):

- duplicate_pair: a row whose pair key has a smaller row index elsewhere.
- conflicting_pair: a row whose swapped key (halves differ) is some row's pair key with a smaller
  row index. The swapped key is sent to the partition of that key, as a query.
- duplicate prompt rows: rows minus distinct prompt keys.
- near-duplicate prompts (MinHash): first, partitions by the raw prompt digest keep the first row
  of each distinct prompt with its signature; then every (band, band key) goes to one partition,
  which sorts its buckets by row, verifies neighbours on the full signature (as the local finder
  does) and returns the accepted edges. Only edges reach the caller, which joins them into groups.

Memory per reducer, N rows over P partitions: pairs ~40 bytes per row (pair key + row, swapped
key + row, prompt key), ~2x that while sorting; MinHash ~80 bytes per row in the first shuffle
and ~1.2 KB per distinct prompt in the band shuffle (16 bands x (signature 64 + key 4 + row 8 +
band 1)). For 100M rows and P = 256: ~16 MB and ~470 MB per reducer.

The shuffle itself is the engine's (`shuffle(split, reduce, blocks, partitions)`); `run_in_process`
is the same shuffle in this process, for one machine and for tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from prefdata.checks.dataset import _PACK3, _stored_keys, _xxh, pair_digests_and_key
from prefdata.checks.minhash import _mix, accept_threshold, jaccard_estimate, prompt_digest, prompt_signatures
from prefdata.core.records import Pair

_U64 = np.uint64


@dataclass
class DigestBlock:
    """Per-row digests of one block of pairs (what a map worker sends; no text)."""

    rows: np.ndarray  # (n,) int64 row index in input order
    prompt_keys: np.ndarray  # (n,) uint64 as dataset.pair_digests_and_key
    pair_keys: np.ndarray  # (n,) uint64
    swapped_keys: np.ndarray  # (n,) uint64 key of (prompt, rejected, chosen)
    halves_differ: np.ndarray  # (n,) bool
    prompt_rows: np.ndarray  # (m,) int64 rows whose prompts near-duplicate detection sees
    prompt_digests: np.ndarray  # (m,) uint64 minhash.prompt_digest (raw text)
    signature_rows: np.ndarray  # (m,) int64 row in `signatures`, -1: no word or not first in block
    signatures: np.ndarray  # (s, num_perm) uint8


def block_from_digests(rows: np.ndarray, digests: Any) -> DigestBlock:
    """A DigestBlock from a chunk's `checks.merge.PairDigests` (what the engine's stage computes)
    and the row ordinals of its pairs: the same rows `DatasetMerge.merge_chunk` would see."""
    rows = np.asarray(rows, dtype=np.int64)
    return DigestBlock(rows, digests.prompt_keys, digests.pair_keys, digests.swapped_keys, digests.halves_differ,
                       rows[digests.prompted], digests.prompt_digests, digests.signature_rows, digests.signatures)


def join_blocks(blocks: Sequence[DigestBlock], num_perm: int = 64) -> DigestBlock:
    """One DigestBlock of consecutive blocks (a worker's group of chunks: one block to shuffle)."""
    if not blocks:
        return digest_block([], [], num_perm)
    signed, signature_rows = 0, []
    for block in blocks:  # each block's signature rows point into its own signatures
        signature_rows.append(np.where(block.signature_rows >= 0, block.signature_rows + signed, -1))
        signed += block.signatures.shape[0]
    columns = {name: np.concatenate([getattr(b, name) for b in blocks])
               for name in ("rows", "prompt_keys", "pair_keys", "swapped_keys", "halves_differ", "prompt_rows",
                            "prompt_digests")}
    return DigestBlock(**columns, signature_rows=np.concatenate(signature_rows),
                       signatures=np.concatenate([b.signatures for b in blocks]))


def shift_rows(block: DigestBlock, first: int) -> DigestBlock:
    """The block with its row ordinals moved by `first` (a group's rows numbered from 0 -> input order)."""
    return DigestBlock(block.rows + first, block.prompt_keys, block.pair_keys, block.swapped_keys, block.halves_differ,
                       block.prompt_rows + first, block.prompt_digests, block.signature_rows, block.signatures)


def digest_block(rows: Sequence[int], pairs: Sequence[Pair], num_perm: int = 64) -> DigestBlock:
    """The digests the partitioned checks need for `pairs` (row indices ascending with input order)."""
    n = len(pairs)
    if not n:
        empty = np.zeros(0, dtype=np.uint64)
        return DigestBlock(np.zeros(0, np.int64), empty, empty, empty, np.zeros(0, bool), np.zeros(0, np.int64),
                           empty, np.zeros(0, np.int64), np.zeros((0, num_perm), np.uint8))
    keys = np.zeros((n, 4), dtype=np.uint64)
    swapped = np.zeros(n, dtype=np.uint64)
    differ = np.zeros(n, dtype=bool)
    for i, pair in enumerate(pairs):
        hp, hc, hr, key = pair_digests_and_key(pair)
        keys[i] = (hp, hc, hr, key)
        differ[i] = hc != hr
        swapped[i] = _xxh(_PACK3(hp, hr, hc))
    digests = np.fromiter((prompt_digest(p.prompt) for p in pairs), dtype=np.uint64, count=n)
    # Only the first row of each digest in this block can be a global first: only it is signed.
    first = np.zeros(n, dtype=bool)
    first[np.unique(digests, return_index=True)[1]] = True
    positions = np.flatnonzero(first)
    has_words, signatures = prompt_signatures([pairs[i].prompt.lower() for i in positions], num_perm)
    signature_rows = np.full(n, -1, dtype=np.int64)
    signature_rows[positions[has_words]] = np.arange(int(has_words.sum()))
    row_array = np.asarray(rows, dtype=np.int64)
    return DigestBlock(row_array, keys[:, 0], keys[:, 3], swapped, differ, row_array, digests, signature_rows, signatures)


def _partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    return (_mix(np.asarray(keys, dtype=np.uint64)) % _U64(partitions)).astype(np.int64)


def _split(partition: np.ndarray, partitions: int, **columns: np.ndarray) -> list[dict[str, np.ndarray]]:
    order = np.argsort(partition, kind="stable")
    bounds = np.searchsorted(partition[order], np.arange(partitions + 1))
    return [{name: column[order[a:b]] for name, column in columns.items()} for a, b in zip(bounds[:-1], bounds[1:])]


# --------------------------------------------------------------------------- duplicates and conflicts


def split_pairs(block: DigestBlock, partitions: int) -> list[dict[str, dict[str, np.ndarray]]]:
    """One block's pair keys, conflict queries and prompt keys, each by the partition of its key."""
    pair_keys, prompt_keys = _stored_keys(block.pair_keys), _stored_keys(block.prompt_keys)
    query = np.flatnonzero(block.halves_differ)
    queries = _stored_keys(block.swapped_keys[query])
    by_pair = _split(_partition_of(pair_keys, partitions), partitions, key=pair_keys, row=block.rows)
    by_query = _split(_partition_of(queries, partitions), partitions, key=queries, row=block.rows[query])
    by_prompt = _split(_partition_of(prompt_keys, partitions), partitions, key=prompt_keys)
    return [{"pairs": a, "queries": b, "prompts": c} for a, b, c in zip(by_pair, by_query, by_prompt)]


@dataclass
class PairPartition:
    """One reducer's answer: the rows to flag and its prompt counts."""

    duplicate_rows: np.ndarray
    conflicting_rows: np.ndarray
    rows: int
    distinct_prompts: int


def reduce_pairs(parts: Sequence[dict[str, dict[str, np.ndarray]]]) -> PairPartition:
    """Duplicates (not the smallest row of their key) and conflicts (a smaller row holds the swap)."""
    keys = np.concatenate([p["pairs"]["key"] for p in parts]) if parts else np.zeros(0, _U64)
    rows = np.concatenate([p["pairs"]["row"] for p in parts]) if parts else np.zeros(0, np.int64)
    order = np.lexsort((rows, keys))
    keys, rows = keys[order], rows[order]
    first = np.r_[True, keys[1:] != keys[:-1]] if keys.size else np.zeros(0, dtype=bool)
    unique_keys, first_rows = keys[first], rows[first]
    q_keys = np.concatenate([p["queries"]["key"] for p in parts]) if parts else np.zeros(0, _U64)
    q_rows = np.concatenate([p["queries"]["row"] for p in parts]) if parts else np.zeros(0, np.int64)
    at = np.minimum(np.searchsorted(unique_keys, q_keys), max(unique_keys.size - 1, 0))
    found = (unique_keys[at] == q_keys) if unique_keys.size else np.zeros(q_keys.size, dtype=bool)
    conflicting = q_rows[found & (first_rows[at] < q_rows)] if unique_keys.size else q_rows[:0]
    prompts = np.concatenate([p["prompts"]["key"] for p in parts]) if parts else np.zeros(0, _U64)
    return PairPartition(np.sort(rows[~first]), np.sort(conflicting), int(rows.size), int(np.unique(prompts).size))


# --------------------------------------------------------------------------- near-duplicate prompts


def split_prompts(block: DigestBlock, partitions: int) -> list[dict[str, np.ndarray]]:
    """One block's prompt digests by partition, each with its signature row (or -1)."""
    signatures = np.zeros((block.prompt_rows.size, block.signatures.shape[1]), np.uint8)
    signed = block.signature_rows >= 0
    signatures[signed] = block.signatures[block.signature_rows[signed]]
    return _split(_partition_of(block.prompt_digests, partitions), partitions, digest=block.prompt_digests,
                  row=block.prompt_rows, signed=signed, signature=signatures)


def reduce_prompts(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, Any]:
    """The first row of each distinct prompt that has words, with its signature, and the counts."""
    digest = np.concatenate([p["digest"] for p in parts])
    row = np.concatenate([p["row"] for p in parts])
    order = np.lexsort((row, digest))
    digest = digest[order]
    first = order[np.r_[True, digest[1:] != digest[:-1]]] if digest.size else order
    signed = np.concatenate([p["signed"] for p in parts])[first]
    signatures = np.concatenate([p["signature"] for p in parts])[first[signed]]
    return {"row": row[first[signed]], "signature": signatures, "seen": int(row.size), "distinct": int(first.size)}


def split_bands(prompts: dict[str, Any], partitions: int) -> list[dict[str, np.ndarray]]:
    """Every (band, band key) of the distinct prompts to one partition, with row and signature."""
    signatures = prompts["signature"]
    n, bands = signatures.shape[0], signatures.shape[1] // 4
    band_keys = np.ascontiguousarray(signatures).view(np.uint32).reshape(n, bands)
    band = np.repeat(np.arange(bands, dtype=np.int64)[None, :], n, axis=0).ravel()
    key = band_keys.ravel()
    owner = np.repeat(np.arange(n), bands)
    bucket = (band.astype(np.uint64) << _U64(32)) | key.astype(np.uint64)
    return _split(_partition_of(bucket, partitions), partitions, bucket=bucket, row=prompts["row"][owner],
                  signature=signatures[owner])


def band_edges(parts: Sequence[dict[str, np.ndarray]], accept: float) -> np.ndarray:
    """(k, 2) verified edges: neighbours by row within each bucket whose signatures agree enough."""
    bucket = np.concatenate([p["bucket"] for p in parts])
    row = np.concatenate([p["row"] for p in parts])
    order = np.lexsort((row, bucket))
    bucket, row = bucket[order], row[order]
    hit = np.flatnonzero(bucket[1:] == bucket[:-1])
    if not hit.size:
        return np.zeros((0, 2), dtype=np.int64)
    signatures = np.concatenate([p["signature"] for p in parts])[order]
    matches = (signatures[hit] == signatures[hit + 1]).mean(axis=1)
    accepted = hit[jaccard_estimate(matches) >= accept]
    return np.stack([row[accepted], row[accepted + 1]], axis=1)


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


class InProcessShuffle:
    """The shuffle in this process: split every block, hand each reducer its parts."""

    def shuffle(self, split: Callable[[Any, int], list[Any]], reduce: Callable[[list[Any]], Any],
                blocks: Sequence[Any], partitions: int, fetch: bool = True) -> list[Any]:
        parts = [split(block, partitions) for block in blocks]
        return [reduce([p[i] for p in parts]) for i in range(partitions)]


@dataclass
class PartitionedResult:
    """The dataset-wide findings, as the local tables give them."""

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


class _BandEdges:
    """`band_edges` with its threshold bound (a picklable callable)."""

    def __init__(self, accept: float) -> None:
        self.accept = accept

    def __call__(self, parts: list[dict[str, np.ndarray]]) -> np.ndarray:
        return band_edges(parts, self.accept)


def partitioned_dataset_checks(blocks: Sequence[Any], partitions: int, *, threshold: float = 0.8,
                               num_perm: int = 64, shuffler: Shuffler | None = None) -> PartitionedResult:
    """duplicate_pair, conflicting_pair and near-duplicate prompt groups over `blocks` (DigestBlocks,
    or the engine's references to them) by hash partitioning; see the module doc."""
    shuffler = shuffler or InProcessShuffle()
    pairs: list[PairPartition] = shuffler.shuffle(split_pairs, reduce_pairs, blocks, partitions)
    firsts = shuffler.shuffle(split_prompts, reduce_prompts, blocks, partitions, fetch=False)
    edges = shuffler.shuffle(split_bands, _BandEdges(accept_threshold(threshold, num_perm)), firsts, partitions)
    counts = shuffler.shuffle(_counts_split, _counts_reduce, firsts, 1)[0]
    return PartitionedResult(
        duplicate_rows=np.sort(np.concatenate([p.duplicate_rows for p in pairs])),
        conflicting_rows=np.sort(np.concatenate([p.conflicting_rows for p in pairs])),
        rows=sum(p.rows for p in pairs),
        distinct_prompts=sum(p.distinct_prompts for p in pairs),
        near_duplicate_groups=groups_from_edges(np.concatenate(edges) if edges else np.zeros((0, 2), np.int64)),
        prompts_seen=counts[0],
        distinct_prompt_texts=counts[1],
    )


def _counts_split(prompts: dict[str, Any], partitions: int) -> list[tuple[int, int]]:
    return [(prompts["seen"], prompts["distinct"])]


def _counts_reduce(parts: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


class PartitionedMerge:
    """`checks.merge.DatasetMerge`'s interface over answers computed beforehand by partitioning
    (`result`, set by the caller's first pass): a chunk's flags are looked up by row ordinal, so
    this process keeps only the flagged rows and the near-duplicate groups."""

    def __init__(self, near_duplicate_threshold: float, result: PartitionedResult | None = None) -> None:
        self.threshold = near_duplicate_threshold
        self._result = result

    @property
    def result(self) -> PartitionedResult:
        if self._result is None:
            raise RuntimeError("PartitionedMerge used before its first pass computed the answers")
        return self._result

    @result.setter
    def result(self, value: PartitionedResult) -> None:
        self._result = value

    def merge_chunk(self, source_file: str, lines: np.ndarray, ordinals: np.ndarray, digests: Any
                    ) -> tuple[np.ndarray, np.ndarray]:
        ordinals = np.asarray(ordinals, dtype=np.int64)
        return member(ordinals, self.result.duplicate_rows), member(ordinals, self.result.conflicting_rows)

    def near_duplicate_clusters(self) -> list[list[int]]:
        return self.result.near_duplicate_groups


def member(values: np.ndarray, sorted_rows: np.ndarray) -> np.ndarray:
    """Which of `values` are in `sorted_rows` (ascending)."""
    if not sorted_rows.size:
        return np.zeros(values.size, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_rows, values), sorted_rows.size - 1)
    return sorted_rows[at] == values
