"""The files of a dataset named by URLs: local copies through the shard cache, or byte
ranges read from the store.

NOTE [ Remote datasets: cache or ranges ]
A dataset whose files are URLs reads them one of two ways.
- With ``cache_dir``: shards go through the :class:`ShardCache` (downloaded by background
  threads a few ahead of the reads, in the order a run first needs them, NOTE [ Epoch order
  to the dataset ] in ``_extract/source.py``; published atomically, shared by the node's processes)
  and samples are slices of the local copies, mapped into memory, handed to the kernels'
  BUFFERS path (and to the read-ahead, NOTE [ Remote read-ahead ] in ``readahead.py``). The
  dataset holds only the few shards it reads (NOTE [ Shards held by a dataset ]), so the
  cache may be smaller than the dataset. Record shards open before their data arrives
  (indexes and headers from the store) and a shard's first read waits for its copy;
  WebDataset shards are indexed from their copies one after another when the dataset opens.
- Without: small files (indexes) are fetched whole into memory, and samples are read by
  byte range from the store into buffers for the kernels' BUFFERS path, ahead of the
  batches in the sampler's order, ``io_depth`` requests at once (NOTE [ Remote read-ahead ]
  in ``readahead.py``); with ``io_depth=0`` the ranges of one batch go out in one call,
  concurrently, when the batch is produced (NOTE [ Protocol library ] in ``store.py``).
Either way the bytes handed to the decoder are the file's bytes, so outputs equal those of
the same files read locally.

NOTE [ Shards held by a dataset ]
A cached shard is held (a :class:`Lease`: not evicted) only while the dataset is likely to
read it again soon, so ``cache_limit`` may be far below the dataset's size:
- A read maps the shard's copy (``mmap``) and hands out slices of the map. The map lives as
  long as any slice does (the kernels' buffers, the read-ahead's slots): bytes in use stay
  valid whatever happens to the lease or to the file (eviction unlinks a published file and
  never changes it in place, so a map never shrinks under a reader). Closing the map or a
  descriptor a pending read still uses is thus impossible by construction, which is why the
  cached path is BUFFERS and not the kernels' ``pread`` of descriptors (SHARDS): a
  descriptor closed while a queued read still names it could be reused by another file.
- The dataset keeps the leases of the most recently read shards, ``open_shards()`` of them:
  all of them without a limit, else as many as fit in the limit less room for the downloads
  ahead and one spare shard (below), and never fewer than 2 (a shuffle buffer that mixes
  neighbouring shards reads two at once). Opening one more (one at a time per dataset)
  releases the least recently read first; the released shard may be evicted at once (its
  bytes are freed when its last slice goes), and a later read of it (shuffled samplers
  revisit shards) acquires it again, downloading it again if it was evicted.
- Ahead of the reads, the next ``AHEAD`` shards in the run's first-use order (``plan``,
  from ``plan_epoch``) are downloaded in the background, only where there is room (and a
  spare shard's) without evicting a held shard or one of them (NOTE [ Shard cache within its limit ] in
  ``shard_cache.py``): with a limit of two shards the window is empty and each shard
  downloads when its first read asks for it. Without a limit the window is the whole
  first-use order (NOTE [ Downloads ahead of a cold epoch ]).
NOTE [ Downloads ahead of a cold epoch ]
A window of ``AHEAD`` shards moves only when a read opens a shard: on a cold epoch the
background downloads then stop while the kernels decode the shards already here, and the
next shard's download starts only when its first read asks for it, so decoding and
downloading take turns instead of overlapping. Without ``cache_limit`` nothing is ever
evicted, so the window is every shard of the run, in first-use order: the cache's
downloaders go from one shard to the next while the earlier ones are decoded, and a read
of a shard none of them has reached downloads it itself (the cache downloads each shard
once). With a limit the window stays ``AHEAD``, bounded by room as above. The record
indexes a dataset opens with are fetched concurrently too (``RemoteFiles.each``): one
shard after another, their requests (size, header, index) were a serial chain of round
trips before the first read. ``python benchmarks/objstore_peers.py`` measures cold and warm
epochs from moto's S3 server against MosaicML Streaming and LitData; on the shared 2-core
machine the change was within the run-to-run noise (its ``--baseline`` rows; the object-store
guide has the table): what a cold first batch waits for is still the download of every shard
its samples come from. Reading those samples by range meanwhile is NOTE [ Samples of a shard
still on its way ]: measured slower against moto, so it is off unless asked for.
So a dataset holds at most ``open_shards()`` leases, the one being opened included, and
the disk holds, beyond the limit, only evicted shards whose slices a batch in flight still
reads (unlinked, freed when the batch is done).

NOTE [ Samples of a shard still on its way ]
With ``storage_options={"ranges_while_caching": True}``, a sample of a shard whose whole-shard
download is on the cache's background list or under way (``ShardCache.downloading``: listed
or being fetched by its threads, and no valid copy published) and that no read has opened
yet is read by byte range from the store, as without the cache (``slices`` through
``read_ranges``; the read-ahead's one-sample request, ``remote_request``, NOTE [ One sample,
one request ] in ``readahead.py``), so the kernels decode while the downloads go on. The
downloads themselves are unchanged (first-use order, NOTE [ Downloads ahead of a cold
epoch ]); once a shard's copy is published the next read opens it and its samples are
slices of the copy again, and no shard is read by range after that (a warm epoch, or a
later run over the same ``cache_dir``, sends no ranged request; one stat of the sidecar per
read tells a listed shard that is already here). The bytes are the object's bytes either
way, so outputs equal the warm epoch's and the uncached path's (same samples, order and
pixels; tests/remote/test_cold_epoch.py). A ranged read that fails is read from the copy
instead (its download reports its own error), and a shard whose background download failed
is no longer "downloading" (the cache remembers the failure until a download succeeds): its
reads download it themselves and raise the error naming the shard, rather than ranging on.
- Duplicated bytes: only samples read while their shard downloads come twice (once by
  range, once in the shard). The worst case, every sample of every shard read before its
  shard arrives, is the dataset's bytes twice plus one request per sample (fewer where
  neighbours share one, NOTE [ Ranges that share a request ] in ``store.py``); a shard not on
  the list (outside a limited cache's window) is never read by range.
- Why it is off by default: moto's S3 server (5.2.5) answers a ranged GET by reading the
  whole object (24 MB here) under the object's lock and slicing it, so each sample read by
  range cost the server about what a shard's download does, took the cores from the
  decoding and held up the downloads. ``python benchmarks/objstore_peers.py --systems
  loaderlib --ll-ranges --baseline DIR --repeat 3`` (2 cores shared with other work, load
  average 3.0-5.2), cold epochs with it against without, medians: 318 against 424 img/s
  (``shuffle=True``), 356 against 716 (``ShardShuffleSampler``); moto's CPU 0.48-0.70 ms
  per image against 0.07-0.10; and the first batch came later, not sooner (1.6-2.6 s
  against 0.8-1.8 s). It is meant for stores that answer a range at the cost of its bytes
  (object stores' own servers, nginx): over HTTP from nginx with 25 MB/s per connection, a
  cold ``shuffle=True`` epoch ran 3.57x faster with it (987 against 276 images/s, first batch
  0.20 s against 3.11 s; ``python benchmarks/ranges_while_caching.py``, quiet machine).
- ``ShardShuffleSampler`` takes the same path (the measurement above covers both shuffles).
  WebDataset shards with the cache are not read by range: the dataset downloads each shard
  when it opens, to index its members from the copy (a sidecar ``.idx`` is used only
  without the cache, NOTE [ WebDataset sidecar index ] in ``_extract/wds_index.py``), so no
  shard is still downloading during an epoch and the option changes nothing there.
"""

from __future__ import annotations

import collections
import io
import mmap
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import RemoteReadError
from .options import StoreOptions
from .shard_cache import Lease, ShardCache
from .store import open_store, read_objects, read_ranges
from .urls import check_scheme, is_url

__all__ = ["RemoteFiles", "remote_files"]

#: Threads that open a dataset's shards at once (``RemoteFiles.each``).
OPEN_THREADS = 16


class RemoteFiles:
    """How a dataset reaches its files named by URLs (NOTE [ Remote datasets: cache or ranges ]).

    Parameters
    ----------
    storage_options : dict, optional
        boto3's names plus the transfer's bounds (:class:`~loaderlib._extract.remote.options.StoreOptions`).
    cache_dir : str, optional
        Turns the shard cache on.
    cache_limit : int or str, optional
        The cache's size bound (``"20GB"``).
    """

    def __init__(self, storage_options: Mapping[str, Any] | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | str | None = None) -> None:
        if cache_limit is not None and cache_dir is None:
            raise ValueError("cache_limit needs cache_dir (the shard cache is off without a folder)")
        self.options = StoreOptions.resolve(storage_options)
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.cache_limit = cache_limit
        self._cache: ShardCache | None = None
        self._leases: dict[str, Lease] = {}
        self._failures: dict[int, RemoteReadError] = {}
        self._lock = threading.Lock()
        self._init_pool()

    #: Shards downloaded ahead of the reads (NOTE [ Shards held by a dataset ]).
    AHEAD = 2

    def _init_pool(self) -> None:
        self._open: collections.OrderedDict[str, tuple[Lease, Any]] = collections.OrderedDict()
        self._opening = threading.Lock()    # one shard opens at a time: the leases stay bounded
        self._order: dict[str, int] = {}
        self._urls: list[str] = []
        self._largest = 0
        #: Shards opened (leased and mapped) by reads, re-openings included.
        self.opened = 0

    @property
    def cached(self) -> bool:
        return self.cache_dir is not None

    @property
    def cache(self) -> ShardCache:
        with self._lock:
            if self._cache is None:
                self._cache = ShardCache(self.cache_dir, self.cache_limit, self.options)
            return self._cache

    def local(self, urls: Sequence[str]) -> list[str]:
        """Local copies of ``urls`` through the cache, downloaded in this order (several at
        once) and held until :meth:`close`."""
        cache = self.cache
        missing = [u for u in urls if u not in self._leases]
        if len(missing) > 1:
            cache.prefetch(missing)
        out = []
        for u in urls:
            with self._lock:
                lease = self._leases.get(u)
            if lease is None:
                lease = cache.acquire(u)
                with self._lock:
                    if u in self._leases:       # another thread got it first
                        lease.release()
                    else:
                        self._leases[u] = lease
                    lease = self._leases[u]
            out.append(lease.path)
        return out

    def held_bytes(self) -> int:
        """Bytes of the local copies :meth:`local` holds."""
        with self._lock:
            leases = list(self._leases.values())
        total = 0
        for lease in leases:
            try:
                total += os.fstat(lease.fd).st_size
            except OSError:
                pass
        return total

    def prefetch(self, urls: Sequence[str]) -> list[str]:
        """Start downloading ``urls`` into the cache in this order; returns the paths their
        copies will have (:meth:`local` waits for one and holds it)."""
        cache = self.cache
        cache.prefetch([u for u in urls if u not in self._leases])
        return [cache.path_of(u) for u in urls]

    # -- shards read through the cache (NOTE [ Shards held by a dataset ]) ----------------
    def open_shards(self) -> int:
        """How many shards this process keeps leased between reads."""
        limit = self.cache.limit
        return self._keep(limit)

    def _keep(self, limit: int | None) -> int:
        if limit is None:
            return 1 << 30
        return max(2, limit // max(1, self._largest) - self.AHEAD - 1)

    def plan(self, urls: Sequence[str]) -> None:
        """The shards a run reads, in the order it first needs them: the next ``AHEAD`` of
        them past the last one opened download in the background."""
        with self._lock:
            self._urls = list(urls)
            self._order = {u: k for k, u in reversed(list(enumerate(self._urls)))}
        self._ahead(0)

    def _window(self) -> int:
        """Shards downloaded ahead of the last one opened (NOTE [ Downloads ahead of a cold epoch ])."""
        return self.AHEAD if self.cache.limit is not None else len(self._urls)

    def _ahead(self, start: int) -> None:
        window = self._window()
        with self._lock:
            want = [u for u in self._urls[start:start + window] if u not in self._open]
        if want:
            self.cache.prefetch(want)

    def view(self, url: str) -> Any:
        """The bytes of the shard ``url`` (its cached copy, mapped), downloaded now if it is
        not cached; slices of it stay valid as long as they live."""
        with self._lock:
            got = self._open.get(url)
            if got is not None:
                self._open.move_to_end(url)
                return got[1]
        cache = self.cache
        with self._opening:
            with self._lock:
                got = self._open.get(url)
                if got is not None:
                    self._open.move_to_end(url)
                    return got[1]
                keep = self._keep(cache.limit) - 1
                drop = []
                while len(self._open) > max(0, keep):
                    drop.append(self._open.popitem(last=False)[1][0])
            for lease in drop:      # their maps live on in the slices still in use
                lease.release()
            lease = cache.acquire(url)
            try:
                size = os.fstat(lease.fd).st_size
                data: Any = memoryview(mmap.mmap(lease.fd, size, prot=mmap.PROT_READ)) if size else memoryview(b"")
            except BaseException:
                lease.release()
                raise
            with self._lock:
                self._open[url] = (lease, data)
                self._largest = max(self._largest, size)
                self.opened += 1
                nxt = self._order.get(url)
        if nxt is not None:
            self._ahead(nxt + 1)
        return data

    def downloading(self, url: str) -> bool:
        """Whether samples of the shard ``url`` are read by byte range now: its whole-shard
        download is listed or under way and no read has opened its copy (NOTE [ Samples of a
        shard still on its way ])."""
        if not self.options.ranges_while_caching:
            return False
        with self._lock:
            if self._cache is None or url in self._open:
                return False
            cache = self._cache
        return cache.downloading(url)

    def slices(self, urls: Sequence[str], offsets: np.ndarray, sizes: np.ndarray) -> list:
        """``sizes[k]`` bytes at ``offsets[k]`` of the cached shard ``urls[k]``, as slices of
        its map (no copy); those of a shard still downloading, by byte range from the store
        (NOTE [ Samples of a shard still on its way ])."""
        views: dict[str, Any] = {}
        offs, lens = offsets.tolist(), sizes.tolist()
        out: list = [None] * len(offs)
        ranged = []
        for k, (u, o, n) in enumerate(zip(urls, offs, lens)):
            v = views.get(u)
            if v is None:
                v = views[u] = False if self.downloading(u) else self.view(u)
            if v is False:
                ranged.append(k)
                continue
            out[k] = self._slice(u, v, o, n)
        if ranged:
            try:
                got = read_ranges([(urls[k], offs[k], offs[k] + lens[k]) for k in ranged], self.options)
            except RemoteReadError:
                got = None      # the copy then: its download reports a failure of its own
            for j, k in enumerate(ranged):
                out[k] = got[j] if got is not None else self._slice(urls[k], self.view(urls[k]), offs[k], lens[k])
        return out

    @staticmethod
    def _slice(url: str, v: Any, o: int, n: int) -> Any:
        if o + n > len(v):
            raise OSError(f"{url}: {n} bytes at offset {o} are past the end of its cached copy ({len(v)} bytes)")
        return v[o:o + n]

    def size(self, url: str) -> int:
        info = open_store(url, self.options).head(url)
        if self.cached:
            self.cache.know(info)     # the cache's own HEAD of this shard is then not sent again
        return info.size

    def each(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list:
        """``[fn(x) for x in items]`` with the calls running concurrently (they wait on the
        store: opening a dataset's shards, NOTE [ Downloads ahead of a cold epoch ]); the first
        item whose call failed, in order, raises its error. The threads end before it returns."""
        items = list(items)
        if len(items) < 2:
            return [fn(x) for x in items]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(OPEN_THREADS, len(items)), thread_name_prefix="ll-open") as pool:
            futures = [pool.submit(fn, x) for x in items]
            try:
                return [f.result() for f in futures]
            finally:
                for f in futures:
                    f.cancel()

    def fetch(self, url: str) -> bytes:
        """A small object, whole (an index file)."""
        return bytes(open_store(url, self.options).get(url))

    def open_bytes(self, url: str) -> io.BytesIO:
        return io.BytesIO(self.fetch(url))

    def read_range(self, url: str, start: int, end: int, index: int | None = None) -> Any:
        return open_store(url, self.options).get_ranges(url, [start], [end],
                                                        [index] if index is not None else None)[0]

    def read(self, urls: Sequence[str], offsets: np.ndarray, sizes: np.ndarray, indices: Sequence[int],
             record: bool = False) -> list:
        """The bytes of samples ``indices``: ``sizes[k]`` bytes at ``offsets[k]`` of ``urls[k]``,
        all fetched concurrently; a failure is one RemoteReadError naming its sample, or with
        ``record`` an empty buffer in its place (NOTE [ Remote failures per sample ])."""
        reqs = [(u, int(o), int(o) + int(n)) for u, o, n in zip(urls, offsets.tolist(), sizes.tolist())]
        return self._per_sample(lambda rs, ix: read_ranges(rs, self.options, indices=ix), reqs, list(indices),
                                record)

    def _per_sample(self, fetch, reqs: list, indices: list[int], record: bool) -> list:
        # NOTE [ Remote failures per sample ]
        # One failed request fails a whole batched call. The kernels fail samples one by one
        # (status codes), and on_error="skip" drops only those, so the batch is read again
        # sample by sample: each failure is kept here under its sample index and an empty
        # buffer (which the decoder refuses) takes its place; native_error() in _extract/source.py
        # asks read_failure(i) and reports the RemoteReadError itself, not a decode error.
        try:
            out = fetch(reqs, indices)
        except RemoteReadError:
            if not record:
                raise
            out = []
            for req, i in zip(reqs, indices):
                try:
                    out.append(fetch([req], [i])[0])
                except RemoteReadError as e:
                    with self._lock:
                        self._failures[i] = e.with_index(i)
                    out.append(b"")
        if record and self._failures:
            with self._lock:
                for i, b in zip(indices, out):
                    if len(memoryview(b)):
                        self._failures.pop(i, None)
        return out

    def note_failure(self, index: int, error: RemoteReadError | None) -> None:
        """Keep (or with None, forget) the read error of sample ``index``, read ahead
        (NOTE [ Remote read-ahead ] in ``readahead.py``)."""
        if error is None and not self._failures:
            return   # the common case, every sample read: nothing to forget, no lock
        with self._lock:
            if error is None:
                self._failures.pop(int(index), None)
            else:
                self._failures[int(index)] = error.with_index(int(index))

    def failure(self, index: int) -> RemoteReadError | None:
        """The read error of sample ``index`` in its last batch, if it failed."""
        with self._lock:
            return self._failures.get(int(index))

    def read_whole(self, urls: Sequence[str], indices: Sequence[int], record: bool = False) -> list:
        """Whole objects, one per sample, all requested at once (``record``: as in :meth:`read`)."""
        return self._per_sample(lambda us, ix: read_objects(us, self.options, indices=ix), list(urls),
                                list(indices), record)

    def __getstate__(self) -> dict:
        # A copy in another process reads the same local copies (they are on this node and
        # held here) or the same ranges; it owns no cache threads or leases.
        d = dict(self.__dict__)
        d["_cache"], d["_leases"], d["_failures"] = None, {}, {}
        for k in ("_lock", "_open", "_opening", "_order", "_urls", "_largest", "opened"):
            d.pop(k, None)
        return d

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._init_pool()

    def close(self) -> None:
        with self._lock:
            leases = list(self._leases.values()) + [lease for lease, _ in self._open.values()]
            self._leases.clear()
            self._open.clear()
        for lease in leases:
            lease.release()
        if self._cache is not None:
            self._cache.close()
            self._cache = None


def remote_files(paths: Any, storage_options: Mapping[str, Any] | None, cache_dir: Any, cache_limit: Any,
                 who: str) -> RemoteFiles | None:
    """A :class:`RemoteFiles` when ``paths`` (a path, URL or list) names URLs, else None;
    mixing URLs and local paths, or remote options without URLs, is a ``ValueError``."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    for p in items:
        check_scheme(p, who)   # NOTE [ Unsupported URL schemes ] in urls.py
    remote = [is_url(p) for p in items]
    if any(remote) and not all(remote):
        raise ValueError(f"{who}: give either local paths or URLs, not both")
    if not any(remote):
        if storage_options is not None or cache_dir is not None or cache_limit is not None:
            raise ValueError(f"{who}: storage_options, cache_dir and cache_limit apply to URLs "
                             "(s3://, gs://, http(s)://), and no path here is one")
        return None
    return RemoteFiles(storage_options, cache_dir, cache_limit)
