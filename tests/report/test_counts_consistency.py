"""The headline's counts are defined once (rows, each counted at its worst severity; exceeded limits
apart) and every rendering prints the same numbers as report.json, with their denominator, consistent
with its flag table and its accounting (issue 40, item 8)."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks.policy import load_policy
from prefdata.core import flags as F
from prefdata.report.builder import ReportBuilder
from prefdata.report.render_github import github_annotations
from prefdata.report.render_html import render_html
from prefdata.report.render_markdown import render_markdown
from prefdata.report.render_text import render_text
from prefdata.report.sections import build_report
from tests.report.test_report import quarantined, row

POLICIES = {"default": load_policy(None), "pr": load_policy("checks/pr.toml")}
# Flags of every severity in the default policy: drop, warn, error, info.
FLAGS = [F.IDENTICAL, F.NEAR_DUPLICATE, F.DUPLICATE_PAIR, F.COMPLETION_TRUNCATED, F.REASONING_LOST,
         F.TOOL_CALL_INVALID, F.SAME_FINAL_ANSWER, F.EMPTY_PROMPT, F.IDENTICAL_AFTER_TRUNCATION]
COUNTS = re.compile(
    r"([\d,]+) of ([\d,]+) rows? with errors, ([\d,]+) with warnings"
    r"(?:, ([\d,]+) with drop flags)?(?:, ([\d,]+) limits? exceeded)?"
)
WORST_FIRST = ("error", "drop", "warn")


def _numbers(text: str) -> tuple[int, int, int, int, int]:
    """(errors, rows in, warnings, drops, limits exceeded) as a rendering prints them."""
    match = COUNTS.search(text)
    assert match, text
    return tuple(int((group or "0").replace(",", "")) for group in match.groups())  # type: ignore[return-value]


def _table_md(markdown: str) -> dict[str, tuple[str, int]]:
    rows = re.findall(r"^\| `([a-z_]+)` \| ([a-z-]+) \| ([\d,]+) \|", markdown.split("### Flags", 1)[1], re.M)
    return {name: (severity, int(n.replace(",", ""))) for name, severity, n in rows}


def _table_html(page: str) -> dict[str, tuple[str, int]]:
    rows = re.findall(r"<tr><td><code>([a-z_]+)</code><div class=meaning>[^<]*</div></td><td><span class=\"badge ([a-z]+)\">"
                      r"[^<]*</span></td><td class=n>([\d,]+)<", page)
    return {name: (severity, int(n.replace(",", ""))) for name, severity, n in rows}


row_flags = st.lists(st.sampled_from(FLAGS), max_size=4, unique=True)


@settings(max_examples=60, deadline=None)
@given(
    flag_lists=st.lists(row_flags, min_size=1, max_size=25),
    quarantines=st.integers(0, 3),
    policy_name=st.sampled_from(sorted(POLICIES)),
    command=st.sampled_from(["validate", "prepare"]),
)
def test_every_rendering_prints_the_counts_of_report_json_and_its_table(flag_lists, quarantines, policy_name, command):
    policy = POLICIES[policy_name]
    builder = ReportBuilder(policy)
    for line, flags in enumerate(flag_lists, start=1):
        builder.add(row(line, f"p{line}", f"a{line}", f"b{line}", flags, policy=policy))
    for extra in range(quarantines):
        builder.add(quarantined(1000 + extra))
    report = json.loads(json.dumps(build_report(builder, {}, {"input": "data", "command": command})))

    # The definition, computed here from the input: each row once, at its worst severity.
    kept_flags = [[f for f in flags if policy.severity(f) != "ignore"] for flags in flag_lists]
    q_severity = "error" if command == "validate" else "warn"
    worst = [next((sev for sev in WORST_FIRST if any(policy.severity(f) == sev for f in flags)), None)
             for flags in kept_flags]
    truth = {severity: worst.count(severity) + (quarantines if q_severity == severity else 0) for severity in WORST_FIRST}
    assert (report["errors"], report["drops"], report["warnings"]) == (truth["error"], truth["drop"], truth["warn"])
    # So the rows with errors and with drop flags are the pairs the policy drops, and the sum never
    # exceeds the rows in.
    assert report["errors"] - (quarantines if q_severity == "error" else 0) + report["drops"] == report["outcomes"]["dropped"]
    assert report["errors"] + report["warnings"] + report["drops"] <= report["accounting"]["rows_in"]
    limits = sum(1 for f in report["findings"] if f["kind"] == "threshold" and f["exceeded"])
    assert report["limits_exceeded"] == limits
    assert (report["status"] == "fail") == bool(report["errors"] or limits)
    expected = (report["errors"], report["accounting"]["rows_in"], report["warnings"], report["drops"],
                report["limits_exceeded"])

    text = render_text(report, top=100)
    markdown = render_markdown(report)
    page = render_html(report)
    notice = github_annotations(report)[0]
    assert notice.startswith("::notice title=prefdata::")
    for rendering in (text.splitlines()[0], markdown, page, notice):
        assert _numbers(rendering) == expected

    # The flag table the counts come from: an error row exists exactly when an error entry does, and
    # a row counts once however many flags it has; a warn or drop row has an entry of its severity.
    for table in (_table_md(markdown), _table_html(page)):
        for severity, total in (("error", report["errors"]), ("warn", report["warnings"]), ("drop", report["drops"])):
            counts = [n for sev, n in table.values() if sev == severity]
            if severity == "error":
                assert bool(counts) == bool(total), (severity, table, total)
            if total:
                assert counts and total <= sum(counts), (severity, table, total)
            if counts and severity == "error":
                assert max(counts) <= total
    if not report["warnings"] and not report["errors"] and not limits:
        assert "PASS with warnings" not in text and "PASS with warnings" not in markdown
