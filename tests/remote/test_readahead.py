"""Remote samples read ahead of the batches (NOTE [ Remote read-ahead ] in
loaderlib/_extract/remote/readahead.py): the same output at any depth, exact resume, failures named
or skipped alone, figures in Stats.extract, and no reading thread left behind."""

from __future__ import annotations

import gc
import io
import threading
import time

import numpy as np
import pytest

import loaderlib as ll
from loaderlib._extract.remote.readahead import GAIN, MIN_DEPTH, RemoteReadAhead
from loaderlib._extract.source import NativeSource, SourceKind
from loaderlib.errors import RemoteReadError
from tests.remote.conftest import FAST, N
from tests.remote.test_datasets import _base, _batches, _faulty_list, _loader, _make, _same


@pytest.mark.parametrize("engine", ["native", "threads"])
@pytest.mark.parametrize("server, kind", [("http", "records"), ("http", "webdataset"), ("http", "list"),
                                          ("http", "recordio"), ("s3", "records"), ("s3", "list")])
@pytest.mark.parametrize("io_depth", [0, 1, 3, None])
def test_output_is_the_same_at_any_depth(ds_root, nginx, moto, engine, server, kind, io_depth):
    local, remote = _make(kind, (ds_root, _base(server, nginx, moto)[0]), _base(server, nginx, moto)[1])
    ref = _loader(local, engine)
    want = [_batches(ref), _batches(ref)]
    loader = _loader(remote, engine, io_depth=io_depth)
    _same(want[0], _batches(loader))
    _same(want[1], _batches(loader))     # a second epoch: the adaptive depth carried over
    loader.close()
    ref.close()


def test_resume_with_reads_in_flight_is_exact(ds_root, nginx, moto):
    _local, remote = _make("records", (ds_root, _base("http", nginx, moto)[0]), _base("http", nginx, moto)[1])
    full = _batches(_loader(remote, "native", io_depth=4))
    loader = _loader(remote, "native", io_depth=4)
    it = iter(loader)
    head = [tuple(np.array(a) for a in next(it)) for _ in range(2)]
    state = loader.state_dict()
    del it
    again = _loader(remote, "native", io_depth=4)
    again.load_state_dict(state)
    _same(full, head + _batches(again))


@pytest.mark.parametrize("io_depth", [2, None])
def test_stats_extract_counts_the_remote_reads(ds_root, nginx, moto, io_depth):
    _local, remote = _make("list", (ds_root, _base("http", nginx, moto)[0]), _base("http", nginx, moto)[1])
    loader = _loader(remote, "native", io_depth=io_depth, profile=True)
    assert "read-ahead from the store" in loader.explain() or "in flight" in loader.explain()
    list(loader)
    ex = loader.stats.extract
    assert ex is not None and ex.reads == N and ex.failures == 0
    assert ex.adaptive == (io_depth is None)
    assert ex.bytes == sum(len(remote.read(i)) for i in range(N))
    assert 0 < ex.latency_p50_ms <= ex.latency_p95_ms and ex.bytes_per_s > 0
    assert "read-ahead from the store" in loader.explain()
    loader.close()


@pytest.mark.parametrize("engine", ["native", "threads"])
def test_failure_read_ahead_names_url_status_and_sample(ds_root, proxy, engine):
    ds, bad = _faulty_list(ds_root, proxy)
    with pytest.raises(RemoteReadError, match=rf"sample {bad}: cannot read .*img007\.jpg \(HTTP 404\)"):
        list(_loader(ds, engine, io_depth=6))
    loader = _loader(ds, engine, io_depth=6, on_error="skip", max_skipped=1)
    with pytest.warns(ll.SkipWarning):
        got = _batches(loader)
    assert sum(len(b[1]) for b in got) == N - 1 and [f.index for f in loader.errors] == [bad]


@pytest.mark.parametrize("kind", ["records", "webdataset", "list", "recordio"])
@pytest.mark.parametrize("quick", ["works", "fails"])
def test_one_sample_requests_go_straight_to_the_store(ds_root, nginx, moto, monkeypatch, kind, quick):
    """NOTE [ One sample, one request ]: a shuffled epoch's samples are requested one by one
    by the reading threads themselves; when that request gives nothing (an error, a short
    body), the sample is read again through the dataset's batch read, so the output is the
    same either way."""
    from loaderlib._extract.remote.store import RemoteStore

    calls = []
    real = RemoteStore.quick_get

    def spy(self, path, start, end):
        calls.append((path, start, end))
        return real(self, path, start, end) if quick == "works" else None

    monkeypatch.setattr(RemoteStore, "quick_get", spy)
    local, remote = _make(kind, (ds_root, _base("http", nginx, moto)[0]), _base("http", nginx, moto)[1])
    ref = _loader(local, "native")
    loader = _loader(remote, "native", io_depth=3)
    _same(_batches(ref), _batches(loader))
    assert len(calls) >= N // 2, len(calls)    # most samples: a call of one (a run of neighbours shares one)
    whole = kind == "list"
    assert all((end is None) == whole for _, _, end in calls)
    loader.close()
    ref.close()


def _reading_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loaderlib-remote-read-")]


@pytest.mark.parametrize("engine", ["native", "threads"])
def test_no_reading_threads_left_after_abandoned_iterators(ds_root, nginx, moto, engine):
    _local, remote = _make("records", (ds_root, _base("http", nginx, moto)[0]), _base("http", nginx, moto)[1])
    for t in _reading_threads():
        t.join(10)
    loader = _loader(remote, engine, io_depth=5)
    for _ in range(5):
        it = iter(loader)
        next(it)
        del it
    loader.close()
    gc.collect()
    for t in _reading_threads():
        t.join(10)    # a request in progress ends on its own (bounded by the store's timeout)
    assert _reading_threads() == []


# -- the adaptive policy, on scripted figures (no store, no clock) -----------------------

class _Fake:
    _remote = None

    def read(self, i):
        return b"x" * 10

    def buffers(self, idx):
        return [b"x" * 10 for _ in idx]

    def source(self, i):
        return f"fake:{i}"


def _stage(batch_size=8):
    src = NativeSource(SourceKind.BUFFERS, stage="fake", dataset=_Fake())
    now = [0]
    ra = RemoteReadAhead(src, np.arange(1000, dtype=np.int64), io_depth=None, batch_size=batch_size, lookahead=2,
                         timeout=None, clock=lambda: now[0])
    ra.close()    # no reads: the test writes the counters
    return ra, now


def _turn(ra, now, *, reads, wait_s, wall_s=1.0, lat_ms=10.0, threads=2):
    now[0] += int(wall_s * 1e9)
    c = ra._c
    c["reads"] += reads
    c["taken"] += reads
    c["lat_ns"] += int(reads * lat_ms * 1e6)
    c["wait_ns"] += int(wait_s * 1e9)
    ra.adapt(threads)


def test_adaptive_depth_starts_at_the_batch_size_and_keeps_a_raise_that_pays():
    ra, now = _stage(batch_size=8)
    assert ra.depth == 8
    _turn(ra, now, reads=400, wait_s=1.5)          # waiting for bytes: the law asks for more
    raised = ra.depth
    assert raised > 8
    _turn(ra, now, reads=int(400 * GAIN) + 40, wait_s=1.0)   # it read faster: kept
    assert ra.depth >= raised


def test_adaptive_depth_undoes_a_raise_that_does_not_read_faster():
    ra, now = _stage(batch_size=8)
    _turn(ra, now, reads=400, wait_s=1.5)
    assert ra.depth > 8
    _turn(ra, now, reads=380, wait_s=1.8)          # a slower store under more requests
    assert ra.depth == 8
    for _ in range(4):                             # not tried again for a while
        _turn(ra, now, reads=400, wait_s=1.5)
        assert ra.depth <= 8
    assert "does not go faster" in ra.decisions[-1][3] or any("does not go faster" in d[3] for d in ra.decisions)


def test_adaptive_depth_does_not_grow_when_the_batches_do_not_wait():
    ra, now = _stage(batch_size=16)
    _turn(ra, now, reads=400, wait_s=0.0, lat_ms=200.0)
    assert ra.depth == 16
    _turn(ra, now, reads=400, wait_s=0.0, lat_ms=0.1)   # the law asks for less: lowered by halves
    assert MIN_DEPTH <= ra.depth < 16



_EXIT_CHILD = """
import sys
import loaderlib as ll
from loaderlib import transforms as T
ds = ll.WebDataset(sys.argv[1] + "/exit-480/wds-{0..7}.tar", storage_options={})
loader = ll.DataLoader(ds.transform_first(T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])),
                       batch_size=64, shuffle=True, seed=0, num_threads=ll.AUTOTUNE)
for _ in range(2):
    for _batch in loader:
        pass
print("done", flush=True)
"""


def test_exit_with_remote_reads_in_flight_is_clean(served, nginx, tmp_path):
    """A script that ends without closing a loader that reads a store ahead (its next epoch's
    requests in flight, each held 5 ms +-50% by a proxy) exits normally: no request completes
    by running Python while the interpreter exits (NOTE [ Requests fanned out on threads ] in
    loaderlib/_extract/remote/store.py). With obstore's asyncio fan-out this aborted the
    process (exit -6 or -11) in about one run of two."""
    import os
    import subprocess
    import sys
    import tarfile

    from benchmarks._servers import DelayProxy
    from benchmarks._synth import encode_jpeg, photo_like

    folder = os.path.join(served, "exit-480")
    if not os.path.isdir(folder):
        os.makedirs(folder)
        for s in range(8):
            with tarfile.open(os.path.join(folder, f"wds-{s}.tar"), "w") as tf:
                for i in range(s * 32, s * 32 + 32):
                    for ext, data in (("jpg", encode_jpeg(photo_like(480, 360, seed=i), quality=90)),
                                      ("cls", str(i % 10).encode())):
                        info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                        info.size = len(data)
                        tf.addfile(info, io.BytesIO(data))
    script = tmp_path / "child.py"
    script.write_text(_EXIT_CHILD)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proxy = DelayProxy(nginx.url, 5.0, 0.5)
    try:
        for _ in range(8):
            res = subprocess.run([sys.executable, str(script), proxy.url], cwd=root, capture_output=True, text=True,
                                 timeout=120, check=False)
            assert res.returncode == 0 and "done" in res.stdout, (res.returncode, res.stderr[-3000:])
    finally:
        proxy.close()


def test_delay_proxy_closes_quietly_with_connections_open(nginx, caplog):
    """The benchmarks' delay proxy (benchmarks/_servers.py) ends the connections it still holds
    when closed without asyncio logging each cancelled one as an error."""
    import logging
    import socket

    from benchmarks._servers import DelayProxy

    proxy = DelayProxy(nginx.url, 1.0)
    conns = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(3)]
    for c in conns:   # one answered request each: the proxy then waits on each for the next one
        c.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got:
            got += c.recv(4096)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        proxy.close()
    for c in conns:
        c.close()
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("engine", ["native", "threads"])
def test_close_ends_the_requests_in_flight(ds_root, nginx, engine):
    """NOTE [ Closing the read-ahead ] (pyx/include/ll_readahead.h): right after close(), every
    request the read-ahead sent has been answered and no reading thread is left. A proxy that
    holds each request 300 ms counts the requests it received and those it forwarded; before
    the fix close() returned with requests still held there."""
    from benchmarks._servers import DelayProxy

    proxy = DelayProxy(nginx.url, rtt_ms=300)
    try:
        local = ll.ImageFolderDataset(f"{ds_root}/folder")
        rel = [p[len(ds_root) + 1:] for p in local.paths]
        ds = ll.ImageListDataset(rel, local.labels, root=f"{proxy.url}/ds", storage_options=dict(FAST))
        loader = _loader(ds, engine, io_depth=8)
        it = iter(loader)
        next(it)
        # Requests of the next batches are held at the proxy now (a bound, not a measurement).
        deadline = time.monotonic() + 30
        while proxy.arrived <= proxy.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.arrived > proxy.requests
        loader.close()
        assert proxy.arrived == proxy.requests   # each was forwarded, and answered before its thread ended
        assert [t.name for t in threading.enumerate() if t.name.startswith("loaderlib-remote-read")] == []
        del it
    finally:
        proxy.close()
