"""CI executes notebooks/walkthrough.ipynb top to bottom (it must stay fast: well under a minute)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "walkthrough.ipynb"


def test_walkthrough_notebook_runs():
    nbformat = pytest.importorskip("nbformat", reason="nbformat is needed to execute the notebook")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is needed to execute the notebook")
    pytest.importorskip("ipykernel", reason="ipykernel provides the python3 kernel the notebook runs on")
    pytest.importorskip("matplotlib", reason="the notebook plots with matplotlib")

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError, with the failing cell, on any error

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "28 rows in" in text and "⟦" in text and "exit code: 1" in text
    assert any("image/png" in o.get("data", {}) for o in outputs), "the distribution plot is missing"
    assert not [o for o in outputs if o.output_type == "error"]
