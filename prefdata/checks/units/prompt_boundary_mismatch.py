"""The `prompt_boundary_mismatch` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="prompt_boundary_mismatch",
    order=9,
    severity="warn",
    meaning="prompt tokens are not a prefix of prompt+completion tokens",
    doc="the prompt's tokens are not a prefix of prompt + completion tokenized together",
    raised_by=("prefdata.tokenize.pairs:PairTokenizer._tokenize_texts",),
    tokens=True,
)
