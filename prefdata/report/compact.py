"""What the report keeps of one row: its content keys and hash, a one-line excerpt, its token
lengths, and CompactRows, the array form of a run of rows checked elsewhere (e.g. in worker processes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import xxhash

from prefdata.checks.dataset import pair_digests_and_key
from prefdata.checks.pair import completion_content, ids_mode, similarity
from prefdata.core.records import Pair, ScoredSummary
from prefdata.report.images import ImageFacts
from prefdata.report.similarity import LazySimilarity

if TYPE_CHECKING:
    import numpy as np

    from prefdata.core.records import CheckedRow

EXCERPT_CHARS = 100
OUTCOMES = ("kept", "dropped", "quarantined", "unpaired")  # codes of CompactRows.outcome
SEVERITY_CODES = (None, "warn", "drop", "error")  # codes of CompactRows.severity


def report_keys(pair: Pair) -> tuple[int, int]:
    """(prompt key, pair key): the same whitespace-normalized digests the dataset-wide checks use,
    so "duplicate" means the same thing in the report as in the `duplicate_pair` flag."""
    keys = pair_digests_and_key(pair)
    return keys[0], keys[3]


def content_hash(pair: Pair) -> str:
    """Stable 16-hex-digit hash of a pair's content (whitespace-normalized prompt, chosen, rejected).

    It identifies a row independently of its position, so a baseline can tell new findings from old."""
    return f"{report_keys(pair)[1]:016x}"


def excerpt(text: str | None, limit: int = EXCERPT_CHARS) -> str:
    """One line, at most `limit` characters, for tables and annotations."""
    if not text:
        return ""
    flat = " ".join(text[: limit * 4].split())  # cut first: excerpts of long texts stay cheap
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def row_hash(row: "CheckedRow") -> str:
    if row.pair is not None:
        return content_hash(row.pair)
    # Quarantined: hash what was read (the same broken line gets the same hash wherever it moves).
    raw = row.raw.raw_text if row.raw.raw_text is not None else repr(row.raw.value)
    digest = xxhash.xxh3_64_intdigest((raw + "\x00" + str(row.error)).encode("utf-8", "surrogatepass"))
    return f"{digest:016x}"


@dataclass
class TokenLengths:
    """Token counts of one pair before truncation, and which parts truncation cut."""

    prompt: int
    chosen: int
    rejected: int
    cut_prompt: bool
    cut_chosen: bool
    cut_rejected: bool


def token_row(tok: Any) -> tuple[int, int, int, bool, bool, bool]:
    """The TokenLengths fields of a TokenizedPair, as one row of CompactRows.tokens."""
    return (tok.prompt_len_full, tok.chosen_len_full, tok.rejected_len_full, len(tok.prompt_ids) < tok.prompt_len_full,
            len(tok.chosen_ids) < tok.chosen_len_full, len(tok.rejected_ids) < tok.rejected_len_full)


def token_lengths(tok: Any) -> TokenLengths:
    """The report's view of a TokenizedPair: lengths before truncation, and what was cut."""
    return TokenLengths(*token_row(tok))


@dataclass
class CompactRows:
    """A run of consecutive records of one file, checked elsewhere (e.g. in worker processes).

    What `ReportBuilder.add` would take from each row, as arrays; the few rows the report describes
    one by one (flagged or quarantined) come back in full through `detail`."""

    source_file: str
    lines: "np.ndarray"  # source line of each record
    outcome: "np.ndarray"  # per record, an index into OUTCOMES
    severity: "np.ndarray"  # per record, an index into SEVERITY_CODES (0 for quarantined records)
    pair_index: "np.ndarray"  # positions of the records that are pairs (not quarantined)
    prompt_keys: "np.ndarray"  # per pair: the report's prompt and pair keys (report_keys)
    pair_keys: "np.ndarray"
    lengths: "np.ndarray"  # per pair: characters of prompt, chosen, rejected, shape (pairs, 3)
    detailed: list[int]  # positions of flagged or quarantined records, ascending
    detail: Callable[[int], "CheckedRow"]  # the full row at a position
    # The similarity sample's candidates: position -> the halves it compares, or their similarity
    # when they are longer than LazySimilarity.DEFER_CHARS (measured at once anyway). Must hold every
    # pair whose key is below the sample's current cut-off (`SimilaritySample.cutoff()`).
    halves: dict[int, tuple[Any, Any] | float] = field(default_factory=dict)
    excerpts: list[str] | None = None  # excerpt(prompt) per row ("" when quarantined), while needed
    # One row per tokenized pair, in order: its `token_row` (the TokenLengths fields), shape (k, 6).
    tokens: "np.ndarray | None" = None
    # (position, summary) of each record of scored completions, on its first row (prefdata.sets.pairing).
    scored: list[tuple[int, ScoredSummary]] = field(default_factory=list)
    # The images of its pairs that have some (report.images); None when none has.
    images: ImageFacts | None = None


def sample_halves(pair: Pair) -> tuple[Any, Any] | float:
    """What the report's similarity sample compares for a pair (ReportBuilder._add_dataset_keys),
    or their similarity when the sample would measure it at once (long halves): CompactRows.halves."""
    if ids_mode(pair):
        halves = pair.chosen_ids or [], pair.rejected_ids or []
    else:
        halves = completion_content(pair, "chosen")[0], completion_content(pair, "rejected")[0]
    if len(halves[0]) + len(halves[1]) > LazySimilarity.DEFER_CHARS:
        return similarity(*halves)
    return halves
