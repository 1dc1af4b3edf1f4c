"""The `whitespace_only` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="whitespace_only",
    order=1,
    severity="drop",
    meaning="chosen and rejected differ only in whitespace",
    doc="equal once whitespace is normalized",
    raised_by=("prefdata.checks.pair:content_flags",),
)
