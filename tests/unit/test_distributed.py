"""loaderlib under torchrun (2 ranks, gloo on loopback; each rank runs ``_ranks.py``): disjoint
equal shards whose union is the epoch, set_epoch reshuffles, default threads split between
local ranks. (``benchmarks/distributed.py`` measures the same setting at size.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from benchmarks._synth import encode_jpeg, photo_like

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
