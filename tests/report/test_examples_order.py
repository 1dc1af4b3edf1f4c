"""Example lines are listed ascending in every summary (issue 40: `e.g. broken.jsonl:2, :1`): the
quarantined entry gathers its lines reason by reason, most common reason first."""

from __future__ import annotations

import json

from prefdata.report.builder import ReportBuilder
from prefdata.report.render_common import locs
from prefdata.report.render_markdown import render_markdown
from prefdata.report.render_text import render_text
from prefdata.report.sections import build_report
from tests.report.test_report import quarantined


def _report() -> dict:
    builder = ReportBuilder()
    builder.add(quarantined(1, "invalid JSON: Expecting value", file="broken.jsonl"))
    builder.add(quarantined(2, "missing field 'rejected'", file="broken.jsonl"))
    builder.add(quarantined(3, "missing field 'rejected'", file="broken.jsonl"))
    return json.loads(json.dumps(build_report(builder, {}, {"input": "broken.jsonl", "command": "prepare"})))


def test_quarantined_examples_are_ascending_in_the_summary_and_the_table():
    report = _report()
    assert report["quarantine"]["reasons"][0]["count"] == 2  # the common reason (lines 2, 3) comes first
    line = next(text for text in render_text(report).splitlines() if text.strip().startswith("quarantined "))
    assert line.endswith("e.g. broken.jsonl:1, :2, :3"), line
    row = next(text for text in render_markdown(report).splitlines() if text.startswith("| `quarantined` |"))
    assert row.index("broken.jsonl:1") < row.index("broken.jsonl:2") < row.index("broken.jsonl:3"), row


def test_locs_sorts_by_file_then_line():
    rows = [{"source_file": "b.jsonl", "source_line": 2}, {"source_file": "a.jsonl", "source_line": 9},
            {"source_file": "b.jsonl", "source_line": 1}]
    assert locs(rows) == "a.jsonl:9, b.jsonl:1, :2"
