"""The dataset health report, collected: a streaming accumulator over checked rows.

`ReportBuilder.add(row)` is called once per row (a pair kept or dropped, a quarantined record, or an
unpaired record of scored completions); `add_compact`
takes a run of rows checked elsewhere in bulk. Memory stays flat apart from compact per-row hash
arrays (8-byte prompt and pair hashes plus a location, for the exact-duplicate sections) and small
bounded samples. report.sections lays report.json out from the collected state
(`build_report(builder, accounting, meta)`; documented in docs/report-schema.md).

The report is deterministic: the same input gives the same dict apart from `generated_at`.
"""

from __future__ import annotations

from array import array
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from prefdata.checks.pair import completion_content, ids_mode
from prefdata.checks.similarity import EXACT_LIMIT
from prefdata.report.compact import (
    OUTCOMES,
    SEVERITY_CODES,
    CompactRows,
    FlaggedRows,
    TokenLengths,
    excerpt,
    report_keys,
    row_hash,
    token_lengths,
)
from prefdata.report.distributions import IntDistribution
from prefdata.report.images import ImageStats
from prefdata.report.length_bias import compare, count_bias
from prefdata.report.scored import ScoredStats
from prefdata.report.similarity import SimilaritySample
from prefdata.report.sources import SourceTally

if TYPE_CHECKING:
    import numpy as np

    from prefdata.core.records import CheckedRow

EXAMPLES_PER_FLAG = 5
MAX_QUARANTINE_REASONS = 50  # distinct quarantine reasons kept; the rest are counted as "other reasons"
LINES_PER_REASON = 10
EXCERPT_ROWS = 20_000  # prompt excerpts kept for the first rows only (bounded memory)
MAX_FLAGGED_ROWS = 200_000  # content hashes of flagged rows kept for baseline comparison
LENGTH_FLUSH_ROWS = 8192  # rows whose character lengths are counted together (numpy, not per row)
TOP_GROUPS = 10  # duplicate-prompt / duplicate-pair / near-duplicate groups listed in the report
LINES_PER_GROUP = 5


class ReportBuilder:
    """Accumulates the report over a stream of CheckedRow objects (one per input record)."""

    def __init__(
        self,
        policy: Any = None,
        *,
        examples_per_flag: int = EXAMPLES_PER_FLAG,
        truncation_known: bool = True,
        quarantine_severity: str | None = None,
        sources: Mapping[str, str] | None = None,
    ) -> None:
        self.policy = policy
        # A mixture: each input file's source (sets.mix.MixPlan.file_sources); the report gets a
        # per-source section (report.sources). `source_plans`: the mix's own numbers, by source name.
        self.file_sources = dict(sources) if sources else None
        self.by_source: dict[str, SourceTally] = {}
        self.source_plans: dict[str, dict[str, Any]] = {}
        # --balance-length: what the subsample did (sets.balance), and the pairs it dropped (they
        # do not count against max_dropped_share: the user asked for them to go).
        self.length_balance: dict[str, Any] | None = None
        self.balance_dropped = 0
        # None: decided in build() from meta["command"] (see sections.QUARANTINE_SEVERITY), "error" otherwise.
        self.quarantine_severity = quarantine_severity
        # False when re-checking stored rows: their ids are already truncated and the lengths
        # before truncation are gone, so truncation rates cannot be measured.
        self.truncation_known = truncation_known
        self.examples_per_flag = examples_per_flag
        self.rows = 0
        self.outcomes: Counter[str] = Counter({"kept": 0, "dropped": 0, "quarantined": 0})
        self.severities: Counter[str] = Counter()
        self.flag_counts: Counter[str] = Counter()
        self.flag_examples: dict[str, list[dict[str, Any]]] = {}
        self.flagged = FlaggedRows()  # see report.sections._flagged_rows for the fields
        self.flagged_total = 0
        self.flagged_rows_any = 0  # rows with at least one flag (for max_flagged_share)
        # Rows by their worst severity (error, then drop, then warn), each row counted once: the
        # report's `errors`, `drops` and `warnings` (report.sections), so that in prepare errors + drops
        # are the dropped pairs and the headline's numbers add up (issue 40).
        self.rows_with: Counter[str] = Counter()
        # Plain-string rows (not messages, not pre-tokenized) flagged prompt_boundary_mismatch: many
        # of them with a chat tokenizer mean --chat-template was wanted (report.hints).
        self.string_boundary_mismatches = 0
        self.quarantine_reasons: dict[str, list[Any]] = {}  # reason -> [count, [locations]]
        self.quarantine_other = 0
        # Per-row compact arrays: location of every record, hashes of every pair.
        self.files: dict[str, int] = {}
        self.file_index = array("I")
        self.line = array("q")
        self.pair_row = array("q")  # record ordinal of each pair
        self.prompt_key = array("Q")
        self.pair_key = array("Q")
        self.prompt_excerpts: list[str] = []  # for the first EXCERPT_ROWS records
        self.chars = {name: IntDistribution() for name in ("prompt", "chosen", "rejected")}
        self.tokens = {name: IntDistribution() for name in ("prompt", "chosen", "rejected")}
        self.bias = {"chars": Counter(), "tokens": Counter()}
        self.bias_kept = {"chars": Counter(), "tokens": Counter()}  # over the kept pairs: what training sees
        # (prompt, chosen, rejected) character lengths not yet in `chars`/`bias`, counted in bulk.
        self._pending_chars = array("q")
        self.tokenized_rows = 0
        self.truncated: Counter[str] = Counter()
        self.similarity = SimilaritySample()
        self.near_duplicates: list[dict[str, Any]] = []
        self.near_duplicate_clusters = 0
        self.near_duplicate_rows = 0
        self.near_duplicates_run = False
        # Pairs whose halves exceed EXACT_LIMIT together: near_duplicate and the similarity sample
        # measured them with the bounded method; the report names them.
        self.bounded_rows = 0
        self.bounded_examples: list[dict[str, Any]] = []
        # --decontaminate-against: the benchmarks (a sets.decontaminate.BenchmarkCatalog, set by the
        # command) and, per flagged pair, (file id, line, outcome, BenchmarkMatch); counted in full.
        self.benchmarks: Any = None
        self.benchmark_matches: list[tuple[int, int, str, Any]] = []
        self.benchmark_pairs: Counter[str] = Counter()
        self.scored = ScoredStats()  # records of scored completions: what pairing made of them
        self.images = ImageStats()  # image pairs: sizes, tokens per image, images per pair (report.images)

    # ------------------------------------------------------------------ per row

    def add(self, row: "CheckedRow") -> None:
        ordinal = self.rows
        self.rows += 1
        self.outcomes[row.outcome] += 1
        raw = row.raw
        file_id = self.files.setdefault(raw.source_file, len(self.files))
        self.file_index.append(file_id)
        self.line.append(raw.source_line)
        pair = row.pair
        if row.scored is not None:
            self.scored.add(row.scored, raw.source_file, raw.source_line)
        if ordinal < EXCERPT_ROWS:
            prompt = pair.prompt if pair is not None else (row.scored.prompt if row.scored is not None else None)
            self.prompt_excerpts.append(excerpt(prompt))
        if self.file_sources is not None:
            self._tally(raw.source_file).add_row(row)
        if row.outcome == "unpaired":  # no pair to check; the scored section says why
            return
        if pair is None:
            self._add_quarantined(row)
            return
        if row.severity:
            self.severities[row.severity] += 1
        if row.flags:
            self._add_flagged(row)
        self._add_dataset_keys(ordinal, row)
        self._add_lengths(row)
        if pair.image_data:
            self.images.add(pair.image_data, row.tokenized.image_tokens if row.tokenized is not None else None)
        halves = (pair.chosen_ids or [], pair.rejected_ids or []) if ids_mode(pair) else (pair.chosen, pair.rejected)
        if len(halves[0]) + len(halves[1]) > EXACT_LIMIT:
            self._add_bounded(raw.source_file, raw.source_line)

    def add_compact(self, rows: CompactRows) -> None:
        """`add` for every record of `rows`, in bulk: the same report as adding them one by one."""
        import numpy as np

        n = len(rows.lines)
        first = self.rows
        self.rows += n
        for code, count in enumerate(np.bincount(rows.outcome, minlength=len(OUTCOMES)).tolist()):
            if count:
                self.outcomes[OUTCOMES[code]] += count
        for code, count in enumerate(np.bincount(rows.severity, minlength=len(SEVERITY_CODES)).tolist()):
            if count and code:
                self.severities[SEVERITY_CODES[code]] += count
        file_id = self.files.setdefault(rows.source_file, len(self.files))
        self.file_index.frombytes(np.full(n, file_id, dtype=np.uint32).tobytes())
        self.line.frombytes(np.asarray(rows.lines, dtype=np.int64).tobytes())
        if first < EXCERPT_ROWS:
            assert rows.excerpts is not None and len(rows.excerpts) == n, "excerpts are needed up to EXCERPT_ROWS"
            self.prompt_excerpts.extend(rows.excerpts[: EXCERPT_ROWS - first])
        at_pair = np.searchsorted(rows.pair_index, rows.detailed)
        flag_lists: list[list[str]] = []
        for position, at in zip(rows.detailed, at_pair.tolist()):  # in input order, as flagged_rows keeps it
            row = rows.detail(position)
            if row.pair is None:
                self._add_quarantined(row)
            else:
                self._add_flagged(row, f"{int(rows.pair_keys[at]):016x}")
                flag_lists.append(row.flags)
        for position, summary in rows.scored:
            self.scored.add(summary, rows.source_file, int(rows.lines[position]))
        pairs = np.asarray(rows.pair_index, dtype=np.int64)
        self.pair_row.frombytes((pairs + first).tobytes())
        self.prompt_key.frombytes(np.asarray(rows.prompt_keys, dtype=np.uint64).tobytes())
        self.pair_key.frombytes(np.asarray(rows.pair_keys, dtype=np.uint64).tobytes())
        self._sample_compact(rows, pairs)
        lengths = np.asarray(rows.lengths, dtype=np.int64).reshape(-1, 3)
        for at in np.flatnonzero(lengths[:, 1] + lengths[:, 2] > EXACT_LIMIT).tolist():
            self._add_bounded(rows.source_file, int(rows.lines[int(pairs[at])]))
        self._pending_chars.frombytes(np.ascontiguousarray(rows.lengths, dtype=np.int64).tobytes())
        if len(self._pending_chars) >= 3 * LENGTH_FLUSH_ROWS:
            self.flush_lengths()
        if rows.tokens is not None:
            self._add_token_array(rows.tokens)
        if rows.images is not None:
            self.images.add_facts(rows.images)
        self._add_kept_compact(rows, pairs, lengths, flag_lists)

    def _add_kept_compact(
        self, rows: CompactRows, pairs: "np.ndarray", lengths: "np.ndarray", flag_lists: list[list[str]]
    ) -> None:
        """The kept pairs' length bias, and the source's tally, of `add_compact`'s rows."""
        import numpy as np

        kept = np.asarray(rows.outcome, dtype=np.int64)[pairs] == OUTCOMES.index("kept")
        count_bias(self.bias_kept["chars"], lengths[kept, 1], lengths[kept, 2])
        tokens = None if rows.tokens is None else np.asarray(rows.tokens, dtype=np.int64).reshape(-1, 6)
        if tokens is not None and len(tokens) != len(pairs):
            tokens = None  # not every pair tokenized: the token rows do not line up with the pairs
        if tokens is not None:
            count_bias(self.bias_kept["tokens"], tokens[kept, 1], tokens[kept, 2])
        if self.file_sources is not None:
            outcomes = [OUTCOMES[code] for code in np.asarray(rows.outcome, dtype=np.int64).tolist()]
            later_pairs = sum(max(0, summary.pairs - 1) for _, summary in rows.scored)
            self._tally(rows.source_file).add_arrays(outcomes, kept, lengths, tokens, flag_lists, later_pairs)

    def _tally(self, source_file: str) -> SourceTally:
        assert self.file_sources is not None
        name = self.file_sources.get(source_file, source_file)
        tally = self.by_source.get(name)
        if tally is None:
            tally = self.by_source[name] = SourceTally()
        return tally

    def _add_bounded(self, source_file: str, source_line: int) -> None:
        self.bounded_rows += 1
        if len(self.bounded_examples) < LINES_PER_REASON and not _listed(self.bounded_examples, source_file, source_line):
            self.bounded_examples.append({"source_file": source_file, "source_line": source_line})

    def _sample_compact(self, rows: CompactRows, pairs: "np.ndarray") -> None:
        """The similarity sample's share of `add_compact`: only keys below the cut-off can enter."""
        import numpy as np

        sample = self.similarity
        sample.seen += len(pairs)
        keys = np.asarray(rows.pair_keys, dtype=np.uint64)
        cutoff = sample.cutoff()
        below = np.flatnonzero(keys < np.uint64(cutoff)) if cutoff < 1 << 64 else np.arange(len(keys))
        for at in below.tolist():
            key = int(keys[at])
            if sample.wants(key):
                halves = rows.halves.get(int(pairs[at]))
                if halves is None:  # left out by the sender: it cannot be in the final sample
                    continue
                if type(halves) is float:
                    sample.put_measured(key, halves)
                else:
                    sample.put(key, *halves)

    def _add_quarantined(self, row: "CheckedRow") -> None:
        reason = row.error or "unreadable record"
        location = {"source_file": row.raw.source_file, "source_line": row.raw.source_line}
        entry = self.quarantine_reasons.get(reason)
        if entry is None:
            if len(self.quarantine_reasons) >= MAX_QUARANTINE_REASONS:
                self.quarantine_other += 1
                entry = None
            else:
                entry = self.quarantine_reasons[reason] = [0, []]
        if entry is not None:
            entry[0] += 1
            if len(entry[1]) < LINES_PER_REASON:
                entry[1].append(location)
        self._remember_flagged(row, [], None)  # severity filled in by build()

    def _add_flagged(self, row: "CheckedRow", digest: str | None = None) -> None:
        """`digest`: the row's content_hash, when known already."""
        pair = row.pair
        assert pair is not None
        if row.severity:  # info-only rows carry a flag but are no finding (max_flagged_share)
            self.flagged_rows_any += 1
        if self.policy is not None:
            severities = {self._flag_severity(flag) for flag in row.flags}
            worst = next((severity for severity in ("error", "drop", "warn") if severity in severities), None)
            if worst is not None:
                self.rows_with[worst] += 1
        if "prompt_boundary_mismatch" in row.flags and not pair.is_conversational and not ids_mode(pair):
            self.string_boundary_mismatches += 1
        if pair.benchmark_match is not None and "benchmark_overlap" in row.flags:
            self._add_benchmark_match(row)
        for flag in row.flags:
            self.flag_counts[flag] += 1
            examples = self.flag_examples.setdefault(flag, [])
            if len(examples) < self.examples_per_flag and not _listed(examples, row.raw.source_file, row.raw.source_line):
                examples.append(
                    {
                        "source_file": row.raw.source_file,
                        "source_line": row.raw.source_line,
                        "outcome": row.outcome,
                        "prompt": excerpt(pair.prompt),
                        "chosen": excerpt(pair.chosen),
                        "rejected": excerpt(pair.rejected),
                    }
                )
        self._remember_flagged(row, list(dict.fromkeys(row.flags)), row.severity, digest)

    def _flag_severity(self, flag: str) -> str | None:
        try:
            return self.policy.severity(flag)
        except ValueError:  # a flag the policy does not know (e.g. from an older OUT/)
            return None

    def _add_benchmark_match(self, row: "CheckedRow") -> None:
        match = row.pair.benchmark_match  # type: ignore[union-attr]
        self.benchmark_pairs[match.benchmark] += 1
        if len(self.benchmark_matches) < MAX_FLAGGED_ROWS:
            self.benchmark_matches.append((self.files[row.raw.source_file], row.raw.source_line, row.outcome, match))

    def _remember_flagged(
        self, row: "CheckedRow", flags: list[str], severity: str | None, digest: str | None = None
    ) -> None:
        self.flagged_total += 1
        if len(self.flagged) >= MAX_FLAGGED_ROWS:
            return
        detail = row.error if row.pair is None else excerpt(row.pair.prompt, 60)
        file_id = self.files[row.raw.source_file]
        digest = digest or row_hash(row)
        self.flagged.append((digest, file_id, row.raw.source_line, tuple(flags), severity, row.outcome, detail))

    def _add_dataset_keys(self, ordinal: int, row: "CheckedRow") -> None:
        pair = row.pair
        assert pair is not None
        prompt_key, pair_key = report_keys(pair)
        self.pair_row.append(ordinal)
        self.prompt_key.append(prompt_key)
        self.pair_key.append(pair_key)
        sample = self.similarity
        sample.seen += 1
        if sample.wants(pair_key):  # most rows stop here: the similarity is computed for few
            if ids_mode(pair):
                sample.put(pair_key, pair.chosen_ids or [], pair.rejected_ids or [])
            else:
                sample.put(pair_key, completion_content(pair, "chosen")[0], completion_content(pair, "rejected")[0])

    def _add_lengths(self, row: "CheckedRow") -> None:
        pair = row.pair
        assert pair is not None
        pending = self._pending_chars
        pending.append(len(pair.prompt))
        pending.append(len(pair.chosen))
        pending.append(len(pair.rejected))
        if len(pending) >= 3 * LENGTH_FLUSH_ROWS:
            self.flush_lengths()
        kept = row.outcome == "kept"
        if kept:
            self.bias_kept["chars"][compare(len(pair.chosen), len(pair.rejected))] += 1
        tok = row.tokenized
        if tok is not None:
            self._add_token_lengths(token_lengths(tok))
            if kept:
                self.bias_kept["tokens"][compare(tok.chosen_len_full, tok.rejected_len_full)] += 1

    def _add_token_lengths(self, tok: TokenLengths) -> None:
        self.tokenized_rows += 1
        # Lengths before truncation describe the data; truncation rates say what the limits cut.
        tokens = self.tokens
        tokens["prompt"].add(tok.prompt)
        tokens["chosen"].add(tok.chosen)
        tokens["rejected"].add(tok.rejected)
        self.bias["tokens"][compare(tok.chosen, tok.rejected)] += 1
        self.truncated["prompt"] += tok.cut_prompt
        self.truncated["chosen"] += tok.cut_chosen
        self.truncated["rejected"] += tok.cut_rejected
        self.truncated["any"] += tok.cut_prompt or tok.cut_chosen or tok.cut_rejected

    def _add_token_array(self, values: "np.ndarray") -> None:
        """`_add_token_lengths` for every row of a (k, 6) array of TokenLengths fields, in bulk."""
        import numpy as np

        if not len(values):
            return
        values = np.asarray(values, dtype=np.int64)
        self.tokenized_rows += len(values)
        for column, name in enumerate(("prompt", "chosen", "rejected")):
            self.tokens[name].add_many(values[:, column])
        count_bias(self.bias["tokens"], values[:, 1], values[:, 2])
        cut = values[:, 3:6] != 0
        for column, name in enumerate(("prompt", "chosen", "rejected")):
            self.truncated[name] += int(cut[:, column].sum())
        self.truncated["any"] += int(cut.any(axis=1).sum())

    def flush_lengths(self) -> None:
        """Move the pending character lengths into the distributions and the length-bias counts."""
        import numpy as np

        if not self._pending_chars:
            return
        values = np.frombuffer(self._pending_chars, dtype=np.int64).reshape(-1, 3)
        for column, name in enumerate(("prompt", "chosen", "rejected")):
            self.chars[name].add_many(values[:, column])
        count_bias(self.bias["chars"], values[:, 1], values[:, 2])
        del values  # release the buffer export before replacing the array
        self._pending_chars = array("q")

    # ------------------------------------------------------------------ near-duplicate prompts

    def location(self, ordinal: int) -> dict[str, Any]:
        """Where record `ordinal` (0-based, in `add` order) came from."""
        files = self.file_names()
        out: dict[str, Any] = {"source_file": files[self.file_index[ordinal]], "source_line": self.line[ordinal]}
        if ordinal < len(self.prompt_excerpts):
            out["excerpt"] = self.prompt_excerpts[ordinal]
        return out

    def add_near_duplicate_prompts(
        self, clusters: Iterable[Iterable[int]], line_of: Mapping[int, Any] | Callable[[int], Any]
    ) -> None:
        """Record MinHash near-duplicate prompt clusters.

        `line_of(row_id)` (or `line_of[row_id]`) gives a line number, a (file, line) tuple, or a dict
        with source_file/source_line (and optionally excerpt)."""
        lookup = line_of.__getitem__ if isinstance(line_of, Mapping) else line_of
        self.near_duplicates_run = True
        materialized = [sorted(cluster) for cluster in clusters]
        sized = sorted((c for c in materialized if len(c) > 1), key=lambda c: (-len(c), c[0]))
        self.near_duplicate_clusters = len(sized)
        self.near_duplicate_rows = sum(len(c) for c in sized)
        self.near_duplicates = [
            {"size": len(c), "rows": [_as_location(lookup(i)) for i in c[:LINES_PER_GROUP]]} for c in sized[:TOP_GROUPS]
        ]

    def file_names(self) -> list[str]:
        """Source file names by file id (the order files were first seen)."""
        names = [""] * len(self.files)
        for name, index in self.files.items():
            names[index] = name
        return names


def _as_location(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return {"source_file": value[0], "source_line": value[1]}
    return {"source_file": None, "source_line": int(value)}


def _listed(examples: list[dict[str, Any]], source_file: str, source_line: int) -> bool:
    """Whether a record's location is already an example: the pairs of one scored record share it,
    and a reader is sent to each record once."""
    return any(e["source_line"] == source_line and e["source_file"] == source_file for e in examples)
