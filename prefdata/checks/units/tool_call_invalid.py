"""The `tool_call_invalid` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="tool_call_invalid",
    order=21,
    severity="error",
    meaning=(
        "a tool call's arguments are not a JSON object, name a function not in `tools`, or break its "
        "parameter schema, or that schema cannot be evaluated (a $ref loop, an unresolvable $ref, more work "
        "than the check's budget)"
    ),
    doc=(
        "tool-call arguments not a JSON object, a function not in `tools`, or arguments that break its "
        "parameter schema (or a schema that cannot be evaluated: `$ref` loop, unresolvable `$ref`, over the "
        "work budget)"
    ),
    raised_by=("prefdata.checks.reasoning:reasoning_flags",),
)
