"""The `unequal_turns` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="unequal_turns",
    order=29,
    severity="warn",
    meaning="one half has far more assistant turns than the other (3x and at least 3 more)",
    doc="one half has 3x the other's assistant turns and at least 3 more",
    raised_by=("prefdata.io.trajectory:divergence_flags",),
    note="one half has 3x the other's assistant turns (and 3 more): length, not decisions, may win",
)
