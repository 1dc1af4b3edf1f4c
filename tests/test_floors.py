"""pyproject.toml's dependency floors are the releases `make test-floors` tests (scripts/floors.txt).

A `>=` bound nobody installs is a promise nobody checked (issue 31): every dependency has a floor,
the floors file pins exactly those floors, and CI runs the floors after the suite (.ci/run).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _pyproject_floors() -> dict[str, str]:
    floors = {}
    for requirement in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", requirement.strip())
        assert match, f"pyproject.toml: {requirement!r} is not NAME>=FLOOR (the floor CI tests)"
        floors[_name(match[1])] = match[2]
    return floors


def _pinned_floors() -> dict[str, str]:
    pins = {}
    for line in (REPO / "scripts" / "floors.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.]*)", line)
        assert match, f"scripts/floors.txt: {line!r} is not NAME==VERSION"
        pins[_name(match[1])] = match[2]
    return pins


# Declared below what the floors run installs, on purpose: a CUDA torch a user already has must satisfy
# the range (pip would otherwise replace it with several GB of CUDA wheels), and transformers' floor
# runs with torch 2.6 and later; CI can install no CPU build of torch older than 2.13.
UNTESTED_FLOORS = {"torch": ("2.6", "2.13.0")}


def test_pyproject_floors_are_the_pinned_floors():
    from packaging.version import Version

    declared = {name: Version(floor) for name, floor in _pyproject_floors().items()}
    pinned = {name: Version(pin) for name, pin in _pinned_floors().items()}
    for name, (floor, pin) in UNTESTED_FLOORS.items():
        assert declared.pop(name) == Version(floor) and pinned.pop(name) == Version(pin), name
    assert declared == pinned


def test_ci_runs_the_floors_after_the_suite():
    run = (REPO / ".ci" / "run").read_text()
    assert run.index("make test\n") < run.index("make test-floors")
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test-floors:.*\n\t.*scripts/test-floors\.sh", makefile, re.M)
