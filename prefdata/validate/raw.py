"""`validate` on raw input: text-only checks in bulk on the engine (prefdata.validate.merge), else
prepare's two passes with nothing written (prefdata.pipeline.shards): with a tokenizer or processor,
or a mixture. Either runs on any number of workers (one: this process).

Text-only input keeps its bulk path because prepare's passes cost it 2.3x the time (100k pairs:
13.9 s against 5.9 s wall, bench/README.md): it needs no tokenizer, so its per-row work is small
next to caching every checked row between the passes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefdata.checks.policy import Policy
from prefdata.report.builder import ReportBuilder
from prefdata.sets.decontaminate import BenchmarkIndex
from prefdata.sets.mix import MixPlan

if TYPE_CHECKING:
    from prefdata.settings.commands import ValidateSettings
    from prefdata.tokenize.pairs import PairTokenizer


def check_raw(
    input_path: "Path | MixPlan",
    builder: ReportBuilder,
    policy: Policy,
    settings: Any,
    run: "ValidateSettings",
    *,
    pair_tokenizer: "PairTokenizer | None",
    benchmarks: BenchmarkIndex | None = None,
    pairing: Any = None,
) -> None:
    """Raw INPUT into `builder`: text-only checks in bulk (validate.merge), else prepare's passes
    (`_check_with_passes`) through `pair_tokenizer` (--tokenizer or --processor) when given.
    `run`: validate's settings (against, progress, batch size, workers, engine); on
    Ray, `workers` is the number of actors (0: one per cluster CPU). `settings`: how rows are tokenized."""
    from prefdata.checks.stream import workers_for
    from prefdata.engine.select import select_engine

    workers = workers_for(input_path, run.workers, run.engine)
    runner = select_engine(run.engine, workers, run.ray_address)
    # A mixture's samples are the passes' (its chunks carry the sample the stage applies).
    if pair_tokenizer is None and not isinstance(input_path, MixPlan):
        from prefdata.validate.merge import check_raw_text

        check_raw_text(
            input_path, builder, policy=policy, settings=settings, against=run.against,
            batch_size=run.batch_size, progress=run.progress, workers=workers, engine=runner, benchmarks=benchmarks,
            pairing=pairing,
        )
        return
    _check_with_passes(input_path, builder, policy, settings, run, runner, workers, pair_tokenizer, benchmarks,
                       pairing)


def _check_with_passes(
    input_path: "Path | MixPlan", builder: ReportBuilder, policy: Policy, settings: Any, run: "ValidateSettings",
    runner: Any, workers: int, pair_tokenizer: "PairTokenizer | None", benchmarks: BenchmarkIndex | None,
    pairing: Any,
) -> None:
    """prepare's two passes with nothing written (pipeline.shards.check_without_writing): the first
    checks and caches groups of chunks, the dataset-wide checks run by hash partitioning, the
    second fills `builder`. `runner`: a Ray engine, or None for local worker processes."""
    from prefdata.checks.checker import build_leak_index
    from prefdata.checks.stage import CheckChunk
    from prefdata.checks.stream import input_chunks
    from prefdata.engine.local import LocalEngine
    from prefdata.pipeline import shards
    from prefdata.sets.pairing import PairingSettings

    engine = runner or LocalEngine(workers)
    leak_index = build_leak_index(run.against) if run.against is not None else None
    check = CheckChunk(pair_tokenizer, settings, policy, leak_index, benchmarks, pairing or PairingSettings())
    shard_bytes = shards.shard_bytes_of(_input_bytes(input_path), engine)
    name = input_path.mix.path if isinstance(input_path, MixPlan) else input_path
    shards.check_without_writing(input_chunks(input_path), builder, check=check, engine=engine,
                                 shard_bytes=shard_bytes, batch_size=run.batch_size, input_name=str(name),
                                 progress=run.progress)


def _input_bytes(input_path: "Path | MixPlan") -> int | None:
    """The bytes of the data files read (a mixture's path sources'); None for a Hub split."""
    from prefdata.io.hub import parse_hub_id
    from prefdata.io.readers import list_input_files

    if isinstance(input_path, MixPlan):
        roots = [s.source.location for s in input_path.sources if s.source.location is not None]
    elif parse_hub_id(input_path) is not None:
        return None
    else:
        roots = [Path(input_path)]
    return sum(path.stat().st_size for root in roots for path in list_input_files(root))
