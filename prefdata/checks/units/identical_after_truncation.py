"""The `identical_after_truncation` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="identical_after_truncation",
    order=3,
    severity="drop",
    meaning="chosen and rejected token ids are equal after truncation",
    doc="token ids of the two halves equal after truncation",
    raised_by=("prefdata.checks.pair:token_flags", "prefdata.tokenize.truncate:truncate_pair"),
    tokens=True,
    cause="length",
    rank=9,
)
