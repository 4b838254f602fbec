"""A cold epoch through the shard cache: the requests made ahead of the reads
(NOTE [ Downloads ahead of a cold epoch ] in ``loaderlib/_extract/remote/files.py``), checked
with the fault proxy's request log and stalls, never with a clock."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from tests.remote.conftest import FAST

#: Stalled requests are held by the proxy; the client must not give up on them meanwhile.
PATIENT = {**FAST, "timeout": 120.0}
#: Samples of shards still downloading read by range (NOTE [ Samples of a shard still on its way ]).
RANGED = {**PATIENT, "ranges_while_caching": True}


def _shards(ds_root: str) -> int:
    return len([n for n in os.listdir(os.path.join(ds_root, "rec")) if n.endswith(".llrec")])


def _url(base: str, ds_root: str) -> str:
    return f"{base}/ds/rec/part-{{00000..{_shards(ds_root) - 1:05d}}}.llrec"


def _whole_gets(proxy, name: str) -> int:
    """GETs of ``name`` without a Range header: whole-shard downloads."""
    with proxy.lock:
        return sum(1 for m, p, r in proxy.requests if m == "GET" and p.endswith(name) and r is None)


def _wait_whole_get(proxy, name: str, timeout: float = 20.0) -> bool:
    with proxy.lock:
        return proxy.lock.wait_for(lambda: any(m == "GET" and p.endswith(name) and r is None
                                               for m, p, r in proxy.requests), timeout)


def test_downloads_go_on_while_the_first_shard_is_still_on_its_way(ds_root, proxy, tmp_path):
    # The run needs shard 0 first. Its download is held by the proxy (as a slow shard is, or
    # one the kernels are still decoding while the next ones should arrive): every later shard
    # must still be requested meanwhile, in the order the run needs them. With a window of two
    # shards that moves only when a read opens a shard, the third was never asked for until
    # shard 0 arrived.
    n = _shards(ds_root)
    assert n >= 3
    ds = ll.RecordFileDataset(_url(proxy.url, ds_root), cache_dir=str(tmp_path / "c"), storage_options=PATIENT)
    try:
        proxy.reset()
        proxy.add("stall", match="part-00000.llrec", method="GET", ranged=False)
        ds.plan_epoch(np.arange(len(ds)))            # what the loader says before a run's first read
        for k in range(1, n):
            assert _wait_whole_get(proxy, f"part-{k:05d}.llrec"), \
                f"shard {k} was not requested while shard 0 was still downloading"
        assert _whole_gets(proxy, "part-00000.llrec") == 1        # asked once, still held
        proxy.released.set()
        ref = ll.RecordFileDataset(os.path.join(ds_root, "rec", "part-*.llrec"))
        chain = T.Compose([T.CenterCrop(16), T.ToCHW()])
        got = list(ll.DataLoader(ds.transform_first(chain), batch_size=5, num_threads=2, timeout=60))
        want = list(ll.DataLoader(ref.transform_first(chain), batch_size=5, num_threads=2))
        assert len(got) == len(want)
        for (a, la), (b, lb) in zip(got, want):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(la, lb)
        # Each shard downloaded once; shard 0's held request was dropped when the proxy let
        # it go (a stall never answers), and sent again.
        assert [_whole_gets(proxy, f"part-{k:05d}.llrec") for k in range(n)] == [2] + [1] * (n - 1)
    finally:
        proxy.released.set()
        ds.close()


def test_a_limited_cache_keeps_its_window_of_two(ds_root, proxy, tmp_path):
    # With cache_limit the window stays AHEAD shards (room for what is held, the downloads
    # ahead and a spare: NOTE [ Shards held by a dataset ]).
    n = _shards(ds_root)
    sizes = [os.path.getsize(os.path.join(ds_root, "rec", f"part-{k:05d}.llrec")) for k in range(n)]
    ds = ll.RecordFileDataset(_url(proxy.url, ds_root), cache_dir=str(tmp_path / "c"), storage_options=PATIENT,
                              cache_limit=100 * max(sizes))
    try:
        proxy.reset()
        proxy.add("stall", match="part-00000.llrec", method="GET", ranged=False)
        ds.plan_epoch(np.arange(len(ds)))
        assert _wait_whole_get(proxy, "part-00001.llrec")
        assert ds._remote.cache.wait_idle(0) is False       # shard 0 is still held by the proxy
        assert _whole_gets(proxy, "part-00002.llrec") == 0
    finally:
        proxy.released.set()
        ds.close()


def test_shard_indexes_are_fetched_concurrently(ds_root, proxy, tmp_path):
    # Opening the dataset asks for every shard's size, header and index; with shard 0's index
    # held by the proxy, the other shards' indexes must still be asked for (they used to be
    # a chain of requests, one shard after another).
    n = _shards(ds_root)
    proxy.reset()
    proxy.add("stall", match="part-00000.llidx", method="GET")
    box: list = []
    opener = threading.Thread(target=lambda: box.append(ll.RecordFileDataset(
        _url(proxy.url, ds_root), cache_dir=str(tmp_path / "c"), storage_options=PATIENT)))
    opener.start()
    try:
        for k in range(1, n):
            assert proxy.wait_for(f"part-{k:05d}.llidx", "GET", timeout=20) >= 1, \
                f"shard {k}'s index was not asked for while shard 0's was on its way"
        assert not box
    finally:
        proxy.released.set()
        opener.join(60)
    assert box and len(box[0]) == len(ll.RecordFileDataset(os.path.join(ds_root, "rec", "part-*.llrec")))
    box[0].close()


def test_an_unreadable_index_names_its_shard(ds_root, proxy, tmp_path):
    # Opened concurrently, a failure still names the shard at fault (the first in order).


    proxy.reset()
    proxy.add("status", match="part-00001.llidx", method="GET", status=404)
    with pytest.raises(ll.RemoteReadError, match=r"part-00001\.llidx.*404"):
        ll.RecordFileDataset(_url(proxy.url, ds_root), cache_dir=str(tmp_path / "c"), storage_options=PATIENT)
    assert not [t for t in threading.enumerate() if t.name.startswith("ll-open")]


def test_the_cache_does_not_ask_again_for_what_the_dataset_asked(ds_root, proxy, tmp_path):
    # The dataset's HEAD of each shard (its size, when it opens) is the cache's answer too:
    # an epoch then sends no HEAD, only each shard's download.
    n = _shards(ds_root)
    ds = ll.RecordFileDataset(_url(proxy.url, ds_root), cache_dir=str(tmp_path / "c"), storage_options=PATIENT)
    try:
        proxy.reset()
        got = sum(len(y) for _x, y in ll.DataLoader(ds.transform_first(T.CenterCrop(16)), batch_size=4,
                                                    shuffle=True, seed=3, num_threads=2, timeout=60))
        assert got == len(ds)
        assert proxy.count(method="HEAD") == 0
        assert [_whole_gets(proxy, f"part-{k:05d}.llrec") for k in range(n)] == [1] * n
    finally:
        ds.close()


# -- NOTE [ Samples of a shard still on its way ] in loaderlib/_extract/remote/files.py ------------

CHAIN = T.Compose([T.CenterCrop(16), T.ToCHW()])
#: A bound on waiting for the first batch while the downloads are held (a bound, not a measurement).
BOUND_S = 60


def _ranged_gets(proxy, suffix: str = ".llrec") -> int:
    """GETs of data shards with a Range header: samples (or a shard's header) read by range."""
    with proxy.lock:
        return sum(1 for m, p, r in proxy.requests if m == "GET" and p.endswith(suffix) and r is not None)


def _batches(loader) -> list:
    return [(np.asarray(x).copy(), np.asarray(y).copy()) for x, y in loader]


def _same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def _cold_epoch_behind_a_gate(ds, proxy, threads: int) -> list:
    """A cold shuffle=True epoch of ``ds`` with every whole-shard GET held by the proxy until
    its first batch has arrived; the batches, or a failure naming why none came."""
    proxy.reset()
    proxy.add("hold", match=".llrec", method="GET", ranged=False, times=1 << 20)
    loader = ll.DataLoader(ds.transform_first(CHAIN), batch_size=5, shuffle=True, seed=11, num_threads=threads,
                           timeout=120)
    first = threading.Event()
    out: list = []
    errors: list = []

    def run() -> None:
        try:
            for x, y in loader:
                out.append((np.asarray(x).copy(), np.asarray(y).copy()))
                first.set()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)
        finally:
            first.set()

    reader = threading.Thread(target=run, name="cold-epoch-reader")
    reader.start()
    try:
        arrived = first.wait(BOUND_S) and bool(out)
        with proxy.lock:
            held, whole = proxy.held, sum(1 for m, p, r in proxy.requests
                                          if m == "GET" and p.endswith(".llrec") and r is None)
        ranged = _ranged_gets(proxy)
    finally:
        proxy.released.set()       # the held downloads go on (or, on a failure, the reader ends)
        reader.join(BOUND_S)
    assert not reader.is_alive(), "the epoch did not end after the whole-shard downloads were let go"
    assert arrived, (f"no batch of a cold shuffle=True epoch within {BOUND_S} s while the whole-shard "
                     f"downloads were held ({whole} asked for): the first batch waited for whole shards")
    assert held >= 1 and whole == held    # every download was asked for and held until then
    assert ranged >= 1     # the first batch's samples, read by range
    assert not errors, errors
    loader.close()
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cold_shuffled_epoch_reads_by_range_while_its_shards_download(ds_root, proxy, tmp_path, threads):
    # A first batch of a shuffled epoch needs samples of every shard; with the whole-shard
    # downloads held back, it can only come from ranged reads of the shards still on their way.
    # The epoch equals the same epoch from the warm cache and without the cache.
    url = _url(proxy.url, ds_root)
    cache = str(tmp_path / "c")
    ds = ll.RecordFileDataset(url, cache_dir=cache, storage_options=RANGED)
    try:
        cold = _cold_epoch_behind_a_gate(ds, proxy, threads)
        assert ds._remote.cache.wait_idle(BOUND_S)
    finally:
        ds.close()
    warm_ds = ll.RecordFileDataset(url, cache_dir=cache, storage_options=RANGED)
    plain = ll.RecordFileDataset(url, storage_options=PATIENT)
    try:
        proxy.reset()
        warm = _batches(ll.DataLoader(warm_ds.transform_first(CHAIN), batch_size=5, shuffle=True, seed=11,
                                      num_threads=threads, timeout=60))
        # Every shard is cached: no range and no download of a data shard.
        assert _ranged_gets(proxy) == 0, proxy.requests
        assert _whole_gets(proxy, ".llrec") == 0
        uncached = _batches(ll.DataLoader(plain.transform_first(CHAIN), batch_size=5, shuffle=True, seed=11,
                                          num_threads=threads, timeout=60))
    finally:
        warm_ds.close()
        plain.close()
    _same(cold, warm)
    _same(cold, uncached)
    local = ll.RecordFileDataset(os.path.join(ds_root, "rec", "part-*.llrec"))
    _same(cold, _batches(ll.DataLoader(local.transform_first(CHAIN), batch_size=5, shuffle=True, seed=11,
                                       num_threads=threads)))


def test_no_ranged_read_once_the_shards_are_cached(ds_root, proxy, tmp_path):
    # The same loader's next epoch reads its copies only: no request for a data shard at all.
    ds = ll.RecordFileDataset(_url(proxy.url, ds_root), cache_dir=str(tmp_path / "c"), storage_options=RANGED)
    try:
        loader = ll.DataLoader(ds.transform_first(CHAIN), batch_size=4, shuffle=True, seed=5, num_threads=2,
                               timeout=60)
        first = _batches(loader)
        assert ds._remote.cache.wait_idle(BOUND_S)
        proxy.reset()
        second = _batches(loader)
        assert len(second) == len(first)
        assert _ranged_gets(proxy) == 0 and _whole_gets(proxy, ".llrec") == 0
    finally:
        ds.close()


def test_a_download_that_fails_midway_names_its_shard(ds_root, proxy, tmp_path):
    # Shard 1's body is cut off every time. Its samples read by range while the download is
    # under way are fine, so the first epoch may end without an error (or fail naming the
    # shard, when a read came after the download failed). Once the background download has
    # failed, no sample of shard 1 is read by range: a read downloads the shard itself, and
    # that failure is the run's error, naming the shard. The second epoch starts only after
    # the background downloads have ended (a second epoch started at once could be read by
    # range again while the first epoch's download was still retrying).
    ds = ll.RecordFileDataset(_url(proxy.url, ds_root), cache_dir=str(tmp_path / "c"), storage_options=RANGED)
    try:
        proxy.reset()
        # The body stops after 1,000 bytes, and the store's resumption from there fails too.
        proxy.add("truncate", match="part-00001.llrec", method="GET", ranged=False, keep=1000, times=1 << 20)
        proxy.add("status", match="part-00001.llrec", method="GET", range="bytes=1000-", status=500, times=1 << 20)

        def loader():
            return ll.DataLoader(ds.transform_first(CHAIN), batch_size=4, shuffle=True, seed=5, num_threads=2,
                                 timeout=60)

        first = loader()
        try:
            _batches(first)
        except ll.RemoteReadError as e:
            assert "part-00001.llrec" in str(e)
        first.close()
        assert ds._remote.cache.wait_idle(BOUND_S)
        second = loader()
        with pytest.raises(ll.RemoteReadError, match=r"part-00001\.llrec"):
            _batches(second)
        second.close()
    finally:
        ds.close()
    assert not [t for t in threading.enumerate() if t.name.startswith(("ll-shard-cache", "loaderlib-remote-read"))]


def test_by_default_a_cold_epoch_waits_for_the_copies(ds_root, proxy, tmp_path):
    # Without ranges_while_caching no sample is read by range: only whole-shard downloads.
    n = _shards(ds_root)
    ds = ll.RecordFileDataset(_url(proxy.url, ds_root), cache_dir=str(tmp_path / "c"), storage_options=PATIENT)
    try:
        proxy.reset()
        _batches(ll.DataLoader(ds.transform_first(CHAIN), batch_size=4, shuffle=True, seed=5, num_threads=2,
                               timeout=60))
        assert _ranged_gets(proxy) == 0
        assert [_whole_gets(proxy, f"part-{k:05d}.llrec") for k in range(n)] == [1] * n
    finally:
        ds.close()


def test_ranges_while_caching_takes_only_a_bool():
    from loaderlib._extract.remote.options import StoreOptions

    assert StoreOptions.resolve({"ranges_while_caching": True}, environ={}).ranges_while_caching is True
    assert StoreOptions.resolve({}, environ={}).ranges_while_caching is False
    with pytest.raises(ValueError, match="ranges_while_caching.*True or False"):
        StoreOptions.resolve({"ranges_while_caching": "yes"}, environ={})
