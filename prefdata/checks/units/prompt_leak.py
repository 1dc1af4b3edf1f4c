"""The `prompt_leak` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="prompt_leak",
    order=13,
    severity="warn",
    meaning="the prompt also occurs in the --against data",
    doc="the prompt occurs in `--against OTHER` (validate)",
    raised_by=("prefdata.checks.checker:pair_flags",),
)
