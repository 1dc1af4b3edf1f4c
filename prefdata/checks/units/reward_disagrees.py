"""The `reward_disagrees` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="reward_disagrees",
    order=16,
    severity="warn",
    meaning="the reward model prefers rejected over chosen by more than the margin",
    doc="a reward model prefers rejected over chosen by more than `reward_margin` (scored data)",
    raised_by=("prefdata.checks.reward:column_flags",),
)
