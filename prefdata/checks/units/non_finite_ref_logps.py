"""The `non_finite_ref_logps` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="non_finite_ref_logps",
    order=14,
    severity="drop",
    meaning="reference log-probs are not finite",
    doc="the reference log-prob is NaN/inf (refs)",
    raised_by=("prefdata.refs.swap:with_ref_columns", "prefdata.validate.prepared:_stored_tokens"),
)
