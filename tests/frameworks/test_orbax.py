"""Orbax checkpoints a loaderlib loader (NOTE [ Loader state in Orbax ]).

The example of docs/integrations/orbax.md runs with a real ``CheckpointManager``; the handler,
given the states of a 2-process job (as ``process_0.json`` and ``process_1.json``), restores
each process's own state on 2 processes and the merge on 1. The reference is a plain-Python
model of the documented order: the global order of the epoch, process ``r`` of ``w`` taking
slots ``r, r + w, ...``.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import loaderlib as ll

pytestmark = pytest.mark.frameworks

HERE = os.path.dirname(os.path.abspath(__file__))
N, BATCH, SEED = 30, 4, 3


def _orbax():
    try:
        from loaderlib.integrations import orbax
    except ImportError as e:   # a test dependency: fail saying why, never skip
        pytest.fail(f"orbax-checkpoint does not import ({e}); it is a test dependency: `make test` installs "
                    "requirements-frameworks.txt")
    return orbax


def _loader(world: int, rank: int):
    return ll.DataLoader(ll.ArrayDataset(np.arange(N)), batch_size=BATCH, seed=0, num_threads=1,
                         sampler=ll.ShardedSampler(world, rank, shuffle=True, seed=SEED))


def _order() -> list[int]:
    return ll.ShardedSampler(1, 0, N, shuffle=True, seed=SEED).order(0).tolist()


def test_the_docs_example_runs(tmp_path, monkeypatch):
    _orbax()
    root = os.path.dirname(os.path.dirname(HERE))
    with open(os.path.join(root, "docs", "integrations", "orbax.md"), encoding="utf-8") as f:
        (code,) = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__doc_snippet__"}
    exec(compile(code, "orbax.md", "exec"), scope)  # noqa: S102
    order = ll.ShardedSampler(1, 0, 64, shuffle=True, seed=3).order(0).tolist()
    assert scope["first"] == [order[i:i + 8] for i in range(0, 24, 8)]
    assert scope["rest"] == [order[i:i + 8] for i in range(24, 64, 8)]
    assert sorted(os.listdir(tmp_path / "ckpt" / "3" / "loader")) == ["commit_success.txt", "process_0.json"]


def test_the_states_of_two_processes_restore_on_two_and_on_one(tmp_path):
    from etils import epath

    orbax = _orbax()
    directory = epath.Path(tmp_path / "loader")
    for r in range(2):   # a 2-process job: process r took 1 batch of its shard
        ld = _loader(2, r)
        next(iter(ld))
        orbax.LoaderCheckpointHandler(r, 2).save(directory, orbax.LoaderSave(ld))
        ld.close()
    order = _order()
    for r in range(2):
        ld = _loader(2, r)
        handler = orbax.LoaderCheckpointHandler(r, 2)
        handler.restore(directory, orbax.LoaderRestore(ld))
        assert handler.applied == "own"
        shard = [order[r + 2 * j] for j in range(15)]
        assert [b.tolist() for b in ld] == [shard[i:i + BATCH] for i in range(BATCH, 15, BATCH)]
    one = _loader(1, 0)
    handler = orbax.LoaderCheckpointHandler(0, 1)
    handler.restore(directory, orbax.LoaderRestore(one))
    assert handler.applied == "merged"
    left = [order[p] for p in range(2 * BATCH, N)]   # slots 0..7 were taken, 4 by each process
    assert [b.tolist() for b in one] == [left[i:i + BATCH] for i in range(0, len(left), BATCH)]
    with pytest.raises(ll.StateError, match="holds no loaderlib state"):
        orbax.LoaderCheckpointHandler(0, 1).restore(epath.Path(tmp_path), orbax.LoaderRestore(_loader(1, 0)))


def test_an_orbax_outside_the_supported_range_is_refused_naming_the_version():
    """NOTE [ Framework version ranges ]: a 0.x minor release may change the handler interface."""
    orbax = _orbax()
    assert orbax.SUPPORTED == ((0, 12), (0, 13))
    for version in ("0.11.5", "0.13.0", "1.0.0"):
        with pytest.raises(ImportError, match=rf"orbax needs orbax-checkpoint >= 0\.12 and < 0\.13 \(.*\), but "
                                              rf"orbax-checkpoint {re.escape(version)} is installed"):
            orbax._check_version(version)
    orbax._check_version("0.12.8")
