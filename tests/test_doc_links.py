"""The docs send a reader only to what the repository has: every relative Markdown link resolves (its
#anchor included, for links into Markdown), and every file a doc names as `NAME.md` exists in the
repository or is one prefdata writes (issue 31: checks/README.md cited a DESIGN.md the repository lacks)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "checks" / "README.md", REPO / "bench" / "README.md",
        *sorted((REPO / "docs").glob("*.md"))]
WRITTEN = {"report.md", "gpu.md"}  # OUT/report.md, bench/results/gpu.md: written by the tools, not in the tree
LINK = re.compile(r"\]\((?P<target>[^)#\s]*)(?:#(?P<anchor>[^)\s]+))?\)")


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lowercased, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _repository_md_names() -> set[str]:
    names = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "demo-out")]
        names |= {name for name in files if name.endswith(".md")}
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    text = doc.read_text(encoding="utf-8")
    for match in LINK.finditer(text):
        target, anchor = match.group("target"), match.group("anchor")
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path = (doc.parent / target) if target else doc
        assert path.exists(), f"{doc.relative_to(REPO)}: link to {target}, which the repository does not have"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path.read_text(encoding="utf-8")), f"{doc.relative_to(REPO)}: {target}#{anchor}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_markdown_file_exists(doc):
    have = _repository_md_names() | WRITTEN
    named = set(re.findall(r"\b([A-Za-z_][\w-]*\.md)\b", doc.read_text(encoding="utf-8")))
    assert named <= have, f"{doc.relative_to(REPO)} names {sorted(named - have)}, which the repository does not have"


def test_the_code_cites_no_design_md():
    """DESIGN.md is in ../shared, not in the repository: docstrings point at the README's sections."""
    hits = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "prefdata").rglob("*.py"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if "DESIGN" in line]
    assert hits == []
