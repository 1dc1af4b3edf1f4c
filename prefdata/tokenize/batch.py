"""Normalize a batch of raw records and tokenize their pairs in one batched tokenizer call.

The per-record half of ingest (it runs in the engine's workers): a record either becomes a pair
with its final token ids, or carries the one-line reason it must be quarantined.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from prefdata.errors import RecordError, UnknownShapeError
from prefdata.io.formats import normalize_record
from prefdata.records import Pair, RawRecord, TokenizedPair
from prefdata.tokenize.pairs import PairTokenizer, TokenizeSettings, truncate_pair


@dataclass
class ProcessedRecord:
    """One record after normalize and tokenize. `pair` is None when it must be quarantined."""

    pair: Pair | None
    tokenized: TokenizedPair | None
    error: str | None = None
    unknown_shape: bool = False  # the error says "not a preference shape" (for the KTO/SFT check)


def normalize_and_tokenize(
    records: list[RawRecord], pair_tokenizer: PairTokenizer | None, settings: TokenizeSettings
) -> list[ProcessedRecord]:
    """Normalize every record and tokenize the pairs in one batched call."""
    results: list[ProcessedRecord] = []
    pairs: list[Pair] = []
    for raw in records:
        if raw.error is not None:
            results.append(ProcessedRecord(None, None, raw.error))
            continue
        try:
            pair = normalize_record(raw)
        except UnknownShapeError as exc:
            results.append(ProcessedRecord(None, None, str(exc), unknown_shape=True))
            continue
        except RecordError as exc:
            results.append(ProcessedRecord(None, None, str(exc)))
            continue
        results.append(ProcessedRecord(pair, None))
        pairs.append(pair)

    if pair_tokenizer is not None:
        tokenized: list[TokenizedPair | RecordError | None] = list(pair_tokenizer.tokenize_pairs_or_errors(pairs))
    else:  # without a tokenizer only pre-tokenized rows get token-level checks
        tokenized = [
            truncate_pair(p.prompt_ids, p.chosen_ids, p.rejected_ids, settings, None) if p.is_pretokenized else None
            for p in pairs
        ]
    it = iter(tokenized)
    for result in results:
        if result.pair is None:
            continue
        token_pair = next(it)
        if isinstance(token_pair, RecordError):  # e.g. the chat template refuses the roles
            result.pair, result.error = None, str(token_pair)
        elif token_pair is not None:
            result.tokenized = compact_ids(token_pair)
    return results


def compact_ids(tokenized: TokenizedPair) -> TokenizedPair:
    """The same pair with its id lists as array('i') (token ids are below 2**31).

    Ids then cross the process boundary as one bytes copy each instead of hundreds of pickled ints,
    and the Arrow writer and the content digest read them without per-element work."""
    tokenized.prompt_ids = array("i", tokenized.prompt_ids)  # type: ignore[assignment]
    tokenized.chosen_ids = array("i", tokenized.chosen_ids)  # type: ignore[assignment]
    tokenized.rejected_ids = array("i", tokenized.rejected_ids)  # type: ignore[assignment]
    return tokenized
