"""Every notebook in notebooks/ runs top to bottom without a cell raising (stored outputs stripped)."""

from __future__ import annotations

import pathlib

import ipykernel  # noqa: F401  (the notebooks' kernel; requirements-test.txt, as the others)
import nbclient
import nbconvert
import nbformat
import pytest

#: Among the slowest tests of the suite: `make test` leaves them to `make test-long` (.ci/run runs both).
pytestmark = pytest.mark.long

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
    _check_static_page(path, nb)


def _hooks():
    import importlib.util

    where = pathlib.Path(__file__).resolve().parents[2] / "docs" / "_hooks.py"
    spec = importlib.util.spec_from_file_location("loaderlib_docs_hooks", where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_static_page(path, nb):
    """NOTE [ Static dashboards in the docs ]: the page nbconvert builds from the executed
    notebook, as the docs build prepares it, shows the last frame of every dashboard."""
    hooks = _hooks()
    want = hooks.dashboards_expected(path.read_text(encoding="utf-8"))
    if not want:
        return
    page, _ = nbconvert.HTMLExporter().from_notebook_node(hooks.keep_static_views(nb))
    assert page.count(f'class="{hooks.FRAME_MARK}"') + page.count(f"class='{hooks.FRAME_MARK}'") == want
    assert 'src="data:image/png;base64,' in page or "src='data:image/png;base64," in page
    # The final frame, not the empty one shown when the cell ran: the run's verdict is in it.
    assert page.count("run finished: figures frozen at its last seconds") >= want
