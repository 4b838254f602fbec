"""Orbax checkpoints a loaderlib loader (NOTE [ Loader state in Orbax ]).

The example of docs/integrations/orbax.md runs with a real ``CheckpointManager``; the handler,
given the states of a 2-process job (as ``process_0.json`` and ``process_1.json``), restores
each process's own state on 2 processes and the merge on 1. A real multi-process JAX job
(``jax.distributed`` on CPU, each process new, running ``orbax_run.py``; marker ``long``, six
jobs): run A takes 12
batches per process straight on 2 processes; run B takes 6 and saves at steps 4 (an epoch
boundary: 4 batches an epoch per process) and 6 (mid-epoch) with a ``CheckpointManager``, one
``process_<i>.json`` per process; new jobs restore step 6 on 2 processes (each its own state:
run A's batches 6..11), on 1 and on 3 (the merge: what the 2 processes left of the epoch, split
again, then the epochs of the new layout), and step 4 on 2. The reference is a plain-Python
model of the documented order: the global order of the epoch, process ``r`` of ``w`` taking
slots ``r, r + w, ...`` (wrapping around to pad), the rest of an epoch after a merge taken in
that order and split the same way.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

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
        pytest.fail(f"orbax-checkpoint does not import ({e}); it is a test dependency: `make test-long` installs "
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(out, procs: int, *args: str) -> dict[int, dict]:
    """One JAX job of ``procs`` processes running orbax_run.py; each process's record."""
    port = str(_free_port())
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore")
    ps = [subprocess.Popen([sys.executable, "orbax_run.py", str(out), "--processes", str(procs), "--process-id",
                            str(i), "--port", port, *args], cwd=HERE, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True) for i in range(procs)]
    logs = []
    try:
        for p in ps:
            logs.append(p.communicate(timeout=300)[0])
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, log) in enumerate(zip(ps, logs)):
        assert p.returncode == 0, f"process {i} of {procs} ({' '.join(args)}) failed:\n{log[-4000:]}"
    got = {}
    for i in range(procs):
        with open(os.path.join(out, f"process{i}.json")) as f:
            got[i] = json.load(f)
    return got


def _shard(items: list[int], rank: int, world: int) -> list[list[int]]:
    """Process ``rank`` of ``world``'s batches of ``items``: slots ``rank, rank + world, ...``,
    wrapping around so that every process has as many."""
    per = -(-len(items) // world)
    mine = [items[(rank + j * world) % len(items)] for j in range(per)]
    return [mine[i:i + BATCH] for i in range(0, per, BATCH)]


def _epochs(rank: int, world: int, first: int, count: int) -> list[list[int]]:
    return [b for e in range(first, first + count)
            for b in _shard(ll.ShardedSampler(1, 0, N, shuffle=True, seed=SEED).order(e).tolist(), rank, world)]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    _orbax()
    root = tmp_path_factory.mktemp("orbax")
    ck = str(root / "ckpt")
    return {"A": _job(root / "A", 2, "--ckpt", str(root / "a-ckpt"), "--steps", "12"),
            "B": _job(root / "B", 2, "--ckpt", ck, "--steps", "6", "--save-at", "4", "--save-at", "6"),
            "R6": _job(root / "R6", 2, "--ckpt", ck, "--steps", "12", "--resume", "6"),
            "R4": _job(root / "R4", 2, "--ckpt", ck, "--steps", "8", "--resume", "4"),
            "R6w1": _job(root / "R6w1", 1, "--ckpt", ck, "--steps", "16", "--resume", "6"),
            "R6w3": _job(root / "R6w3", 3, "--ckpt", ck, "--steps", "12", "--resume", "6")}


@pytest.mark.long
def test_a_jax_job_of_two_processes_resumes_each_its_own(jobs):
    a = jobs["A"]
    for r in (0, 1):
        assert a[r]["world"] == 2 and a[r]["batches"] == _epochs(r, 2, 0, 3)[:12], f"process {r}: the straight run"
        assert jobs["B"][r]["batches"] == a[r]["batches"][:6]
        assert jobs["B"][r]["files"] == {"4": ["commit_success.txt", "process_0.json", "process_1.json"],
                                         "6": ["commit_success.txt", "process_0.json", "process_1.json"]}
        assert jobs["R6"][r]["batches"] == a[r]["batches"][6:12], f"process {r}: restored mid-epoch at step 6"
        assert jobs["R4"][r]["batches"] == a[r]["batches"][4:8], f"process {r}: restored at the epoch boundary"
        assert jobs["R6"][r]["applied"] == jobs["R4"][r]["applied"] == "own"


@pytest.mark.long
def test_the_states_of_two_processes_resume_on_one_and_on_three(jobs):
    order1 = ll.ShardedSampler(1, 0, N, shuffle=True, seed=SEED).order(1).tolist()
    left = order1[2 * 2 * BATCH:]   # step 6: each process took 2 batches of epoch 1, slots 0..15
    one = jobs["R6w1"][0]
    assert one["applied"] == "merged" and one["world"] == 1
    assert one["batches"] == (_shard(left, 0, 1) + _epochs(0, 1, 2, 2))[:10]
    for r in range(3):
        got = jobs["R6w3"][r]
        assert got["applied"] == "merged" and got["world"] == 3
        assert got["batches"] == (_shard(left, r, 3) + _epochs(r, 3, 2, 2))[:6], f"process {r} of 3"
