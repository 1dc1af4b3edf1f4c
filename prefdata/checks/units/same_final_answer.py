"""The `same_final_answer` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="same_final_answer",
    order=20,
    severity="info",
    meaning="the halves differ only inside the reasoning; their answers are equal",
    doc="the halves differ only inside the reasoning",
    raised_by=("prefdata.checks.reasoning:reasoning_flags",),
)
