"""Normalize a batch of raw records and tokenize their pairs in one batched tokenizer call.

The per-record half of the checked-row stream (prefdata.checks.stream), run in the engine's workers:
a record either becomes a pair with its final token ids, or carries the one-line reason it must be
quarantined. A record of scored completions (prefdata.sets.scored) becomes one result per pair it
makes, or one unpaired result.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from prefdata.core.errors import RecordError, UnknownShapeError
from prefdata.core.records import Pair, RawRecord, ScoredSummary, TokenizedPair
from prefdata.io.formats import check_vocabulary
from prefdata.io.images import load_pair_images
from prefdata.sets.pairing import PairingSettings
from prefdata.sets.scored import record_pairs
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.truncate import truncate_pair

if TYPE_CHECKING:  # type only: the tokenizer modules load with a tokenizer (text-only start-up)
    from prefdata.tokenize.pairs import PairTokenizer


@dataclass
class ProcessedRecord:
    """One row after normalize and tokenize: a pair, a record to quarantine (`pair` None, `error`),
    or a record of scored completions that made no pair (`pair` None, `scored.reason`)."""

    pair: Pair | None
    tokenized: TokenizedPair | None
    error: str | None = None
    unknown_shape: bool = False  # the error says "not a preference shape" (for the KTO/SFT check)
    record: int = 0  # position of the row's record in the batch (a record may give several rows)
    scored: ScoredSummary | None = None  # on the first row of a record of scored completions


def normalize_and_tokenize(
    records: list[RawRecord], pair_tokenizer: PairTokenizer | None, settings: TokenizeSettings,
    pairing: PairingSettings | None = None,
) -> list[ProcessedRecord]:
    """Normalize every record and tokenize the pairs in one batched call: the rows in input order
    (a record of scored completions gives one per pair, or one unpaired row)."""
    pairing = pairing or PairingSettings()
    results: list[ProcessedRecord] = []
    pairs: list[Pair] = []
    vocabulary = _vocabulary_size(pair_tokenizer)
    for position, raw in enumerate(records):
        if raw.error is not None:
            results.append(ProcessedRecord(None, None, raw.error, record=position))
            continue
        try:
            made = record_pairs(raw, pairing)
            for pair in made.pairs if vocabulary is not None else ():
                if pair.is_pretokenized:  # given ids the tokenizer does not know are quarantined
                    check_vocabulary(pair, vocabulary)
            load_pair_images(made.pairs, settings.images)  # image pairs: read here, in the worker
        except UnknownShapeError as exc:
            results.append(ProcessedRecord(None, None, str(exc), unknown_shape=True, record=position))
            continue
        except RecordError as exc:
            results.append(ProcessedRecord(None, None, str(exc), record=position))
            continue
        if not made.pairs:
            results.append(ProcessedRecord(None, None, record=position, scored=made.scored))
        for number, pair in enumerate(made.pairs):
            results.append(ProcessedRecord(pair, None, record=position, scored=made.scored if number == 0 else None))
            pairs.append(pair)

    if pair_tokenizer is not None:
        tokenized: list[TokenizedPair | RecordError | None] = list(pair_tokenizer.tokenize_pairs_or_errors(pairs))
    else:  # without a tokenizer only pre-tokenized rows get token-level checks
        tokenized = [
            truncate_pair(p.prompt_ids, p.chosen_ids, p.rejected_ids, settings, None) if p.is_pretokenized else None
            for p in pairs
        ]
    it = iter(tokenized)
    refused: dict[int, str] = {}  # record -> the first error of its pairs
    for result in results:
        if result.pair is None:
            continue
        token_pair = next(it)
        if isinstance(token_pair, RecordError):  # e.g. the chat template refuses the roles
            refused.setdefault(result.record, str(token_pair))
        elif token_pair is not None:
            result.tokenized = compact_ids(token_pair)
    if refused:  # a record one of whose pairs cannot be rendered is quarantined whole, as one row
        kept: list[ProcessedRecord] = []
        for result in results:
            if result.record not in refused:
                kept.append(result)
            elif not kept or kept[-1].record != result.record:
                kept.append(ProcessedRecord(None, None, refused[result.record], record=result.record))
        results = kept
    return results


def _vocabulary_size(pair_tokenizer: PairTokenizer | None) -> int | None:
    """len(tokenizer): how many ids the tokenizer knows (added tokens included); None without one."""
    if pair_tokenizer is None:
        return None
    pair_tokenizer.setup()
    tokenizer = getattr(pair_tokenizer.tokenizer, "tokenizer", pair_tokenizer.tokenizer)  # a processor's own
    try:
        return len(tokenizer)
    except TypeError:
        return None


def compact_ids(tokenized: TokenizedPair) -> TokenizedPair:
    """The same pair with its id lists as array('i') (token ids are below 2**31).

    Ids then cross the process boundary as one bytes copy each instead of hundreds of pickled ints,
    and the Arrow writer and the content digest read them without per-element work."""
    tokenized.prompt_ids = _as_array(tokenized.prompt_ids)  # type: ignore[assignment]
    tokenized.chosen_ids = _as_array(tokenized.chosen_ids)  # type: ignore[assignment]
    tokenized.rejected_ids = _as_array(tokenized.rejected_ids)  # type: ignore[assignment]
    return tokenized


def _as_array(ids: Sequence[int]) -> array:
    """array('i') of `ids`; one already (a huge text's, tokenize.pieces) is kept, not copied."""
    return ids if isinstance(ids, array) and ids.typecode == "i" else array("i", ids)
