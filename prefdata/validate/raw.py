"""`validate` on raw input: text-only checks in bulk on the engine (prefdata.validate.merge, any number
of workers, one: this process), else the checked-row stream (prefdata.checks.stream): with a tokenizer
or processor, or a mixture."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefdata.checks.policy import Policy
from prefdata.report.builder import ReportBuilder
from prefdata.sets.decontaminate import BenchmarkIndex
from prefdata.sets.mix import MixPlan
from prefdata.validate.prepared import accumulate

if TYPE_CHECKING:
    from prefdata.tokenize.pairs import PairTokenizer


def check_raw(
    input_path: "Path | MixPlan",
    builder: ReportBuilder,
    policy: Policy,
    settings: Any,
    *,
    pair_tokenizer: "PairTokenizer | None",
    against: str | Path | None,
    progress: bool,
    batch_size: int,
    workers: int | None,
    engine: str = "local",
    ray_address: str | None = None,
    partitioned_checks: bool = False,
    benchmarks: BenchmarkIndex | None = None,
    pairing: Any = None,
) -> None:
    """Raw INPUT: text-only checks in bulk on the engine (validate.merge), else the
    checked-row stream (checks.stream), through `pair_tokenizer` (--tokenizer or --processor) when given.
    On Ray, `workers` is the number of actors (0: one per cluster CPU)."""
    from prefdata.checks.merge import DatasetMerge
    from prefdata.checks.partitioned import PartitionedMerge
    from prefdata.engine.local import default_workers
    from prefdata.engine.select import select_engine

    if workers is None:
        workers = 0 if engine == "ray" else default_workers()
    runner = select_engine(engine, workers, ray_address)
    # One worker runs the same pipeline in this process (the engine's one-worker case). A mixture's
    # samples are the checked-row stream's (its chunks carry the sample the stage applies).
    if pair_tokenizer is None and not isinstance(input_path, MixPlan):
        from prefdata.validate.merge import check_raw_text

        check_raw_text(
            input_path, builder, policy=policy, settings=settings, against=against,
            batch_size=batch_size, progress=progress, workers=workers, engine=runner, benchmarks=benchmarks,
            pairing=pairing, partitioned=partitioned_checks,
        )
        return
    from prefdata.checks.stream import iter_checked_rows

    threshold = policy.near_duplicate_prompt_threshold
    merge = PartitionedMerge(threshold) if partitioned_checks else DatasetMerge(threshold)
    rows = iter_checked_rows(
        input_path, pair_tokenizer=pair_tokenizer, policy=policy, settings=settings, batch_size=batch_size,
        progress=progress, against=against, workers=workers, merge=merge,
        engine=runner, benchmarks=benchmarks, pairing=pairing,
    )
    accumulate(rows, builder, merge)
