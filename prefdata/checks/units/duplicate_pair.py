"""The `duplicate_pair` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="duplicate_pair",
    order=10,
    severity="warn",
    meaning="the same pair appears earlier in the data",
    doc="the same (prompt, chosen, rejected) seen earlier",
    raised_by=("prefdata.checks.partitioned:dataset_flags",),
)
