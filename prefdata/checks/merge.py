"""The order-dependent step of the checked-row stream (checks.stream): dataset-wide checks, merged in input order.

Everything per pair (parse, normalize, tokenize, the pair's own flags, and the digests below) runs
in the engine's workers, chunk by chunk, in any order. What depends on the rows before a row --
`duplicate_pair`, `conflicting_pair` (first occurrence wins) and the MinHash table of
near-duplicate prompts -- is `DatasetMerge`, fed one chunk at a time in input order by `prepare`
and `validate` alike (`merge_pair` is the same step a row at a time, for rows checked in-process).
Only 64-bit digests and 64-byte signatures cross from the workers: the merge never re-reads text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prefdata.checks.dataset import _PACK3, DatasetWideChecks, _xxh, first_occurrences, pair_digests_and_key
from prefdata.checks.minhash import NearDuplicatePrompts, prompt_digest, prompt_signatures
from prefdata.core import flags as F
from prefdata.core.records import Pair

NEAR_DUPLICATE_BATCH = 4096  # prompts hashed at a time on the row-at-a-time path


@dataclass
class PairDigests:
    """What the merge needs of a chunk's p pairs (m of them with a prompt), computed in a worker."""

    prompt_keys: np.ndarray  # (p,) uint64, as checks.dataset.pair_digests_and_key
    pair_keys: np.ndarray  # (p,) uint64
    swapped_keys: np.ndarray  # (p,) uint64 pair key with the halves swapped (0 when they are equal)
    halves_differ: np.ndarray  # (p,) bool chosen digest != rejected digest
    first_prompts: np.ndarray  # (p,) bool first_occurrences of prompt_keys
    first_pairs: np.ndarray  # (p,) bool first_occurrences of pair_keys
    prompted: np.ndarray  # (m,) int64 indices of the pairs with a non-empty prompt
    prompt_digests: np.ndarray  # (m,) uint64 minhash.prompt_digest
    first_digests: np.ndarray  # (m,) bool first_occurrences of prompt_digests
    signature_rows: np.ndarray  # (m,) int64 row in `signatures`; -1: no word, or not first here
    signatures: np.ndarray  # (s, num_perm) uint8


def pair_digests(pairs: Sequence[Pair], keys: Sequence[tuple[int, int, int, int]] | None = None) -> PairDigests:
    """The digests of `pairs` (one chunk, in order); `keys`: their pair_digests_and_key, if known."""
    if keys is None:
        keys = [pair_digests_and_key(pair) for pair in pairs]
    key_array = np.array(keys, dtype=np.uint64).reshape(-1, 4)
    swapped = [_xxh(_PACK3(hp, hr, hc)) if hc != hr else 0 for hp, hc, hr, _ in keys]
    prompt_keys = np.ascontiguousarray(key_array[:, 0])
    pair_keys = np.ascontiguousarray(key_array[:, 3])
    prompted = [i for i, pair in enumerate(pairs) if pair.prompt]
    prompts = [pairs[i].prompt for i in prompted]
    digests = np.array([prompt_digest(prompt) for prompt in prompts], dtype=np.uint64)
    first_digests = first_occurrences(digests)
    # Only the first prompt of each digest here is hashed: a later copy needs no signature.
    firsts = np.flatnonzero(first_digests)
    has_words, signatures = prompt_signatures([prompts[i].lower() for i in firsts.tolist()])
    rows = np.full(len(prompts), -1, dtype=np.int64)
    rows[firsts[has_words]] = np.arange(int(has_words.sum()))
    return PairDigests(
        prompt_keys=prompt_keys,
        pair_keys=pair_keys,
        swapped_keys=np.array(swapped, dtype=np.uint64),
        halves_differ=key_array[:, 1] != key_array[:, 2],
        first_prompts=first_occurrences(prompt_keys),
        first_pairs=first_occurrences(pair_keys),
        prompted=np.array(prompted, dtype=np.int64),
        prompt_digests=digests,
        first_digests=first_digests,
        signature_rows=rows,
        signatures=signatures,
    )


class DatasetMerge:
    """Duplicate and conflicting pairs, and near-duplicate prompts, over the rows in input order.

    `merge_chunk` (a chunk's digests) and `merge_pair` (one pair) keep the same tables, so their
    answers do not depend on how the rows were cut into chunks. Row ordinals (the row's index in
    the input, quarantined rows included) are what `near_duplicate_clusters` reports back.
    """

    def __init__(self, near_duplicate_threshold: float, *, background: bool = False) -> None:
        self.dataset = DatasetWideChecks()
        self.near = NearDuplicatePrompts(threshold=near_duplicate_threshold, background=background)
        self._ordinals: list[int] = []  # prompts of merge_pair waiting for MinHash
        self._prompts: list[str] = []

    def merge_chunk(
        self, source_file: str, lines: np.ndarray, ordinals: np.ndarray, digests: PairDigests
    ) -> tuple[np.ndarray, np.ndarray]:
        """(duplicate_pair, conflicting_pair) masks of a chunk's pairs from `source_file`, at
        `lines` (final line numbers) and row `ordinals`."""
        self._flush()  # rows merged one at a time before this chunk come first
        duplicate, conflicting = self.dataset.observe_digests(
            source_file, lines, digests.prompt_keys, digests.pair_keys, digests.swapped_keys,
            digests.halves_differ, digests.first_prompts, digests.first_pairs,
        )
        self.near.add_signatures(
            np.asarray(ordinals, dtype=np.int64)[digests.prompted], digests.prompt_digests,
            digests.signature_rows, digests.signatures, digests.first_digests,
        )
        return duplicate, conflicting

    def merge_pair(self, ordinal: int, pair: Pair) -> list[str]:
        """The dataset-wide flags of one pair (flags.ALL_FLAGS order), the row `ordinal`."""
        if pair.prompt:
            self._ordinals.append(ordinal)
            self._prompts.append(pair.prompt)
            if len(self._prompts) >= NEAR_DUPLICATE_BATCH:
                self._flush()
        return self.dataset.observe(pair)

    def _flush(self) -> None:
        if self._prompts:
            self.near.add_batch(self._ordinals, self._prompts)
            self._ordinals, self._prompts = [], []

    def near_duplicate_clusters(self) -> list[list[int]]:
        """Groups of >= 2 row ordinals whose prompts are near-duplicates (NearDuplicatePrompts.clusters)."""
        self._flush()
        return self.near.clusters()


def dataset_flags(duplicate: bool, conflicting: bool) -> list[str]:
    """The flag names of `merge_chunk`'s answer for one pair."""
    if not (duplicate or conflicting):
        return []
    return [F.DUPLICATE_PAIR] * duplicate + [F.CONFLICTING_PAIR] * conflicting
