"""The `image_truncated` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="image_truncated",
    order=24,
    severity="drop",
    meaning="fitting the length limits would cut an image's tokens: the pair is left uncut",
    doc=(
        "fitting max_length / max_prompt_length would cut into an image's tokens (or part it from its "
        "placeholder): the pair is left uncut and flagged"
    ),
    raised_by=("prefdata.tokenize.truncate:truncate_pair",),
    tokens=True,
    cause="length",
    rank=2,
    note="truncation would cut an image's tokens: never trained half-visible",
)
