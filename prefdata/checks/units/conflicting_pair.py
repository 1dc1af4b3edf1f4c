"""The `conflicting_pair` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="conflicting_pair",
    order=11,
    severity="warn",
    meaning="the same pair appears earlier with chosen and rejected swapped",
    doc="the same pair seen earlier with chosen/rejected swapped",
    raised_by=("prefdata.checks.partitioned:dataset_flags",),
)
