"""The harness and verdict on loaderlib's own DataLoader, with injected bottlenecks.

Images are the demo dataset (derived from loaderlib's sample photo), built small into a
temporary folder. These are end-to-end timing checks (real clocks, real sleeps): they carry
the ``timing`` marker and run apart from the main suite (``make test`` only warns when they
fail). The accounting they rely on is tested without clocks in test_profiling_accounting.py.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from loaderlib.profiling import benchmark, build_demo_dataset

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._threads import available_cpus
from tests._timing import judged


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(build_demo_dataset(tmp_path_factory.mktemp("demo"), n_images=128, n_classes=4, progress=False))


def _native(root, threads, bs=16, size=224):
    chain = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToCHW()])
    return ll.DataLoader(ll.ImageFolderDataset(root).transform_first(chain), batch_size=bs, shuffle=True,
                         num_threads=threads, seed=0)



def _adds_up(r):
    assert r.problems == () and all(p.problems() == [] for p in r.parts), r
    assert r.consumer_wall_fraction == pytest.approx(1.0, abs=0.10), r


@pytest.mark.timing
def test_native_one_thread_is_decode_bound(root):
    loader = _native(root, 1)
    assert loader.engine == "native"
    try:
        r = benchmark(loader, seconds=2.5, warmup_batches=1)
    finally:
        loader.close()
    judged(r, "decode")
    assert r.stats.percentile_source == "per-sample"  # the kernels' per-sample timings
    assert r.stage_s["decode"] > r.stage_s["transform"] > 0 and r.stage_s["read"] > 0
    if available_cpus() > 1:
        assert "num_threads=1 -> " in r.verdict.suggestion
    _adds_up(r)


@pytest.mark.timing
def test_slow_python_transform_is_python(root):
    def slow_step(img):
        time.sleep(0.006)
        return np.ascontiguousarray(img[:32, :32])

    loader = ll.DataLoader(ll.ImageFolderDataset(root).transform_first(slow_step), batch_size=8, num_threads=2)
    assert loader.engine == "threads"
    try:
        r = benchmark(loader, seconds=2.5, warmup_batches=1)
    finally:
        loader.close()
    judged(r, "python")
    _adds_up(r)


@pytest.mark.timing
def test_slow_model_step_is_model(root):
    loader = _native(root, 2, bs=16, size=64)
    try:
        r = benchmark(loader, model_step=0.05, seconds=2.5, warmup_batches=1)
    finally:
        loader.close()
    judged(r, "model")
    assert r.accelerator_idle_fraction < 0.1
    assert r.consumer_wall_fraction == pytest.approx(1.0, abs=0.10)


class SlowReads(ll.Dataset):
    """A dataset wrapper whose reads take 6 ms (a slow disk or network file system)."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        time.sleep(0.006)
        return self.base[i]


@pytest.mark.timing
def test_slow_reads_in_a_dataset_wrapper_are_io(root):
    chain = T.Compose([T.RandomResizedCrop(64), T.ToCHW()])
    loader = ll.DataLoader(SlowReads(ll.ImageFolderDataset(root).transform_first(chain)), batch_size=8,
                           num_threads=2)
    try:
        r = benchmark(loader, seconds=2.5, warmup_batches=1)
    finally:
        loader.close()
    judged(r, "io")


@pytest.mark.timing
def test_seconds_mode_on_native_leaves_no_threads(root):
    before = set(threading.enumerate())
    loader = _native(root, 2, bs=16, size=64)
    try:
        r = benchmark(loader, seconds=0.5, warmup_batches=2)
    finally:
        loader.close()
    assert r.wall_s >= 0.5 and r.samples > 0 and r.engine == "native"
    assert loader.recorder.enabled is False  # restored (DataLoader records only when asked)
    time.sleep(0.1)
    assert {t for t in threading.enumerate() if t.is_alive()} <= before


def test_batch_wall_does_not_count_overlap_twice():
    from loaderlib._engines.base import batch_wall

    assert batch_wall(start=0, previous_end=0, end=10) == 10
    assert batch_wall(start=0, previous_end=6, end=10) == 4   # in flight beside the previous batch
    assert batch_wall(start=8, previous_end=6, end=10) == 2   # started after the previous one ended


@pytest.mark.timing
@pytest.mark.parametrize("workers", [0, 2])
def test_busy_fraction_with_batches_in_flight(root, workers):
    """Two threads (or worker processes) that always have a sample to work on are busy nearly
    all the time, although the engines keep several batches in flight (NOTE [ Batch wall time ])."""
    def step(img):
        time.sleep(0.004)
        return np.ascontiguousarray(img[:8, :8])

    loader = ll.DataLoader(ll.ImageFolderDataset(root).transform_first(step), batch_size=8, num_threads=2,
                           num_workers=workers, profile=True)
    assert loader.engine == ("processes" if workers else "threads")
    try:
        for _ in loader:  # the first epoch pays for starting the pool or the workers
            pass
        for _ in loader:  # 16 batches; the recorder restarts with the epoch
            pass
        busy = loader.stats.busy_fraction
    finally:
        loader.close()
    assert 0.75 < busy <= 1.0, busy
