"""The `environment_differs` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="environment_differs",
    order=26,
    severity="drop",
    meaning=(
        "the trajectories first differ at a tool result to the same call: the environment answered "
        "differently, the model decided nothing different"
    ),
    doc=(
        "trajectories first differ at a tool result to the same call: the environment answered differently, "
        "the model decided nothing different"
    ),
    raised_by=("prefdata.io.trajectory:divergence_flags",),
    note="the same tool call got different results: the environment differs, not the policy",
)
