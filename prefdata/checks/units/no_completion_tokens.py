"""The `no_completion_tokens` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="no_completion_tokens",
    order=7,
    severity="drop",
    meaning="a completion has no tokens left after truncation",
    doc="a half has zero loss tokens after truncation",
    raised_by=("prefdata.checks.pair:token_flags", "prefdata.tokenize.pairs:_set_loss_starts", "prefdata.tokenize.truncate:truncate_pair"),
    tokens=True,
    cause="length",
    rank=1,
)
