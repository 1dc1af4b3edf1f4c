"""The `length_balance` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="length_balance",
    order=25,
    severity="drop",
    meaning=(
        "removed by --balance-length's seeded subsample toward its target share of chosen-longer pairs"
    ),
    doc=(
        "removed by `prepare --balance-length`'s seeded subsample toward a target share of chosen-longer "
        "pairs"
    ),
    raised_by=("prefdata.pipeline.shard_stages:WriteShard._rows",),
    note="prepare --balance-length: pairs its subsample removed (warn: only mark them)",
)
