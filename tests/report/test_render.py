"""Renderers: terminal text, Markdown tables, self-contained HTML, GitHub annotations, step summary."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from prefdata.checks.policy import load_policy
from prefdata.core import flags as F
from prefdata.report.baseline import apply_baseline
from prefdata.report.builder import ReportBuilder
from prefdata.report.render_github import STEP_SUMMARY_LIMIT, github_annotations, truncate_utf8, write_step_summary
from prefdata.report.render_html import render_html
from prefdata.report.render_markdown import render_markdown
from prefdata.report.render_text import render_text
from prefdata.report.sections import build_report
from tests.report.test_report import quarantined, row, tok

ANNOTATION = re.compile(r"^::(error|warning|notice) ((?:[a-z]+=[^,:]*)(?:,[a-z]+=[^,:]*)*)::(.+)$")


@pytest.fixture(scope="module")
def report():
    pr = load_policy("checks/pr.toml")
    builder = ReportBuilder(pr)
    for i in range(1, 31):
        flags = [F.IDENTICAL] if i % 2 else [F.NEAR_DUPLICATE]
        builder.add(row(i, f"prompt <b>{i}</b> | pipe", "same", "same" if i % 2 else "sane", flags, policy=pr, tokenized=tok(5, 8 + i, 4, full=(5, 8 + i, 9))))
    for i in range(31, 120):
        builder.add(row(i, f"clean prompt {i}", "a fine answer " * (i % 9 + 1), "meh", policy=pr, tokenized=tok(5, i % 40 + 1, 3)))
    builder.add(quarantined(200))
    builder.add_near_duplicate_prompts([[31, 32, 33]], builder.location)
    return build_report(builder, {}, {"input": "data/train.jsonl", "command": "validate", "tokenizer": "tiny"})


def test_text_summary_has_counts_flags_and_lines(report):
    text = render_text(report)
    assert "FAIL" in text and "120 rows in" in text and "quarantined" in text
    assert "identical" in text and "data/train.jsonl:1" in text
    assert len(text.splitlines()) < 20


def test_markdown_has_summary_and_flag_table(report):
    md = render_markdown(report)
    assert md.startswith("## ❌ prefdata validate: FAIL")
    assert "| flag | severity | rows | share | meaning | examples |" in md and "| 12.6% of 119 pairs |" in md
    identical = next(line for line in md.splitlines() if line.startswith("| `identical`"))
    assert "| error | 15 |" in identical and "`data/train.jsonl:1`" in identical
    assert "prompt <b>1</b> \\| pipe" in identical  # pipes escaped so the table holds
    assert "### Quarantined records" in md and "### Dataset-wide" in md and "### Lengths (tokens" in md
    assert "max_flagged_share" in md


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.urls, self.stack_ok = [], [], True
        self.open = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action") and value:
                self.urls.append(value)


def test_html_is_self_contained_and_parses(report):
    page = render_html(report)
    parser = _Collector()
    parser.feed(page)
    parser.close()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "script" not in parser.tags and "link" not in parser.tags and "img" not in parser.tags
    assert not [u for u in parser.urls if re.match(r"(https?:)?//", u)]
    assert "url(" not in page and "@import" not in page  # no fetched CSS resources
    assert parser.tags.count("svg") >= 4  # three length histograms and the similarity histogram
    assert "<style>" in page and "prompt &lt;b&gt;1&lt;/b&gt;" in page  # data is escaped
    for section in ("Flags", "Quarantined records", "Dataset-wide", "Lengths", "Length bias", "Truncation", "similarity"):
        assert section in page


def test_html_renders_an_empty_report():
    page = render_html(build_report(ReportBuilder(load_policy(None)), {}, {"input": "nothing"}))
    assert "No row carries a flag." in page and "</html>" in page


def test_github_annotations_format_cap_and_rest(report, monkeypatch):
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    lines = github_annotations(report, max_annotations=10)
    errors = [line for line in lines if line.startswith("::error")]
    warnings = [line for line in lines if line.startswith("::warning")]
    notices = [line for line in lines if line.startswith("::notice")]
    for line in lines:
        assert ANNOTATION.match(line), line
    assert len(errors) == 10 and len(warnings) == 10  # GitHub shows no more per step
    # Exceeded limits come first so the cap never hides them; then rows at their lines.
    assert errors[0].startswith("::error title=prefdata%3A length_bias::chosen longer than rejected: 94.1%25")
    assert errors[1].startswith("::error title=prefdata%3A max_flagged_share::flagged rows: 25.2%25")
    assert errors[2].startswith("::error file=data/train.jsonl,line=1,title=prefdata%3A identical::")
    # 15 identical (error) + 1 quarantined (error) + 15 near_duplicate (warn) = 31 rows; 8 + 10 shown.
    # The verdict with the headline's counts leads; then the count of rows left out.
    assert notices[0] == "::notice title=prefdata::FAIL (16 of 120 rows with errors, 15 with warnings, 2 limits exceeded)"
    assert len(notices) == 2 and "13 more flagged rows" in notices[1]


def test_github_annotation_escaping(monkeypatch, tmp_path):
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    builder = ReportBuilder(load_policy(None))
    builder.add(row(7, "a: b, c\nd 100%", "x", "x", [F.IDENTICAL], file=str(tmp_path / "data" / "my,file.jsonl")))
    # The one pair is dropped, so max_dropped_share's annotation comes too; the row's is the one escaped.
    (line,) = [a for a in github_annotations(build_report(builder, {}, {})) if "title=prefdata%3A identical" in a]
    assert line.startswith("::warning file=data/my%2Cfile.jsonl,line=7,title=prefdata%3A identical::")
    assert "\n" not in line and "100%25" in line


def test_github_annotations_with_baseline_only_new(report):
    pr = load_policy("checks/pr.toml")
    builder = ReportBuilder(pr)
    for i in range(1, 120):
        builder.add(row(i, f"clean prompt {i}", "answer", "reply", policy=pr))
    builder.add(row(500, "brand new", "dup", "dup", [F.IDENTICAL], policy=pr))
    head = apply_baseline(build_report(builder, {}, {}), report)
    lines = github_annotations(head)
    assert lines == [
        "::notice title=prefdata::FAIL (1 of 120 rows with errors, 0 with warnings, 1 limit exceeded)",
        "::error file=data/train.jsonl,line=500,title=prefdata%3A identical::chosen and rejected are identical (prompt: brand new)",
    ]


def test_step_summary_appends_and_stays_under_one_mib(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step output\n", encoding="utf-8")
    huge = "\n".join(f"| row {i} | ünïcödé text that goes on and on |" for i in range(60_000))
    assert write_step_summary(huge, summary)
    data = summary.read_bytes()
    assert data.startswith(b"# earlier step output\n")
    assert len(data) < STEP_SUMMARY_LIMIT
    text = data.decode("utf-8")  # the cut never splits a character
    assert "Report truncated" in text


def test_step_summary_without_env_is_a_no_op(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert write_step_summary("# hi") is False


def test_step_summary_small_report_is_written_whole(tmp_path, report):
    summary = tmp_path / "s.md"
    md = render_markdown(report)
    write_step_summary(md, summary)
    assert summary.read_text(encoding="utf-8") == md


def test_truncate_utf8_respects_limit_and_lines():
    text = "ab\n" * 100
    cut = truncate_utf8(text, 50, "[cut]")
    assert len(cut.encode()) <= 50 and cut.endswith("ab\n[cut]")
    assert truncate_utf8("short", 50, "[cut]") == "short"


def test_every_flag_has_a_meaning_in_the_reports():
    """A flag row with an empty meaning column tells a user nothing (image_mismatch once had none)."""
    from prefdata.core import flags as F
    from prefdata.report.render_common import FLAG_MEANINGS

    assert [flag for flag in F.ALL_FLAGS if not FLAG_MEANINGS.get(flag, "").strip()] == []


def test_headline_counts_one_in_the_singular():
    from prefdata.report.render_common import headline

    one = {"command": "validate", "rows_checked": 1, "rows_flagged": 0, "accounting": {"rows_in": 1, "rows_quarantined": 0}}
    assert headline(one).startswith("1 row in · 1 pair checked · ")
    two = {**one, "rows_checked": 2, "accounting": {"rows_in": 2, "rows_quarantined": 0}}
    assert headline(two).startswith("2 rows in · 2 pairs checked · ")
    prepared = {"command": "prepare", "accounting": {"rows_in": 1, "rows_out": 1, "rows_dropped": 0, "rows_quarantined": 0}}
    assert headline(prepared) == "1 row in · 1 kept · 0 dropped · 0 quarantined"
