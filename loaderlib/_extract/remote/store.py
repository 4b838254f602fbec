"""One object store or HTTP origin: head, whole gets, many byte ranges in one call, listing.

Every failure leaves this module as one :class:`~loaderlib.errors.RemoteReadError` naming
the URL, the HTTP status and (when the caller passes it) the sample index.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..._threads import name_native_thread
from ...errors import RemoteReadError
from . import _deps
from .options import StoreOptions
from .urls import ObjectURL, expand_braces, has_glob, parse_url

__all__ = ["ObjectInfo", "RemoteStore", "expand_urls", "open_store", "read_objects", "read_ranges"]

# NOTE [ Protocol library ]
# The protocols (S3 signing, GCS auth, HTTP ranges, retries, connection pools) come from
# obstore (Rust's object_store): never hand-written. Chosen over fsspec (s3fs, HTTPFileSystem)
# by benchmarks/remote_protocols.py on this machine (2 shared cores; nginx and moto's S3
# server on loopback; 8 shards x 16 MB, 512 ranges of 110 KB, median of 3):
#   nginx, 110 KB ranges from Python threads, MB/s at concurrency 1/16/64:
#     obstore 430 / 1,076 / 670; fsspec 184 / 229 / 340 (fsspec's batched cat_ranges:
#     325 / 893 / 674; obstore's asyncio gather: 125 / 476 / 415)
#   nginx, whole 16 MB shards, best of 3, concurrency 1 / 8: obstore get 642 / 1,248,
#     get_range 658 / 1,381; fsspec cat_file 370 / 426
#   moto, ranges at 16 threads: obstore 138 req/s at 6 CPU-s/GB, fsspec 39 req/s at
#     25 CPU-s/GB (moto itself caps both); whole shards 266 vs 199 MB/s.
# obstore wins or ties every row, spends a fifth of fsspec's client CPU per byte against
# S3, releases the GIL for the whole request (the read-ahead stage's threads call it
# concurrently), returns buffers the kernels read without a copy, and has retry/backoff and
# timeouts built in. So the reader calls obstore's blocking functions from the loader's own
# threads (its asyncio path was slower here: one event loop per call costs more than it
# saves; NOTE [ Requests fanned out on threads ]).

# NOTE [ Faults the library handles ]
# Checked with benchmarks/_servers.py's fault proxy in front of nginx: obstore retries
# 5xx and 429 with exponential backoff up to max_retries, reconnects after a reset, re-reads
# a body cut short by a closed connection (Content-Length not met), and abandons a request
# that stalls after `timeout` and retries it. It does not see a well-formed response whose
# body is shorter than the range asked for (a proxy or server that lies in Content-Length):
# get_range returns the short buffer, and get_ranges panics when such a body was to cover
# several coalesced ranges. So every read here knows its expected length
# (range ends, or the size from head) and re-reads a short body, with the same backoff,
# before reporting it. 403, 404 and other 4xx are raised at once.

_STATUS = re.compile(r"status code: (\d{3})")
_STORES: dict[tuple, RemoteStore] = {}
_STORES_LOCK = threading.Lock()


@dataclass(frozen=True)
class ObjectInfo:
    """An object's URL, size in bytes and ETag (``None`` when the server sends none)."""

    url: str
    size: int
    etag: str | None


def _status_of(exc: BaseException) -> int | None:
    ob = _deps.obstore()
    exc_mod = ob.exceptions
    if isinstance(exc, (FileNotFoundError, exc_mod.NotFoundError)):
        return 404
    if isinstance(exc, exc_mod.PermissionDeniedError):
        return 403
    if isinstance(exc, exc_mod.UnauthenticatedError):
        return 401
    m = _STATUS.search(str(exc))
    return int(m.group(1)) if m else None


def _is_panic(exc: BaseException) -> bool:
    # obstore 0.12's get_ranges panics (pyo3's PanicException, a BaseException) when a
    # coalesced response is shorter than the ranges it was to cover; that is a short body,
    # re-read like one (NOTE [ Faults the library handles ]).
    return type(exc).__name__ == "PanicException"


def _reason(exc: BaseException) -> str:
    # obstore's messages end with a multi-line debug dump of the Rust error: keep the summary,
    # plus the one fact the summary hides ("error sending request" when the cause is a timeout).
    full = str(exc)
    text = full.split("\n\nDebug source:")[0].strip()
    text = text.splitlines()[0] if text else type(exc).__name__
    if "TimedOut" in full or "kind: Timeout" in full:
        text = "timed out: " + text
    return text


def _error(url: str, exc: BaseException, index: int | None) -> RemoteReadError:
    if isinstance(exc, RemoteReadError):
        return exc.with_index(index) if index is not None else exc
    return RemoteReadError(url, _reason(exc), _status_of(exc), index)


class RemoteStore:
    """A bucket (``s3://bucket``, ``gs://bucket``) or an HTTP origin, opened once.

    Thread-safe: every method may be called from many threads at once (the requests run
    on obstore's own runtime with the GIL released).

    Parameters
    ----------
    root : str
        The store's root URL (``ObjectURL.store``).
    options : StoreOptions
        Credentials, endpoint and transfer bounds.
    """

    def __init__(self, root: str, options: StoreOptions) -> None:
        ob = _deps.obstore()
        self.root = root
        self.options = options
        scheme = root.split("://", 1)[0]
        client = options.client_options(url_is_http=scheme == "http")
        retry = options.retry_config()
        try:
            if scheme == "s3":
                self._store = ob.store.S3Store(root[len("s3://"):], config=options.s3_config(),
                                               client_options=client, retry_config=retry)
            elif scheme == "gs":
                self._store = ob.store.GCSStore(root[len("gs://"):], config=options.gcs_config(),
                                                client_options=client, retry_config=retry)
            else:
                self._store = ob.store.HTTPStore.from_url(root, client_options=client, retry_config=retry)
        except ob.exceptions.BaseError as e:
            raise ValueError(f"cannot open {root}: {_reason(e)}") from e
        self._ob = ob

    def _path(self, url: str) -> str:
        u = parse_url(url)
        if u.store != self.root:
            raise ValueError(f"{url} is not in {self.root}")
        return u.path

    def object_path(self, url: str) -> str:
        """The path of ``url``'s object in this store."""
        return self._path(url)

    # -- the requests -----------------------------------------------------------------
    def quick_get(self, path: str, start: int, end: int | None) -> Any:
        """Bytes ``[start, end)`` of the object at ``path`` (``end`` None: all of it) in one
        request, with obstore's own retries only: None when the request fails or the body is
        short, for the caller to read it again through the checked path (NOTE [ One sample,
        one request ] in ``readahead.py``)."""
        try:
            if end is None:
                return self._ob.get(self._store, path).bytes()
            if end <= start:
                return None
            data = self._ob.get_range(self._store, path, start=start, end=end)
        except Exception:  # noqa: BLE001 - read again by the checked path, which reports it
            return None
        except BaseException as e:   # obstore's panic on a malformed response: the same
            if not _is_panic(e):
                raise
            return None
        return data if len(memoryview(data)) == end - start else None

    def head(self, url: str, index: int | None = None) -> ObjectInfo:
        """Size and ETag of one object."""
        try:
            meta = self._ob.head(self._store, self._path(url))
        except Exception as e:
            raise _error(url, e, index) from e
        return ObjectInfo(url, int(meta["size"]), meta.get("e_tag"))

    def get(self, url: str, size: int | None = None, index: int | None = None) -> Any:
        """The whole object, as a buffer; with ``size`` known, a shorter body is re-read."""
        path = self._path(url)

        def once():
            if size is None:
                return self._ob.get(self._store, path).bytes()
            if size == 0:
                return b""
            return self._ob.get_range(self._store, path, start=0, end=size)

        return self._checked(url, once, [size] if size is not None else None, index, single=True)

    def get_ranges(self, url: str, starts: Sequence[int], ends: Sequence[int],
                   indices: Sequence[int] | None = None) -> list:
        """The bytes ``[start, end)`` of each range of one object, fetched concurrently
        (neighbouring ranges are coalesced by obstore); one buffer per range."""
        path = self._path(url)
        starts = [int(s) for s in starts]
        ends = [int(e) for e in ends]
        if not starts:
            return []
        index = indices[0] if indices else None

        def once():
            if len(starts) == 1:   # one range: the plain ranged GET, a little cheaper than a list of one
                return [self._ob.get_range(self._store, path, start=starts[0], end=ends[0])]
            return self._ob.get_ranges(self._store, path, starts=starts, ends=ends)

        return self._checked(url, once, [e - s for s, e in zip(starts, ends)], index, indices=indices)

    def download(self, url: str, f, size: int, index: int | None = None, chunk: int = 8 << 20) -> None:
        """Stream the whole object into the binary file ``f`` (written from its start);
        ``size`` is the object's size from :meth:`head`, and a body of another length is
        fetched again (NOTE [ Faults the library handles ])."""
        path = self._path(url)

        def once():
            f.seek(0)
            f.truncate()
            n = 0
            for part in self._ob.get(self._store, path).stream(min_chunk_size=chunk):
                f.write(part)
                n += len(part)
            return n

        delay = self.options.backoff
        for attempt in range(self.options.max_retries + 1):
            try:
                n = once()
            except Exception as e:
                raise _error(url, e, index) from e
            if n == size:
                return
            if attempt < self.options.max_retries:
                time.sleep(delay)
                delay = min(delay * 2, self.options.max_backoff)
        raise RemoteReadError(url, f"short body: {n} of {size} bytes after {self.options.max_retries} retries",
                              None, index)

    def _checked(self, url: str, once, lengths: list[int] | None, index: int | None,
                 single: bool = False, indices: Sequence[int] | None = None):
        """Run ``once`` (obstore already retried what it retries, NOTE [ Faults the library
        handles ]); re-run it while a body comes back shorter than asked, with backoff."""
        delay = self.options.backoff
        deadline = time.monotonic() + self.options.retry_timeout
        for attempt in range(self.options.max_retries + 1):
            bad = index
            try:
                out = once()
            except BaseException as e:
                if not _is_panic(e):
                    if isinstance(e, Exception):
                        raise _error(url, e, index) from e
                    raise
                problem = f"malformed response ({_reason(e)})"
            else:
                if lengths is None:
                    return out
                bufs = [out] if single else out
                short = next((k for k, (b, n) in enumerate(zip(bufs, lengths)) if len(memoryview(b)) != n), None)
                if short is None:
                    return out
                problem = f"short body: {len(memoryview(bufs[short]))} of {lengths[short]} bytes"
                bad = indices[short] if indices else index
            if attempt == self.options.max_retries or time.monotonic() + delay > deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, self.options.max_backoff)
        raise RemoteReadError(url, f"{problem} after {attempt} retries", None, bad)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose path starts with ``prefix`` (recursively), sorted by path."""
        u = ObjectURL(self.root.split("://", 1)[0], self.root, prefix)
        if not u.is_object_store:
            raise ValueError(f"cannot list {u.url}: an HTTP server has no listing; name the files "
                             "(a list or a brace range such as part-{0000..0099}.tar)")
        out = []
        try:
            for batch in self._ob.list(self._store, prefix=prefix or None):
                for meta in batch:
                    out.append(ObjectInfo(f"{self.root}/{meta['path']}", int(meta["size"]), meta.get("e_tag")))
        except Exception as e:
            raise _error(u.url, e, None) from e
        return sorted(out, key=lambda o: o.url)


def open_store(url: str, storage_options: Mapping[str, Any] | StoreOptions | None = None) -> RemoteStore:
    """The store holding ``url``, shared per process by every reader with the same options
    (one connection pool per store). A forked child opens its own."""
    if isinstance(storage_options, StoreOptions):
        # Every request asks: remembered per (process, URL, options object), no hashing of the options.
        hit = _LAST_STORE.get((url, id(storage_options)))
        if hit is not None and hit[0] is storage_options and hit[1] == os.getpid():
            return hit[2]
        store = _open_store(url, storage_options)
        if len(_LAST_STORE) > 4096:
            _LAST_STORE.clear()
        _LAST_STORE[url, id(storage_options)] = (storage_options, os.getpid(), store)
        return store
    return _open_store(url, StoreOptions.resolve(storage_options))


_LAST_STORE: dict[tuple[str, int], tuple[StoreOptions, int, RemoteStore]] = {}


def _open_store(url: str, opts: StoreOptions) -> RemoteStore:
    root = parse_url(url).store
    key = (os.getpid(), root, opts)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = RemoteStore(root, opts)
    return store


# NOTE [ Ranges that share a request ]
# object_store's get_ranges merges the ranges of one call that lie within 1 MiB of each other
# into one request, and sends at most 10 requests of a call at once. That suits columnar files
# (many small nearby ranges); for samples drawn at random from shards of many megabytes it reads
# most of each shard for every batch: 8 random 47 KB images of a 6 MB shard are about 700 KB
# apart, so one call fetches about 5 MB for 0.4 MB of samples. So the groups are made here:
# neighbouring ranges of an object share a request only when the gap between them is at most
# ``max(COALESCE_MIN, the call's median range)`` (reading the gap costs less than another
# request), each group is its own obstore call, and every group of every object goes out at
# once. A shard read in order (a shard-shuffle sampler, a sequential epoch) still becomes one
# request per run of neighbours.

#: Ranges of one object this close (bytes) or closer share a request (NOTE [ Ranges that share a request ]).
COALESCE_MIN = 64 << 10


def _range_groups(requests: Sequence[tuple[str, int, int]]) -> list[tuple[str, list[int]]]:
    """The requests (positions in ``requests``) grouped by object and by neighbourhood
    (NOTE [ Ranges that share a request ]), each group sorted by start."""
    if len(requests) == 1:
        return [(requests[0][0], [0])]
    by_url: dict[str, list[int]] = {}
    for k, (url, _, _) in enumerate(requests):
        by_url.setdefault(url, []).append(k)
    groups: list[tuple[str, list[int]]] = []
    for url, ks in by_url.items():
        ks = sorted(ks, key=lambda k: requests[k][1])
        lengths = sorted(requests[k][2] - requests[k][1] for k in ks)
        gap = max(COALESCE_MIN, lengths[len(lengths) // 2])
        run = [ks[0]]
        end = requests[ks[0]][2]
        for k in ks[1:]:
            if requests[k][1] - end > gap:
                groups.append((url, run))
                run = []
            run.append(k)
            end = max(end, requests[k][2])
        groups.append((url, run))
    return groups


# NOTE [ Requests fanned out on threads ]
# One call of many requests (a batch's groups of ranges, a batch's objects) fans out over a
# small pool of daemon threads, each making obstore's blocking call (the GIL is released for
# the whole request). obstore's asyncio functions would do the same on one event loop, but
# they complete their futures from the store's own runtime threads, which then run Python
# (the loop's wake-up) and abort the process when that happens while the interpreter exits
# with a request in flight (a loader dropped without close(), reading ahead, at the end of a
# script: seen as exit -6 and -11 in benchmarks/storage.py --remote). They were also slower
# here (NOTE [ Protocol library ]). A thread that is inside a blocking call when the
# interpreter exits is parked by obstore's binding, not killed.

#: Most requests of one call in flight at once (more wait for a free thread).
FAN_OUT = 64


class _Pool:
    """Daemon threads running ``fn()`` jobs; started on first use, grown up to ``FAN_OUT``."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = 0
        self._idle = 0
        self._lock = threading.Lock()

    def _worker(self) -> None:
        name_native_thread("ll-fetch")   # NOTE [ Thread names ] in pyx/include/ll_pool.h
        while True:
            with self._lock:
                self._idle += 1
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
            job()

    def run(self, fns: Sequence[Any]) -> list:
        """``[fn() for fn in fns]``, run concurrently; the first exception is raised after all
        have finished. The caller wakes once, when the last job ends (a semaphore released
        per job woke it, and handed it the GIL, once per request)."""
        n = len(fns)
        if n == 1:
            return [fns[0]()]
        out: list = [None] * n
        errors: list = [None] * n
        left = [n]
        count = threading.Lock()
        finished = threading.Lock()
        finished.acquire()

        def job(k: int) -> Any:
            def go() -> None:
                try:
                    out[k] = fns[k]()
                except BaseException as e:   # handed to the caller
                    errors[k] = e
                finally:
                    with count:
                        left[0] -= 1
                        last = left[0] == 0
                    if last:
                        finished.release()
            return go

        with self._lock:
            grow = min(FAN_OUT, n) - self._idle
            for _ in range(max(0, min(grow, FAN_OUT - self._threads))):
                self._threads += 1
                threading.Thread(target=self._worker, name="loaderlib-remote", daemon=True).start()
        for k in range(n):
            self._jobs.put(job(k))
        finished.acquire()
        err = next((e for e in errors if e is not None), None)
        if err is not None:
            raise err
        return out


_POOL = _Pool()


def read_ranges(requests: Sequence[tuple[str, int, int]],
                storage_options: Mapping[str, Any] | StoreOptions | None = None,
                indices: Sequence[int] | None = None) -> list:
    """The bytes of many ``(url, start, end)`` ranges, over any number of objects, in one
    call: neighbouring ranges of an object share a request (NOTE [ Ranges that share a
    request ]), and the requests go out at once (NOTE [ Requests fanned out on threads ]).
    Returned in the order asked."""
    out: list = [None] * len(requests)
    groups = _range_groups(requests)

    def group(url: str, ks: list[int]):
        return lambda: open_store(url, storage_options).get_ranges(
            url, [requests[k][1] for k in ks], [requests[k][2] for k in ks],
            [indices[k] for k in ks] if indices is not None else None)

    results = [group(*groups[0])()] if len(groups) == 1 else _POOL.run([group(u, ks) for u, ks in groups])
    for (_url, ks), bufs in zip(groups, results):
        for k, b in zip(ks, bufs):
            out[k] = b
    return out


def read_objects(urls: Sequence[str], storage_options: Mapping[str, Any] | StoreOptions | None = None,
                 indices: Sequence[int] | None = None) -> list:
    """Whole objects (one image each), all requested at once (NOTE [ Requests fanned out on
    threads ]); in the order asked."""
    def one(k: int):
        return lambda: open_store(urls[k], storage_options).get(urls[k], index=indices[k] if indices else None)

    if len(urls) == 1:
        return [one(0)()]
    return _POOL.run([one(k) for k in range(len(urls))])


def expand_urls(spec: str | Iterable[str], storage_options: Mapping[str, Any] | StoreOptions | None = None,
                suffixes: tuple[str, ...] | None = None) -> list[str]:
    """Object URLs from a URL, a list, brace ranges and (object stores only) a glob
    (``s3://b/train/*.tar``) or a prefix ending in ``/`` (everything under it).

    Globs and prefixes are listed once; ``suffixes`` keeps only names ending so. Brace
    ranges and plain URLs are returned as written (not checked to exist here).
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for item in items:
        for url in expand_braces(item):
            u = parse_url(url)
            if has_glob(u.path) or url.endswith("/") or u.path == "":
                if not u.is_object_store:
                    raise ValueError(f"{url}: globs and prefixes need an object store (s3://, gs://); "
                                     "over HTTP name the files or use a brace range")
                segs = u.path.split("/")
                static = []
                for s in segs:
                    if has_glob(s):
                        break
                    static.append(s)
                prefix = "/".join(static)
                if has_glob(u.path) and len(static) < len(segs):
                    prefix = prefix + "/" if static else ""
                found = [o.url for o in open_store(url, storage_options).list(prefix)
                         if not has_glob(u.path) or parse_url(o.url).matches(u.path)]
                if suffixes:
                    found = [f for f in found if f.endswith(suffixes)]
                if not found:
                    raise FileNotFoundError(f"no object matches {url}")
                out += found
            else:
                out.append(url)
    return out
