"""examples/lattice_tour.ipynb: stored without outputs, in step with the
script that writes it, and runs headless from top to bottom without error."""

import importlib.util
import shutil
from pathlib import Path

import nbformat
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOTEBOOK = EXAMPLES / "lattice_tour.ipynb"


def _maker():
    spec = importlib.util.spec_from_file_location(
        "make_lattice_tour", EXAMPLES / "make_lattice_tour.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {index} has stored outputs"
            assert cell.execution_count is None, f"cell {index} has an execution count"


def test_notebook_matches_its_script():
    stored = nbformat.read(NOTEBOOK, as_version=4)
    built = _maker().build()
    assert [(c.cell_type, c.source) for c in stored.cells] == [
        (c.cell_type, c.source) for c in built.cells
    ], "run `python examples/make_lattice_tour.py` and commit the notebook"


def test_notebook_runs_headless(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel starts in a scratch folder so that nothing it writes lands in
    # the checkout; ipykernel's inline matplotlib backend needs no display.
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError on any failing cell
    kinds = [
        kind
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        for kind in output.get("data", {})
    ]
    assert "image/png" in kinds, "the alignment pictures were not drawn"
    if shutil.which("dot") is not None:
        assert "image/svg+xml" in kinds, "no FSA was drawn"
