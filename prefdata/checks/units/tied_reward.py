"""The `tied_reward` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="tied_reward",
    order=15,
    severity="drop",
    meaning="the two generated samples got the same reward (within the tie threshold)",
    doc=(
        "generated pair whose rewards differ by no more than `tie_threshold` (online DPO, and pairs made from "
        "scored completions)"
    ),
    raised_by=("prefdata.checks.reward:column_flags",),
    cause="setting",
    setting="tie_threshold",
    hint="samples got equal rewards; sample more per prompt or lower the policy's tie_threshold",
)
