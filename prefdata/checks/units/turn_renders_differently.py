"""The `turn_renders_differently` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="turn_renders_differently",
    order=30,
    severity="error",
    meaning=(
        "an assistant turn renders differently once later turns follow, and could not be located in the full "
        "render: its loss mask may miss part of that turn"
    ),
    doc=(
        "an assistant turn of a completion renders differently once a later turn follows, and could not be "
        "located in the full render: its loss mask may miss part of that turn"
    ),
    raised_by=("prefdata.tokenize.render_pairs:PairRendering._spans_of",),
    tokens=True,
    note=(
        "a turn the template renders differently once later turns follow, not located: its mask may miss it"
    ),
    cause="setting",
    setting="--chat-template-file",
    hint=(
        "the chat template (the tokenizer's, or the one --chat-template-file gave) renders an assistant turn "
        "differently once later turns follow, and the turn could not be found in the full render; give "
        "--chat-template-file a template whose turns render the same whatever follows, or train only the final "
        "turn (--train-turns last)"
    ),
)
