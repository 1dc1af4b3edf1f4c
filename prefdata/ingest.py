"""The streaming core `prepare` and `validate` share: read -> normalize -> tokenize -> check.

Records stream in batches; normalize and tokenize run in worker processes (prefdata.engine);
the order-dependent checks (dataset-wide tables) run here, in input order.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterable, Iterator

from prefdata.checks.checker import PairChecker, build_leak_index
from prefdata.checks.policy import Policy, load_policy
from prefdata.engine.local import ProcessedRecord, process_batch, process_batches
from prefdata.errors import PrefdataError
from prefdata.io.readers import iter_raw_records
from prefdata.records import CheckedRow, RawRecord
from prefdata.tokenize.pairs import PairTokenizer, TokenizeSettings

# How many leading records may all be of an unknown shape before we call the input "not preference data".
SHAPE_PROBE_RECORDS = 200


def _chunks(iterable: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(iterable)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _progress(iterable: Iterable[Any], enabled: bool, desc: str) -> Iterable[Any]:
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    # disable=None: no bar when stderr is not a terminal (CI logs stay readable).
    return tqdm(iterable, desc=desc, unit=" rows", disable=None, mininterval=0.5)


ENGINES = ("local", "ray")


class NormalizeTokenizeStage:
    """normalize + tokenize of one batch of records, as a stage an engine runs (tokenizer loaded
    once per worker in `setup`)."""

    def __init__(self, pair_tokenizer: PairTokenizer | None, settings: TokenizeSettings) -> None:
        self.pair_tokenizer = pair_tokenizer
        self.settings = settings

    def setup(self) -> None:
        if self.pair_tokenizer is not None:
            self.pair_tokenizer.setup()

    def __call__(self, records: list[RawRecord]) -> list[ProcessedRecord]:
        return process_batch(records, self.pair_tokenizer, self.settings)


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise PrefdataError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    return engine


def iter_checked_rows(
    raw_path: str | Path,
    *,
    tokenizer_path: str | None = None,
    policy: Policy | None = None,
    settings: TokenizeSettings | None = None,
    batch_size: int = 1000,
    progress: bool = True,
    against: str | Path | None = None,
    pair_tokenizer: PairTokenizer | None = None,
    trust_remote_code: bool = False,
    workers: int = 1,
    engine: str = "local",
    ray_address: str | None = None,
) -> Iterator[CheckedRow]:
    """Stream every input record through normalize, tokenize (when a tokenizer is given) and checks.

    Memory stays flat: records are processed in batches of `batch_size`; only the dataset-wide
    hash tables grow. Output order equals input order whatever the batch size and the number of
    `workers` (processes that normalize and tokenize; see prefdata.engine.local). `engine="ray"`
    runs normalize and tokenize on a Ray cluster instead (prefdata.engine.ray; `workers` actors,
    default one per cluster CPU); the checks stay here, so the rows are the same.
    """
    check_engine(engine)
    policy = policy or load_policy(None)
    settings = settings or TokenizeSettings()
    if pair_tokenizer is None and tokenizer_path is not None:
        pair_tokenizer = PairTokenizer(tokenizer_path, settings, trust_remote_code=trust_remote_code)
        pair_tokenizer.setup()
    checker = PairChecker(policy, build_leak_index(against) if against is not None else None)

    records = _progress(iter_raw_records(raw_path), progress, "checking")
    seen_pairs = 0
    seen_records = 0
    first_problem: str | None = None
    only_unknown_shapes = True
    if engine == "ray":
        from prefdata.engine.ray import RayEngine

        ray_engine = RayEngine(ray_address, workers=workers or None)
        batches: Iterable[tuple[list[RawRecord], list[ProcessedRecord]]] = ray_engine.map_ordered(
            NormalizeTokenizeStage(pair_tokenizer, settings), _chunks(records, batch_size)
        )
    else:
        batches = process_batches(_chunks(records, batch_size), pair_tokenizer, settings, workers)
    for chunk, results in batches:
        for raw, result in zip(chunk, results):
            seen_records += 1
            if result.pair is None:
                only_unknown_shapes = only_unknown_shapes and result.unknown_shape
                first_problem = first_problem or f"{raw.source_file}:{raw.source_line}: {result.error}"
                yield CheckedRow(raw, None, None, [], None, "quarantined", error=result.error)
                continue
            seen_pairs += 1
            kept_flags, severity, outcome = checker.check(result.pair, result.tokenized)
            yield CheckedRow(raw, result.pair, result.tokenized, kept_flags, severity, outcome)
        if seen_pairs == 0 and only_unknown_shapes and seen_records >= min(SHAPE_PROBE_RECORDS, batch_size):
            raise PrefdataError(f"{raw_path} does not look like preference data ({first_problem})")

    if seen_pairs == 0:
        if seen_records == 0:
            raise PrefdataError(f"{raw_path} holds no records")
        if only_unknown_shapes:
            raise PrefdataError(f"{raw_path} does not look like preference data ({first_problem})")
