"""The read-ahead stage for samples in an object store: the BUFFERS counterpart of the native
read-ahead (``loaderlib._extract.readahead.ReadAhead``), with the same interface to the engines.

NOTE [ Remote read-ahead ]
Without the shard cache a remote dataset's samples are objects or byte ranges read from the
store into buffers (NOTE [ Remote datasets: cache or ranges ] in ``files.py``); with it,
slices of the shards' local copies, whose first read of a shard may wait for its download,
run through this stage the same way. Read one
batch at a time, when the batch is produced, at most one batch of requests is in flight and
the kernels wait for the network between batches. Here the reads run ahead instead, in the
stream's order (the sampler's), like local files in the native stage (NOTE [ Read-ahead ] in
``pyx/include/ll_readahead.h``):

- ``depth`` Python threads each take the next queued stream position and read it, together
  with the positions after it while they hold the next sample indices (at most a batch): a
  run of consecutive samples (a sequential epoch, a shard read in order) lies side by side in
  its shard and goes through the dataset's ``buffers`` (its batch read), where it shares one
  request (NOTE [ Ranges that share a request ] in ``store.py``); any other sample is a
  request of its own, made on the reading thread itself (below). Before, each thread read
  calls of a batch's samples, fanned out to a second pool of threads (NOTE [ Requests fanned
  out on threads ]): each sample's bytes went through two threads, and a call returned only
  when its slowest request did. An earlier version still sent one request per sample without
  grouping neighbours and read moto's record ranges at 148 img/s against 357 for calls whose
  ranges obstore merged within 1 MiB; random samples of multi-megabyte shards no longer share
  requests either way (NOTE [ Ranges that share a request ]).
- NOTE [ One sample, one request ]: a call of one sample (a shuffled epoch's usual case)
  skips the batch read's layers (arrays of indices, groups of ranges, the failure
  bookkeeping): the dataset names the sample's request (``remote_request(i)``: its URL and
  byte range, or the whole object), and the thread sends that one GET itself
  (``RemoteStore.quick_get``). Anything unusual (an error, a short body, a dataset with the
  shard cache) gives None, and the sample is read again by the dataset's batch read, which
  retries, checks the length and keeps the error for its sample; so what reaches the
  kernels, and how failures are reported, does not change.
- Measured with ``python benchmarks/storage.py --remote --protocols http --repeat 3
  --storage-cpus 1`` (nginx and the 5 ms delay proxy on CPU 1, the loader on CPU 0): the
  default loader's CPU per image was 0.515 ms on record shards, 0.518 on WebDataset shards
  and 0.519 on one object per image, against 0.435 / 0.427 / 0.440 for the same files read
  locally, and it reached 0.84 / 0.82 / 0.84 of the ideal (the batch calls fanned out to a
  second pool, the same command with 2 rounds: 0.76 / 0.75 / 0.76).
- The bytes wait in a slot per position until the batch that holds the sample is produced:
  the native engine's BUFFERS pass and the threads engine's ``item_from_bytes`` take them by
  position (waiting if they have not arrived, at most half the loader's timeout, as the
  native stage does). A position that was never queued (the slots were full) is read as
  before, with the rest of its batch. The bytes are the object's bytes, so outputs do not
  depend on the depth; a failed read is kept in its slot and reported, or skipped, exactly
  as a failure in the batch read (NOTE [ Remote failures per sample ] in ``files.py``).
- Memory: the slots in use are bounded as in NOTE [ Read-ahead memory ] (``_extract/readahead.py``):
  the batches queued on the kernels plus twice the depth, within the read-ahead's memory
  budget at the largest sample seen.
- ``io_depth``: an integer is used as given, 0 turns the stage off (the per-batch reads),
  None / AUTOTUNE adapts. The adaptive rule is NOTE [ Read-ahead depth ]'s Little's law, with
  one difference: a store's latency grows with the requests it is sent (a server that handles
  requests one after another, like moto's, turns every extra request into queueing), so the
  law, fed the latency it measures, asks for ever more. The depth starts at the batch size
  (the concurrency of the per-batch reads), and a raise is kept only if the next turn reads
  faster (``GAIN``); otherwise the depth goes back and the raise is not tried again for
  ``PROBE_TURNS`` turns. Lowering follows the law, as locally.
- The counters have the native stage's names, so ``Stats.extract`` and the verdict's storage
  evidence read them unchanged.

Measured with ``python benchmarks/remote_loader.py --images 256 --rounds 3 --epochs 2
--io-depths 0,default`` (2 shared cores, loaded by a test run at the same time, so the figures
swing by a third between identical rows; img/s epoch 1 / epoch 2, io_depth=0 then default):
S3 (moto) record ranges 401 / 379 and 444 / 545; S3 one object per image 194 / 252 and
201 / 180; HTTP record ranges 623 / 1,130 and 568 / 734; HTTP one object per image 713 / 1,007
and 843 / 901. An earlier version that sent one request per sample ran S3 record ranges at
119 / 148 against 197 / 357 per batch (same command with ``0,default,16``), hence the calls
of a batch. At 4 batches an epoch the adaptive rule has barely one turn, so these rows compare
the start (one batch-sized call ahead) with the per-batch reads; a quiet machine and longer
runs are still to be measured. ``python benchmarks/storage.py --remote --repeat 2`` (2 cores,
a proxy adding 5 ms per request, after NOTE [ Ranges that share a request ] and NOTE [ Requests
fanned out on threads ] in ``store.py``): HTTP record shards by ranges 2,872 img/s (the same
path at 0 ms: 3,206; PyTorch's best 1,148), one object per image 2,647 (2,896; 1,096).
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any

import numpy as np

from ..._threads import name_native_thread
from ...errors import RemoteReadError
from .. import closing
from .store import open_store

__all__ = ["RemoteReadAhead"]

#: The adaptive depth's bounds (reads in flight).
MIN_DEPTH = 4
MAX_DEPTH = 256
#: A raise is kept when the next turn's read rate is at least this factor of the last one's.
GAIN = 1.1
#: Turns a raise that did not pay is not tried again for.
PROBE_TURNS = 16
#: Slack over Little's law, and the share of time waiting for bytes that asks for more.
HEADROOM = 1.5
WAITING = 0.05
#: Reads between two adaptations at least.
MIN_READS = 8
#: Memory for the slots without a ``ram_budget``.
DEFAULT_BYTES = 512 << 20
#: Latency histogram: bin b holds [2^(b/4), 2^((b+1)/4)) microseconds (as the native stage).
LAT_BINS = 96


def _bin(ns: int) -> int:
    us = ns / 1e3
    if us < 1:
        return 0
    return min(LAT_BINS - 1, int(4 * math.log2(us)))


class _Slot:
    __slots__ = ("data", "done", "error", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.data: Any = None
        self.error: BaseException | None = None
        self.done = False


class RemoteReadAhead:
    """Reads of a BUFFERS source's samples ahead of the batches, ``depth`` at once
    (NOTE [ Remote read-ahead ]). The interface is :class:`loaderlib._extract.readahead.ReadAhead`'s.

    Parameters
    ----------
    src : NativeSource
        A BUFFERS source whose dataset reads samples with ``buffers(indices)`` (the batch read).
    stream : numpy.ndarray
        The run's stream of sample indices.
    io_depth : int or None
        Reads in flight; None adapts.
    batch_size, lookahead : int
        The batches queued at once hold their slots.
    timeout : float or None
        The loader's timeout: a batch waits half of it for one sample's bytes.
    budget_bytes : int or None
        Memory bound of the slots (None: ``DEFAULT_BYTES``).
    start : int
        The first stream position the run produces.
    hint : dict, optional
        Carried from run to run: the adaptive depth starts where the last run left it.
    """

    def __init__(self, src: Any, stream: np.ndarray, *, io_depth: int | None, batch_size: int, lookahead: int,
                 timeout: float | None, budget_bytes: int | None = None, start: int = 0, hint: dict | None = None,
                 clock: Any = time.perf_counter_ns) -> None:
        self.src = src
        self.dataset = src.dataset
        self.stream = stream
        self.fixed = None if io_depth is None else max(1, min(int(io_depth), MAX_DEPTH))
        self.batch_size = max(1, int(batch_size))
        self.held = self.batch_size * max(1, int(lookahead))
        self.budget = int(budget_bytes) if budget_bytes else DEFAULT_BYTES
        self.timeout = float(timeout) / 2 if timeout else 0.0
        self._clock = clock
        self.hint = hint if hint is not None else {}
        start_depth = max(MIN_DEPTH, min(int(batch_size), MAX_DEPTH))
        self.depth = self.fixed or int(self.hint.get("remote_depth", start_depth))
        self.next = int(start)
        self.largest = 0
        self.waiting = 0.0
        self.inline = False
        self.decisions: list[tuple[float, int, int, str]] = []
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)      # readers wait for positions
        self._arrived = threading.Condition(self._lock)   # batches wait for bytes
        self._queue: collections.deque = collections.deque()
        self._slots: dict[int, _Slot] = {}
        self._threads: list[threading.Thread] = []
        self._stores: dict[str, tuple] = {}   # url -> (store, object path), for _direct
        self._stopped = False
        self._c = {"reads": 0, "failures": 0, "bytes": 0, "lat_ns": 0, "cpu_ns": 0, "queue_ns": 0, "queued": 0,
                   "taken": 0, "wait_ns": 0, "reading": 0}
        self._hist = [0] * LAT_BINS
        self._last = self._snapshot()
        self._last_t = clock()
        self._trial: tuple[int, float] | None = None   # (depth before a raise, read rate then)
        self._ceiling: tuple[int, int] | None = None   # (most depth while a raise did not pay, turns left)
        self._set_limit()
        self._spawn()

    # -- the reading threads -----------------------------------------------------------
    def _calls(self) -> tuple[int, int]:
        """(most samples per call, calls in flight): ``depth`` calls at once, each one sample
        or a run of consecutive sample indices of at most a batch (NOTE [ Remote read-ahead ])."""
        return self.batch_size, max(1, self.depth)

    def _spawn(self) -> None:
        while len(self._threads) < self._calls()[1]:
            t = threading.Thread(target=self._run, args=(len(self._threads),), daemon=True,
                                 name=f"loaderlib-remote-read-{len(self._threads)}")
            self._threads.append(t)
            t.start()

    def _direct(self, request: Any, i: int) -> Any:
        """Sample ``i``'s bytes by one request made here (NOTE [ One sample, one request ]), or
        None when the dataset's own read must do it (no such request, or anything went wrong)."""
        req = request(i)
        if req is None:
            return None
        url, start, end = req
        hit = self._stores.get(url)
        if hit is None:
            store = open_store(url, self.dataset._remote.options)
            hit = self._stores[url] = (store, store.object_path(url))
        return hit[0].quick_get(hit[1], start, end)

    def _run(self, k: int) -> None:
        name_native_thread(f"ll-remote-{k}")   # NOTE [ Thread names ] in pyx/include/ll_pool.h
        data_index = self.src.data_index
        remote = getattr(self.dataset, "_remote", None)
        direct = getattr(self.dataset, "remote_request", None) if remote is not None else None
        while True:
            with self._lock:
                while not self._stopped and (not self._queue or k >= self._calls()[1]):
                    self._work.wait()
                if self._stopped:
                    return
                chunk = self._calls()[0]
                got: list = []
                while self._queue and len(got) < chunk:
                    pos, t_queued = self._queue[0]
                    slot = self._slots.get(pos)
                    if slot is not None and got and slot.index != got[-1][0].index + 1:
                        break   # not the next sample: the run ends (NOTE [ Remote read-ahead ])
                    self._queue.popleft()
                    if slot is not None:   # None: dropped (a later start)
                        got.append((slot, t_queued))
                if not got:
                    continue
                self._c["reading"] += len(got)
            t0 = self._clock()
            c0 = time.thread_time_ns()
            bufs, error = None, None
            if len(got) == 1 and direct is not None:
                # NOTE [ One sample, one request ]: the request straight to the store.
                idx = [int(data_index(got[0][0].index))]
                one = self._direct(direct, idx[0])
                if one is not None:
                    bufs = [one]
            else:
                idx = data_index(np.asarray([slot.index for slot, _ in got], np.int64)).tolist()
            if bufs is None:
                try:
                    # One call per chunk: ranges of one object coalesce, objects go concurrently,
                    # a failed sample is an empty buffer with its error kept (as the batch read).
                    bufs = self.dataset.buffers(idx)
                except Exception as e:  # noqa: BLE001 - kept in the slots and reported with their samples
                    error = e
            dt = self._clock() - t0
            cpu = time.thread_time_ns() - c0
            sizes = [len(memoryview(b)) for b in bufs] if bufs is not None else None
            with self._lock:
                c = self._c
                m = len(got)
                c["reading"] -= m
                c["reads"] += m
                c["lat_ns"] += dt * m
                c["cpu_ns"] += min(cpu, dt)
                c["queue_ns"] += sum(max(0, t0 - t_queued) for _, t_queued in got)
                self._hist[_bin(dt)] += m
                for j, (slot, _) in enumerate(got):
                    if sizes is None:
                        data, err = None, error
                    else:
                        data, err = bufs[j], None
                        if not sizes[j] and remote is not None:
                            err = remote.failure(idx[j])
                    if err is not None:
                        c["failures"] += 1
                    else:
                        c["bytes"] += sizes[j]
                        if sizes[j] > self.largest:
                            self.largest = sizes[j]
                    slot.data, slot.error, slot.done = data, err, True
                self._arrived.notify_all()

    # -- queueing ------------------------------------------------------------------------
    def top_up(self, start: int | None = None) -> int:
        """Queue reads from the next unqueued stream position on (not before ``start``, the
        first position still to produce) while the slot limit allows; returns how many."""
        n = self.stream.size
        with self._lock:
            if self._stopped:
                return 0
            if start is not None and int(start) > self.next:
                self.next = int(start)
            if start is not None:
                for p in [p for p in self._slots if p < int(start)]:   # skipped over: free the slot
                    del self._slots[p]
            room = self.limit - len(self._slots)
            end = min(n, self.next + max(0, room))
            if end <= self.next:
                return 0
            now = self._clock()
            for p in range(self.next, end):
                self._slots[p] = _Slot(int(self.stream[p]))
                self._queue.append((p, now))
            took = end - self.next
            self.next = end
            self._c["queued"] += took
            self._work.notify_all()
        return took

    def attached(self, end: int) -> None:
        """A batch was queued with every position below ``end`` (as
        :meth:`loaderlib._extract.readahead.ReadAhead.attached`): later top-ups start at ``end``."""
        with self._lock:
            self.next = max(self.next, int(end))

    def take(self, position: int, timeout: float = 0.0) -> tuple[Any, int]:
        """The bytes of stream position ``position`` and the nanoseconds waited for them;
        ``(None, 0)`` when it was never queued. A failed read raises its error."""
        position = int(position)
        with self._lock:
            slot = self._slots.get(position)
            if slot is None:
                return None, 0
            waited = 0
            if not slot.done:   # the bytes have not arrived: wait, and count the wait
                t0 = self._clock()
                deadline = time.monotonic() + timeout if timeout else None
                while not slot.done and not self._stopped:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._arrived.wait(left)
                waited = self._clock() - t0
            del self._slots[position]
            self._c["taken"] += 1
            self._c["wait_ns"] += waited
        if not slot.done:
            i = int(self.src.data_index(np.asarray([slot.index]))[0])
            raise RemoteReadError(self.src.source(slot.index) or "?", f"no bytes after {timeout:.3g}s "
                                  "(half the loader's timeout)", None, i)
        if slot.error is not None:
            raise slot.error
        return slot.data, waited

    def buffers(self, positions: np.ndarray, data: list[int]) -> list:
        """The buffers of dataset samples ``data`` at stream ``positions`` for the kernels'
        BUFFERS pass: read-ahead bytes where queued, the others read now in one batch; a
        failure is an empty buffer with its error kept for ``read_failure``
        (NOTE [ Remote failures per sample ] in ``files.py``)."""
        out: list = [None] * len(data)
        missing = []
        remote = getattr(self.dataset, "_remote", None)
        for k, (p, i) in enumerate(zip(positions.tolist(), data)):
            try:
                b, _ = self.take(p, self.timeout)
            except RemoteReadError as e:
                if remote is None:
                    raise
                remote.note_failure(i, e)
                out[k] = b""
                continue
            if b is None:
                missing.append(k)
            else:
                if remote is not None:
                    remote.note_failure(i, None)
                out[k] = b
        if missing:
            got = self.dataset.buffers([data[k] for k in missing])
            for k, b in zip(missing, got):
                out[k] = b
        return out

    # -- depth and memory ------------------------------------------------------------------
    def _set_limit(self) -> None:
        by_memory = max(1, self.budget // max(self.largest, 1))
        self.limit = int(max(1, min(self.held + 2 * self.depth, by_memory)))

    def set_depth(self, depth: int, reason: str) -> None:
        """Reads in flight from now on."""
        depth = max(1, min(int(depth), MAX_DEPTH))
        if self.fixed is None:
            self.hint["remote_depth"] = depth
        with self._lock:
            if depth != self.depth:
                self.decisions.append((self._clock() / 1e9, self.depth, depth, reason))
                self.depth = depth
                self._work.notify_all()
            self._set_limit()
        self._spawn()

    def _snapshot(self) -> dict:
        with self._lock:
            return dict(self._c)

    def adapt(self, threads: int) -> None:
        """After a batch: re-derive the depth once per turn (NOTE [ Remote read-ahead ])."""
        c = self._snapshot()
        now = self._clock()
        last = self._last
        reads = c["reads"] - last["reads"]
        latency_ns = (c["lat_ns"] - last["lat_ns"]) / reads if reads else 0
        if self.fixed is not None or reads < max(MIN_READS, self.depth) or now - self._last_t < 2 * latency_ns:
            with self._lock:
                self._set_limit()
            return
        wall_s = (now - self._last_t) / 1e9
        self._last, self._last_t = c, now
        threads = max(1, int(threads))
        wait_s = (c["wait_ns"] - last["wait_ns"]) / 1e9
        self.waiting = min(1.0, wait_s / (threads * wall_s)) if wall_s > 0 else 0.0
        rate = reads / wall_s if wall_s > 0 else 0.0
        if self._ceiling is not None:
            d, left = self._ceiling
            self._ceiling = (d, left - 1) if left > 1 else None
        if self._trial is not None:
            before, before_rate = self._trial
            self._trial = None
            self.hint["remote_depth"] = self.depth if rate >= GAIN * before_rate else before
            if rate < GAIN * before_rate:
                self._ceiling = (before, PROBE_TURNS)
                self.set_depth(before, f"raising to {self.depth} read {rate:.0f} samples/s, not more than "
                               f"{before_rate:.0f} at {before}: the store does not go faster with more requests")
                return
        taken = c["taken"] - last["taken"]
        if taken <= 0:
            return
        busy = max(threads * wall_s - wait_s, 1e-9)
        want = math.ceil(HEADROOM * (threads * taken / busy) * latency_ns / 1e9) + threads
        why = (f"Little's law: {threads * taken / busy:.0f} samples/s x {latency_ns / 1e6:.2f} ms per read x "
               f"{HEADROOM} + {threads}; the batches waited for bytes {100 * self.waiting:.0f}% of the time")
        if self.waiting > WAITING and want <= self.depth:
            want = math.ceil(self.depth * 1.25)
        if self.waiting <= WAITING and want > self.depth:
            want = self.depth    # not waiting: more requests would not show
        if self._ceiling is not None:
            want = min(want, self._ceiling[0])
        want = max(MIN_DEPTH, min(want, MAX_DEPTH))
        if want > self.depth:
            self._trial = (self.depth, rate)
            self.set_depth(want, why)
            self.hint["remote_depth"] = self._trial[0]   # the next run starts from a raise that paid
            return
        if want < self.depth:
            want = max(want, (self.depth + want) // 2)   # lower by halves
        if want != self.depth:
            self.set_depth(want, why)

    # -- figures -----------------------------------------------------------------------------
    def counters(self) -> dict:
        """The figures under the native stage's names (``ExtractStats.from_counters``)."""
        with self._lock:
            c = dict(self._c)
            c["hist"] = list(self._hist)
            c["depth"] = self.depth
            c["limit"] = c["slots_limit"] = self.limit
            c["threads"] = len(self._threads)
        c["adaptive"] = self.fixed is None
        c["inline"] = False
        return c

    def buffer_bytes(self) -> int:
        """Bytes the slots hold now."""
        with self._lock:
            return sum(len(memoryview(s.data)) for s in self._slots.values() if s.data is not None)

    def describe(self) -> str:
        """One line for ``explain()``."""
        how = (f"io_depth={self.fixed} requests in flight" if self.fixed is not None else
               f"adaptive depth (now {self.depth}; Little's law, a raise kept only when it reads faster)")
        return (f"read-ahead from the store: {how}, Python threads in the sampler's order, at most {self.limit} "
                "samples' bytes held")

    def close(self, wait: bool = False) -> None:
        """Stop the reading threads (queued reads are dropped) and free the slots. With
        ``wait``, also wait for the requests in progress to return and the threads to exit, at
        most ``closing.CLOSE_WAIT_S`` in all (NOTE [ Closing the read-ahead ] in
        ``pyx/include/ll_readahead.h``: a request cannot be called back, but each thread is in
        at most one, so the wait lasts one request's latency)."""
        with self._lock:
            self._stopped = True
            self._queue.clear()
            self._slots.clear()
            self._work.notify_all()
            self._arrived.notify_all()
        if wait:
            closing.left_running(self.join(closing.CLOSE_WAIT_S), "requests to the store")

    def join(self, timeout: float | None = None) -> int:
        """Wait for the reading threads to end after :meth:`close`, at most ``timeout`` seconds
        in all; returns how many still run."""
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self._threads if t is not me)
