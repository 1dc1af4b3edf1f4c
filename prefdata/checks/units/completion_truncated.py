"""The `completion_truncated` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="completion_truncated",
    order=8,
    severity="warn",
    meaning="a completion lost its end (EOS) to truncation",
    doc="a half lost its end (EOS) to truncation",
    raised_by=("prefdata.checks.reward:column_flags", "prefdata.tokenize.truncate:truncate_pair"),
    tokens=True,
)
