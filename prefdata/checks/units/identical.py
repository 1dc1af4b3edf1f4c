"""The `identical` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="identical",
    order=0,
    severity="drop",
    meaning="chosen and rejected are identical",
    doc="chosen == rejected",
    raised_by=("prefdata.checks.pair:content_flags",),
)
