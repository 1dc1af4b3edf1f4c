"""The `empty_chosen` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="empty_chosen",
    order=5,
    severity="drop",
    meaning="the chosen completion is empty",
    doc="the chosen completion is empty or whitespace-only",
    raised_by=("prefdata.checks.pair:content_flags",),
)
