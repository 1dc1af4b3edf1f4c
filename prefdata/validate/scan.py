"""Check one chunk of raw input without a tokenizer: the per-record work of text-level `validate`.

Runs in a worker process (or in-process): parse, normalize, read the images of image pairs (a
missing or broken one quarantines its record, as in `prepare`), the pair's own flags (text checks,
pre-tokenized truncation, prompt leak, benchmark overlap), the digests the dataset-wide checks and
the report key on, character lengths, the images' facts (report.images), and the MinHash
signatures of the prompts. Everything that depends on earlier
chunks (duplicates, conflicts, the similarity sample, exact-duplicate prompts) is left to the
main process, which merges the chunks in input order (prefdata.validate.merge).

The result is compact: numpy arrays per record or per pair, plus detail only for the few records
that need it (quarantined ones, pre-tokenized ones, similarity-sample candidates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefdata.checks.checker import pair_flags
from prefdata.checks.dataset import PromptLeakIndex, pair_digests_and_key
from prefdata.checks.digests import PairDigests, pair_digests
from prefdata.checks.pair import similarity
from prefdata.checks.policy import Policy
from prefdata.core import flags as F
from prefdata.core.errors import RecordError, UnknownShapeError
from prefdata.core.records import Pair, ScoredSummary
from prefdata.io.chunks import Chunk, RangeChunk, chunk_records, line_count, range_data
from prefdata.io.images import load_pair_images
from prefdata.report.compact import excerpt, sample_halves, token_row
from prefdata.report.images import ImageFacts, ImageFactsCollector
from prefdata.sets.decontaminate import BenchmarkIndex
from prefdata.sets.pairing import PairingSettings
from prefdata.sets.scored import record_pairs
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.truncate import truncate_pair

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
    benchmarks: BenchmarkIndex | None = None  # --decontaminate-against
    pairing: PairingSettings = field(default_factory=PairingSettings)  # scored completions -> pairs


@dataclass
class ChunkScan:
    """The compact result of one chunk: n rows, p of them pairs. A row is a record, or one pair of
    a record of scored completions (or its one unpaired row)."""

    lines: np.ndarray  # (n,) int64 source line of each row (of a RangeChunk: from 1 within it)
    flag_bits: np.ndarray  # (n,) uint64 FLAG_BIT mask of the pair's own flags (0 when quarantined)
    quarantined: list[tuple[int, str, bool]]  # (position, error, unknown shape), ascending
    pair_index: np.ndarray  # (p,) int64 positions of the pairs
    digests: PairDigests  # of the pairs, for the dataset-wide merge (prefdata.checks.partitioned)
    lengths: np.ndarray  # (p, 3) int64 characters of prompt, chosen, rejected
    halves: dict[int, tuple[Any, Any] | float] = field(default_factory=dict)  # similarity candidates
    tokens: np.ndarray | None = None  # report.compact.token_row of each pre-tokenized pair, (k, 6)
    excerpts: list[str] | None = None  # report.excerpt(prompt) per record, when asked for
    line_count: int = 0  # lines in a RangeChunk (blank ones included)
    spans: np.ndarray | None = None  # (n, 2) int64 of a RangeChunk: each row's record's (offset, length)
    # Where rows are not records (scored completions): each row's record position in the chunk.
    record_of: np.ndarray | None = None
    unpaired: list[int] = field(default_factory=list)  # positions of unpaired rows
    scored: list[tuple[int, ScoredSummary]] = field(default_factory=list)  # (position, summary), as CompactRows
    images: ImageFacts | None = None  # of its pairs with images (report.images), as CompactRows


@dataclass
class ScanUnit:
    """A chunk to scan, with what the main process's report wanted when the chunk was handed out."""

    chunk: Chunk
    sample_cutoff: int  # pairs with a key below it bring their halves (the similarity sample)
    want_excerpts: bool  # the report still keeps prompt excerpts


@dataclass
class ScanChunks:
    """The engine stage (prefdata.engine.local): `run(unit)` -> ChunkScan."""

    settings: ScanSettings

    def setup(self) -> None:
        pass  # nothing to load: the settings came with the stage

    def run(self, unit: ScanUnit) -> "ChunkScan":
        return scan_chunk(unit.chunk, self.settings, unit.sample_cutoff, unit.want_excerpts)


class MeasureSimilarity:
    """The engine stage that measures the similarity sample: `run(halves)` -> checks.similarity of
    each (chosen, rejected)."""

    def setup(self) -> None:
        pass

    def run(self, halves: list[tuple[Any, Any]]) -> list[float]:
        return [similarity(chosen, rejected) for chosen, rejected in halves]


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
    lengths: list[int] = []
    tokens: list[tuple[int, int, int, bool, bool, bool]] = []
    excerpts: list[str] | None = [] if want_excerpts else None
    bit = FLAG_BIT
    data = range_data(chunk) if isinstance(chunk, RangeChunk) else None
    spans: list[int] = []
    record_of: list[int] = []
    unpaired: list[int] = []
    scored: list[tuple[int, ScoredSummary]] = []
    images = ImageFactsCollector()
    position = 0
    for record, (raw, offset, length) in enumerate(chunk_records(chunk, data)):
        made: list[Pair | None] = [None]
        error: tuple[str, bool] | None = None
        try:
            if raw.error is not None:
                raise RecordError(raw.error)
            result = record_pairs(raw, settings.pairing)
            load_pair_images(result.pairs, tokenize.images)  # image pairs: read here, in the worker
        except UnknownShapeError as exc:
            error = (str(exc), True)
        except RecordError as exc:
            error = (str(exc), False)
        else:
            made = list(result.pairs) or [None]
            if result.scored is not None:
                scored.append((position, result.scored))
        for pair in made:
            lines.append(raw.source_line)
            spans += (offset, length)
            record_of.append(record)
            if pair is None:  # quarantined, or scored completions that made no pair
                if error is not None:
                    quarantined.append((position, *error))
                else:
                    unpaired.append(position)
                bits.append(0)
                if excerpts is not None:
                    excerpts.append(excerpt(result.scored.prompt) if error is None and result.scored else "")
                position += 1
                continue
            # PairChecker.check's sequence, up to the dataset-wide checks.
            tokenized = None
            if pair.chosen_ids is not None:  # pre-tokenized: token checks on the truncated ids
                tokenized = truncate_pair(pair.prompt_ids, pair.chosen_ids, pair.rejected_ids, tokenize, None)
                tokens.append(token_row(tokenized))
            found = pair_flags(pair, tokenized, policy, leak_index, settings.benchmarks)
            mask = 0
            for flag in found:
                mask |= bit[flag]
            bits.append(mask)
            keys.append(pair_digests_and_key(pair))
            lengths += (len(pair.prompt), len(pair.chosen), len(pair.rejected))
            pairs.append(pair)
            pair_index.append(position)
            if pair.image_data:
                images.add(pair.image_data, None)  # no processor: no tokens per image
            if excerpts is not None:
                excerpts.append(excerpt(pair.prompt))
            position += 1

    digests = pair_digests(pairs, keys)
    below = (
        np.arange(len(pairs))
        if sample_cutoff >= 1 << 64
        else np.flatnonzero(digests.pair_keys < np.uint64(sample_cutoff))
    )
    return ChunkScan(
        line_count=line_count(data) if data is not None else 0,
        spans=np.array(spans, dtype=np.int64).reshape(-1, 2) if data is not None else None,
        lines=np.array(lines, dtype=np.int64),
        flag_bits=np.array(bits, dtype=np.uint64),
        quarantined=quarantined,
        pair_index=np.array(pair_index, dtype=np.int64),
        digests=digests,
        lengths=np.array(lengths, dtype=np.int64).reshape(-1, 3),
        halves={pair_index[i]: sample_halves(pairs[i]) for i in below.tolist()},
        tokens=np.array(tokens, dtype=np.int64).reshape(-1, 6),
        excerpts=excerpts,
        record_of=np.array(record_of, dtype=np.int64) if record_of and position != record_of[-1] + 1 else None,
        unpaired=unpaired,
        scored=scored,
        images=images.facts(),
    )
