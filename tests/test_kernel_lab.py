"""notebooks/kernel_lab.ipynb executes top to bottom on the CPU (interpreter, tiny shapes)."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "kernel_lab.ipynb"


def test_kernel_lab_runs_top_to_bottom():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # python3 = the ipykernel of the interpreter running the tests (no kernel registered anywhere)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=240,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()      # raises CellExecutionError naming the cell if any cell errors
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []))
    assert "bit for bit" in text and "normalized error" in text
    images = [o for c in nb.cells for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the plot cell produced no inline PNG"
