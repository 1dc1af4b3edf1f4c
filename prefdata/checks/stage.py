"""`CheckChunk`: the per-record half of the checked-row stream (checks.stream) as one engine stage
(see prefdata.engine.local).

For one chunk of raw input: parse its records (JSON lines are parsed here, from their bytes),
normalize and tokenize them (prefdata.tokenize.batch), the pair's own checks (text, tokens, prompt
leak) and the digests the dataset-wide checks need (prefdata.checks.digests). What depends on other
chunks -- where a byte-range chunk's lines sit in its file, duplicates, conflicts, near-duplicate
prompts, the policy's verdict on all of it -- is left to the main process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from prefdata.checks.checker import pair_flags
from prefdata.checks.dataset import PromptLeakIndex
from prefdata.checks.digests import PairDigests, pair_digests
from prefdata.checks.policy import Policy
from prefdata.core.records import Pair, RawRecord, ScoredSummary, TokenizedPair
from prefdata.io.chunks import Chunk, RangeChunk, chunk_records, exact_record, line_count, range_data
from prefdata.sets.decontaminate import BenchmarkIndex
from prefdata.sets.mix import SOURCE_COLUMN, sampled_positions
from prefdata.sets.pairing import PairingSettings
from prefdata.tokenize.batch import normalize_and_tokenize
from prefdata.tokenize.settings import TokenizeSettings

if TYPE_CHECKING:  # type only: the tokenizer modules load with a tokenizer (text-only start-up)
    from prefdata.tokenize.pairs import PairTokenizer


@dataclass
class RecordResult:
    """One row of a chunk: a pair, a quarantined record, or an unpaired record of scored
    completions (`pair` and `error` None). Of a pair, `raw` keeps only where it came from (the pair
    has the rest); of a quarantined record, exactly what the reader gives (its raw text included).
    Each row has its own `raw` (lines are placed per row)."""

    raw: RawRecord
    pair: Pair | None  # None: quarantined for `error`, or unpaired
    tokenized: TokenizedPair | None
    flags: list[str]  # pair_flags
    error: str | None = None
    unknown_shape: bool = False  # the error says "not a preference shape" (for the KTO/SFT check)
    scored: ScoredSummary | None = None  # on the first row of a record of scored completions

    @property
    def unpaired(self) -> bool:
        return self.pair is None and self.error is None

    @property
    def quarantined(self) -> bool:
        return self.pair is None and self.error is not None


@dataclass
class CheckedChunk:
    """A chunk's rows in order (a record of scored completions may give several, or one unpaired);
    a RangeChunk's lines are numbered from 1 within it."""

    records: list[RecordResult]
    pair_index: np.ndarray  # (p,) int64 positions of the pairs in `records`
    digests: PairDigests  # of those pairs, in order
    line_count: int  # lines of a RangeChunk (blank ones included), 0 for other chunks


@dataclass
class CheckChunk:
    """The stage: `run(chunk)` -> CheckedChunk. `pair_tokenizer`: None checks text only."""

    pair_tokenizer: PairTokenizer | None
    settings: TokenizeSettings
    policy: Policy
    leak_index: PromptLeakIndex | None = None
    benchmarks: BenchmarkIndex | None = None  # --decontaminate-against
    pairing: PairingSettings = field(default_factory=PairingSettings)  # scored completions -> pairs
    made_in: int = field(default_factory=os.getpid)  # the process that made the stage

    def setup(self) -> None:
        if os.getpid() != self.made_in:
            # A worker: one tokenizer thread per process, the processes are the parallelism. (Run
            # where it was made, the tokenizer keeps its threads and the caller's environment stays.)
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        if self.pair_tokenizer is not None:
            self.pair_tokenizer.setup()

    def run(self, chunk: Chunk) -> CheckedChunk:
        data = range_data(chunk) if isinstance(chunk, RangeChunk) else None
        raws: list[RawRecord] = []
        spans: list[tuple[int, int]] = []
        for raw, offset, length in chunk_records(chunk, data):
            raws.append(raw)
            spans.append((offset, length))
        positions = range(len(raws))
        selection = chunk.selection
        if selection is not None:  # a mixture: only the sampled records are input rows (prefdata.sets.mix)
            positions = sampled_positions(selection, len(raws))
            raws = [raws[i] for i in positions]
        records: list[RecordResult] = []
        pair_index: list[int] = []
        rows = normalize_and_tokenize(raws, self.pair_tokenizer, self.settings, self.pairing)
        for at, done in enumerate(rows):  # `at`: the row; `done.record`: its record among `raws`
            raw = raws[done.record]
            if done.error is not None:
                # The fast parse keeps no raw text: quarantine.jsonl and the report want the exact record.
                position = positions[done.record]
                exact = exact_record(chunk, position, raw.source_line, spans[position], data=data)
                records.append(RecordResult(exact, None, None, [], done.error, done.unknown_shape))
                continue
            where = RawRecord(raw.source_file, raw.source_line)
            if done.pair is None:  # scored completions that made no pair
                records.append(RecordResult(where, None, None, [], scored=done.scored))
                continue
            if selection is not None:
                _tag_source(done.pair, selection.source)
            # Every pair of a record of scored completions is checked on its own (benchmark_overlap included).
            flags = pair_flags(done.pair, done.tokenized, self.policy, self.leak_index, self.benchmarks)
            records.append(RecordResult(where, done.pair, done.tokenized, flags, scored=done.scored))
            pair_index.append(at)
        pairs = [records[i].pair for i in pair_index]
        return CheckedChunk(
            records=records,
            pair_index=np.array(pair_index, dtype=np.int64),
            digests=pair_digests(pairs),  # type: ignore[arg-type]
            line_count=line_count(data) if data is not None else 0,
        )


def _tag_source(pair: Pair, source: str) -> None:
    """The mixture's `source` column; a pass-through column of that name is kept as `raw_source`."""
    extra = pair.extra
    if SOURCE_COLUMN in extra:
        extra["raw_source"] = extra.pop(SOURCE_COLUMN)
    extra[SOURCE_COLUMN] = source
