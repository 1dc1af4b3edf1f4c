"""The `reasoning_lost` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="reasoning_lost",
    order=17,
    severity="error",
    meaning=(
        "the chat template does not render the row's reasoning, tool calls or tools in the completion (many "
        "reasoning templates drop the trace even from the last turn; see docs/reasoning.md)"
    ),
    doc=(
        "the row carries reasoning, tool calls, tool turns (a tool result) or tools that its rendered tokens "
        "do not contain (the template drops them), judged on each part's own render"
    ),
    raised_by=("prefdata.tokenize.render_pairs:PairRendering._plain_texts", "prefdata.tokenize.render_pairs:PairRendering._split_render"),
    tokens=True,
    cause="template",
    rank=0,
)
