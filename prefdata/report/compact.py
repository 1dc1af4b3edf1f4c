"""What the report keeps of one row: its content keys and hash, a one-line excerpt, its token
lengths, and CompactRows, the array form of a run of rows checked elsewhere (e.g. in worker processes)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

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
    # pair whose key is below the sample's current cut-off (`SimilaritySample.cutoff()`) and that
    # can be in the final sample (a pair missing here is skipped).
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


class FlaggedRows:
    """ReportBuilder.flagged: (digest, file id, line, flags, severity, outcome, detail) per flagged
    row, in order (report.sections._flagged_rows reads them), held in flat arrays.

    A large dirty dataset keeps up to MAX_FLAGGED_ROWS of these until the report is built: as
    tuples of Python strings they cost ~350 bytes a row, and, made while each shard's rows from the
    workers were alive, they pinned those rows' freed memory. Here: the digest as 8 bytes, the
    (flags, severity, outcome) triple as a code, the detail as UTF-8 bytes. A row that does not fit
    (a digest that is not 16 hex digits, a line that is not an int) is kept as its tuple."""

    def __init__(self) -> None:
        self._digest = array("Q")
        self._file = array("I")
        self._line = array("q")
        self._verdict = array("I")
        self._verdicts: dict[tuple[Any, ...], int] = {}
        self._verdict_list: list[tuple[Any, ...]] = []
        self._text = bytearray()
        self._ends = array("Q")
        self._none_details: set[int] = set()
        self._odd: dict[int, tuple[Any, ...]] = {}

    def __len__(self) -> int:
        return len(self._digest)

    def append(self, row: tuple[Any, ...]) -> None:
        digest, file_id, line, flags, severity, outcome, detail = row
        index = len(self._digest)
        fits = (type(digest) is str and len(digest) == 16 and digest == digest.lower() and _is_hex(digest)
                and type(line) is int and -(1 << 63) <= line < 1 << 63 and type(file_id) is int
                and 0 <= file_id < 1 << 32 and (detail is None or type(detail) is str))
        if not fits:
            self._odd[index] = row
            digest, file_id, line, detail = "0" * 16, 0, 0, None
        verdict = (tuple(flags), severity, outcome)
        code = self._verdicts.get(verdict)
        if code is None:
            code = self._verdicts[verdict] = len(self._verdict_list)
            self._verdict_list.append(verdict)
        self._digest.append(int(digest, 16))
        self._file.append(file_id)
        self._line.append(line)
        self._verdict.append(code)
        if detail is None:
            self._none_details.add(index)
        else:
            self._text += detail.encode("utf-8", "surrogatepass")
        self._ends.append(len(self._text))

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        start = 0
        for index in range(len(self._digest)):
            end = self._ends[index]
            odd = self._odd.get(index)
            if odd is not None:
                yield odd
            else:
                flags, severity, outcome = self._verdict_list[self._verdict[index]]
                detail = None if index in self._none_details else self._text[start:end].decode("utf-8", "surrogatepass")
                yield (f"{self._digest[index]:016x}", self._file[index], self._line[index], flags, severity, outcome,
                       detail)
            start = end


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
