"""The real model these tests run on: SmolLM2-135M-Instruct as `make smollm2` converts it (float32,
outside the repository). Tests that need it skip with one line where it has not been converted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "get_smollm2.py"


def _script():
    # scripts/ is no package: load the script's module for its one notion of where the model lives.
    spec = importlib.util.spec_from_file_location("_get_smollm2", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The converted model's directory ($PREFDATA_SMOLLM2_DIR or ~/.cache/prefdata/smollm2-135m-instruct)."""
    script = _script()
    path = script.model_dir()
    if not script.is_converted(path):
        pytest.skip(f"SmolLM2 not converted: run `make smollm2` (looked in {path})")
    return str(path)
