"""The `reasoning_mismatch` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="reasoning_mismatch",
    order=19,
    severity="warn",
    meaning=(
        "one half reasons and the other does not (or has an empty think block): the model would learn a "
        "format preference"
    ),
    doc="one half reasons and the other does not, or has an empty think block",
    raised_by=("prefdata.checks.reasoning:reasoning_flags",),
)
