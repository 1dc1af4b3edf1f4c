"""The `benchmark_overlap` check (prefdata.checks.units)."""

from prefdata.checks.units import Check

CHECK = Check(
    name="benchmark_overlap",
    order=22,
    severity="drop",
    meaning=(
        "the prompt (or a completion) shares an N-word run with a benchmark item (--decontaminate-against)"
    ),
    doc=(
        "the prompt (with `--decontaminate-completions`, a completion) shares a 13-word run with a benchmark "
        "item (`--decontaminate-against`)"
    ),
    raised_by=("prefdata.checks.checker:pair_flags",),
)
