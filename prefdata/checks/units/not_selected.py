"""The `not_selected` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="not_selected",
    order=31,
    severity="drop",
    meaning=(
        "left out by `prefdata select`: beyond its budget, outside --min/--max, or a non-finite signal"
    ),
    doc=(
        "left out by `prefdata select` (beyond its `--keep` budget, outside `--min`/`--max`, or a non-finite "
        "signal); only in the new OUT's `dropped.jsonl` ([docs/select.md](select.md))"
    ),
    raised_by=("prefdata.select.write:write_dropped",),
    note="prefdata select: pairs its selection left out (in the new OUT's dropped.jsonl)",
)
