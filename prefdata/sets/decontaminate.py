"""`benchmark_overlap`: pairs that share an N-word run with a benchmark item (decontamination).

The convention is lm-evaluation-harness's (`lm_eval/decontamination/janitor.py`, the GPT-3 paper's
13-gram overlap): lowercase, delete punctuation, split on whitespace, compare runs of N = 13 words.
Two deliberate widenings, both toward catching more: Unicode letters are lowercased too (the Janitor
lowercases ASCII only), and Unicode punctuation (category P: curly quotes, dashes, ellipses) is
deleted along with ASCII's `string.punctuation`, so `don’t` and `don't` are the same word. Items
shorter than N words (but at least MIN_SHORT_WORDS) are matched whole: a prompt that contains the
entire item is contaminated, which an N-gram alone could never see.

Streaming and compact: the benchmark's word runs are 64-bit hashes in one sorted array, with the
index of the first item that has each run beside it (12 bytes per distinct run; the measured
figure is in bench/README.md). A run's hash is a polynomial over 64-bit word hashes (xxh3), so every
run of a text is two numpy operations away from a prefix sum, whatever its length, and the hashes
are the same in every process (Ray actors included). `BenchmarkIndex` is what the workers need;
`BenchmarkCatalog` (excerpts of the items, for the report) stays in the main process.
"""

from __future__ import annotations

import re
import string
import sys
import unicodedata
from array import array
from functools import cache
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import xxhash

from prefdata.core.errors import PrefdataError, RecordError
from prefdata.core.records import Pair, RawRecord

DEFAULT_NGRAM = 13  # lm-evaluation-harness / GPT-3
MIN_SHORT_WORDS = 8  # shorter items would match ordinary phrases ("what is the capital of")
# Fields a benchmark's text is found in without being named (open-instruct's decontamination lists
# the same fields per benchmark: MMLU/GSM8K `question`, MATH `problem`, HumanEval/IFEval `prompt`,
# AlpacaEval `instruction`, BBH `input`), first one present wins for each item.
COMMON_FIELDS = ("prompt", "question", "problem", "instruction", "input", "text")
EXCERPT_CHARS = 120
HALVES = ("prompt", "chosen", "rejected")

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd, so it has an inverse modulo 2**64
_INVERSE = np.uint64(pow(int(_MULTIPLIER), -1, 1 << 64))


_ASCII_PUNCTUATION = string.punctuation.encode("ascii")


@cache
def _punctuation_table() -> dict[int, None]:
    """Every punctuation character (ASCII and Unicode category P) mapped to deletion; built once
    per process, on the first non-ASCII text (a quarter of a second)."""
    table = {ord(c): None for c in string.punctuation}
    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code)).startswith("P"):
            table[code] = None
    return table


def normalize_words(text: str) -> list[str]:
    """The words runs are made of: lowercased, punctuation deleted, split on whitespace."""
    lowered = text.lower()
    if lowered.isascii():  # the common case, as bytes: several times faster than str.translate
        return lowered.encode("ascii").translate(None, _ASCII_PUNCTUATION).decode("ascii").split()
    return lowered.translate(_punctuation_table()).split()


def _word_hashes(words: Sequence[str]) -> np.ndarray:
    digest = xxhash.xxh3_64_intdigest
    return np.fromiter((digest(w.encode("utf-8", "surrogatepass")) for w in words), dtype=np.uint64, count=len(words))


# Characters normalized per step in `text_word_hashes`: a Python str per word costs ~60 bytes, so a
# 50 MB benchmark line as one list of words would take ~350 MB; a piece at a time, ~15 MB.
_WORDS_PIECE = 1 << 20
_WHITESPACE = re.compile(r"\s")  # str.isspace's characters, what str.split() splits on


def text_word_hashes(text: str) -> np.ndarray:
    """_word_hashes(normalize_words(text)), computed a piece of text at a time (pieces end at
    whitespace, so no word is cut): the words of a huge text never exist as one list."""
    if len(text) <= _WORDS_PIECE:
        return _word_hashes(normalize_words(text))
    pieces: list[np.ndarray] = []
    start = 0
    while start < len(text):
        end = start + _WORDS_PIECE
        space = _WHITESPACE.search(text, end) if end < len(text) else None
        end = space.start() if space else len(text)
        pieces.append(_word_hashes(normalize_words(text[start:end])))
        start = end
    return np.concatenate(pieces)


class _Powers:
    """M**i and M**-i modulo 2**64, grown on demand."""

    def __init__(self) -> None:
        self.up = np.ones(1, dtype=np.uint64)
        self.down = np.ones(1, dtype=np.uint64)

    def upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < n:
            size = max(n, 2 * len(self.up))
            self.up = np.cumprod(np.r_[np.uint64(1), np.full(size - 1, _MULTIPLIER)], dtype=np.uint64)
            self.down = np.cumprod(np.r_[np.uint64(1), np.full(size - 1, _INVERSE)], dtype=np.uint64)
        return self.up[:n], self.down[:n]


_POWERS = _Powers()


def run_hashes(word_hashes: np.ndarray, lengths: Iterable[int]) -> list[tuple[int, np.ndarray]]:
    """(k, hashes of every run of k consecutive words) for each k in `lengths`; a run's hash is
    Σ w[j]·M**(end-j), the same wherever the run sits. Wrap-around uint64 arithmetic is the point."""
    n = len(word_hashes)
    up, down = _POWERS.upto(n)
    with np.errstate(over="ignore"):
        prefix = np.r_[np.uint64(0), np.cumsum(word_hashes * down, dtype=np.uint64)]
        out = []
        for k in lengths:
            if k <= n:
                out.append((k, up[k - 1 :] * (prefix[k:] - prefix[: n - k + 1])))
    return out


def text_run_hashes(text: str, n: int) -> np.ndarray:
    """Hashes of every N-word run of `text` (empty when it has fewer words)."""
    runs = run_hashes(text_word_hashes(text), [n])
    return runs[0][1] if runs else np.zeros(0, dtype=np.uint64)


@dataclass(frozen=True)
class BenchmarkMatch:
    """Where a pair overlaps a benchmark: the benchmark (as given), the item's file and line (its
    1-based record index in Parquet/Arrow/Hub input), its 0-based ordinal among all benchmark items,
    the half that overlaps and the overlapping words (normalized)."""

    benchmark: str
    item_file: str
    item_line: int
    item: int
    half: str
    overlap: str

    def record(self) -> dict[str, Any]:
        """The dropped.jsonl / report form."""
        return {"benchmark": self.benchmark, "item_file": self.item_file, "item_line": self.item_line,
                "half": self.half, "overlap": self.overlap}


@dataclass
class BenchmarkIndex:
    """The benchmark's word runs, for the workers: sorted hashes, the first item having each, and
    where each item is. Pickled to every worker (Ray actor) once."""

    ngram: int
    completions: bool
    hashes: np.ndarray  # uint64, sorted, distinct
    first_item: np.ndarray  # uint32, per hash
    lengths: tuple[int, ...]  # run lengths indexed: N, and the lengths of short items matched whole
    names: list[str]  # benchmark paths as given
    item_source: np.ndarray  # uint32 per item: index into `files`
    item_line: np.ndarray  # int64 per item
    files: list[str]  # item source files (a directory benchmark has several)
    file_benchmark: list[int]  # per file: index into `names`

    @property
    def nbytes(self) -> int:
        """Bytes of the run table (hashes and first items), what grows with the benchmark."""
        return int(self.hashes.nbytes + self.first_item.nbytes)

    def halves(self) -> tuple[str, ...]:
        return HALVES if self.completions else HALVES[:1]

    def annotate(self, pairs: Sequence[Pair]) -> None:
        """Set `pair.benchmark_match` on each pair that shares a run with an item (else None).

        The prompt is looked at first, then chosen and rejected (with `completions`); the match
        named is the first overlapping run of the first half that has one."""
        for pair in pairs:
            pair.benchmark_match = self.match(pair)

    def match(self, pair: Pair) -> BenchmarkMatch | None:
        if not self.hashes.size:
            return None
        for half in self.halves():
            text = getattr(pair, half)
            if not text:
                continue
            words = normalize_words(text)
            if len(words) < self.lengths[0]:
                continue
            for k, runs in run_hashes(_word_hashes(words), self.lengths):
                at = np.searchsorted(self.hashes, runs)
                np.minimum(at, self.hashes.size - 1, out=at)
                hit = np.flatnonzero(self.hashes[at] == runs)
                if hit.size:
                    start = int(hit[0])
                    return self._match(int(self.first_item[at[start]]), half, " ".join(words[start : start + k]))
        return None

    def _match(self, item: int, half: str, overlap: str) -> BenchmarkMatch:
        source = int(self.item_source[item])
        return BenchmarkMatch(self.names[self.file_benchmark[source]], self.files[source], int(self.item_line[item]),
                              item, half, overlap)


@dataclass
class BenchmarkCatalog:
    """What the report says about the benchmarks: per benchmark its items and runs, and a short
    excerpt of every item (kept here, in the main process, never sent to the workers)."""

    ngram: int
    completions: bool
    fields: list[str] | None
    benchmarks: list[dict[str, Any]]  # path, items, items_indexed, items_short, items_without_text, runs
    runs: int  # distinct runs in the index
    index_bytes: int
    excerpts: list[str] = field(default_factory=list)  # per item

    def excerpt(self, item: int) -> str:
        return self.excerpts[item] if 0 <= item < len(self.excerpts) else ""

    def settings(self) -> dict[str, Any]:
        """The effective settings, for the manifest's config and the report."""
        return {"against": [b["path"] for b in self.benchmarks], "ngram": self.ngram, "completions": self.completions,
                "fields": self.fields, "min_short_words": MIN_SHORT_WORDS}


def build_benchmarks(
    paths: Sequence[str | Path], *, ngram: int = DEFAULT_NGRAM, fields: Sequence[str] | None = None,
    completions: bool = False,
) -> tuple[BenchmarkIndex, BenchmarkCatalog]:
    """Read every benchmark (files or directories in any format prefdata reads, or Hub ids
    `org/name:split`) into the index the workers match against and the catalog the report uses."""
    if ngram < 1:
        raise PrefdataError(f"--decontaminate-ngram must be at least 1, got {ngram}")
    if not paths:
        raise PrefdataError("--decontaminate-against needs at least one benchmark file")
    field_list = [f for f in (fields or []) if f] or None
    run_hash, run_item = array("Q"), array("I")
    lengths = {ngram}
    names: list[str] = []
    files: list[str] = []
    file_index: dict[str, int] = {}
    file_benchmark: list[int] = []
    item_source, item_line = array("I"), array("q")
    excerpts: list[str] = []
    stats: list[dict[str, Any]] = []
    for path in paths:
        bench = len(names)
        names.append(str(path))
        counts = {"path": str(path), "items": 0, "items_indexed": 0, "items_short": 0, "items_without_text": 0}
        for raw in _records(path):
            texts = _item_texts(raw, field_list)
            key = f"{bench}\x00{raw.source_file}"
            if key not in file_index:
                file_index[key] = len(files)
                files.append(raw.source_file)
                file_benchmark.append(bench)
            item = len(item_line)
            item_source.append(file_index[key])
            item_line.append(raw.source_line)
            excerpts.append(_excerpt(" ".join(texts)))
            counts["items"] += 1
            if not texts:
                counts["items_without_text"] += 1
                continue
            indexed = False
            for text in texts:
                words = text_word_hashes(text)
                k = len(words) if MIN_SHORT_WORDS <= len(words) < ngram else ngram
                for _, hashes in run_hashes(words, [k]):
                    run_hash.frombytes(hashes.tobytes())
                    run_item.frombytes(np.full(hashes.size, item, dtype=np.uint32).tobytes())
                    lengths.add(k)
                    indexed = True
            counts["items_indexed" if indexed else "items_short"] += 1
        if counts["items"] == 0:
            raise PrefdataError(f"--decontaminate-against {path}: no benchmark items")
        if counts["items_without_text"] == counts["items"]:
            named = ", ".join(field_list) if field_list else "a preference shape or one of " + ", ".join(COMMON_FIELDS)
            raise PrefdataError(
                f"--decontaminate-against {path}: no item has text in {named}; name the field with --decontaminate-field"
            )
        stats.append(counts)
    hashes = np.frombuffer(run_hash, dtype=np.uint64)
    items = np.frombuffer(run_item, dtype=np.uint32)
    # np.unique keeps each hash's first occurrence: the first item (in benchmark order) that has the run.
    distinct, first = np.unique(hashes, return_index=True)
    first_item = items[first].copy()
    del hashes, items, run_hash, run_item
    per_bench = np.bincount(np.asarray(file_benchmark, dtype=np.int64)[np.frombuffer(item_source, np.uint32)[first_item]]
                            if first_item.size else np.zeros(0, np.int64), minlength=len(names))
    for counts, runs in zip(stats, per_bench.tolist()):
        counts["runs"] = int(runs)
    index = BenchmarkIndex(
        ngram=ngram, completions=completions, hashes=distinct, first_item=first_item,
        lengths=tuple(sorted(lengths)), names=names,
        item_source=np.frombuffer(item_source, dtype=np.uint32).copy(),
        item_line=np.frombuffer(item_line, dtype=np.int64).copy(), files=files, file_benchmark=file_benchmark,
    )
    catalog = BenchmarkCatalog(ngram, completions, field_list, stats, int(distinct.size), index.nbytes, excerpts)
    return index, catalog


def _records(path: str | Path) -> Iterator[RawRecord]:
    from prefdata.io.hub import iter_hub_records, parse_hub_id
    from prefdata.io.readers import iter_raw_records

    hub = parse_hub_id(path)
    if hub is not None:
        return iter_hub_records(hub)
    if not Path(path).exists():
        raise PrefdataError(f"--decontaminate-against {path}: no such file or directory")
    return iter_raw_records(path)


def _item_texts(raw: RawRecord, fields: list[str] | None) -> list[str]:
    """The texts of one benchmark item: the named fields, else the first common field present,
    else the prompt of a preference row. Each text is matched on its own (no run spans two)."""
    row = raw.value
    if raw.error is not None or type(row) is not dict:
        return []
    if fields is not None:
        return [t for name in fields for t in _texts_of(row.get(name))]
    for name in COMMON_FIELDS:
        texts = _texts_of(row.get(name))
        if texts:
            return texts
    from prefdata.io.formats import normalize_record

    try:
        pair = normalize_record(raw)
    except RecordError:
        return []
    return [pair.prompt] if pair.prompt.strip() else []


def _texts_of(value: Any) -> list[str]:
    """Text in a field: a string, the contents of a message list, or a list of strings."""
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, list):
        out: list[str] = []
        for part in value:
            if isinstance(part, dict):
                out.extend(_texts_of(part.get("content", part.get("value"))))
            else:
                out.extend(_texts_of(part))
        return out
    return []


def _excerpt(text: str) -> str:
    flat = " ".join(text[: EXCERPT_CHARS * 4].split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[: EXCERPT_CHARS - 1] + "…"


def load_benchmarks(
    against: str | Path | Sequence[str | Path] | None, *, ngram: int = DEFAULT_NGRAM,
    fields: str | Sequence[str] | None = None, completions: bool = False,
) -> tuple[BenchmarkIndex, BenchmarkCatalog] | None:
    """`build_benchmarks` for the command-line and config forms (one path or several, one field or
    several), or None without benchmarks."""
    if against is None or against == [] or against == ():
        if fields or completions or ngram != DEFAULT_NGRAM:
            raise PrefdataError("--decontaminate-field/-ngram/-completions need --decontaminate-against PATH")
        return None
    paths = [against] if isinstance(against, (str, Path)) else list(against)
    field_list = [fields] if isinstance(fields, str) else list(fields or [])
    return build_benchmarks(paths, ngram=ngram, fields=field_list, completions=completions)
