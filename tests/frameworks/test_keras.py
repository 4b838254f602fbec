"""Keras 3 trains on a loaderlib loader through ``KerasView`` (NOTE [ A loader as a Keras
PyDataset ]), on the torch, JAX and TensorFlow backends.

Each backend in a new process (``KERAS_BACKEND`` is read at import) running ``keras_run.py``:
``model.fit(KerasView(loader), epochs=3, shuffle=False)``. Every epoch must run ``len(loader)``
steps, and the batches Keras received in epoch ``e`` must be the loader's epoch ``e``: its
sampler's order of ``(seed, e)`` cut into batches of 4 (Keras' look at the first batches, one
on torch and JAX and two on TensorFlow, costs no epoch of the loader). TensorFlow's backend
runs on ``tensorflow-cpu`` (requirements-frameworks.txt).
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


BACKEND_MODULE = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}


@pytest.mark.parametrize("backend", ["torch", "jax", "tensorflow"])
def test_keras_fit_runs_the_loaders_epochs(backend, tmp_path):
    out = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "keras_run.py", str(out)], capture_output=True, text=True, timeout=600,
                       cwd=HERE, env=dict(os.environ, KERAS_BACKEND=backend, PYTHONWARNINGS="ignore",
                                          TF_CPP_MIN_LOG_LEVEL="2"))
    for module in ("keras", BACKEND_MODULE[backend]):   # test dependencies: fail saying why, never skip
        if f"No module named '{module}'" in p.stderr:
            pytest.fail(f"{module} does not import, so Keras' {backend} backend cannot run; it is a test dependency: "
                        "`make test-long` installs requirements-frameworks.txt")
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    got = json.loads(out.read_text())
    assert got["backend"] == backend and got["keras"].startswith("3.")
    assert got["steps"] == [got["len"]] * 3 == [8, 8, 8]
    for e, batches in enumerate(got["epochs"]):
        order = ll.RandomSampler(N, seed=5).order(e).tolist()
        assert batches == [[float(v) for v in order[i:i + BATCH]] for i in range(0, N, BATCH)], f"epoch {e}"
    assert len(got["epochs"]) == 3


def _keras(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")   # read when keras is first imported
    try:
        from loaderlib.integrations import keras
    except ImportError as e:
        pytest.fail(f"Keras does not import ({e}); it is a test dependency")
    return keras


def test_the_view_refuses_what_it_cannot_serve(monkeypatch):
    KerasView = _keras(monkeypatch).KerasView
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


def test_keras_looks_at_the_first_batches_cost_no_epoch(monkeypatch):
    """The calls each backend makes (NOTE [ A loader as a Keras PyDataset ]): TensorFlow reads
    batches 0 and 1 outside any epoch, torch and JAX batch 0 inside a bracket of its own; each
    look ends with on_epoch_end, and the epochs after it are the loader's 0, 1, ..."""
    KerasView = _keras(monkeypatch).KerasView

    def epoch(view):
        view.on_epoch_begin()
        got = [view[i][1].tolist() for i in range(len(view))]
        view.on_epoch_end()
        return got

    def reference(e):
        order = ll.RandomSampler(N, seed=5).order(e).tolist()
        return [order[i:i + BATCH] for i in range(0, N, BATCH)]

    for look in ("tensorflow", "torch"):
        view = KerasView(ll.DataLoader(ll.ArrayDataset(np.zeros((N, 2), np.float32), np.arange(N)),
                                       batch_size=BATCH, shuffle=True, seed=5, num_threads=1))
        if look == "tensorflow":
            seen = [view[0][1].tolist(), view[1][1].tolist()]
        else:
            view.on_epoch_begin()
            seen = [view[0][1].tolist()]
        view.on_epoch_end()
        assert seen == reference(0)[:len(seen)], look
        assert [epoch(view) for _ in range(2)] == [reference(0), reference(1)], look


def test_a_keras_outside_the_supported_range_is_refused_naming_the_version(monkeypatch):
    import re

    keras = _keras(monkeypatch)
    assert keras.SUPPORTED == ((3, 5), (4, 0))
    for version in ("3.4.1", "4.0.0", "2.15.0"):
        with pytest.raises(ImportError, match=rf"Keras >= 3\.5 and < 4\.0 \(before 3\.5 .*keras {re.escape(version)} is "
                                              "installed"):
            keras._check_version(version)
    keras._check_version("3.15.1")


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
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
