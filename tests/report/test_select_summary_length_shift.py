"""`prefdata select`'s summary line says when the selection moved the length bias (issue 40: it moved
"chosen longer" from 47% to 0% and said nothing), and stays quiet when it barely moved."""

from __future__ import annotations

import numpy as np

from prefdata.report.render_selection import summary_line
from prefdata.report.selection import Choice, PairFacts, selection_report


def _report(kept: list[int], chosen: list[int], rejected: list[int]) -> dict:
    values = np.arange(len(chosen), dtype=float)
    return selection_report(
        signal="rejected_length", formula="len(rejected)", settings={}, values=values,
        choice=Choice(np.asarray(kept), {"budget": len(chosen) - len(kept)}, len(kept), None), other_signals={},
        pairs=PairFacts(np.asarray(chosen), np.asarray(rejected), ["a"] * len(chosen), [[] for _ in chosen]),
        accounting={}, lineage={})


def test_a_selection_that_moves_the_length_bias_says_so():
    # 47 of 100 pairs have the longer chosen half; the 30 kept have none.
    chosen = [20] * 47 + [5] * 53
    rejected = [10] * 100
    report = _report(list(range(47, 77)), chosen, rejected)
    line = summary_line(report)
    assert "\n" not in line
    assert line.endswith("; chosen longer (tokens) 47.0% of 100 pairs -> 0.0% of 30 kept"), line


def test_a_selection_that_keeps_the_length_bias_does_not_mention_it():
    chosen = [20, 5] * 50
    report = _report(list(range(0, 40)), chosen, [10] * 100)  # 50% -> 50%
    assert "chosen longer" not in summary_line(report)
