"""A local folder of whole shards downloaded from a store, shared by the processes (and
ranks) of one node.

NOTE [ Shard cache layout and locks ]
For each shard ``<key>`` (a hash of its URL plus its file name) the folder holds:
  ``<key>``          the shard's bytes, published with ``os.replace`` once complete;
  ``<key>.json``     its sidecar: URL, size, ETag. An entry exists only when the sidecar
                     exists and the data file has the sidecar's size; the sidecar is written
                     after the data (and removed before it on eviction), so a crash between
                     the two leaves a data file without sidecar, which is not an entry;
  ``<key>.lock``     an ``fcntl.flock`` lock: exclusive while one process downloads or
                     evicts the entry, shared while a reader holds it (a :class:`Lease`);
  ``<key>.part-<pid>-<n>-<size>``  a download in progress (counted at its full size against
                     the limit from the moment it is reserved); a dead process's parts are
                     removed at start and whenever room is made.
A process that needs an entry another is downloading waits for the lock shared (not
exclusive: readers hold it shared for as long as they read, so an exclusive wait could last
for ever) and then finds it published. ``.cache.lock`` serialises room decisions and
publishing (NOTE [ Publishing under the room lock ]). Eviction takes an entry's lock without
waiting and skips the entry when it cannot (held by a reader or being downloaded), so
a shard is never removed under a reader; a reader that opened the file keeps its bytes even
if it is removed later (POSIX unlink). LRU order is the sidecar's mtime, touched on each
lease. Across runs an entry is reused when the store's ETag and size (one HEAD per shard
and process) match the sidecar's; otherwise it is downloaded again. A crash leaves only
complete entries and dead parts, so a restart downloads only the shards it lacks.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..._checks import parse_bytes
from ..._threads import name_native_thread
from .options import StoreOptions
from .store import ObjectInfo, open_store

__all__ = ["Lease", "ShardCache"]

log = logging.getLogger(__name__)
_PART = re.compile(r"\.part-(\d+)-\d+-(\d+)$")


@dataclass
class Lease:
    """A cached shard held open: ``path`` is its local file, ``fd`` an open descriptor of it.
    While a lease is held the shard is not evicted. ``release()`` (or ``with``) ends it."""

    url: str
    path: str
    fd: int
    _lock_fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)     # closing the descriptor drops its flock
            self._lock_fd = -1

    def __enter__(self) -> Lease:  # noqa: PYI034 - not meant to be subclassed
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


class ShardCache:
    """Whole shards of a remote dataset in ``cache_dir``, at most ``cache_limit`` bytes.

    Parameters
    ----------
    cache_dir : str
        The folder (created if missing). Several processes may use one folder at once.
    cache_limit : int or str, optional
        Bytes (or ``"20GB"``) the published shards may take; least recently used shards
        not held by a reader are evicted to stay within it. ``None``: no limit.
    storage_options : dict or StoreOptions, optional
        How to reach the store (see :class:`~loaderlib._extract.remote.options.StoreOptions`).
    workers : int
        Background downloads running at once for :meth:`prefetch`.

    Notes
    -----
    Thread-safe. Layout, locking and crash behaviour: NOTE [ Shard cache layout and locks ].
    """

    def __init__(self, cache_dir: str | os.PathLike, cache_limit: int | str | None = None,
                 storage_options: Mapping[str, Any] | StoreOptions | None = None, workers: int = 2) -> None:
        self.dir = os.path.abspath(os.fspath(cache_dir))
        os.makedirs(self.dir, exist_ok=True)
        self.limit = parse_bytes(cache_limit, "cache_limit") if cache_limit is not None else None
        self.options = (storage_options if isinstance(storage_options, StoreOptions)
                        else StoreOptions.resolve(storage_options))
        self.workers = max(1, int(workers))
        self._info: dict[str, ObjectInfo] = {}
        self._keys: dict[str, str] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._clock = 0
        #: Shards this object evicted to make room.
        self.evictions = 0
        self._q = _Queue()
        self._remove_dead_parts()
        weakref.finalize(self, _stop, self._q, False)

    # -- names ------------------------------------------------------------------------
    def key(self, url: str) -> str:
        import hashlib  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

        got = self._keys.get(url)
        if got is None:
            base = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-80:]
            got = self._keys[url] = hashlib.sha256(url.encode()).hexdigest()[:20] + "-" + base
        return got

    def path_of(self, url: str) -> str:
        """Where the copy of ``url`` is (or will be) published."""
        return self._p(self.key(url))

    def _p(self, key: str, suffix: str = "") -> str:
        return os.path.join(self.dir, key + suffix)

    def _remove_dead_parts(self) -> None:
        for name in os.listdir(self.dir):
            m = _PART.search(name)
            if m and not _alive(int(m.group(1))):
                _unlink(os.path.join(self.dir, name))

    # -- what the store says ----------------------------------------------------------
    def info(self, url: str, index: int | None = None) -> ObjectInfo:
        """Size and ETag of ``url`` (one HEAD per process)."""
        with self._lock:
            got = self._info.get(url)
        if got is None:
            got = open_store(url, self.options).head(url, index)
            with self._lock:
                self._info[url] = got
        return got

    def know(self, info: ObjectInfo) -> None:
        """Take ``info`` (a HEAD of ``info.url`` the caller made) as this process's answer
        for that URL, so :meth:`info` does not ask the store again."""
        with self._lock:
            self._info.setdefault(info.url, info)

    def _sidecar(self, key: str) -> dict | None:
        try:
            with open(self._p(key, ".json")) as f:
                side = json.load(f)
            # A damaged sidecar (another type, a size that is no integer) is no entry.
            if not isinstance(side, dict) or type(side.get("size")) is not int:
                return None
            if os.path.getsize(self._p(key)) != side["size"]:
                return None
            return side
        except (OSError, ValueError, KeyError, RecursionError):
            return None

    def _valid(self, key: str, info: ObjectInfo) -> bool:
        side = self._sidecar(key)
        return (side is not None and side.get("url") == info.url and side["size"] == info.size
                and side.get("etag") == info.etag)

    def cached(self, url: str) -> bool:
        """Whether a copy of ``url`` matching the store's ETag and size is published."""
        return self._valid(self.key(url), self.info(url))

    # -- download and publish ---------------------------------------------------------
    def ensure(self, url: str, index: int | None = None, _prefetch: bool = False) -> bool:
        """Download ``url`` unless a valid copy is published; returns once it is (or, for
        a prefetch that would have to evict a shard needed sooner, ``False`` without it).
        A shard larger than ``cache_limit`` is a ``ValueError``."""
        info = self.info(url, index)
        if self.limit is not None and info.size > self.limit:
            raise ValueError(f"shard cache {self.dir}: {url} has {info.size} bytes, more than cache_limit="
                             f"{self.limit} bytes; raise cache_limit to at least the largest shard's size")
        key = self.key(url)
        lock = self._p(key, ".lock")
        while True:
            if self._valid(key, info):
                return True
            # Wait for a download under way elsewhere (it holds the lock exclusively), without
            # queueing for the exclusive lock itself: readers hold a published entry's lock
            # shared for as long as they read, so waiting for it exclusively could be forever.
            with _Flock(lock, fcntl.LOCK_SH):
                if self._valid(key, info):
                    return True
            try:
                with _Flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB):
                    if self._valid(key, info):      # published meanwhile
                        return True
                    part = self._reserve(info.size, key, _prefetch)
                    if part is None:
                        return False
                    self._download(url, info, key, index, part)
                    return True
            except BlockingIOError:
                time.sleep(0.005)       # taken between the two locks: look again

    def _download(self, url: str, info: ObjectInfo, key: str, index: int | None, part: str) -> None:
        # The entry stops existing before its data changes, and an older copy's bytes go
        # with it: only the part, reserved at full size, is counted from here on.
        _unlink(self._p(key, ".json"))
        _unlink(self._p(key))
        try:
            with open(part, "r+b") as f:
                open_store(url, self.options).download(url, f, info.size, index)
                f.flush()
                os.fsync(f.fileno())
            # NOTE [ Publishing under the room lock ]
            # Between the rename and the sidecar the shard is neither a part nor an entry, so
            # a room decision made then counts its bytes nowhere and lets one more shard in
            # (a CI run saw 3 shards on disk under a limit of 2). Publishing holds the lock
            # every room decision holds, so none sees that moment.
            with _Flock(os.path.join(self.dir, ".cache.lock"), fcntl.LOCK_EX):
                os.replace(part, self._p(key))
                side = {"url": url, "size": info.size, "etag": info.etag}
                tmp = part + ".json"
                with open(tmp, "w") as f:
                    json.dump(side, f)
                self._touch(tmp)
                os.replace(tmp, self._p(key, ".json"))
        finally:
            _unlink(part)
            _unlink(part + ".json")

    def _entries(self) -> list[tuple[int, str, int]]:
        out = []
        for name in os.listdir(self.dir):
            if name.endswith(".json") and ".part-" not in name:
                key = name[:-5]
                side = self._sidecar(key)
                if side is not None:
                    try:
                        out.append((os.stat(self._p(key, ".json")).st_mtime_ns, key, side["size"]))
                    except OSError:
                        pass
        return sorted(out)

    def used(self) -> int:
        """Bytes taken by published shards."""
        return sum(size for _, _, size in self._entries())

    def _parts(self) -> int:
        # Downloads under way, at their full size (in the part's name, as it is written from
        # its start); a dead process's parts go.
        total = 0
        for name in os.listdir(self.dir):
            m = _PART.search(name)
            if m is None:
                continue
            if not _alive(int(m.group(1))):
                _unlink(os.path.join(self.dir, name))
                continue
            total += int(m.group(2))
        return total

    def _reserve(self, size: int, key: str, prefetch: bool) -> str | None:
        """Room for a download of ``size`` bytes within the limit, and its part file, sized
        named with its size so that every process's room decision counts it (None: a prefetch that
        would evict a shard needed sooner)."""
        with self._lock:
            self._seq += 1
            part = self._p(key, f".part-{os.getpid()}-{self._seq}-{size}")
        upcoming: set[str] = set()
        if prefetch:
            with self._q.cond:
                upcoming = {self.key(u) for u in self._q.upcoming}
        with _Flock(os.path.join(self.dir, ".cache.lock"), fcntl.LOCK_EX):
            if self.limit is not None and not self._make_room(size, key, prefetch, upcoming):
                return None
            open(part, "wb").close()    # noqa: SIM115 - created, counted from now on
        return part

    def _make_room(self, size: int, key: str, prefetch: bool, upcoming: set[str]) -> bool:
        # NOTE [ Shard cache within its limit ]
        # Published shards plus the downloads under way (counted at their full size) stay
        # within the limit: room is made by evicting the least recently used shards no reader
        # holds, never one held (a lease) or, for a prefetch, one the read-ahead needs sooner.
        # A prefetch leaves room for one more shard of its size besides its own, so that a
        # read asking for a shard the prefetch did not foresee (a shuffle buffer's neighbour,
        # the next epoch's first shard started early) still finds room; a prefetch that finds
        # none gives up (the read needs the shard later and downloads it then). A read that finds no room because other processes hold the rest downloads
        # anyway, over the limit, with a warning: waiting could deadlock two processes that
        # each hold what the other needs, and a dataset holds only the few shards it reads
        # (NOTE [ Shards held by a dataset ] in files.py), so the excess is bounded by what
        # the node's readers hold at once. A shard larger than the limit is an error (ensure).
        entries = self._entries()
        total = sum(s for _, _, s in entries) + self._parts()
        need = 2 * size if prefetch else size
        for _, other, osize in entries:
            if total + need <= self.limit:
                break
            if other == key or other in upcoming:
                continue
            if self._evict(other):
                total -= osize
        if total + need <= self.limit:
            return True
        if prefetch:
            return False
        log.warning("shard cache %s: %d bytes needed, %d of %d in use by readers; going over the limit",
                    self.dir, size, total, self.limit)
        return True

    def _evict(self, key: str) -> bool:
        try:
            lock = _Flock(self._p(key, ".lock"), fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock.__enter__()
        except BlockingIOError:
            return False            # a reader holds it, or it is being downloaded
        try:
            _unlink(self._p(key, ".json"))
            _unlink(self._p(key))
        finally:
            lock.__exit__()
        with self._lock:
            self.evictions += 1
        return True

    def _touch(self, path: str) -> None:
        # The LRU clock. Set explicitly: the kernel stamps files with a coarse clock (one
        # tick is milliseconds), so two uses in a row could otherwise tie.
        with self._lock:
            self._clock = max(time.time_ns(), self._clock + 1)
            t = self._clock
        try:
            os.utime(path, ns=(t, t))
        except OSError:
            pass

    # -- readers ----------------------------------------------------------------------
    def acquire(self, url: str, index: int | None = None) -> Lease:
        """The shard ``url`` as a local file, downloaded now if it is not cached; held
        (not evicted) until the lease is released."""
        info = self.info(url, index)
        key = self.key(url)
        for _ in range(100):
            self.ensure(url, index)
            lock_fd = os.open(self._p(key, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
            if self._valid(key, info):
                with self._q.cond:
                    self._q.failed.discard(url)
                fd = os.open(self._p(key), os.O_RDONLY)
                self._touch(self._p(key, ".json"))     # most recently used
                return Lease(url, self._p(key), fd, lock_fd)
            os.close(lock_fd)       # evicted between ensure and the lock: fetch again
        raise RuntimeError(f"shard cache {self.dir}: {url} keeps being evicted; raise cache_limit")

    def path(self, url: str, index: int | None = None) -> str:
        """The local path of a cached copy of ``url`` (downloaded now if needed). Not held:
        for reading while other processes evict, use :meth:`acquire`."""
        self.ensure(url, index)
        return self._p(self.key(url))

    # -- read-ahead -------------------------------------------------------------------
    def prefetch(self, urls: Sequence[str]) -> None:
        """Download ``urls`` in the background, in this order (the order the sampler will
        need them), replacing any earlier list. Shards already cached are skipped; a shard
        is not downloaded when that would evict one needed sooner."""
        q = self._q
        with q.cond:
            if q.closed:
                raise ValueError("the shard cache is closed")
            q.upcoming = list(urls)
            q.items = list(urls)
            q.queued = set(q.items)
            while len(q.threads) < min(self.workers, len(q.items)):
                t = threading.Thread(target=_worker, args=(weakref.ref(self), q),
                                     name=f"ll-shard-cache-{len(q.threads)}", daemon=True)
                q.threads.append(t)
                t.start()
            q.cond.notify_all()

    def downloading(self, url: str) -> bool:
        """Whether ``url`` is on the background downloads' list or being downloaded by one of
        them now, and no valid copy is published (NOTE [ Samples of a shard still on its way ]
        in ``files.py``)."""
        q = self._q
        with q.cond:
            if url in q.failed or (url not in q.active and url not in q.queued):
                return False     # a failed download: the read's own download reports it
        # Listed or started: it may be here already (an earlier run's copy, a warm epoch with
        # a limit; the thread finds it valid). One stat tells a cold shard (no sidecar yet).
        key = self.key(url)
        if not os.path.exists(self._p(key, ".json")):
            return True
        return not self._valid(key, self.info(url))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the background downloads have drained their list; ``False`` on timeout."""
        q = self._q
        with q.cond:
            return q.cond.wait_for(lambda: not q.items and q.busy == 0, timeout)

    def close(self) -> None:
        """Stop the background downloads (one under way finishes first) and join them."""
        _stop(self._q)

    def __enter__(self) -> ShardCache:  # noqa: PYI034 - not meant to be subclassed
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Queue:
    """The read-ahead list and its downloader threads, apart from the cache object so the
    threads do not keep the cache alive (a dropped cache stops its threads)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: list[str] = []
        self.upcoming: list[str] = []
        self.threads: list[threading.Thread] = []
        self.queued: set[str] = set()      # the URLs of items, for a quick look-up
        self.active: set[str] = set()      # the URLs being downloaded by the threads now
        self.failed: set[str] = set()      # the URLs whose download by a thread failed last
        self.busy = 0
        self.closed = False


def _worker(ref: weakref.ref, q: _Queue) -> None:
    name_native_thread(threading.current_thread().name.replace("shard-cache", "cache"))   # ll-cache-N
    while True:
        with q.cond:
            while not q.items and not q.closed:
                q.cond.wait()
            if q.closed:
                return
            url = q.items.pop(0)
            q.queued.discard(url)
            q.active.add(url)
            q.busy += 1
        cache = ref()
        try:
            if cache is None:
                return
            if not cache.ensure(url, _prefetch=True):
                with q.cond:
                    q.items.clear()     # no room without evicting a shard needed sooner
                    q.queued.clear()
            else:
                with q.cond:
                    q.failed.discard(url)
        except Exception as e:   # noqa: BLE001  the reader that needs the shard raises it
            log.debug("shard cache: prefetch of %s failed: %s", url, e)
            with q.cond:
                q.failed.add(url)
        finally:
            del cache
            with q.cond:
                q.active.discard(url)
                q.busy -= 1
                q.cond.notify_all()


def _stop(q: _Queue, join: bool = True) -> None:
    # A dropped cache (or the interpreter's exit) only signals its threads: they are daemons
    # and end after the download under way; close() waits for them.
    with q.cond:
        q.closed = True
        q.items.clear()
        q.queued.clear()
        q.cond.notify_all()
        threads = list(q.threads)
        q.threads.clear()
    for t in threads:
        if join and t is not threading.current_thread():
            t.join()


class _Flock:
    """``fcntl.flock`` on a lock file, held for a ``with`` block."""

    def __init__(self, path: str, mode: int) -> None:
        self.path = path
        self.mode = mode
        self.fd = -1

    def __enter__(self) -> _Flock:  # noqa: PYI034 - private
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, self.mode)
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
