"""Hugging Face Accelerate resumes a loaderlib loader registered with
``accelerator.register_for_checkpointing(loader)`` exactly.

The real framework on CPU: 2 processes under torchrun (gloo), each run new processes running
``accelerate_run.py``. Accelerate saves a registered object's ``state_dict()`` from the main
process only and loads it on every rank (NOTE [ One state for every rank ]). Run A trains 12
steps straight; run B trains 6 steps and saves after steps 4 (an epoch boundary: 4 batches per
epoch per rank) and 6 (mid-epoch); new jobs load those states and train on to 8 and 12, and on
one process from step 6. Each rank's batches must equal run A's from the same step, and run A
must follow the documented order (a plain-Python model: each epoch's global order, rank ``r``
taking slots ``r, r + 2, ...``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import loaderlib as ll

pytestmark = pytest.mark.frameworks

HERE = os.path.dirname(os.path.abspath(__file__))
N, BATCH, ORDER_SEED = 30, 4, 3   # as in accelerate_run.py


def _run(out, procs: int, *args: str) -> dict[int, list[list[int]]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
           "accelerate_run.py", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=HERE,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert p.returncode == 0, f"{' '.join(cmd[3:])} failed:\n{(p.stdout + p.stderr)[-4000:]}"
    ranks = {}
    for r in range(procs):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks[r] = json.load(f)["batches"]
    return ranks


def _model(rank: int, world: int, epochs: int) -> list[list[int]]:
    out = []
    for e in range(epochs):
        order = ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(e).tolist()
        per = -(-N // world)
        shard = [order[(rank + j * world) % N] for j in range(per)]
        out += [shard[i:i + BATCH] for i in range(0, per, BATCH)]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    try:
        import accelerate
    except ImportError as e:   # a test dependency: fail saying why, never skip
        pytest.fail(f"Accelerate does not import ({e}); it is a test dependency: `make test-long` installs "
                    "requirements-frameworks.txt over the local CPU torch")
    assert accelerate.__version__.startswith("1."), accelerate.__version__
    root = tmp_path_factory.mktemp("accelerate")
    c4, c6 = root / "c4", root / "c6"
    return {"A": _run(root / "A", 2, "--steps", "12"),
            "B": _run(root / "B", 2, "--steps", "6", "--save-at", "4", str(c4), "--save-at", "6", str(c6)),
            "R6": _run(root / "R6", 2, "--steps", "12", "--from-step", "6", "--resume", str(c6)),
            "R4": _run(root / "R4", 2, "--steps", "8", "--from-step", "4", "--resume", str(c4)),
            "R6w1": _run(root / "R6w1", 1, "--steps", "12", "--from-step", "6", "--resume", str(c6))}


def test_each_rank_sees_the_batches_of_a_straight_run_after_load_state(runs):
    a = runs["A"]
    for r in (0, 1):
        assert a[r] == _model(r, 2, 3)[:12], f"rank {r}: the straight run"
        assert runs["B"][r] == a[r][:6], f"rank {r}: the first 6 steps"
        assert runs["R6"][r] == a[r][6:12], f"rank {r}: resumed mid-epoch at step 6"
        assert runs["R4"][r] == a[r][4:8], f"rank {r}: resumed at the epoch boundary (step 4)"


def test_a_resume_on_one_process_delivers_what_the_two_ranks_left(runs):
    order1 = ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(1).tolist()
    taken = {(r + 2 * j) for r in (0, 1) for j in range(2 * BATCH)}   # 2 batches of each rank
    left = [order1[p] for p in range(N) if p not in taken]
    rest = [left[i:i + BATCH] for i in range(0, len(left), BATCH)]
    got = runs["R6w1"][0]
    assert got[:len(rest)] == rest
    assert got[len(rest):] == _model(0, 1, 3)[16:16 + len(got) - len(rest)]   # epoch 2 (8 batches an epoch)


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_the_docs_example_runs(tmp_path, monkeypatch):
    """docs/integrations/accelerate.md: its example saves the loader's state and resumes."""
    import re

    root = os.path.dirname(os.path.dirname(HERE))
    with open(os.path.join(root, "docs", "integrations", "accelerate.md"), encoding="utf-8") as f:
        (code,) = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__doc_snippet__"}
    exec(compile(code, "accelerate.md", "exec"), scope)  # noqa: S102
    order = ll.ShardedSampler(1, 0, 64, shuffle=True, seed=3).order(0).tolist()   # one process: all of it
    assert scope["rest"] == [order[i:i + 8] for i in range(24, 64, 8)]   # after 3 batches of 8
