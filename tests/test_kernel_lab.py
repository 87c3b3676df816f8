"""notebooks/kernel_lab.ipynb executes top to bottom on the CPU (interpreter, tiny shapes)."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "kernel_lab.ipynb"


def _execute(timeout):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # python3 = the ipykernel of the interpreter running the tests (no kernel registered anywhere)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=timeout,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()      # raises CellExecutionError naming the cell if any cell errors
    return nb


def _text(nb):
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []))


@pytest.mark.gpu
def test_kernel_lab_times_on_a_gpu():
    text = _text(_execute(timeout=600))
    assert "decode rate" in text and "moe time" in text and "timing skipped" not in text


def test_kernel_lab_runs_top_to_bottom():
    nb = _execute(timeout=240)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []))
    assert "bit for bit" in text and "normalized error" in text
    images = [o for c in nb.cells for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the plot cell produced no inline PNG"
