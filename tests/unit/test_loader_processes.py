"""The processes engine: persistent workers writing into shared-memory slots."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import DataLoader
from loaderlib._engines.processes import shm_prefix
from loaderlib.datasets import ArrayDataset


def _shm_names():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(shm_prefix())}
    except FileNotFoundError:
        return set()


def _xy(n=40):
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4), np.arange(n, dtype=np.int64)


def test_order_preserved_and_local_functions():
    x, y = _xy(50)
    offset = 3.0

    class Shift:                       # a local class: not importable by name
        def __call__(self, a, b):
            return a + offset, b

    ds = ArrayDataset(x, y).transform(Shift()).transform(lambda a, b: (a * 2, b))
    with DataLoader(ds, batch_size=8, num_workers=2, timeout=60) as loader:
        assert loader.engine == "processes"
        for epoch in range(2):
            got = list(loader)
            assert len(got) == len(loader) == 7
            for k, (a, b) in enumerate(got):
                np.testing.assert_array_equal(a, (x[8 * k:8 * k + 8] + 3) * 2)
                np.testing.assert_array_equal(b, y[8 * k:8 * k + 8])
        pids = [w.proc.pid for w in loader._workers.workers]
        list(loader)
        assert [w.proc.pid for w in loader._workers.workers] == pids   # persistent


def test_shuffle_covers_every_sample():
    x, y = _xy(60)
    with DataLoader(ArrayDataset(x, y).transform(lambda a, b: (a, b)), batch_size=7, shuffle=True, seed=2,
                    num_workers=2) as loader:
        e0 = np.concatenate([b for _, b in loader])
        e1 = np.concatenate([b for _, b in loader])
    assert sorted(e0.tolist()) == list(range(60)) == sorted(e1.tolist())
    assert e0.tolist() != e1.tolist()


def test_error_propagates_with_type_and_index():
    def bad(a, b):
        if b == 13:
            raise KeyError("missing field")
        return a, b

    loader = DataLoader(ArrayDataset(*_xy()).transform(bad), batch_size=4, num_workers=2, timeout=60)
    with loader, pytest.raises(KeyError, match="missing field") as info:
        list(loader)
    assert info.value.sample_index == 13


def test_skip_fills_and_records():
    def bad(a, b):
        if b in (2, 21):
            raise ValueError("corrupt")
        return a, b

    with DataLoader(ArrayDataset(*_xy(24)).transform(bad), batch_size=5, num_workers=2, on_error="skip") as loader:
        sizes = [len(b) for _, b in loader]
        assert sizes == [5, 5, 5, 5, 2]
        assert sorted(e.index for e in loader.errors) == [2, 21]


def test_killed_worker_raises_not_hangs():
    def die(a, b):
        if b == 9:
            os.kill(os.getpid(), signal.SIGKILL)
        return a, b

    before = _shm_names()
    loader = DataLoader(ArrayDataset(*_xy()).transform(die), batch_size=4, num_workers=2, timeout=60)
    t0 = time.monotonic()
    with pytest.raises(ll.WorkerError, match="SIGKILL"):
        list(loader)
    assert time.monotonic() - t0 < 30
    loader.close()
    assert _shm_names() - before == set()


def test_two_loaders_in_lockstep():
    x, y = _xy(30)
    l1 = DataLoader(ArrayDataset(x, y).transform(lambda a, b: (a, b)), batch_size=5, num_workers=1)
    l2 = DataLoader(ArrayDataset(-x, y * 3).transform(lambda a, b: (a, b)), batch_size=5, num_workers=2)
    with l1, l2:
        for k, ((a1, b1), (a2, b2)) in enumerate(zip(l1, l2)):
            np.testing.assert_array_equal(a1, x[5 * k:5 * k + 5])
            np.testing.assert_array_equal(a2, -x[5 * k:5 * k + 5])
            np.testing.assert_array_equal(b2, 3 * y[5 * k:5 * k + 5])
        assert k == 5


def test_kept_batches_and_shared_memory_released():
    before = _shm_names()
    x, y = _xy(40)
    loader = DataLoader(ArrayDataset(x, y).transform(lambda a, b: (a, b)), batch_size=4, num_workers=2, prefetch=2)
    kept = list(loader)
    for k, (a, b) in enumerate(kept):
        np.testing.assert_array_equal(a, x[4 * k:4 * k + 4])
    loader.close()
    np.testing.assert_array_equal(kept[3][0], x[12:16])   # still valid after close
    del kept, a, b
    assert _shm_names() - before == set()


def test_worker_init_fn_runs_in_each_worker(tmp_path):
    def init(worker_id):
        with open(os.path.join(str(tmp_path), f"w{worker_id}"), "w") as f:
            f.write(str(os.getpid()))

    with DataLoader(ArrayDataset(*_xy(8)).transform(lambda a, b: (a, b)), batch_size=2, num_workers=2,
                    worker_init_fn=init) as loader:
        list(loader)
    assert sorted(os.listdir(tmp_path)) == ["w0", "w1"]


def test_main_module_classes_without_guard(tmp_path):
    # A script with no `if __name__ == "__main__"` guard and a dataset class defined in
    # __main__: the classic "Can't get attribute on __main__" case of fork-less workers.
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import loaderlib as ll

        class Squares:
            def __len__(self):
                return 10
            def __getitem__(self, i):
                return np.array([i * i])

        loader = ll.DataLoader(Squares(), batch_size=4, num_workers=2, timeout=60)
        print(sum(int(b.sum()) for b in loader))
        loader.close()
    """))
    res = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(sum(i * i for i in range(10)))


def test_temporary_loader_keeps_its_workers():
    x, y = _xy(24)
    got = [b for _, b in DataLoader(ArrayDataset(x, y).transform(lambda a, b: (a, b)), batch_size=4,
                                    num_workers=2, timeout=60)]
    np.testing.assert_array_equal(np.concatenate(got), y)
