"""``torch.distributed.checkpoint`` resumes a loaderlib loader (NOTE [ Loader state in DCP ]):
each rank's state under a key of its own, loaded on the same or another data-parallel size.

torchrun with gloo on CPU, each job new processes running ``dcp_run.py``. Job A takes 12
batches per rank straight; job B takes 6 (mid-epoch: 4 batches per epoch per rank) and saves
with ``dcp.save``; new jobs load that checkpoint with ``dcp.load``: on 2 ranks each must take
job A's batches 6..11 (its own state, bitwise), on 3 ranks they must take what the 2 ranks left
of the epoch, split again, then the next epoch of the 3-rank layout. The reference is a
plain-Python model of the documented order (each epoch's global order; rank ``r`` of ``w``
takes slots ``r, r + w, ...``, padded by wrapping around).
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
N, BATCH, ORDER_SEED = 30, 4, 3   # as in dcp_run.py


def _run(out, procs: int, *args: str) -> dict[int, dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", "dcp_run.py",
           str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=HERE,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert p.returncode == 0, f"{' '.join(cmd[3:])} failed:\n{(p.stdout + p.stderr)[-4000:]}"
    out_ = {}
    for r in range(procs):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            out_[r] = json.load(f)
    return out_


def _order(epoch: int) -> list[int]:
    return ll.ShardedSampler(1, 0, N, shuffle=True, seed=ORDER_SEED).order(epoch).tolist()


def _deal(items: list[int], world: int, rank: int) -> list[list[int]]:
    per = -(-len(items) // world)
    shard = [items[(rank + j * world) % len(items)] for j in range(per)]
    return [shard[i:i + BATCH] for i in range(0, per, BATCH)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp")
    ckpt = root / "c6"
    return {"A": _run(root / "A", 2, "--steps", "12"),
            "B": _run(root / "B", 2, "--steps", "6", "--save-at", "6", str(ckpt)),
            "R2": _run(root / "R2", 2, "--steps", "6", "--resume", str(ckpt)),
            "R3": _run(root / "R3", 3, "--steps", "3", "--resume", str(ckpt))}


def test_on_the_same_size_each_rank_continues_its_own_state(runs):
    for r in (0, 1):
        want = [b for e in range(3) for b in _deal(_order(e), 2, r)][:12]
        assert runs["A"][r]["batches"] == want, f"rank {r}: the straight job"
        assert runs["B"][r]["batches"] == want[:6]
        assert runs["R2"][r]["batches"] == want[6:12], f"rank {r}: resumed"
        assert runs["R2"][r]["applied"] == "own"


def test_on_another_size_the_rest_of_the_epoch_is_split_again(runs):
    left = [_order(1)[p] for p in range(16, N)]   # 2 ranks took slots 0..15 of epoch 1 (2 batches of 4 each)
    for r in range(3):
        want = _deal(left, 3, r) + _deal(_order(2), 3, r)
        assert runs["R3"][r]["batches"] == want[:3], f"rank {r}"
        assert runs["R3"][r]["applied"] == "merged"


@pytest.mark.long   # NOTE [ The slowest framework runs ] (tests/frameworks/__init__.py)
def test_the_docs_example_runs(tmp_path, monkeypatch):
    """docs/integrations/dcp.md: one process, no process group."""
    import re

    root = os.path.dirname(os.path.dirname(HERE))
    with open(os.path.join(root, "docs", "integrations", "dcp.md"), encoding="utf-8") as f:
        (code,) = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__doc_snippet__"}
    exec(compile(code, "dcp.md", "exec"), scope)  # noqa: S102
    order = ll.ShardedSampler(1, 0, 64, shuffle=True, seed=3).order(0).tolist()
    assert scope["first"] == [order[i:i + 8] for i in range(0, 24, 8)]
    assert scope["rest"] == [order[i:i + 8] for i in range(24, 64, 8)]


def test_a_torch_outside_the_supported_range_is_refused_naming_the_version():
    """NOTE [ Framework version ranges ]: the version string as torch reports it."""
    import re

    from loaderlib.integrations import dcp

    assert dcp.SUPPORTED == ((2, 2), (3, 0))
    for version in ("2.1.2+cpu", "3.0.0", "1.13.1"):
        with pytest.raises(ImportError, match=rf"dcp needs torch >= 2\.2 and < 3\.0 \(.*\), but torch "
                                              rf"{re.escape(version)} is installed"):
            dcp._check_version(version)
    dcp._check_version("2.13.0+cpu")
