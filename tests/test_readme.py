"""The README is the front door (issue 44): short enough to read, and it leads to every page of docs/,
where the rest lives (the docs tests run every page: tests/test_doc_examples.py, tests/test_doc_links.py)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 400


def test_the_readme_stays_under_400_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < MAX_LINES, (f"README.md has {lines} lines (limit {MAX_LINES}): move the longer text to a page of "
                               "docs/ and link it from the README's Documentation list")


def test_the_readme_links_every_docs_page():
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)(?:#[^)]*)?\)", README.read_text(encoding="utf-8")))
    pages = {path.name for path in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), f"docs pages the README does not link: {sorted(pages - linked)}"


def test_the_readme_keeps_the_two_commands_for_a_fresh_machine():
    text = README.read_text(encoding="utf-8")
    assert re.search(r"^make demo ", text, re.M) and re.search(r"^make test ", text, re.M)
