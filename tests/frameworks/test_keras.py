"""Keras 3 trains on a loaderlib loader through ``KerasView`` (NOTE [ A loader as a Keras
PyDataset ]), on the torch and JAX backends.

Each backend in a new process (``KERAS_BACKEND`` is read at import) running ``keras_run.py``:
``model.fit(KerasView(loader), epochs=3, shuffle=False)``. Every epoch must run ``len(loader)``
steps, and the batches Keras received in epoch ``e`` must be the loader's epoch ``e``: its
sampler's order of ``(seed, e)`` cut into batches of 4 (Keras' first look at batch 0 costs no
epoch of the loader). TensorFlow is not installed here (no CPU wheel is carried for it), so its
backend is not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import loaderlib as ll

pytestmark = pytest.mark.frameworks

HERE = os.path.dirname(os.path.abspath(__file__))
N, BATCH = 30, 4   # as in keras_run.py


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_keras_fit_runs_the_loaders_epochs(backend, tmp_path):
    out = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "keras_run.py", str(out)], capture_output=True, text=True, timeout=600,
                       cwd=HERE, env=dict(os.environ, KERAS_BACKEND=backend, PYTHONWARNINGS="ignore"))
    if "No module named 'keras'" in p.stderr:   # a test dependency: fail saying why, never skip
        pytest.fail("Keras does not import; it is a test dependency: `make test` installs requirements-frameworks.txt")
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    got = json.loads(out.read_text())
    assert got["backend"] == backend and got["keras"].startswith("3.")
    assert got["steps"] == [got["len"]] * 3 == [8, 8, 8]
    for e, batches in enumerate(got["epochs"]):
        order = ll.RandomSampler(N, seed=5).order(e).tolist()
        assert batches == [[float(v) for v in order[i:i + BATCH]] for i in range(0, N, BATCH)], f"epoch {e}"
    assert len(got["epochs"]) == 3


def test_the_view_refuses_what_it_cannot_serve(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")   # read when keras is first imported
    try:
        from loaderlib.integrations.keras import KerasView
    except ImportError as e:
        pytest.fail(f"Keras does not import ({e}); it is a test dependency")
    ld = ll.DataLoader(ll.ArrayDataset(np.arange(N, dtype=np.float32), np.arange(N)), batch_size=BATCH, seed=0)
    view = KerasView(ld)
    assert len(view) == 8
    view[0]
    with pytest.raises(IndexError, match=r"asked for batch 3, the next is 1: pass model.fit\(\.\.\., shuffle=False\)"):
        view[3]
    with pytest.raises(ValueError, match="output='numpy'"):
        KerasView(ll.DataLoader(ll.ArrayDataset(np.arange(N)), batch_size=BATCH, output="torch"))
    with pytest.raises(TypeError, match="loaderlib DataLoader"):
        KerasView([1, 2])


def test_the_docs_example_runs(tmp_path):
    """docs/integrations/keras.md, in a new process (the backend is chosen at import)."""
    import re

    root = os.path.dirname(os.path.dirname(HERE))
    with open(os.path.join(root, "docs", "integrations", "keras.md"), encoding="utf-8") as f:
        (code,) = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    code += "\nassert len(history.history['loss']) == 2, history.history\nprint('ok')\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"})
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.stdout + p.stderr)[-3000:]
