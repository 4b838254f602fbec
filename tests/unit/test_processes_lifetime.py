"""Processes engine lifetime: early breaks return everything, hung workers are replaced,
iterators share the pool, load balancing, worker info."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import DataLoader
from loaderlib._engines.processes import shm_prefix
from loaderlib.datasets import ArrayDataset


def _shm_names():
    return {n for n in os.listdir("/dev/shm") if n.startswith(shm_prefix())}


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _xy(n=40):
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4), np.arange(n, dtype=np.int64)


def _double(a, b):
    return a * 2, b


def test_thirty_early_breaks_leave_nothing_behind():
    x, y = _xy(200)
    shm0 = _shm_names()
    loader = DataLoader(ArrayDataset(x, y).transform(_double), batch_size=4, num_workers=2, timeout=60)
    for _ in range(2):           # the steady pool: workers started, ring sized
        for _b in loader:
            break
    del _b
    gc.collect()
    shm1, fd1 = _shm_names(), _fds()
    for _ in range(30):
        for a, b in loader:
            np.testing.assert_array_equal(a, x[b] * 2)
            break
    del a, b
    gc.collect()
    pool = loader._workers
    assert pool.arena.stats["leased"] == 0 and not pool.inflight
    assert _shm_names() == shm1
    # Nothing left open by the thirty runs; the count may fall (an earlier test's garbage closing
    # its descriptors late), never rise.
    assert _fds() <= fd1
    loader.close()
    assert _shm_names() == shm0


class _HangsOnce:
    """Blocks forever the first time any worker loads sample 5 (a flag file marks it)."""

    def __init__(self, flag):
        self.flag = flag

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 5 and not os.path.exists(self.flag):
            open(self.flag, "w").close()
            threading.Event().wait()
        return np.float32(i)


def test_hung_worker_is_replaced(tmp_path):
    loader = DataLoader(_HangsOnce(str(tmp_path / "flag")), batch_size=2, num_workers=2, timeout=3)
    pids = None
    with pytest.raises(ll.LoaderTimeoutError, match="was killed"):
        for _ in loader:
            pids = pids or [w.proc.pid for w in loader._workers.workers]
    assert sum(w.alive() for w in loader._workers.workers) == 1
    got = np.concatenate(list(loader))                 # the next epoch: a fresh worker in its place
    np.testing.assert_array_equal(got, np.arange(12, dtype=np.float32))
    assert all(w.alive() for w in loader._workers.workers)
    assert [w.proc.pid for w in loader._workers.workers] != pids
    loader.close()


def test_next_epoch_after_a_timeout_while_the_failed_iterator_is_kept(tmp_path):
    # The next epoch was planned (warm) before the timeout killed a worker that held some of
    # its batches: it is dropped with the failed iterator, even though the kept iterator (and
    # the exception's traceback) is not collected.
    loader = DataLoader(_HangsOnce(str(tmp_path / "flag")), batch_size=2, num_workers=2, timeout=3)
    it = iter(loader)
    with pytest.raises(ll.LoaderTimeoutError, match="was killed") as failed:
        for _ in it:
            pass
    got = np.concatenate(list(loader))
    np.testing.assert_array_equal(got, np.arange(12, dtype=np.float32))
    assert failed.value.__traceback__ is not None and it is not None
    loader.close()


def test_a_stale_wait_on_a_replaced_worker_leaves_the_fresh_one_alone():
    # The race behind the test above, made deterministic: the timed-out run's driver, still
    # waiting on the killed worker, finds it dead only after the next epoch has started a
    # fresh worker with the same id and sent it a batch. That batch stays the fresh worker's
    # (it was lost: "worker 0 was replaced; cannot load batch 0 of epoch 1").
    from loaderlib._engines.messages import Done
    from loaderlib._engines.processes import _decode

    x, y = _xy(8)
    loader = DataLoader(ArrayDataset(x, y).transform(_double), batch_size=4, num_workers=2, timeout=60)
    assert len(list(loader)) == 2   # the pool is up
    pool = loader._workers
    old = pool.workers[0]
    pool.kill(0)
    pool.revive()
    tid, wid = pool.submit(np.arange(4), wid=0)
    assert wid == 0 and pool.workers[0] is not old
    with pytest.raises(ll.WorkerError, match="worker 0 .*while loading batch 2 of epoch 0"):
        raise pool._fail(old, "batch 2 of epoch 0")   # what the stale driver does
    assert tid in pool.inflight
    msg, lease = pool.recv(0, tid, 60, "batch 0 of epoch 1")
    assert isinstance(msg, Done)
    a, b = _decode(msg.structure, np.frombuffer(lease, np.uint8))
    np.testing.assert_array_equal(a, x[:4] * 2)
    np.testing.assert_array_equal(b, y[:4])
    del a, b, lease
    loader.close()


def test_killed_worker_is_replaced_next_epoch():
    x, y = _xy(80)
    loader = DataLoader(ArrayDataset(x, y).transform(_double), batch_size=4, num_workers=2, timeout=60)
    it = iter(loader)
    next(it)
    os.kill(loader._workers.workers[0].proc.pid, signal.SIGKILL)
    with pytest.raises(ll.WorkerError, match="worker 0"):
        for _ in it:
            pass
    got = [b for _, b in loader]
    assert np.concatenate(got).tolist() == list(range(80))
    loader.close()


def test_two_iterators_share_the_workers():
    x, y = _xy(48)
    loader = DataLoader(ArrayDataset(x, y).transform(_double), batch_size=4, num_workers=2, timeout=60)
    a, b = iter(loader), iter(loader)
    got_a, got_b = [], []
    for pair in zip(a, b):
        got_a.append(pair[0][1].copy())
        got_b.append(pair[1][1].copy())
    got_a += [t[1].copy() for t in a]
    got_b += [t[1].copy() for t in b]
    assert np.concatenate(got_a).tolist() == list(range(48))
    assert np.concatenate(got_b).tolist() == list(range(48))
    loader.close()


class _SlowOnWorkerZero:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        info = ll.get_worker_info()
        if info is not None and info.id == 0:
            time.sleep(0.02)
        return np.float32(i)


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded"])
def test_load_balance_keeps_order(policy):
    # A slow worker changes who loads what, never what comes out or in which order.
    loader = DataLoader(_SlowOnWorkerZero(), batch_size=2, num_workers=2, load_balance=policy, max_in_flight=4,
                        timeout=60)
    got = np.concatenate(list(loader))
    np.testing.assert_array_equal(got, np.arange(64, dtype=np.float32))
    assert sum(loader._workers.sent) >= 32   # the 32 batches, and the warm next epoch's first ones
    loader.close()


class _FakeWorker:
    def __init__(self, wid):
        self.wid = wid

    def alive(self):
        return False   # nothing to poll: the loads below are the whole state


def _fake_pool(policy, loads):
    from loaderlib._engines.processes import WorkerPool

    pool = WorkerPool.__new__(WorkerPool)   # the policy alone, without processes
    pool.load_balance = policy
    pool.workers = [_FakeWorker(k) for k in range(len(loads))]
    pool.load = list(loads)
    pool._rr = 0
    return pool


def test_least_loaded_picks_the_worker_with_fewest_tasks_in_flight():
    assert _fake_pool("least_loaded", [3, 1, 2])._pick().wid == 1
    assert _fake_pool("least_loaded", [2, 2, 2])._pick().wid == 0    # ties: the lowest id
    assert _fake_pool("least_loaded", [0, 5])._pick().wid == 0


def test_round_robin_ignores_load():
    pool = _fake_pool("round_robin", [9, 0, 0])
    assert [pool._pick().wid for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def _record_init(wid):
    info = ll.get_worker_info()
    with open(os.environ["LL_TEST_INIT_LOG"], "a") as f:
        f.write(f"{wid} {info.id} {info.num_workers} {info.seed}\n")


def test_worker_init_fn_sees_worker_info(tmp_path, monkeypatch):
    log = tmp_path / "init.log"
    monkeypatch.setenv("LL_TEST_INIT_LOG", str(log))
    x, y = _xy(8)
    loader = DataLoader(ArrayDataset(x, y).transform(_double), batch_size=4, num_workers=2, seed=100,
                        worker_init_fn=_record_init, timeout=60)
    list(loader)
    loader.close()
    lines = sorted(log.read_text().split("\n")[:-1])
    assert lines == ["0 0 2 100", "1 1 2 101"]


_KILLED_SCRIPT = r"""
import json, os, signal, sys
import numpy as np
import loaderlib as ll
from loaderlib.datasets import ArrayDataset

x = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
loader = ll.DataLoader(ArrayDataset(x).transform(lambda a: a * 2), batch_size=4, num_workers=2, timeout=60)
it = iter(loader)
next(it)
next(it)
blocks = sorted(b.name for b in loader._workers._blocks)
workers = [w.proc.pid for w in loader._workers.workers]
print(json.dumps({"blocks": blocks, "workers": workers, "pid": os.getpid()}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:   # a zombie whose parent died is reaped by init; treat a zombie as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_sigkilled_loader_leaves_no_workers_or_shared_memory(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(_KILLED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == -signal.SIGKILL, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["blocks"] and len(info["workers"]) == 2
    assert all(b.startswith(shm_prefix(info["pid"])) for b in info["blocks"])   # named after their process
    # The workers see their socket close and exit; the loader's resource tracker unlinks its
    # segments. Both happen asynchronously: wait for them (a hang guard, not a timing check).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = set(info["blocks"]) & set(os.listdir("/dev/shm"))
        alive = [p for p in info["workers"] if not _gone(p)]
        if not left and not alive:
            break
        time.sleep(0.1)
    assert not (set(info["blocks"]) & set(os.listdir("/dev/shm")))
    assert all(_gone(p) for p in info["workers"])
