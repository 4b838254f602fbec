"""benchmarks/distributed.py under torchrun (2 ranks, gloo on loopback): disjoint equal shards
whose union is the epoch, set_epoch reshuffles, default threads split between local ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

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
    out = tmp_path / "ranks.json"
    env = {k: v for k, v in os.environ.items() if k not in ("LOADERLIB_NUM_THREADS", "RANK", "WORLD_SIZE",
                                                             "LOCAL_WORLD_SIZE")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", os.path.join(ROOT, "benchmarks", "distributed.py"),
           "--images", "41", "--batch-size", "4", "--size", "32", "--epochs", "2",
           "--data", str(tmp_path / "data"), "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"]
    # Check the gathered shards here too, independently of the script's own verdict.
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    assert [r["local_world_size"] for r in ranks] == [2, 2]
    for e in range(2):
        a, b = (r["epochs"][e] for r in ranks)
        assert len(a) == len(b) == 21                           # 41 samples padded to 42
        assert set(a) | set(b) == set(range(41))
        assert len(set(a) & set(b)) <= 1                        # only the wrapped-around sample
    assert all(r["epochs"][0] != r["epochs"][1] for r in ranks)
    cpus = ranks[0]["available_cpus"]
    assert all(r["num_threads"] == max(1, cpus // 2) for r in ranks)
