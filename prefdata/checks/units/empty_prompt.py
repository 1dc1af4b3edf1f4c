"""The `empty_prompt` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="empty_prompt",
    order=4,
    severity="warn",
    meaning="the prompt is empty",
    doc="the prompt is empty or whitespace-only",
    raised_by=("prefdata.checks.pair:content_flags",),
)
