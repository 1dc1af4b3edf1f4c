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
    """Raw INPUT: text-only checks in bulk on the engine (validate.merge), else the
    checked-row stream (checks.stream), through `pair_tokenizer` (--tokenizer or --processor) when given.
    `run`: validate's settings (against, progress, batch size, workers, engine); on
    Ray, `workers` is the number of actors (0: one per cluster CPU). `settings`: how rows are tokenized."""
    from prefdata.checks.partitioned import PartitionedMerge
    from prefdata.engine.local import default_workers
    from prefdata.engine.select import select_engine

    workers = run.workers
    if workers is None:
        workers = 0 if run.engine == "ray" else default_workers()
    runner = select_engine(run.engine, workers, run.ray_address)
    # One worker runs the same pipeline in this process (the engine's one-worker case). A mixture's
    # samples are the checked-row stream's (its chunks carry the sample the stage applies).
    if pair_tokenizer is None and not isinstance(input_path, MixPlan):
        from prefdata.validate.merge import check_raw_text

        check_raw_text(
            input_path, builder, policy=policy, settings=settings, against=run.against,
            batch_size=run.batch_size, progress=run.progress, workers=workers, engine=runner, benchmarks=benchmarks,
            pairing=pairing,
        )
        return
    from prefdata.checks.stream import iter_checked_rows

    merge = PartitionedMerge(policy.near_duplicate_prompt_threshold)
    rows = iter_checked_rows(
        input_path, pair_tokenizer=pair_tokenizer, policy=policy, settings=settings, batch_size=run.batch_size,
        progress=run.progress, against=run.against, workers=workers, merge=merge,
        engine=runner, benchmarks=benchmarks, pairing=pairing,
    )
    accumulate(rows, builder, merge)
