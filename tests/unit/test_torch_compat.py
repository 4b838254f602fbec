"""PyTorch's DataLoader keywords, worker info on every engine, thread defaults, num_threads=0."""

from __future__ import annotations

import functools
import operator
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import _threads
from loaderlib import transforms as T

N = 24


def _arrays():
    return ll.ArrayDataset(np.arange(N * 2, dtype=np.float32).reshape(N, 2), np.arange(N, dtype=np.int64))


def _labels(loader):
    return [b[1].tolist() for b in loader]


# -- keywords ---------------------------------------------------------------------------------


def test_generator_numpy_seeds_the_shuffle():
    a = ll.DataLoader(_arrays(), batch_size=4, shuffle=True, generator=np.random.default_rng(5))
    b = ll.DataLoader(_arrays(), batch_size=4, shuffle=True, generator=np.random.default_rng(5))
    c = ll.DataLoader(_arrays(), batch_size=4, shuffle=True, generator=np.random.default_rng(6))
    assert _labels(a) == _labels(b) != _labels(c)
    assert sorted(functools.reduce(operator.iadd, _labels(a), [])) == list(range(N))


def test_generator_torch_seeds_the_shuffle():
    torch = pytest.importorskip("torch")
    a = ll.DataLoader(_arrays(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    b = ll.DataLoader(_arrays(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    assert _labels(a) == _labels(b)
    assert a.seed == b.seed


def test_generator_conflicts_with_seed():
    with pytest.raises(ValueError, match="seed and generator"):
        ll.DataLoader(_arrays(), batch_size=4, seed=1, generator=np.random.default_rng(1))
    with pytest.raises(ValueError, match="generator must be"):
        ll.DataLoader(_arrays(), batch_size=4, generator=42)


def test_prefetch_factor_sets_depth_per_worker():
    loader = ll.DataLoader(_arrays(), batch_size=4, prefetch_factor=3)
    assert loader.prefetch == 3
    loader = ll.DataLoader(_arrays().transform(lambda a, b: (a, b)), batch_size=4, num_workers=2, prefetch_factor=3)
    assert loader.prefetch == 6 and loader.max_in_flight == 6
    with pytest.raises(ValueError, match="prefetch and prefetch_factor"):
        ll.DataLoader(_arrays(), batch_size=4, prefetch=2, prefetch_factor=2)
    with pytest.raises(ValueError, match="prefetch_factor must be"):
        ll.DataLoader(_arrays(), batch_size=4, prefetch_factor=0)


def test_persistent_workers_and_in_order_accepted():
    loader = ll.DataLoader(_arrays(), batch_size=4, persistent_workers=True, in_order=False)
    assert _labels(loader) == [list(range(k, k + 4)) for k in range(0, N, 4)]   # always in order
    with pytest.raises(ValueError, match="persistent_workers"):
        ll.DataLoader(_arrays(), batch_size=4, persistent_workers="yes")


@pytest.mark.parametrize("ctx", [None, "spawn", "forkserver"])
def test_multiprocessing_context_spawn_like(ctx):
    import multiprocessing as mp

    for c in (ctx, mp.get_context(ctx) if ctx else None):
        loader = ll.DataLoader(_arrays(), batch_size=4, multiprocessing_context=c)
        assert loader.multiprocessing_context == ctx


def test_multiprocessing_context_fork_refused():
    with pytest.raises(ValueError, match="'fork' would inherit an OpenMP pool"):
        ll.DataLoader(_arrays(), batch_size=4, num_workers=1, multiprocessing_context="fork")


def _no_cuda():
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA present")
    except ImportError:
        pass


def test_pin_memory_without_cuda_warns_once_and_loads_unpinned():
    """As PyTorch's DataLoader: a GPU script smoke-tested on a CPU machine runs unchanged."""
    _no_cuda()
    ref = [(x.copy(), y.copy()) for x, y in ll.DataLoader(_arrays(), batch_size=4, seed=3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = ll.DataLoader(_arrays(), batch_size=4, seed=3, pin_memory=True)
        got = [[(x.copy(), y.copy()) for x, y in loader] for _ in range(2)]
    pin = [w for w in caught if "pin_memory" in str(w.message)]
    assert len(pin) == 1 and issubclass(pin[0].category, UserWarning)
    assert str(pin[0].message).startswith("pin_memory=True: no CUDA device")
    assert "unpinned" in str(pin[0].message)
    assert pin[0].filename == __file__            # points at the user's DataLoader(...) line
    assert loader.pin_memory is False
    for epoch in got:
        assert len(epoch) == len(ref)
        for (x, y), (rx, ry) in zip(epoch, ref):
            np.testing.assert_array_equal(x, rx)
            np.testing.assert_array_equal(y, ry)
    with pytest.warns(UserWarning, match=r"pin_memory=True, pin_memory_device='cuda': no CUDA device"):
        ll.DataLoader(_arrays(), batch_size=4, pin_memory=True, pin_memory_device="cuda")
    # What cannot be honoured on any machine still raises.
    with pytest.raises(ValueError, match="needs pin_memory=True"):
        ll.DataLoader(_arrays(), batch_size=4, pin_memory_device="cuda")


def test_load_balance_and_max_in_flight_validated():
    with pytest.raises(ValueError, match="load_balance must be"):
        ll.DataLoader(_arrays(), batch_size=4, load_balance="random")
    with pytest.raises(ValueError, match="max_in_flight must be"):
        ll.DataLoader(_arrays(), batch_size=4, max_in_flight=0)


def test_num_workers_sets_native_threads_and_explain_says_so(tmp_path):
    loader = ll.DataLoader(_arrays(), batch_size=4, num_workers=3)
    assert loader.engine == "native" and loader.num_threads == 3
    assert "num_workers=3 sets the kernel thread count" in loader.explain()
    loader = ll.DataLoader(_arrays(), batch_size=4, num_workers=3, num_threads=1)
    assert loader.num_threads == 1


# -- worker_init_fn and get_worker_info on every engine ------------------------------------------


class _InfoDataset:
    """Returns, per sample, the worker id seen by get_worker_info() (-1 in the main thread)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = ll.get_worker_info()
        return np.array([i, -1 if info is None else info.id, -1 if info is None else info.num_workers])


def test_get_worker_info_is_none_in_main_thread():
    assert ll.get_worker_info() is None


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_worker_info_inside_dataset(engine):
    kwargs = {"num_workers": 2} if engine == "processes" else {"num_threads": 2}
    loader = ll.DataLoader(_InfoDataset(), batch_size=4, **kwargs)
    assert loader.engine == engine
    rows = np.concatenate(list(loader))
    assert rows[:, 0].tolist() == list(range(8))
    assert set(rows[:, 1].tolist()) <= {0, 1} and set(rows[:, 2].tolist()) == {2}
    loader.close()


def test_worker_init_fn_on_native_engine():
    seen = []

    def init(wid):
        info = ll.get_worker_info()
        seen.append((wid, info.id, info.num_workers, info.seed, threading.current_thread().name))

    loader = ll.DataLoader(_arrays(), batch_size=4, num_threads=2, seed=10, worker_init_fn=init)
    assert loader.engine == "native"
    list(loader)
    list(loader)   # kernel threads persist: once per slot, not per epoch
    assert [s[:4] for s in seen] == [(0, 0, 2, 10), (1, 1, 2, 11)]
    assert all(s[4] == "loaderlib-driver" for s in seen)
    assert ll.get_worker_info() is None


def test_worker_init_fn_on_threads_engine():
    seen = []
    lock = threading.Lock()

    def init(wid):
        with lock:
            seen.append((wid, ll.get_worker_info().id))

    loader = ll.DataLoader(_arrays().transform(lambda a, b: (a, b)), batch_size=2, num_threads=2,
                           worker_init_fn=init)
    list(loader)
    assert sorted(seen) == [(w, w) for w in sorted(w for w, _ in seen)] and {w for w, _ in seen} <= {0, 1}


def test_worker_init_fn_with_num_threads_zero_runs_in_caller():
    seen = []
    loader = ll.DataLoader(_arrays(), batch_size=4, num_threads=0, worker_init_fn=seen.append)
    list(loader)
    assert seen == [0]


# -- thread defaults -------------------------------------------------------------------------------


def test_the_quota_is_read_once_a_second_per_process(monkeypatch):
    reads = []
    now = [100.0]
    monkeypatch.setattr(_threads, "_quota_cache", None)
    monkeypatch.setattr(_threads, "_clock", lambda: now[0])
    monkeypatch.setattr(_threads, "_affinity_cpus", lambda: 64)
    monkeypatch.setattr(_threads, "cgroup_cpu_limit", lambda root="/sys/fs/cgroup": reads.append(1) or 4.0)
    assert [_threads.available_cpus() for _ in range(5)] == [4] * 5
    assert len(reads) == 1
    now[0] += _threads.QUOTA_TTL_S                          # a second later: read again
    monkeypatch.setattr(_threads, "cgroup_cpu_limit", lambda root="/sys/fs/cgroup": reads.append(1) or 2.0)
    assert _threads.available_cpus() == 2 and len(reads) == 2
    pid = os.getpid()
    monkeypatch.setattr(_threads.os, "getpid", lambda: pid + 1)   # a forked child reads its own
    assert _threads.available_cpus() == 2 and len(reads) == 3


def test_cgroup_quota_is_read(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _threads.cgroup_cpu_limit(str(tmp_path)) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _threads.cgroup_cpu_limit(str(tmp_path)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _threads.cgroup_cpu_limit(str(v1)) == 3.0


def test_quota_caps_available_cpus(monkeypatch):
    monkeypatch.setattr(_threads, "_quota_cache", None)
    monkeypatch.setattr(_threads, "_affinity_cpus", lambda: 64)
    monkeypatch.setattr(_threads, "cgroup_cpu_limit", lambda root="/sys/fs/cgroup": 2.5)
    assert _threads.available_cpus() == 3
    monkeypatch.delenv("LOADERLIB_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert _threads.default_num_threads() == 1
    monkeypatch.setenv("LOADERLIB_NUM_THREADS", "5")
    assert _threads.default_num_threads() == 5


def _default_in_child(env_extra, affinity=None):
    code = "import os, loaderlib as ll\n"
    if affinity is not None:
        code += f"os.sched_setaffinity(0, {set(affinity)!r})\n"
    code += "print(ll.DataLoader(ll.ArrayDataset(list(range(4))), batch_size=2).num_threads)"
    env = {k: v for k, v in os.environ.items() if k not in ("LOADERLIB_NUM_THREADS", "LOCAL_WORLD_SIZE")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True, timeout=60).stdout.strip())


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity API")
def test_thread_default_under_affinity_mask_and_local_world_size():
    cpus = sorted(os.sched_getaffinity(0))
    assert _default_in_child({}, affinity=cpus[:1]) == 1
    expect = max(1, _threads.available_cpus() // 2)
    assert _default_in_child({"LOCAL_WORLD_SIZE": "2"}) == expect
    assert _default_in_child({"LOADERLIB_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "2"}) == 3


# -- num_threads=0 ------------------------------------------------------------------------------------


def test_num_threads_zero_equals_two_threads_native(tmp_path):
    import cv2

    rng = np.random.default_rng(1)
    paths = []
    for i in range(10):
        p = tmp_path / f"{i}.jpg"
        cv2.imwrite(str(p), rng.integers(0, 255, (30, 40, 3), dtype=np.uint8))
        paths.append(str(p))
    ds = ll.ImageListDataset(paths, list(range(10))).transform_first(
        T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToCHW()]))
    before = {t.name for t in threading.enumerate()}
    zero = [tuple(np.array(a) for a in b) for b in ll.DataLoader(ds, batch_size=4, num_threads=0, seed=3, shuffle=True)]
    assert {t.name for t in threading.enumerate()} - before == set()   # no thread was started
    two = [tuple(np.array(a) for a in b) for b in ll.DataLoader(ds, batch_size=4, num_threads=2, seed=3, shuffle=True)]
    assert len(zero) == len(two) == 3
    for a, b in zip(zero, two):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_num_threads_zero_runs_python_in_calling_thread():
    callers = set()

    def step(a, b):
        callers.add(threading.current_thread().name)
        return a + 1, b

    loader = ll.DataLoader(_arrays().transform(step), batch_size=4, num_threads=0, shuffle=True, seed=2)
    ref = ll.DataLoader(_arrays().transform(lambda a, b: (a + 1, b)), batch_size=4, num_threads=2, shuffle=True,
                        seed=2)
    got, want = list(loader), list(ref)
    assert callers == {threading.current_thread().name}
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a[0], b[0])
    assert "calling thread" in loader.explain()


def test_num_threads_zero_conflicts_with_workers():
    with pytest.raises(ValueError, match="num_threads=0 runs everything in the calling thread"):
        ll.DataLoader(_arrays(), batch_size=4, num_threads=0, num_workers=2)


def test_num_threads_zero_error_raises_in_caller():
    def bad(a, b):
        raise RuntimeError("boom")

    loader = ll.DataLoader(_arrays().transform(bad), batch_size=4, num_threads=0)
    with pytest.raises(RuntimeError, match="boom"):
        next(iter(loader))


def test_worker_init_fn_threads_engine_num_threads_zero():
    seen = []
    loader = ll.DataLoader(_arrays().transform(lambda a, b: (a, b)), batch_size=4, num_threads=0,
                           worker_init_fn=seen.append)
    list(loader)
    assert seen == [0]


def test_pin_memory_slots_come_from_the_pinned_allocator(monkeypatch):
    """With CUDA, every arena slot is allocated once through torch's pinned allocator (simulated
    here: this machine has no CUDA, so pin_memory=True is recorded and dropped)."""
    torch = pytest.importorskip("torch")
    calls = []
    real_empty = torch.empty

    def fake_empty(*args, pin_memory=False, **kwargs):
        calls.append(pin_memory)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "empty", fake_empty)
    loader = ll.DataLoader(_arrays(), batch_size=4, pin_memory=True, prefetch=2)
    got = [b.copy() for b, _ in loader]
    np.testing.assert_array_equal(np.concatenate(got), np.arange(N * 2, dtype=np.float32).reshape(N, 2))
    assert calls and all(calls)                       # every slot pinned
    n = len(calls)
    for _ in range(5):                                # 30 more batches
        list(loader)
    # Once per slot, not per batch: every call is one of the ring's allocations, and the ring
    # grows by at most a slot or two once warm epochs overlap (never per batch).
    assert len(calls) == loader._arena_ring.stats["allocations"] and len(calls) <= n + 2
    # The processes engine pins too, by registering its shared-memory slots with CUDA
    # (tests/unit/test_pinned_processes.py).
    with ll.DataLoader(_arrays().transform(lambda a, b: (a, b)), batch_size=4, num_workers=2,
                       pin_memory=True) as procs:
        assert procs.engine == "processes" and procs.pin_memory
