"""Every notebook in notebooks/ runs top to bottom without a cell raising (stored outputs stripped)."""

from __future__ import annotations

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    # One demo dataset for all notebooks, built outside the user's own cache.
    return tmp_path_factory.mktemp("xdg-cache")


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:4] == [
        "01_quickstart.ipynb", "02_live_bottleneck_dashboard.ipynb", "03_infinitely_fast_model.ipynb",
        "04_pipeline.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, cache_home, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    # Committed notebooks carry no outputs (they are produced here, and by the screenshots script).
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), f"{path.name} has stored outputs"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError naming the cell if any cell raises
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
