"""``loader.close()`` ends every read (NOTE [ Closing the read-ahead ] in
pyx/include/ll_readahead.h): right after it returns, on a filesystem where each file takes
64 ms, no file under the mount is open, no loader thread is left, and the mount can be
unmounted at once. The loader's native threads carry names (NOTE [ Thread names ] in
pyx/include/ll_pool.h)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import loaderlib as ll
from benchmarks._latencyfs import mount
from loaderlib import transforms as T
from loaderlib._ext import _chain
from loaderlib._extract import closing, readahead
from tests._synth import encode_jpeg, photo_like
from tests._threads import threads

#: The native threads' system names (NOTE [ Thread names ]). The loader's Python threads (its
#: driver, the threads engine's pool, the remote read-ahead) are checked through ``threading``:
#: a joined Python thread has finished, but CPython does not join its system thread, whose
#: last instructions may still show in /proc for a moment.
NATIVE_THREADS = ("ll-io", "ll-team")


def thread_names() -> list[str]:
    return list(threads().values())


@pytest.fixture(autouse=True)
def _others():
    """Loader threads of earlier tests in this process (a loader they left to the collector)
    are not this test's: collected first, and any still there are left out of the checks."""
    gc.collect()
    global _BEFORE
    _BEFORE = {t for t, n in threads().items() if n.startswith(NATIVE_THREADS)}
    _BEFORE_PY.clear()
    _BEFORE_PY.update(t.ident for t in threading.enumerate())
    yield


_BEFORE: set[int] = set()
_BEFORE_PY: set = set()


def loader_threads() -> list[str]:
    """The threads of this test's loaders still running: native ones by their system name,
    Python ones (its driver, the threads engine's pool, the remote read-ahead) by ``threading``."""
    native = [n for t, n in threads().items() if n.startswith(NATIVE_THREADS) and t not in _BEFORE]
    # The store's fan-out pool ("loaderlib-remote") and a shard cache's downloaders belong to
    # the process and its datasets, not to a loader.
    python = [t.name for t in threading.enumerate() if t.ident not in _BEFORE_PY
              and t.name.startswith(("loaderlib-driver", "loaderlib-python", "loaderlib-remote-read"))]
    return sorted(native + python)


def open_under(root: str) -> list[str]:
    """The files this process holds open below ``root``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root + os.sep):
            out.append(target)
    return out


def _photos(folder, n: int) -> list[str]:
    folder.mkdir()
    for i in range(n):
        (folder / f"{i:03d}.jpg").write_bytes(encode_jpeg(photo_like(96, 72, seed=i)))
    return sorted(f.name for f in folder.iterdir())


def _loader(root: str, names: list[str], **kw) -> ll.DataLoader:
    ds = ll.ImageListDataset([os.path.join(root, n) for n in names]).transform_first(
        T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()]))
    return ll.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_threads=2, **kw)


@pytest.mark.parametrize("how", ["close", "drop the iterator", "collect the loader", "with block"])
def test_no_read_file_or_thread_is_left_after_close_on_slow_storage(tmp_path, how):
    names = _photos(tmp_path / "src", 160)
    with mount(tmp_path / "src", latency_ms=64) as m:
        loader = _loader(m.path, names, io_depth=64)
        it = iter(loader)
        next(it)   # the reads of the next batches are in flight now: 64 reads of 64 ms each
        if how == "close":
            loader.close()
        elif how == "drop the iterator":
            del it
        elif how == "collect the loader":
            del it, loader
            gc.collect()
        else:
            with loader:
                next(it)
        assert open_under(m.path) == []
        assert loader_threads() == []
        # A mount is free the moment close() returns (it was "Device or resource busy").
        r = subprocess.run(["fusermount3", "-u", m.path], capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr


def test_the_threads_engine_ends_its_reads_too(tmp_path):
    names = _photos(tmp_path / "src", 96)
    with mount(tmp_path / "src", latency_ms=64) as m:
        ds = ll.ImageListDataset([os.path.join(m.path, n) for n in names]).transform_first(
            T.Compose([T.RandomResizedCrop(32), lambda img: img[::-1]]))   # a Python tail: threads engine
        loader = ll.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_threads=2, io_depth=32)
        assert loader.engine == "threads"
        it = iter(loader)
        next(it)
        loader.close()
        assert open_under(m.path) == []
        assert loader_threads() == []


def test_native_threads_carry_the_loaders_names(tmp_path):
    names = _photos(tmp_path / "src", 48)
    loader = _loader(str(tmp_path / "src"), names, io_depth=4)
    it = iter(loader)
    next(it)
    seen = set(thread_names())
    assert {"ll-driver", "ll-team-0", "ll-team-1", "ll-io-0", "ll-io-3"} <= seen, seen
    assert all(len(n) <= 15 for n in seen)
    loader.close()
    assert loader_threads() == []
    # The threads engine's Python pool carries its name at the system level too.
    ds = ll.ImageListDataset([str(tmp_path / "src" / n) for n in names]).transform_first(lambda img: img[:8, :8])
    loader = ll.DataLoader(ds, batch_size=8, num_threads=2)
    it = iter(loader)
    next(it)
    assert {"ll-driver", "ll-python-0", "ll-python-1"} <= set(thread_names())
    loader.close()
    assert loader_threads() == []


def test_a_read_that_does_not_return_bounds_close_and_is_reported(tmp_path, monkeypatch):
    """A read held 3 s at open stands for a hung mount: closing waits ``closing.CLOSE_WAIT_S`` (set to
    0.2 s here) at most for it, warns, and leaves the thread to end once the read returns."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "slow.bin").write_bytes(b"x" * 100)
    with mount(tmp_path / "src", latency_ms=3000, jitter=0, where="open") as m:
        reader = _chain.Reader(8, 1)
        assert reader.queue_files(np.arange(1, dtype=np.int64), [os.fsencode(os.path.join(m.path, "slow.bin"))]) == 1
        deadline = time.monotonic() + 30   # a bound on the wait for the read to start, not a measurement
        while reader.counters()["reading"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        ahead = readahead.ReadAhead.__new__(readahead.ReadAhead)   # the policy around this native reader
        ahead.native = reader
        monkeypatch.setattr(closing, "CLOSE_WAIT_S", 0.2)
        with pytest.warns(ResourceWarning, match=r"1 reads still in progress 0\.2 s after close\(\)"):
            ahead.close(wait=True)
        assert [n for t, n in threads().items() if n.startswith("ll-io") and t not in _BEFORE] == ["ll-io-0"]
        # The detached thread ends by itself once its read returns; nothing is left to wait for.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert reader.join(30.0) == 0
        assert reader.counters()["reads"] == 1


_STUCK_WARM_EPOCH = r"""
import gc, threading
import numpy as np
import loaderlib as ll
from loaderlib._engines import base

base.EXIT_JOIN_S = 0.5   # how long dropping a loader waits for a driver that never comes back
entered, release = threading.Event(), threading.Event()
calls = [0]


def batchify(samples):
    calls[0] += 1
    if calls[0] > 2:          # the warm next epoch's first batch: stuck in user code
        entered.set()
        release.wait()
    return np.stack(samples)


loader = ll.DataLoader(ll.ArrayDataset(np.arange(8, dtype=np.float32)), batch_size=4, batchify_fn=batchify,
                       num_threads=2)
assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
assert entered.wait(30), "the warm next epoch never started"
del loader
gc.collect()
print("done", flush=True)
release.set()
"""


def test_a_collected_loader_joins_its_warm_epoch_with_a_bound(tmp_path):
    """``DataLoader.__del__`` joins the driver of a warm next epoch for at most ``EXIT_JOIN_S``:
    a driver inside a user's batchify_fn that never returns no longer hangs the collection (it
    did, for ever). The subprocess timeout only guards against that hang."""
    script = tmp_path / "child.py"
    script.write_text(_STUCK_WARM_EPOCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env,
                       check=False)
    assert r.returncode == 0 and "done" in r.stdout, (r.returncode, r.stdout, r.stderr[-3000:])
