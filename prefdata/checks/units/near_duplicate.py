"""The `near_duplicate` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="near_duplicate",
    order=2,
    severity="warn",
    meaning="chosen and rejected are nearly identical",
    doc="chosen/rejected similarity ≥ threshold (0.95)",
    raised_by=("prefdata.checks.pair:content_flags",),
)
