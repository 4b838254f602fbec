"""loaderlib under torchrun (2 ranks, gloo on loopback; each rank runs ``_ranks.py``): disjoint
equal shards whose union is the epoch, set_epoch reshuffles, default threads split between
local ranks. (``benchmarks/distributed.py`` measures the same setting at size.) A job killed
mid-epoch resumes on another number of ranks (``_elastic_ranks.py``)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks._synth import encode_jpeg, photo_like

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: torchrun jobs, among the slowest tests: `make test` leaves them to `make test-long` (.ci/run runs both).
pytestmark = pytest.mark.long


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_ranks(tmp_path):
    pytest.importorskip("torch.distributed")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch without gloo")
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(41):
        w = int(rng.integers(48, 80))
        (data / f"img_{i:03d}.jpg").write_bytes(encode_jpeg(photo_like(w, w * 3 // 4, seed=i), quality=90))
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LOADERLIB_NUM_THREADS", "RANK", "WORLD_SIZE",
                                                             "LOCAL_WORLD_SIZE")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", os.path.join(ROOT, "tests", "unit", "_ranks.py"),
           "--data", str(data), "--out", str(out), "--epochs", "2", "--batch-size", "4"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["local_world_size"] for r in ranks] == [2, 2]
    for e in range(2):
        a, b = (r["epochs"][e] for r in ranks)
        assert len(a) == len(b) == 21                           # 41 samples padded to 42
        assert set(a) | set(b) == set(range(41))
        assert len(set(a) & set(b)) <= 1                        # only the wrapped-around sample
    assert all(r["epochs"][0] != r["epochs"][1] for r in ranks)
    cpus = ranks[0]["available_cpus"]
    assert all(r["num_threads"] == max(1, cpus // 2) for r in ranks)


def _torchrun(nproc: int, script: str, log, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("LOADERLIB_NUM_THREADS", "RANK", "WORLD_SIZE",
                                                             "LOCAL_WORLD_SIZE")}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", os.path.join(ROOT, "tests", "unit", script), *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _logged(out) -> list[list[int]]:
    """Each rank's delivered labels, in rank order (one list per rank)."""
    files = sorted(out.glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    return [[v for line in f.read_text().splitlines() for v in json.loads(line)] for f in files]


@pytest.mark.slow   # three torchrun jobs: `make test` runs it, `make test-fast` leaves it out
def test_torchrun_job_killed_mid_epoch_resumes_on_three_ranks_and_on_one(tmp_path):
    """A 2-rank job is SIGKILLed mid-epoch once rank 0 has saved every rank's state; restarted
    on 3 ranks, and (from the same checkpoint) on 1, it delivers the rest of the epoch: the
    union is the epoch, with no duplicate beyond padding, and the new ranks run as many
    batches each (NOTE [ Elastic resume ])."""
    pytest.importorskip("torch.distributed")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch without gloo")
    n = 41
    data = tmp_path / "data"
    data.mkdir()
    for i in range(n):
        (data / f"img_{i:03d}.jpg").write_bytes(encode_jpeg(photo_like(40, 30, seed=i), quality=90))
    checkpoint = tmp_path / "checkpoint.json"
    killed = tmp_path / "killed"
    killed.mkdir()
    log = tmp_path / "torchrun.log"
    with open(log, "w") as f:
        job = _torchrun(2, "_elastic_ranks.py", f, "--data", str(data), "--out", str(killed), "--checkpoint",
                        str(checkpoint), "--stop-after", "3")
    try:
        deadline = time.monotonic() + 240   # a bounded wait for the file the job writes, never a fixed sleep
        while not (killed / "saved").exists():
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the job never saved its state"
            time.sleep(0.05)
    finally:
        for p in killed.glob("pid*"):   # the ranks (torchrun starts each in a session of its own), then torchrun
            try:
                os.kill(int(p.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        job.kill()
        job.wait(timeout=60)
    assert job.returncode == -signal.SIGKILL
    assert len(list(killed.glob("pid*"))) == 2
    first = _logged(killed)
    assert [len(r) for r in first] == [12, 12]            # 3 batches of 4 on each rank, then the kill
    saved = json.loads(checkpoint.read_text())
    assert sorted(s["position"] for s in saved) == [12, 12]
    for world in (3, 1):
        out = tmp_path / f"on{world}"
        out.mkdir()
        mine = out / "checkpoint.json"   # each restart saves its own checkpoints as it goes
        mine.write_text(checkpoint.read_text())
        with open(log, "w") as f:
            proc = _torchrun(world, "_elastic_ranks.py", f, "--data", str(data), "--out", str(out), "--checkpoint",
                             str(mine))
            proc.wait(timeout=300)
        assert proc.returncode == 0, log.read_text()[-3000:]
        second = _logged(out)
        assert len(second) == world
        assert len({-(-len(r) // 4) for r in second}) == 1       # as many batches on every rank
        delivered = sum(first, []) + sum(second, [])
        assert set(delivered) == set(range(n))                  # the whole epoch
        assert len(delivered) - n <= 1 + (world - 1)            # repeated: only each layout's padding


def test_the_guides_torchrun_recipe_runs(tmp_path):
    """The torchrun recipe of docs/guide/training-at-scale.md, as one rank of gloo: it trains,
    saves the gathered states, and a second start resumes from them."""
    pytest.importorskip("torch.distributed")
    with open(os.path.join(ROOT, "docs", "guide", "training-at-scale.md"), encoding="utf-8") as f:
        recipes = [s for s in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "init_process_group" in s]
    assert len(recipes) == 1
    (tmp_path / "train.py").write_text(recipes[0])
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join([ROOT] + [p for p in sys.path if p])}
    for _ in range(2):
        env["MASTER_PORT"] = str(_free_port())
        proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        states = json.loads((tmp_path / "loader-states.json").read_text())
        assert len(states) == 1 and states[0]["layout"] == {"num_shards": 1, "shard_id": 0, "drop_last": False}
