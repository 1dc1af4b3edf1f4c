"""Check one chunk of raw input without a tokenizer: the per-record work of text-level `validate`.

Runs in a worker process (or in-process): parse, normalize, the pair's own flags (text checks,
pre-tokenized truncation, prompt leak), the digests the dataset-wide checks and the report key on,
character lengths, and the MinHash signatures of the prompts. Everything that depends on earlier
chunks (duplicates, conflicts, the similarity sample, exact-duplicate prompts) is left to the
main process, which merges the chunks in input order (`text_validate`).

The result is compact: numpy arrays per record or per pair, plus detail only for the few records
that need it (quarantined ones, pre-tokenized ones, similarity-sample candidates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefdata import flags as F
from prefdata.checks.pair import completion_content, ids_mode, similarity, text_flags, token_flags
from prefdata.checks.dataset import PromptLeakIndex, _PACK3, _xxh, first_occurrences, pair_digests_and_key
from prefdata.errors import RecordError, UnknownShapeError
from prefdata.io.formats import normalize_record
from prefdata.checks.minhash import prompt_digest, prompt_signatures
from prefdata.checks.policy import Policy
from prefdata.records import Pair
from prefdata.report.compact import TokenLengths, excerpt, token_lengths
from prefdata.report.similarity import LazySimilarity
from prefdata.io.chunks import Chunk, RangeChunk, chunk_records, line_count, range_data
from prefdata.tokenize.pairs import TokenizeSettings, truncate_pair

FLAG_BIT = {flag: 1 << i for i, flag in enumerate(F.ALL_FLAGS)}


def flags_of(bits: int) -> list[str]:
    """The flag names in a FLAG_BIT mask, in flags.ALL_FLAGS order."""
    return [flag for flag in F.ALL_FLAGS if bits & FLAG_BIT[flag]]


@dataclass
class ScanSettings:
    """What every chunk is checked with (set once per worker process)."""

    policy: Policy
    tokenize: TokenizeSettings
    leak_index: PromptLeakIndex | None = None


@dataclass
class ChunkScan:
    """The compact result of one chunk: n records, p of them pairs, m pairs with a prompt."""

    lines: np.ndarray  # (n,) int64 source line of each record (of a RangeChunk: from 1 within it)
    flag_bits: np.ndarray  # (n,) uint32 FLAG_BIT mask of the pair's own flags (0 when quarantined)
    quarantined: list[tuple[int, str, bool]]  # (position, error, unknown shape), ascending
    pair_index: np.ndarray  # (p,) int64 positions of the pairs
    prompt_keys: np.ndarray  # (p,) uint64 digests as dataset_checks.pair_digests_and_key
    pair_keys: np.ndarray  # (p,) uint64
    first_prompts: np.ndarray  # (p,) bool dataset_checks.first_occurrences of prompt_keys
    first_pairs: np.ndarray  # (p,) bool ... of pair_keys
    swapped_keys: np.ndarray  # (p,) uint64 pair key with the halves swapped (0 when they are equal)
    halves_differ: np.ndarray  # (p,) bool chosen digest != rejected digest
    lengths: np.ndarray  # (p, 3) int64 characters of prompt, chosen, rejected
    prompt_positions: np.ndarray  # (m,) int64 positions of the pairs with a non-empty prompt
    prompt_digests: np.ndarray  # (m,) uint64 minhash.prompt_digest
    first_digests: np.ndarray  # (m,) bool first_occurrences of prompt_digests
    signature_rows: np.ndarray  # (m,) int64 row in `signatures`; -1: no word, or not first here
    signatures: np.ndarray  # (s, num_perm) uint8
    halves: dict[int, tuple[Any, Any] | float] = field(default_factory=dict)  # similarity candidates
    tokens: dict[int, TokenLengths] = field(default_factory=dict)  # pre-tokenized pairs
    excerpts: list[str] | None = None  # report.excerpt(prompt) per record, when asked for
    line_count: int = 0  # lines in a RangeChunk (blank ones included)
    spans: np.ndarray | None = None  # (n, 2) int64 of a RangeChunk: each record's (offset, length)


def scan_chunk(chunk: Chunk, settings: ScanSettings, sample_cutoff: int, want_excerpts: bool) -> ChunkScan:
    """Check every record of `chunk` (see the module doc).

    `sample_cutoff`: pairs whose key is below it come back with the halves the similarity sample
    compares. `want_excerpts`: return the prompt excerpt of every record."""
    policy, leak_index, tokenize = settings.policy, settings.leak_index, settings.tokenize
    lines: list[int] = []
    bits: list[int] = []
    quarantined: list[tuple[int, str, bool]] = []
    pairs: list[Pair] = []
    pair_index: list[int] = []
    keys: list[tuple[int, int, int, int]] = []
    swapped: list[int] = []
    lengths: list[int] = []
    tokens: dict[int, TokenLengths] = {}
    excerpts: list[str] | None = [] if want_excerpts else None
    bit = FLAG_BIT
    data = range_data(chunk) if isinstance(chunk, RangeChunk) else None
    spans: list[int] = []
    for position, (raw, offset, length) in enumerate(chunk_records(chunk, data)):
        lines.append(raw.source_line)
        spans += (offset, length)
        try:
            if raw.error is not None:
                raise RecordError(raw.error)
            pair = normalize_record(raw)
        except UnknownShapeError as exc:
            quarantined.append((position, str(exc), True))
        except RecordError as exc:
            quarantined.append((position, str(exc), False))
        else:
            # PairChecker.check's sequence, up to the dataset-wide checks.
            found = pair.flags + text_flags(pair, policy)
            if pair.chosen_ids is not None:  # pre-tokenized: token checks on the truncated ids
                tokenized = truncate_pair(pair.prompt_ids, pair.chosen_ids, pair.rejected_ids, tokenize, None)
                found = token_flags(tokenized, found)
                tokens[position] = token_lengths(tokenized)
            if leak_index is not None and leak_index.contains_pair(pair):
                found.append(F.PROMPT_LEAK)
            mask = 0
            for flag in found:
                mask |= bit[flag]
            bits.append(mask)
            digests = pair_digests_and_key(pair)
            hp, hc, hr, _ = digests
            keys.append(digests)
            swapped.append(_xxh(_PACK3(hp, hr, hc)) if hc != hr else 0)
            lengths += (len(pair.prompt), len(pair.chosen), len(pair.rejected))
            pairs.append(pair)
            pair_index.append(position)
            if excerpts is not None:
                excerpts.append(excerpt(pair.prompt))
            continue
        bits.append(0)
        if excerpts is not None:
            excerpts.append("")

    key_array = np.array(keys, dtype=np.uint64).reshape(-1, 4)
    hc, hr = key_array[:, 1], key_array[:, 2]
    positions = np.array(pair_index, dtype=np.int64)
    pair_keys = np.ascontiguousarray(key_array[:, 3])
    below = np.arange(len(pairs)) if sample_cutoff >= 1 << 64 else np.flatnonzero(pair_keys < np.uint64(sample_cutoff))
    halves = {pair_index[i]: _halves(pairs[i]) for i in below.tolist()}
    prompted = [i for i, pair in enumerate(pairs) if pair.prompt]
    digests, first_digests, signature_rows, signatures = _prompt_signatures([pairs[i].prompt for i in prompted])
    prompt_keys = np.ascontiguousarray(key_array[:, 0])
    return ChunkScan(
        line_count=line_count(data) if data is not None else 0,
        spans=np.array(spans, dtype=np.int64).reshape(-1, 2) if data is not None else None,
        lines=np.array(lines, dtype=np.int64),
        flag_bits=np.array(bits, dtype=np.uint32),
        quarantined=quarantined,
        pair_index=positions,
        prompt_keys=prompt_keys,
        pair_keys=pair_keys,
        first_prompts=first_occurrences(prompt_keys),
        first_pairs=first_occurrences(pair_keys),
        swapped_keys=np.array(swapped, dtype=np.uint64),
        halves_differ=hc != hr,
        lengths=np.array(lengths, dtype=np.int64).reshape(-1, 3),
        prompt_positions=positions[prompted],
        prompt_digests=digests,
        first_digests=first_digests,
        signature_rows=signature_rows,
        signatures=signatures,
        halves=halves,
        tokens=tokens,
        excerpts=excerpts,
    )


def _halves(pair: Pair) -> tuple[Any, Any] | float:
    """What the report's similarity sample compares for a pair (ReportBuilder._add_dataset_keys),
    or their similarity when the sample would measure it at once (long halves)."""
    if ids_mode(pair):
        halves = pair.chosen_ids or [], pair.rejected_ids or []
    else:
        halves = completion_content(pair, "chosen")[0], completion_content(pair, "rejected")[0]
    if len(halves[0]) + len(halves[1]) > LazySimilarity.DEFER_CHARS:
        return similarity(*halves)
    return halves


def _prompt_signatures(prompts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(digests, first occurrences, signature rows, signatures): only the first prompt of each
    digest here is hashed."""
    digests = np.array([prompt_digest(prompt) for prompt in prompts], dtype=np.uint64)
    first = first_occurrences(digests)
    firsts = np.flatnonzero(first)
    has_words, signatures = prompt_signatures([prompts[i].lower() for i in firsts.tolist()])
    rows = np.full(len(prompts), -1, dtype=np.int64)
    rows[firsts[has_words]] = np.arange(int(has_words.sum()))
    return digests, first, rows, signatures
