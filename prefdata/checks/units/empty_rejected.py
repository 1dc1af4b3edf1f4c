"""The `empty_rejected` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="empty_rejected",
    order=6,
    severity="drop",
    meaning="the rejected completion is empty",
    doc="the rejected completion is empty or whitespace-only",
    raised_by=("prefdata.checks.pair:content_flags",),
)
