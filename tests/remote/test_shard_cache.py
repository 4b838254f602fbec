"""The shard cache against nginx (through the fault proxy, which counts requests) and moto."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from loaderlib._extract.remote.shard_cache import ShardCache
from loaderlib.errors import RemoteReadError
from tests.remote.conftest import BUCKET, FAST

SIZE = 300_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _file(served, i):
    with open(os.path.join(served, "blobs", f"b{i}.bin"), "rb") as f:
        return f.read()


def _urls(base, n=6):
    return [f"{base}/blobs/b{i}.bin" for i in range(n)]


def _bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _read(lease) -> bytes:
    return os.pread(lease.fd, os.fstat(lease.fd).st_size, 0)


def test_download_publish_and_reuse_across_runs(proxy, served, tmp_path):
    urls = _urls(proxy.url)
    with ShardCache(tmp_path, storage_options=FAST) as cache:
        for i in (0, 1):
            with cache.acquire(urls[i]) as lease:
                assert _read(lease) == _file(served, i)
        key = cache.key(urls[0])
        side = json.loads((tmp_path / (key + ".json")).read_text())
        assert side["url"] == urls[0] and side["size"] == SIZE and side["etag"]
        assert not [p for p in os.listdir(tmp_path) if ".part-" in p]
    assert proxy.count("/blobs/") == 2
    # A new run: one HEAD per shard confirms ETag and size; no GET.
    proxy.reset()
    with ShardCache(tmp_path, storage_options=FAST) as cache:
        assert cache.cached(urls[0]) and cache.cached(urls[1]) and not cache.cached(urls[2])
        with cache.acquire(urls[1]) as lease:
            assert _read(lease) == _file(served, 1)
    assert proxy.count("/blobs/", "GET") == 0 and proxy.count("/blobs/", "HEAD") == 3


def test_changed_object_is_downloaded_again(nginx, served, tmp_path, monkeypatch):
    # The stale copy is deleted when its new download starts: the part, reserved at full size,
    # is then the only count of that shard's bytes and the only bytes on disk.
    from loaderlib._extract.remote import shard_cache as sc

    os.makedirs(os.path.join(served, "changing"), exist_ok=True)
    path = os.path.join(served, "changing", "x.bin")
    with open(path, "wb") as f:
        f.write(b"a" * 1000)
    url = f"{nginx.url}/changing/x.bin"
    with ShardCache(tmp_path / "c", storage_options=FAST) as cache:
        assert _bytes(cache.path(url)) == b"a" * 1000
        old = cache.path_of(url)
    with open(path, "wb") as f:
        f.write(b"b" * 1200)            # another size, so another ETag (nginx: mtime-size)
    during = []
    cls = type(sc.open_store(url, sc.StoreOptions.resolve(FAST)))
    real = cls.download

    def download(self, *a, **k):
        during.append(os.path.exists(old))
        return real(self, *a, **k)

    monkeypatch.setattr(cls, "download", download)
    with ShardCache(tmp_path / "c", storage_options=FAST) as cache:
        assert not cache.cached(url)
        assert _bytes(cache.path(url)) == b"b" * 1200
    assert during == [False]            # the stale copy was gone while the new one downloaded


def test_lru_eviction_within_limit_never_evicts_a_held_shard(proxy, served, tmp_path):
    urls = _urls(proxy.url)
    with ShardCache(tmp_path, cache_limit=2 * SIZE + 10, storage_options=FAST) as cache:
        held = cache.acquire(urls[0])
        with cache.acquire(urls[1]):
            pass
        with cache.acquire(urls[2]):    # full: the LRU shard is 0, but it is held -> 1 goes
            pass
        assert cache.used() <= 2 * SIZE + 10
        assert cache.cached(urls[0]) and not cache.cached(urls[1]) and cache.cached(urls[2])
        assert _read(held) == _file(served, 0)
        held.release()
        with cache.acquire(urls[3]):    # now 0 is the least recently used and free
            pass
        assert not cache.cached(urls[0]) and cache.cached(urls[2]) and cache.cached(urls[3])
        # Touching 2 makes 3 the LRU one.
        cache.acquire(urls[2]).release()
        cache.acquire(urls[4]).release()
        assert cache.cached(urls[2]) and not cache.cached(urls[3])


def test_no_room_decision_runs_while_a_shard_is_published(proxy, served, tmp_path, monkeypatch):
    # NOTE [ Publishing under the room lock ]: between the rename of a finished download and
    # its sidecar, the shard is neither a part nor an entry; a room decision then would count
    # its bytes nowhere. At that moment (the sidecar being written) the room lock is taken, and
    # afterwards what the cache counts is what is on disk.
    import fcntl

    urls = _urls(proxy.url)
    free_at_publish = []
    real_dump = json.dump

    def dump(obj, f):
        fd = os.open(os.path.join(tmp_path, ".cache.lock"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free_at_publish.append(obj["url"])
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        real_dump(obj, f)

    monkeypatch.setattr(json, "dump", dump)
    with ShardCache(tmp_path, cache_limit=2 * SIZE + 10, storage_options=FAST) as cache:
        for u in urls[:4]:
            cache.acquire(u).release()
            on_disk = sum(os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path)
                          if not n.endswith((".json", ".lock")))
            assert on_disk == cache.used() <= 2 * SIZE + 10
    assert free_at_publish == []


def test_cache_limit_accepts_sizes(tmp_path):
    assert ShardCache(tmp_path, cache_limit="20GB").limit == 20 * 10**9
    assert ShardCache(tmp_path, cache_limit="20GiB").limit == 20 << 30
    with pytest.raises(ValueError, match="cache_limit must be a positive number of bytes"):
        ShardCache(tmp_path, cache_limit="lots")


def test_prefetch_follows_the_given_order_and_keeps_what_comes_sooner(proxy, tmp_path):
    urls = _urls(proxy.url)
    order = [urls[4], urls[1], urls[3], urls[0]]
    with ShardCache(tmp_path, cache_limit=4 * SIZE, storage_options=FAST, workers=1) as cache:
        cache.prefetch(order)
        assert cache.wait_idle(60)
        gets = [p for m, p, _ in proxy.requests if m == "GET"]
        # Three fit with a shard's room left for a read (NOTE [ Shard cache within its limit ]);
        # the fourth would evict a shard needed sooner, so it waits for a reader.
        assert gets == ["/blobs/b4.bin", "/blobs/b1.bin", "/blobs/b3.bin"]
        assert all(cache.cached(u) for u in order[:3]) and not cache.cached(order[3])


def test_short_download_is_retried_then_reported(proxy, served, tmp_path):
    url = _urls(proxy.url)[5]
    with ShardCache(tmp_path, storage_options=FAST) as cache:
        proxy.add("short", keep=1000, match="b5.bin", method="GET")
        assert _bytes(cache.path(url)) == _file(served, 5)
    proxy.reset()
    with ShardCache(tmp_path / "x", storage_options={**FAST, "max_retries": 1}) as cache:
        proxy.add("short", keep=1000, match="b5.bin", method="GET", times=100)
        with pytest.raises(RemoteReadError, match=r"sample 9: cannot read .*b5\.bin \(no HTTP status\): short body"):
            cache.acquire(url, index=9)
        assert not cache.cached(url) and not os.path.exists(cache._p(cache.key(url)))


def test_missing_shard_names_url_status_and_sample(nginx, tmp_path):
    with ShardCache(tmp_path, storage_options=FAST) as cache, \
            pytest.raises(RemoteReadError, match=r"sample 3: cannot read .*nope\.bin \(HTTP 404\)"):
        cache.acquire(f"{nginx.url}/blobs/nope.bin", index=3)


def test_a_download_in_progress_is_never_read(proxy, served, tmp_path):
    url = _urls(proxy.url)[2]
    cache = ShardCache(tmp_path, storage_options=FAST)
    proxy.add("stall", match="b2.bin", method="GET")
    cache.prefetch([url])
    assert proxy.wait_for("b2.bin", "GET") == 1   # the download has started
    assert not cache.cached(url) and not os.path.exists(cache._p(cache.key(url)))
    proxy.released.set()                    # the stalled request fails; the retry succeeds
    assert cache.wait_idle(60)
    with cache.acquire(url) as lease:
        assert _read(lease) == _file(served, 2)
    cache.close()


_CHILD = """
import sys
sys.path.insert(0, {root!r})
from loaderlib._extract.remote.shard_cache import ShardCache
cache = ShardCache({dir!r}, storage_options={opts!r}, workers=1)
for u in {urls!r}:
    cache.path(u)
print("done", flush=True)
"""


def test_crash_resume_downloads_only_what_is_missing(proxy, served, tmp_path):
    urls = _urls(proxy.url, 3)
    proxy.add("stall", match="b1.bin", method="GET")      # the child dies while downloading b1
    code = _CHILD.format(root=ROOT, dir=str(tmp_path), opts=FAST, urls=urls)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proxy.wait_for("b1.bin", "GET") == 1 and proxy.count("b0.bin", "GET") == 1
        for _ in range(3000):               # its part file exists once bytes started to flow
            if any(".part-" in p for p in os.listdir(tmp_path)):
                break
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert any(".part-" in p for p in os.listdir(tmp_path))
    proxy.released.set()
    proxy.reset()
    with ShardCache(tmp_path, storage_options=FAST) as cache:
        assert not any(".part-" in p for p in os.listdir(tmp_path))     # the dead run's part is gone
        for i, u in enumerate(urls):
            assert _bytes(cache.path(u)) == _file(served, i)
    assert [p for m, p, _ in proxy.requests if m == "GET"] == ["/blobs/b1.bin", "/blobs/b2.bin"]


def _ranks_child(args):
    cache_dir, urls, opts = args
    cache = ShardCache(cache_dir, storage_options=opts)
    out = []
    for u in urls:
        with cache.acquire(u) as lease:
            out.append(_read(lease))
    cache.close()
    return out


def test_processes_share_one_cache_and_download_each_shard_once(proxy, served, tmp_path):
    urls = _urls(proxy.url, 4)
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(_ranks_child, [(str(tmp_path), urls[k:] + urls[:k], FAST) for k in range(4)])
    for k, res in enumerate(results):
        assert res == [_file(served, (k + j) % 4) for j in range(4)]
    # The entry locks let one process download each shard while the others wait for it.
    assert sorted(p for m, p, _ in proxy.requests if m == "GET") == [f"/blobs/b{i}.bin" for i in range(4)]
    assert not [p for p in os.listdir(tmp_path) if ".part-" in p]


def test_s3_shards_through_the_cache(moto, served, tmp_path):
    urls = _urls(f"s3://{BUCKET}", 2)
    with ShardCache(tmp_path, cache_limit="1MB", storage_options=moto.storage_options) as cache:
        cache.prefetch(urls)
        assert cache.wait_idle(60)
        assert all(cache.cached(u) for u in urls)
        for i, u in enumerate(urls):
            with cache.acquire(u) as lease:
                assert _read(lease) == _file(served, i)


def test_prefetch_never_waits_on_a_held_shard(proxy, served, tmp_path):
    # A reader downloads b3 (stalled at first) while a prefetch asks for it too; once the
    # reader holds its lease, the prefetch must see the published shard, not queue for the
    # entry's exclusive lock behind the reader for as long as it reads.
    import threading

    url = _urls(proxy.url)[3]
    cache = ShardCache(tmp_path, storage_options={**FAST, "timeout": 2.0})
    proxy.add("stall", match="b3.bin", method="GET")
    box = []
    reader = threading.Thread(target=lambda: box.append(cache.acquire(url)))
    reader.start()
    proxy.wait_for("b3.bin", "GET")
    cache.prefetch([url])
    proxy.released.set()
    reader.join(60)
    assert box and _read(box[0]) == _file(served, 3)
    assert cache.wait_idle(30), "the prefetch is stuck behind a reader's lease"
    box[0].release()
    cache.close()


def test_cache_downloads_shards_in_the_order_the_sampler_first_needs_them(ds_root, nginx, tmp_path, monkeypatch):
    # NOTE [ Epoch order to the dataset ]: the shard list handed to the cache is the order of
    # first use on a shuffled epoch, computed here in plain Python from the sampler.
    import loaderlib as ll
    from loaderlib import transforms as T
    from loaderlib._extract.remote.shard_cache import ShardCache
    from loaderlib.sampler import RandomSampler

    asked: list[list[str]] = []
    real = ShardCache.prefetch

    def recording(self, urls):
        asked.append(list(urls))
        return real(self, urls)

    monkeypatch.setattr(ShardCache, "prefetch", recording)
    url = f"{nginx.url}/ds/rec/part-{{00000..{len(os.listdir(os.path.join(ds_root, 'rec'))) // 2 - 1:05d}}}.llrec"
    ds = ll.RecordFileDataset(url, cache_dir=str(tmp_path / "c"), storage_options=FAST)
    data = lambda: [a for a in asked if any(u.endswith(".llrec") for u in a)]   # noqa: E731 - the indexes go first
    assert len(ds.urls) >= 3 and data() == []     # no shard downloads before a run says its order
    sampler = RandomSampler(len(ds), seed=11)
    order = sampler.order(0)
    want = []
    for i in order.tolist():
        s = int(ds.shard_of[i])
        if s not in want:
            want.append(s)
    assert want != sorted(want)                   # the shuffle changes the order
    loader = ll.DataLoader(ds.transform_first(T.Compose([T.CenterCrop(16), T.ToCHW()])), batch_size=4,
                           sampler=sampler, num_threads=2, timeout=60)
    n = sum(len(b[1]) for b in loader)
    assert n == len(ds)
    # Without a cache limit the window is the whole first-use order (NOTE [ Downloads ahead
    # of a cold epoch ]); later windows are runs of it, further along.
    wanted = [ds.urls[s] for s in want]
    assert data()[0] == wanted
    seen: list[str] = []
    for a in data():
        k = wanted.index(a[0])
        assert a == wanted[k:k + len(a)]
        seen += [u for u in a if u not in seen]
    assert seen == wanted
    loader.close()
    ds.close()


@pytest.fixture(scope="module")
def six_shards(ds_root, served):
    """Six record shards of four JPEGs each under served/six (the local reference beside them)."""
    import loaderlib as ll

    root = os.path.join(served, "six")
    if not os.path.isdir(root):
        src = ll.RecordFileDataset(os.path.join(ds_root, "rec", "part-*.llrec"), raw=True)
        items = [src[i] for i in range(len(src))]
        os.makedirs(root)
        for k in range(6):
            part = items[4 * k:4 * k + 4]
            ll.write_records(os.path.join(root, f"s-{k:05d}"), [b for b, _ in part], [lab for _, lab in part])
    sizes = [os.path.getsize(os.path.join(root, f"s-{k:05d}.llrec")) for k in range(6)]
    return root, sizes


def _data_bytes(folder) -> int:
    """Published shards and downloads under way: everything but sidecars and lock files. A
    background download may publish (rename) a part file between the listing and its size:
    then the folder is listed again, so the sum is of one consistent listing."""
    while True:
        try:
            return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
                       if not n.endswith((".json", ".lock")) and os.path.isfile(os.path.join(folder, n)))
        except FileNotFoundError:
            continue


@pytest.mark.parametrize("engine", ["native", "threads"])
def test_cache_smaller_than_the_dataset_stays_within_its_limit(six_shards, nginx, tmp_path, engine, caplog):
    # NOTE [ Shards held by a dataset ]: a limit of about two shards over six, a shuffled
    # sampler revisiting shards over two epochs; every batch equals the local files', the
    # cache never holds more than its limit, and shards were evicted (and read again).
    import numpy as np

    import loaderlib as ll
    from loaderlib import transforms as T
    from loaderlib.sampler import ShardShuffleSampler

    root, sizes = six_shards
    limit = 2 * max(sizes) + 100
    assert limit < sum(sizes) / 2
    cache_dir = tmp_path / "cache"
    remote = ll.RecordFileDataset(f"{nginx.url}/six/s-{{00000..00005}}.llrec", storage_options=FAST,
                                  cache_dir=str(cache_dir), cache_limit=limit)
    local = ll.RecordFileDataset(os.path.join(root, "s-*.llrec"))

    def loader(ds):
        chain = [T.RandomResizedCrop(24), T.ToCHW()]
        if engine == "threads":
            chain.append(lambda x: x + 1)
        sampler = ShardShuffleSampler(ds.shard_sizes, buffer_size=3, seed=5)
        out = ll.DataLoader(ds.transform_first(T.Compose(chain)), batch_size=3, sampler=sampler, seed=2,
                            num_threads=2, timeout=60)
        assert out.engine == engine
        return out

    want, got = [], []
    ref, run = loader(local), loader(remote)
    cache = remote._remote.cache
    for epoch in range(2):
        ref.set_epoch(epoch)
        run.set_epoch(epoch)
        want += [tuple(np.array(a) for a in b) for b in ref]
        for b in run:
            got.append(tuple(np.array(a) for a in b))
            assert cache.used() <= limit and _data_bytes(cache_dir) <= limit
    run.close()
    ref.close()
    assert len(got) == len(want)
    for x, y in zip(got, want):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)
    assert "over the limit" not in caplog.text
    assert cache.evictions >= 4                          # six shards through room for two, twice
    assert remote._remote.opened > len(sizes)            # shards read again after a release
    remote.close()


def test_a_shard_larger_than_the_limit_is_an_error(six_shards, nginx, tmp_path):
    import loaderlib as ll

    _, sizes = six_shards
    ds = ll.RecordFileDataset(f"{nginx.url}/six/s-{{00000..00005}}.llrec", storage_options=FAST,
                              cache_dir=str(tmp_path), cache_limit=sizes[0] - 1)
    with pytest.raises(ValueError, match=rf"has {sizes[0]} bytes, more than cache_limit={sizes[0] - 1} bytes"):
        ds.read(0)
    ds.close()
