"""The `system_lost` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="system_lost",
    order=18,
    severity="error",
    meaning=(
        "the chat template does not render a system (or developer) message of the row: the tokens lack an "
        "instruction the data gives (SmolLM3 reads only a first system message)"
    ),
    doc=(
        "a system (or `developer`) message's text is not in the rendered tokens: the template ignores it "
        "(SmolLM3 reads only a first system message)"
    ),
    raised_by=("prefdata.tokenize.render_pairs:PairRendering._split_render",),
    tokens=True,
    note=(
        "a system or developer message the template does not render (SmolLM3 reads only a first one)"
    ),
    cause="setting",
    setting="--chat-template-file",
    hint=(
        "the chat template (the tokenizer's, or the one --chat-template-file gave) does not render every system "
        "(or developer) message of the rows (SmolLM3 renders only a first one); give --chat-template-file a "
        "template that renders them, or merge each row's system messages into one"
    ),
)
