"""report/ stays in its layer: it imports only what stands below it, collecting does not know
rendering, and renderers read only the report dict (so a stored report.json renders the same)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "prefdata"
REPORT = PACKAGE / "report"
RENDERING = {"render_common", "render_text", "render_markdown", "render_html", "render_github", "render_scored",
             "render_images", "render_selection", "render_trainer", "svg"}
# What report/ may import from prefdata: the layers below it, and itself.
BELOW_REPORT = ("prefdata.core", "prefdata.checks", "prefdata.report")


def prefdata_imports(path: Path) -> set[str]:
    """Every prefdata module `path` imports, at the top or inside a function (lazy imports count)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("prefdata"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("prefdata"):
            # `from prefdata.report import builder` imports the module prefdata.report.builder.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def report_modules() -> list[Path]:
    return sorted(p for p in REPORT.glob("*.py") if p.name != "__init__.py")


def test_report_modules_are_found():
    names = {p.stem for p in report_modules()}
    assert {"builder", "sections", "render_markdown", "render_html"} <= names


@pytest.mark.parametrize("path", report_modules(), ids=lambda p: p.stem)
def test_report_imports_only_what_stands_below_it(path):
    upward = sorted(
        name for name in prefdata_imports(path) if name != "prefdata.__version__" and not name.startswith(BELOW_REPORT)
    )
    assert upward == [], f"{path.name} imports {upward}"


@pytest.mark.parametrize("path", report_modules(), ids=lambda p: p.stem)
def test_collecting_and_rendering_stay_apart(path):
    imported = {name.split(".")[2] for name in prefdata_imports(path) if name.startswith("prefdata.report.")}
    if path.stem in RENDERING:
        # A renderer reads only the report dict: no builder state, no checks.
        assert imported <= RENDERING, f"{path.name} imports {sorted(imported - RENDERING)}"
        # The check units are declarations (each flag's name, meaning, hint): the legends' words come from there.
        assert not any(n.startswith("prefdata.checks") and not n.startswith("prefdata.checks.units")
                       for n in prefdata_imports(path))
    else:
        assert not imported & RENDERING, f"{path.name} imports {sorted(imported & RENDERING)}"


def test_nothing_below_report_imports_it():
    below = [p for layer in ("core", "io", "sets", "tokenize", "checks") for p in (PACKAGE / layer).glob("*.py")]
    offenders = {}
    for path in below:
        found = sorted(n for n in prefdata_imports(path) if n.startswith("prefdata.report"))
        if found:
            offenders[path.relative_to(PACKAGE).as_posix()] = found
    assert offenders == {}
