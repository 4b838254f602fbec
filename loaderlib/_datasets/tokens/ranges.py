"""Token files behind URLs read by byte range into sparse local files (``remote_reads="ranges"``).

NOTE [ Token files read by range ]
A shuffled batch of a corpus behind URLs needs a few KB from each of up to B files; the
whole-file mode (NOTE [ Token files behind URLs ] in remote.py) made the first batch of a
1 TB corpus wait for ~64 multi-GB downloads and needed a cache as large as the corpus. Here
each token file whose bytes the kernel reads at random (Megatron ``.bin``, flat ``.bin``,
datatrove ``.ds``: the ones whose data starts at byte 0 and need no scan to open) gets a
local sparse file of the object's size in the cache folder, mapped read-only and handed to
the kernel's corpus as a local file is (``Corpus.set_tokens``); which ``CHUNK``-sized pieces
of it hold the object's bytes is kept here (``present``).
- When the engine plans a batch (``TokenDataset.start_gather``, one or two batches before
  the user takes it) the batch's spans become chunk ids, every one of them is pinned, the
  missing ones are claimed and fetched in one ``read_ranges`` call (neighbouring chunks share
  a request, the rest go out at once: NOTE [ Ranges that share a request ] in
  ``_extract/remote/store.py``) on a fetch thread of the dataset (``ll-token-fetch``, at most
  ``FETCHES`` batches at once), written with ``pwrite`` and marked present; only then is the
  batch's kernel queued (from that thread), so the engine's driver does not wait for the
  network while it plans the next batches. A chunk another batch is fetching is waited for,
  not fetched twice. A chunk never fetched is a hole, which reads as zeros: the kernel is
  never given a batch before all its chunks are present, and a chunk is never freed while
  pinned (from planning until ``Gather.wait()`` returns; a batch dropped unwaited lets go
  when it is collected).
- ``CHUNK`` is 64 KiB. A row of 2,048 uint16 tokens is 4 KiB, so a random row costs one
  request either way, and what the size trades is bytes against requests: once the cache is
  smaller than the corpus a shuffle revisits evicted chunks, and each row then costs a chunk
  (16x its bytes at 64 KiB, 256x at 1 MiB: at 500 rows/s per accelerator, 32 MB/s against
  500 MB/s); a 64 KiB request is already as cheap as its round trip (nginx on loopback served
  110 KB ranges at 430 MB/s from one connection, about 0.25 ms each; an object store's first
  byte takes 10-30 ms), so smaller chunks would save no time. Neighbouring chunks share a
  request, so a sequential batch is one request however small the chunks. Covering a whole
  1 TB corpus costs 16 M requests at 64 KiB: corpora read in order, and read many times
  from a cache that holds them, read better as whole files (``remote_reads="files"``).
- ``cache_limit`` bounds the bytes of chunks held, less what the dataset's whole files take
  (indexes, and files read whole). Room is made before a fetch by freeing chunks not used
  lately that no batch has pinned, picked by the clock algorithm (``_make_room``), with
  ``fallocate(PUNCH_HOLE)``: the blocks go back to the file system and the range reads as a
  hole again. Pinned chunks of batches in flight may carry the total past the limit by what
  those batches hold; when they are waited for, the excess is freed. A batch whose own
  chunks exceed the limit is a ``ValueError`` naming the numbers.
- Measured with ``python benchmarks/token_ranges.py`` (8 flat files of 64 MB from nginx on
  loopback, each connection capped at 25 MB/s, a shuffled loader of 64 x 2048-token rows, 2
  threads, medians of 2 rounds, 2 shared cores): the first batch came after 0.075 s with
  8.7 MB fetched (the batches planned ahead included) against 10.5 s and 537 MB for whole
  files; 50 batches 0.54 s and 185 MB (14x the rows' bytes) against 10.6 s. Without the cap:
  0.072 s against 1.53 s. With ``--cache-limit 32MB --batches 200`` (the cache 6% of the
  corpus): 200 batches in 2.4 s with 839 MB fetched, more than the corpus's 537 MB, as each
  random row then costs a chunk. Against moto's S3 server, which reads a whole object for every
  ranged GET (NOTE [ Samples of a shard still on its way ] in ``_extract/remote/files.py``),
  ranges are slower (``--s3 --mb 16``: first batch 0.72 s against 0.39 s; 50 batches 9.1 s
  against 0.40 s): that measures moto.
- The sparse files belong to this process (``<key>.chunks-<pid>-<n>``: never shared, not
  reused by a later run, removed by ``close()`` or, after a crash, by the next dataset that
  opens the folder) and are no part of the loader's state: resume reads the same bytes.
- Not checked: that the object did not change during the run (its size is checked when it
  opens; a new object of the same size mid-run would mix versions).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..._extract.remote.shard_cache import _alive
from ..._extract.remote.store import read_ranges
from ..._threads import name_native_thread
from ...errors import RemoteReadError
from .formats import TokenFile, _map
from .packing import Spans

__all__ = ["CHUNK", "TokenRanges"]

log = logging.getLogger(__name__)

#: Bytes per chunk of a token file read by range (NOTE [ Token files read by range ]).
CHUNK = 64 << 10
#: Batches whose chunks are fetched at once.
FETCHES = 4
_SPARSE = re.compile(r"\.chunks-(\d+)-\d+$")
_PUNCH = 0x01 | 0x02   # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
_LIBC: Any = None
_NUMBERS = itertools.count(1)
#: Chunk ids the clock's hand looks at per numpy step (NOTE [ Token files read by range ]).
_SWEEP = 1 << 16


def _fallocate() -> Any:
    global _LIBC
    if _LIBC is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
            _LIBC = fn
        except (OSError, AttributeError):   # not Linux: chunks are forgotten, not freed
            _LIBC = False
    return _LIBC


class _Claim:
    """Chunks one fetch brings: set once they are present, or with the error that stopped it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


class Fetch:
    """The chunks of one batch being made present; :meth:`wait` returns what ``then`` returned
    once they are (``then`` runs on the fetch thread, or at once when nothing was missing),
    unless :meth:`give_up` came first."""

    def __init__(self, owner: TokenRanges, gids: np.ndarray, pinned: bool, generation: int) -> None:
        self.owner, self.gids, self.pinned, self.generation = owner, gids, pinned, generation
        self.future: Future | None = None
        self.value: Any = None
        #: ``(bytes, nanoseconds)`` of this batch's own fetch once waited for (None: nothing fetched).
        self.read: tuple[int, int] | None = None
        self._then_lock = threading.Lock()
        self._then_started = False
        self._given_up = False

    def _then(self, then: Callable[[], Any] | None) -> Any:
        with self._then_lock:
            if self._given_up:
                return None
            self._then_started = True
        return then() if then is not None else None

    def give_up(self) -> bool:
        """Never run ``then`` from now on (True: the batch is given up, so no late write lands
        in a slot that went back to the ring), unless it already started (False)."""
        with self._then_lock:
            if self._then_started:
                return False
            self._given_up = True
            return True

    def done(self) -> bool:
        """Whether the chunks came (or their fetch failed)."""
        return self.future is None or self.future.done()

    def wait(self, timeout: float | None = None) -> Any:
        if self.future is not None:
            self.value, self.read = self.future.result(timeout)
            self.future = None
        return self.value

    def release(self) -> None:
        """Unpin the batch's chunks (once)."""
        if self.pinned:
            self.pinned = False
            self.owner.unpin(self.gids, self.generation)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


class TokenRanges:
    """The token files of a corpus read by range (NOTE [ Token files read by range ]).

    Parameters
    ----------
    files : list of TokenFile
        The corpus's files, in order.
    which : list of int
        The files read by range (each has ``url``, and its data from byte 0).
    file_start : numpy array
        Global token offset of each file and the total last.
    folder : str
        Where the sparse files are made (the shard cache's folder).
    options : StoreOptions
        How to reach the store.
    budget : int or None
        Bytes of chunks held at most (None: no bound).
    corpus : _tokens.Corpus
        The kernel's corpus; ranged files are pointed at their sparse files.

    Thread-safe: batches are planned, fetched and released from any threads.
    """

    def __init__(self, files: Sequence[TokenFile], which: Sequence[int], file_start: np.ndarray, folder: str,
                 options: Any, budget: int | None, corpus: Any) -> None:
        self.files = list(files)
        self.which = [int(f) for f in which]
        self.file_start = np.asarray(file_start, np.int64)
        self.folder = folder
        self.options = options
        self.budget = budget
        self.corpus = corpus
        nf = len(self.files)
        self.itemsize = np.ones(nf, np.int64)
        self.size = np.zeros(nf, np.int64)
        self.chunk0 = np.full(nf, -1, np.int64)
        total = 0
        for f in self.which:
            tf = self.files[f]
            self.itemsize[f] = tf.token_dtype.itemsize
            self.size[f] = tf.num_tokens * tf.token_dtype.itemsize
            self.chunk0[f] = total
            total += -(-int(self.size[f]) // CHUNK)
        self.nchunks = total
        #: Per file of the corpus: read by range here.
        self.ranged = np.zeros(nf, bool)
        self.ranged[self.which] = True
        self._firsts = self.chunk0[self.which]        # sorted: chunk ids are given in file order
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._paths: dict[int, str] = {}
        self._warned = False
        self._generation = 0   # +1 at close(): pins of batches planned before are void
        self._pid = os.getpid()
        #: Bytes and requests fetched (whole-run counters; requests before coalescing).
        self.fetched_bytes = 0
        self.fetched_chunks = 0
        #: Chunks freed to make room.
        self.evicted = 0
        #: The most bytes of chunks held and being fetched at once.
        self.peak = 0
        self._reset()
        self._remove_dead()
        self._open_files()

    # -- the sparse files ---------------------------------------------------------------
    def _reset(self) -> None:
        self.present = np.zeros(self.nchunks, bool)
        self.pins: dict[int, int] = {}
        self.inflight: dict[int, _Claim] = {}
        self.used = np.zeros(self.nchunks, bool)   # used since the clock's hand last passed
        self.hand = 0
        self.held = 0       # bytes of present chunks
        self.reserved = 0   # bytes of chunks being fetched

    def _remove_dead(self) -> None:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            m = _SPARSE.search(name)
            if m and not _alive(int(m.group(1))):
                try:
                    os.unlink(os.path.join(self.folder, name))
                except OSError:
                    pass

    def _open_files(self) -> None:
        import hashlib

        os.makedirs(self.folder, exist_ok=True)
        for f in self.which:
            tf = self.files[f]
            url = tf.url or tf.path
            base = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-80:]
            # numbered per process (datasets of one process may read one URL into one folder)
            path = os.path.join(self.folder, hashlib.sha256(url.encode()).hexdigest()[:20] + "-" + base
                                + f".chunks-{os.getpid()}-{next(_NUMBERS)}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                os.ftruncate(fd, int(self.size[f]))
            finally:
                os.close(fd)
            self._paths[f] = path
            self.corpus.set_tokens(f, _map(path, tf.token_dtype, random=True))

    def paths(self) -> list[str]:
        """The sparse files (one per ranged token file)."""
        return [self._paths[f] for f in self.which if f in self._paths]

    def disk_bytes(self) -> int:
        """Bytes the sparse files take on disk (their allocated blocks)."""
        total = 0
        for p in self.paths():
            try:
                total += os.stat(p).st_blocks * 512
            except OSError:
                pass
        return total

    # -- chunks of a batch ----------------------------------------------------------------
    def chunks(self, sp: Spans) -> np.ndarray:
        """The sorted ids of the chunks the spans ``sp`` read in ranged files."""
        g = np.asarray(sp.g, np.int64)
        n = np.asarray(sp.n, np.int64)
        keep = n > 0
        g, n = g[keep], n[keep]
        if g.size == 0:
            return np.zeros(0, np.int64)
        fs = self.file_start
        f0 = np.searchsorted(fs, g, side="right") - 1
        f1 = np.searchsorted(fs, g + n - 1, side="right") - 1
        pf, lo, hi = f0, g, g + n
        cross = np.flatnonzero(f1 != f0)
        if cross.size:   # spans over a file boundary (concat windows): one piece per file
            pf, lo, hi = [f0], [g], [np.minimum(g + n, fs[f0 + 1])]
            for k in cross.tolist():
                for f in range(int(f0[k]) + 1, int(f1[k]) + 1):
                    pf.append(np.array([f]))
                    lo.append(np.array([fs[f]]))
                    hi.append(np.array([min(int(g[k] + n[k]), int(fs[f + 1]))]))
            pf, lo, hi = np.concatenate(pf), np.concatenate(lo), np.concatenate(hi)
        sel = self.ranged[pf] & (hi > lo)
        pf, lo, hi = pf[sel], lo[sel], hi[sel]
        if pf.size == 0:
            return np.zeros(0, np.int64)
        isz = self.itemsize[pf]
        c0 = (lo - fs[pf]) * isz // CHUNK
        c1 = ((hi - fs[pf]) * isz - 1) // CHUNK
        cnt = c1 - c0 + 1
        first = self.chunk0[pf] + c0
        ids = np.repeat(first - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()), dtype=np.int64)
        return np.unique(ids)

    def _where(self, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """File, byte start and byte end of each chunk id."""
        k = np.searchsorted(self._firsts, gids, side="right") - 1
        f = np.asarray(self.which, np.int64)[k]
        lo = (gids - self.chunk0[f]) * CHUNK
        hi = np.minimum(lo + CHUNK, self.size[f])
        return f, lo, hi

    def bytes_of(self, gids: np.ndarray) -> int:
        """Bytes of the chunks ``gids``."""
        if gids.size == 0:
            return 0
        _, lo, hi = self._where(gids)
        return int((hi - lo).sum())

    # -- planning a batch ---------------------------------------------------------------------
    def start(self, sp: Spans, then: Callable[[], Any] | None = None, pin: bool = True) -> Fetch:
        """Make the chunks of the spans ``sp`` present, pinned until the returned
        :class:`Fetch` is released (``pin``); ``then()`` runs once they are."""
        gids = self.chunks(sp)
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            if not self._paths and self.which:
                self._open_files()   # read again after close()
            fetch = Fetch(self, gids, False, self._generation)
            if self.budget is not None and gids.size:
                need_all = gids.size * CHUNK
                if need_all > self.budget:
                    raise ValueError(
                        f"cache_limit is too small for one batch: its rows read {gids.size} chunks of {CHUNK} "
                        f"bytes ({need_all} bytes) from token files behind URLs, and {self.budget} bytes are left "
                        "for chunks (cache_limit less the whole files the dataset holds); raise cache_limit or "
                        "make the batch smaller (NOTE [ Token files read by range ])")
            if pin:
                for g in gids.tolist():
                    self.pins[g] = self.pins.get(g, 0) + 1
                fetch.pinned = True
            here = self.present[gids] if gids.size else np.zeros(0, bool)
            self.used[gids[here]] = True
            missing = gids[~here]
            waits: list[_Claim] = []
            mine: list[int] = []
            for g in missing.tolist():
                c = self.inflight.get(g)
                if c is None:
                    mine.append(g)
                elif not waits or waits[-1] is not c:
                    waits.append(c)
            claim = _Claim()
            mine_ids = np.asarray(mine, np.int64)
            need = mine_ids.size * CHUNK   # whole chunks: what a file's short last one takes on disk, rounded up
            try:
                if self.budget is not None and need:
                    self._make_room(need)
            except BaseException:
                if fetch.pinned:
                    fetch.pinned = False
                    self._unpin(gids)
                raise
            self.reserved += need
            self.peak = max(self.peak, self.held + self.reserved)
            for g in mine:
                self.inflight[g] = claim
            if mine or waits:
                # Submitted under the lock: a batch waiting for another's chunks is queued after
                # the fetch of those chunks, which is then running on a thread of its own.
                try:
                    pool = self._pool
                    if pool is None:
                        pool = self._pool = ThreadPoolExecutor(FETCHES, thread_name_prefix="ll-token-fetch",
                                                               initializer=name_native_thread,
                                                               initargs=("ll-token-fetch",))
                    fetch.future = pool.submit(self._run, mine_ids, need, claim, waits, fetch, then)
                except BaseException as e:
                    self._undo(mine_ids, need, claim, e)
                    if fetch.pinned:
                        fetch.pinned = False
                        self._unpin(gids)
                    raise
                return fetch
        fetch.value = fetch._then(then)
        return fetch

    def _make_room(self, need: int) -> None:
        """Free unpinned chunks not used lately until ``need`` more bytes fit the budget (caller
        holds the lock); what pinned chunks hold beyond it stays until they are released.

        The choice is the clock algorithm (second chance): a hand sweeps the chunk ids, and a
        present chunk used since it last passed (``used``) is spared once, its flag cleared. It
        approximates least-recently-used with two flags per chunk of the corpus (32 MB for
        1 TB in 64 KiB chunks), where an ordered list of the chunks held cost about 100 bytes
        of Python objects per chunk (160 MB for a 100 GB cache), and it sweeps with numpy.
        """
        assert self.budget is not None
        over = self.held + self.reserved + need - self.budget
        if over <= 0 or self.nchunks == 0:
            return
        want = -(-over // CHUNK)
        pinned = np.fromiter(self.pins, np.int64, len(self.pins)) if self.pins else None
        victims: list[np.ndarray] = []
        found = 0
        swept = 0
        while found < want and swept < 2 * self.nchunks + _SWEEP:
            a = self.hand
            b = min(a + _SWEEP, self.nchunks)
            cand = np.flatnonzero(self.present[a:b] & ~self.used[a:b]) + a
            if pinned is not None and cand.size:
                cand = cand[~np.isin(cand, pinned)]
            if found + cand.size >= want:
                cand = cand[:want - found]
                b = int(cand[-1]) + 1
            self.used[a:b] = False
            self.present[cand] = False   # now: a second sweep must not pick them again
            victims.append(cand)
            found += cand.size
            swept += b - a
            self.hand = b % self.nchunks
        ids = np.concatenate(victims) if victims else np.zeros(0, np.int64)
        if ids.size == 0:
            return
        f, lo, _ = self._where(ids)
        self.held -= ids.size * CHUNK
        self.evicted += ids.size
        # whole chunks, past a file's end too: a partial block at its end would be zeroed, not freed
        self._punch(f, lo, lo + CHUNK)

    def _punch(self, f: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Give the blocks of these chunks back to the file system (caller holds the lock: no
        fetch can write one of them meanwhile)."""
        fn = _fallocate()
        order = np.lexsort((lo, f))
        runs: list[tuple[int, int, int]] = []
        for k in order.tolist():
            ff, a, b = int(f[k]), int(lo[k]), int(hi[k])
            if runs and runs[-1][0] == ff and runs[-1][2] == a:
                runs[-1] = (ff, runs[-1][1], b)
            else:
                runs.append((ff, a, b))
        fds: dict[int, int] = {}
        try:
            for ff, a, b in runs:
                if not fn:
                    break
                fd = fds.get(ff)
                if fd is None:
                    fd = fds[ff] = os.open(self._paths[ff], os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
                if fn(fd, _PUNCH, a, b - a) != 0 and not self._warned:
                    self._warned = True
                    err = ctypes.get_errno()
                    log.warning("token chunks cannot be freed in %s (%s): the disk holds them until close()",
                                self.folder, os.strerror(err))
        finally:
            for fd in fds.values():
                os.close(fd)

    def _run(self, mine: np.ndarray, need: int, claim: _Claim, waits: list[_Claim], fetch: Fetch,
             then: Callable[[], Any] | None) -> Any:
        read = None
        try:
            if mine.size:
                t0 = time.perf_counter_ns()
                self._fetch(mine)
                read = (self.bytes_of(mine), time.perf_counter_ns() - t0)
        except BaseException as e:
            self._finish(mine, need, claim, e)
            raise
        self._finish(mine, need, claim, None)
        for c in waits:
            c.done.wait()
            if c.error is not None:
                raise c.error
        return fetch._then(then), read

    def _fetch(self, gids: np.ndarray) -> None:
        f, lo, hi = self._where(gids)
        urls = [self.files[int(x)].url or "" for x in f.tolist()]
        reqs = [(u, int(a), int(b)) for u, a, b in zip(urls, lo.tolist(), hi.tolist())]
        try:
            bufs = read_ranges(reqs, self.options)
        except RemoteReadError as e:
            mine = [(a, b) for u, a, b in reqs if u == e.url]
            shown = ", ".join(f"{a}-{b}" for a, b in mine[:4]) + (f" and {len(mine) - 4} more" if len(mine) > 4 else "")
            raise RemoteReadError(e.url, f"{e.reason} (token bytes {shown} of a batch)", e.status, e.index) from e
        fds: dict[int, int] = {}
        try:
            for ff, a, buf in zip(f.tolist(), lo.tolist(), bufs):
                fd = fds.get(ff)
                if fd is None:
                    fd = fds[ff] = os.open(self._paths[ff], os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
                view = memoryview(buf)
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], a + done)
        finally:
            for fd in fds.values():
                os.close(fd)

    def _finish(self, mine: np.ndarray, need: int, claim: _Claim, error: BaseException | None) -> None:
        with self._lock:
            self._undo(mine, need, claim, error)

    def _undo(self, mine: np.ndarray, need: int, claim: _Claim, error: BaseException | None) -> None:
        """The chunks ``mine`` of ``claim`` are no longer being fetched: present when ``error``
        is None (caller holds the lock)."""
        self.reserved -= need
        for g in mine.tolist():
            self.inflight.pop(g, None)
        if error is None and mine.size:
            self.present[mine] = True
            self.held += need
            self.fetched_bytes += self.bytes_of(mine)
            self.fetched_chunks += int(mine.size)
            self.used[mine] = True
        claim.error = error
        claim.done.set()

    def unpin(self, gids: np.ndarray, generation: int) -> None:
        """Let go of a batch's chunks; the bytes held past the budget are freed now."""
        with self._lock:
            if generation == self._generation:
                self._unpin(gids)

    def _unpin(self, gids: np.ndarray) -> None:
        for g in gids.tolist():
            k = self.pins.get(g, 0) - 1
            if k > 0:
                self.pins[g] = k
            else:
                self.pins.pop(g, None)
        if self.budget is not None and self.held + self.reserved > self.budget:
            self._make_room(0)

    def _after_fork(self) -> None:
        """In a child process forked from the one that made the files: its own files and fetch
        threads (the parent's threads did not come along, and its files are the parent's)."""
        self._lock = threading.Lock()
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._pool = None
            self._paths = {}
            self._reset()
            self._generation += 1

    def close(self) -> None:
        """Wait for the fetches under way, end the fetch threads and remove the sparse files
        (the mappings the corpus holds then read zeros; a batch planned after this opens new files)."""
        if self._pid != os.getpid():   # a forked child: the threads and files are the parent's
            self._after_fork()
            return
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            try:
                pool.shutdown(wait=True)
            except RuntimeError:   # closed from a fetch thread (the dataset's last reference went there)
                pool.shutdown(wait=False)
        with self._lock:
            for path in self._paths.values():
                try:
                    os.unlink(path)
                except OSError:
                    pass
            self._paths.clear()
            self._reset()
            self._generation += 1
