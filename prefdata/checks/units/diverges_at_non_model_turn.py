"""The `diverges_at_non_model_turn` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="diverges_at_non_model_turn",
    order=27,
    severity="drop",
    meaning="the halves first differ at a user or tool turn, not at a model decision",
    raised_by=("prefdata.io.formats:_hh", "prefdata.io.trajectory:divergence_flags"),
    note="the halves first differ at a user or tool turn: no shared state to compare from",
)
