"""The `multi_turn_completion` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="multi_turn_completion",
    order=12,
    severity="warn",
    meaning=(
        "HH transcripts diverge before their last Assistant turn, so a completion spans several turns (its "
        "Human turns are kept out of the loss)"
    ),
    doc=(
        "HH-style text transcripts diverge before their last Assistant turn, so a completion spans several "
        "turns (its Human turns stay out of the loss; message-list trajectories, whose completions hold "
        "several turns by design, are not flagged)"
    ),
    raised_by=("prefdata.io.formats:_hh",),
)
