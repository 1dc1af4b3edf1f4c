"""The `no_trained_tokens` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="no_trained_tokens",
    order=28,
    severity="drop",
    meaning="a completion's loss mask covers no token: no model turn of it is left to train",
    doc=(
        "a completion's loss mask covers no token (its model turns were cut, or `--train-turns last` found "
        "none)"
    ),
    raised_by=("prefdata.tokenize.pairs:_flag_untrained", "prefdata.validate.prepared:_stored_tokens"),
    tokens=True,
    note="a half's loss mask covers no model token (e.g. only tool output survived truncation)",
)
