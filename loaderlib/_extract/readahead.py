"""The read-ahead stage's policy: what to queue, how many reads in flight, how much memory.

The native half (``loaderlib._ext._chain.Reader``; NOTE [ Read-ahead ] in
``pyx/include/ll_readahead.h``) reads; this module decides.

NOTE [ Read-ahead depth ]
``io_depth`` is the number of reads in flight. A fixed integer is used as given. The default
(``None``) adapts after every batch by Little's law: to keep the kernel threads fed, the reads
in flight must cover the rate at which the kernels could consume samples times the time one
read takes, ``depth = rate x latency``. Both are measured over the last batches:

* latency: the mean time the IO threads spent per read (from the native counters);
* rate: what the kernel threads would reach if they never waited for bytes,
  ``threads / (per-sample compute time)``, the compute time being the threads' wall time
  minus the time they waited for bytes (both from the native counters, so nothing depends
  on profiling being on).

The depth is set to ``HEADROOM`` times that (jittered latencies need slack) plus one read per
kernel thread, raised at once and lowered by halves; it stays between ``MIN_DEPTH`` (or the
thread count, if larger) and ``MAX_DEPTH``, and within the memory bound. Too few reads in
flight cost throughput and too many cost a parked thread and a buffer each, so the rule leans
high: on the latency filesystem at 1 ms per file the law's depth of about 9 ran at 0.55x the
ideal where a fixed 64 ran at 0.80x (``benchmarks/storage.py``, 3 rounds, 2 shared cores). When the kernel threads waited for bytes more
than ``WAITING`` of their time although the depth already covers the law, it is raised by a
quarter: the latency measured can understate what a server gives under more concurrency.

A change shows in the measurements only once the reads it adds have completed, so the depth is
re-derived once per *turn*: after at least as many reads as the depth and at least two read
latencies of wall time since the last decision. Deciding every batch instead (batches of 32 at
2,500 samples/s last 13 ms, less than one 16 ms read) compounded raises whose effect had not
arrived yet: on the 16 ms latency filesystem the depth ran to 414 and the rate fell to 0.6x a
fixed depth of 64 (FUSE daemon and reader threads fighting for 2 cores), where the per-turn
rule settles near what the law asks for.

NOTE [ Reads that are work ]
On warm local files a read is a copy out of the page cache: its time is CPU time, not
waiting. Handing it to an IO thread then gains nothing (the copy runs on the same cores) and
costs two thread hand-offs per sample: ``benchmarks/storage.py``'s warm local row (RN50
uint8 on 1,024 photos, 2 cores, 2 rounds) gives a fixed ``io_depth=64`` 0.81x of the
default, which reads this way. So the adaptive depth also asks whether the reads waited for
storage: each IO thread counts the reads during which it slept (a voluntary context switch,
from ``getrusage(RUSAGE_THREAD)``). A read from a disk, a network filesystem or a FUSE mount
sleeps; a page-cache read does not, however busy the cores are, except now and then on a
lock of the process's memory map while other threads fault pages in (9% of the reads in one
probe of the float RN50 bench, none in most; a profiling script's counts). When at most
``INLINE_SLEPT`` of the reads slept, the stage stops queuing and the decode threads read
their own samples again (the kernel pass reads any sample whose position was not queued);
one batch in ``PROBE_EVERY`` is still read ahead, so the measurement goes on, and when reads
wait again (a cold cache, a remote mount: at least ``WAIT_SLEPT`` of the reads slept)
read-ahead resumes, once ``SLOW_PROBES`` probes in a row say so. Where sleeping cannot be
counted, the test is the IO threads' CPU time against the read's wall time
(``INLINE_CPU_SHARE``), which a busy machine blurs: a read's wall time includes the wait for
a core, and with the decode threads on both cores of the reference machine page-cache reads
measured 6% to 51% CPU, so the first epoch of the float RN50 bench kept reading ahead (96
reads' buffers and 16 IO threads, 5 MB of its peak memory; measured with a profiling script
reading /proc/PID/smaps). A fixed ``io_depth`` always reads ahead. While reading inline the
probes need only one measurement's worth of reads (``MIN_READS``), so the slot limit drops
to that, ``INLINE_DEPTH`` IO threads read them, and the buffers of the slots no longer used
are freed (NOTE [ Read-ahead memory ]).

NOTE [ Read-ahead memory ]
Bytes read ahead wait in the reader's slots until a kernel thread decodes them. The slots in
use are bounded by ``limit``: the batches queued on the kernel threads (``lookahead``
batches) plus twice the depth, and never more than the memory bound allows at the largest
file size seen so far. The bound is ``ram_budget``'s read-ahead share (NOTE [ One memory
budget ] in ``_autotune.py``) or, without a budget, ``DEFAULT_BYTES``. Free slots are reused
last-in first-out, so only as many buffers as were ever in use at once hold memory. When the
stage turns to reading inline (NOTE [ Reads that are work ]) the limit drops to
``MIN_READS`` and the free slots' buffers are freed (``Reader.trim``): on warm local files
the first batches' read-ahead (96 slots of about 100 KB for batches of 64 photos, by a
profiling script) would otherwise stay resident for the whole epoch, and each epoch's run
has its own reader, so a warm next epoch's reader and the current one's overlap at the
boundary. For the same reason a loader's first reader, which knows nothing of its storage
yet, holds only ``depth`` reads (one measurement's worth) until its first measurement: on
slow storage the rest of the first batch is read by the kernel threads, once; on warm local
files the first batches' bytes would otherwise be the loader's peak memory. Slot buffers
grow to fit (NOTE [ Scratch grows to fit ] in ``pyx/include/ll_common.h``).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np

from .._ext import _chain
from . import closing
from .source import NativeSource, SourceKind, encode_paths

__all__ = ["DEFAULT_BYTES", "MAX_DEPTH", "ReadAhead", "ReadTally", "choose_depth", "read_ahead_for"]

#: Reads in flight at most (the native thread cap).
MAX_DEPTH = int(_chain.MAX_IO_THREADS)
#: The adaptive depth's first value, before anything was measured.
START_DEPTH = 16
#: The adaptive depth never goes below this while reading ahead: a read in flight costs one
#: parked thread and one buffer, while too few cost throughput (NOTE [ Read-ahead depth ]).
MIN_DEPTH = 16
#: Slack over Little's law (NOTE [ Read-ahead depth ]).
HEADROOM = 1.5
#: Kernel threads waiting for bytes more than this share of their time: raise the depth.
WAITING = 0.05
#: Memory for read-ahead buffers without a ``ram_budget`` (NOTE [ Read-ahead memory ]).
DEFAULT_BYTES = 512 << 20
#: Reads between two adaptations (fewer: keep measuring).
MIN_READS = 8
#: Share of a read's wall time spent on the CPU above which reads are work, not waiting, and
#: the decode threads read their own samples (NOTE [ Reads that are work ]), where the IO
#: threads cannot tell whether a read slept.
INLINE_CPU_SHARE = 0.5
#: Share of reads that slept at most for reads to count as work (NOTE [ Reads that are work ]).
INLINE_SLEPT = 0.25
#: Share of reads that slept at least for reads to count as waiting for storage.
WAIT_SLEPT = 0.5
#: While reading inline, one batch in this many is read ahead to keep measuring.
PROBE_EVERY = 8
#: IO threads while reading inline: the probes need few (NOTE [ Read-ahead memory ]).
INLINE_DEPTH = 4
#: Probes in a row that must find reads waiting before read-ahead resumes (NOTE [ Reads that are work ]).
SLOW_PROBES = 2


def choose_depth(*, current: int, threads: int, latency_s: float, taken: int, wait_s: float,
                 wall_s: float) -> tuple[int, str] | None:
    """The adaptive depth from one stretch of measurements (NOTE [ Read-ahead depth ]), with
    the reason; None when the stretch says nothing (no sample taken, no time passed).

    Parameters
    ----------
    current : int
        The depth now.
    threads : int
        Kernel threads decoding.
    latency_s : float
        Mean time of one read on an IO thread.
    taken, wait_s, wall_s : int, float, float
        Samples the kernel threads took in the stretch, the thread-seconds they waited for
        bytes, and the stretch's wall time.
    """
    threads = max(1, int(threads))
    if taken <= 0 or wall_s <= 0:
        return None
    busy = max(threads * wall_s - wait_s, 1e-9)
    rate = threads * taken / busy            # samples/s if the threads never waited
    want = math.ceil(HEADROOM * rate * latency_s) + threads
    waiting = min(1.0, max(0.0, wait_s / (threads * wall_s)))
    why = (f"Little's law: {rate:.0f} samples/s x {latency_s * 1e3:.2f} ms per read x {HEADROOM} + {threads} "
           f"threads; the decode threads waited for bytes {100 * waiting:.0f}% of the time")
    if waiting > WAITING and want <= current:
        want = math.ceil(current * 1.25)
    want = max(threads, MIN_DEPTH, min(want, MAX_DEPTH))
    if want < current:
        want = max(want, (current + want) // 2)   # lower by halves
    return want, why


class ReadAhead:
    """The read-ahead stage of one run (one epoch's pass): queues reads in the stream's order
    and adapts the depth (NOTE [ Read-ahead depth ], NOTE [ Read-ahead memory ]).

    Parameters
    ----------
    src : NativeSource
        A FILES or SHARDS source.
    stream : numpy.ndarray
        The run's stream of sample indices (positions index it).
    start : int
        The first stream position the run produces (a resumed or flushed run starts inside).
    hint : dict, optional
        Carried from run to run (a loader's epochs): the adaptive depth and whether reads were
        inline start where the previous run left them, and this run writes its own back.
    io_depth : int or None
        Reads in flight; None adapts.
    batch_size, lookahead : int
        The batches queued on the kernel threads at once hold their slots.
    timeout : float or None
        The loader's timeout: a kernel thread waits half of it for one sample's bytes before
        failing the sample.
    budget_bytes : int or None
        Memory bound of the read-ahead buffers (None: ``DEFAULT_BYTES``).
    """

    def __init__(self, src: NativeSource, stream: np.ndarray, *, io_depth: int | None, batch_size: int,
                 lookahead: int, timeout: float | None, budget_bytes: int | None = None, start: int = 0,
                 hint: dict | None = None, clock: Any = time.perf_counter_ns) -> None:
        if src.kind not in (SourceKind.FILES, SourceKind.SHARDS):
            raise ValueError(f"read-ahead reads files and byte ranges, not a {src.kind.name} source")
        self.src = src
        self.stream = stream
        self.fixed = None if io_depth is None else max(1, min(int(io_depth), MAX_DEPTH))
        self.held = max(1, int(batch_size)) * max(1, int(lookahead))
        self.budget = int(budget_bytes) if budget_bytes else DEFAULT_BYTES
        # Half the loader's timeout: one stuck read fails its sample (which on_error="skip"
        # can skip) before the consumer's wait for the whole batch runs out.
        self.timeout = float(timeout) / 2 if timeout else 0.0
        self._clock = clock
        most = self.fixed if self.fixed is not None else MAX_DEPTH
        self.hint = hint if hint is not None else {}
        start_depth = self.fixed or int(self.hint.get("depth", START_DEPTH))
        inline = self.fixed is None and bool(self.hint.get("inline", False))   # NOTE [ Reads that are work ]
        self.native = _chain.Reader(self.held + 2 * most, INLINE_DEPTH if inline else start_depth)
        self.depth = start_depth      # the read-ahead depth (the IO threads' while not reading inline)
        self.next = int(start)        # next stream position to queue
        self.largest = 0              # largest sample seen, bytes (the memory bound's unit)
        self.decisions: list[tuple[float, int, int, str]] = []
        self.waiting = 0.0            # share of the last turn the kernel threads waited for bytes
        self.inline = inline
        # A loader's first reader knows nothing of its storage yet (NOTE [ Read-ahead memory ]).
        self.unmeasured = self.fixed is None and "depth" not in self.hint and "inline" not in self.hint
        self._calls = 0
        self._slow_probes = 0          # probes in a row whose reads looked like waiting
        self._counters = self.native.counters   # what adapt() reads (a test scripts it)
        self._last = self._counters()
        self._last_t = clock()
        self._set_limit()

    # -- queueing ----------------------------------------------------------------------
    def top_up(self, start: int | None = None) -> int:
        """Queue reads from the next unqueued stream position on (not before ``start``, the
        first position still to produce), as far as the slot limit allows; returns how many
        positions were handled. While reading inline (NOTE [ Reads that are work ]) only every
        ``PROBE_EVERY``-th call queues."""
        n = self.stream.size
        if start is not None:
            self.next = max(self.next, int(start))
        if self.inline:
            self._calls += 1
            if self._calls % PROBE_EVERY:
                return 0
        if self.next >= n:
            return 0
        end = min(n, self.next + self.limit)
        took = self.queue(np.arange(self.next, end, dtype=np.int64), self.stream[self.next:end])
        self.next += took
        return took

    def attached(self, end: int) -> None:
        """A batch was queued on the kernel team with every position below ``end``: those
        positions are below the native reader's floor (NOTE [ Read-ahead ] in
        include/ll_readahead.h) and never queued again, so later top-ups start at ``end``.
        Without this, a probe made after a batch queued behind a gate (NOTE [ Batches in
        memory ]) had attached its positions spent itself on positions the reader passes over."""
        self.next = max(self.next, int(end))

    def queue(self, positions: np.ndarray, idx: np.ndarray) -> int:
        """Queue reads of the samples ``idx`` (stream indices) at ``positions`` (increasing,
        above every position queued or attached before); returns how many were taken."""
        if self.src.kind is SourceKind.FILES:   # NOTE [ Paths per batch ] in source.py
            enc, _ = encode_paths(self.src.paths or (), self.src.data_index(idx).tolist())
            took = self.native.queue_files(positions, enc)
        else:
            fds, offs, sizes = self.src.ranges(idx)
            if sizes.size:
                self.largest = max(self.largest, int(sizes.max()))
            took = self.native.queue_ranges(positions, fds, offs, sizes)
        return int(took)

    # -- depth and memory ----------------------------------------------------------------
    def _set_limit(self) -> None:
        unit = max(self.largest, 1)
        by_memory = max(1, self.budget // unit)
        # Reading inline, only the probes queue: one measurement's reads (NOTE [ Read-ahead memory ]).
        want = (max(MIN_READS, INLINE_DEPTH) if self.inline else self.depth if self.unmeasured
                else self.held + 2 * self.depth)
        self.limit = int(max(1, min(self.native.cap, want, by_memory)))
        self.native.set_limit(self.limit)

    def set_depth(self, depth: int, reason: str) -> None:
        depth = max(1, min(int(depth), MAX_DEPTH))
        self.hint["depth"] = depth
        if depth != self.depth:
            self.decisions.append(((self._clock() / 1e9), self.depth, depth, reason))
            self.depth = depth
            if not self.inline:   # reading inline, INLINE_DEPTH threads read the probes
                self.native.set_depth(depth)
        self._set_limit()

    def adapt(self, threads: int) -> None:
        """After a batch: re-derive the depth from the last batches' figures (adaptive only)."""
        c = self._counters()
        now = self._clock()
        last = self._last
        reads = c["reads"] - last["reads"]
        if self.src.kind is SourceKind.FILES and reads > 0:
            # A file's size is known once read: the memory bound counts twice the mean so far.
            self.largest = max(self.largest, int(2 * (c["bytes"] - last["bytes"]) / reads))
        latency_ns = (c["lat_ns"] - last["lat_ns"]) / reads if reads else 0
        need = MIN_READS if self.inline else max(MIN_READS, self.depth)
        if self.fixed is not None or reads < need or now - self._last_t < 2 * latency_ns:
            self._set_limit()   # one turn at a time (NOTE [ Read-ahead depth ])
            return
        wall_s = (now - self._last_t) / 1e9
        self._last, self._last_t = c, now
        if self.unmeasured:
            self.unmeasured = False
            self._set_limit()
        cpu_share = (c["cpu_ns"] - last["cpu_ns"]) / max(1, c["lat_ns"] - last["lat_ns"])
        b1, b0 = c.get("blocked", -1), last.get("blocked", -1)
        if b1 >= 0 and b0 >= 0:   # NOTE [ Reads that are work ]: did the reads sleep?
            slept = (b1 - b0) / reads
            work, waits = slept <= INLINE_SLEPT, slept >= WAIT_SLEPT
            how = f"{100 * slept:.0f}% of reads waited for storage, {100 * cpu_share:.0f}% CPU"
        else:
            work, waits = cpu_share > INLINE_CPU_SHARE, cpu_share < INLINE_CPU_SHARE / 2
            how = f"reads are {100 * cpu_share:.0f}% CPU"
        if not self.inline and work:
            self.inline = self.hint["inline"] = True
            self.decisions.append((now / 1e9, self.depth, self.depth, f"{how} (page cache): the decode threads "
                                   f"read their own samples, one batch in {PROBE_EVERY} still read ahead to "
                                   "measure"))
            self._set_limit()
            self.native.set_depth(INLINE_DEPTH)
            self.native.trim()   # NOTE [ Read-ahead memory ]
            return
        if self.inline:
            # Two probes in a row: one read's wall time includes waiting for a core, which a
            # busy machine stretches now and then (NOTE [ Reads that are work ]).
            self._slow_probes = self._slow_probes + 1 if waits else 0
        if self.inline and self._slow_probes >= SLOW_PROBES:
            self.inline = self.hint["inline"] = False
            self.decisions.append((now / 1e9, self.depth, self.depth, f"{how}: reading ahead again"))
            self.native.set_depth(self.depth)
            self._set_limit()
        if self.inline:
            return
        if wall_s > 0:
            self.waiting = min(1.0, (c["wait_ns"] - last["wait_ns"]) / 1e9 / (max(1, int(threads)) * wall_s))
        choice = choose_depth(current=self.depth, threads=threads, latency_s=(c["lat_ns"] - last["lat_ns"]) / 1e9 / reads,
                              taken=c["taken"] - last["taken"], wait_s=(c["wait_ns"] - last["wait_ns"]) / 1e9,
                              wall_s=wall_s)
        if choice is not None:
            self.set_depth(*choice)

    def take(self, position: int, timeout: float) -> tuple:
        """The bytes of stream position ``position`` (None if never queued) and the
        nanoseconds waited for them (the threads engine's items, NOTE [ Read-ahead for Python
        reads ] in ``_engines/threads.py``)."""
        return self.native.take(int(position), timeout)

    def buffer_bytes(self) -> int:
        """Bytes the read slots' buffers hold."""
        return int(self.native.buffer_bytes())

    # -- figures ---------------------------------------------------------------------------
    def counters(self) -> dict:
        """The native counters plus the policy's state."""
        c = self.native.counters()
        c["slots_limit"] = self.limit
        c["adaptive"] = self.fixed is None
        c["inline"] = self.inline
        return c

    def describe(self) -> str:
        """One line for ``explain()``."""
        how = (f"io_depth={self.fixed} reads in flight" if self.fixed is not None else
               "the decode threads read (reads are CPU work here, one batch in "
               f"{PROBE_EVERY} read ahead to measure)" if self.inline else
               f"adaptive depth (now {self.depth}; Little's law on measured read latency and decode rate)")
        return f"read-ahead: {how}, native IO threads, at most {self.limit} samples' bytes held"

    def close(self, wait: bool = False) -> None:
        """Stop the IO threads (queued reads are dropped; batches still queued give up). With
        ``wait``, also wait for the reads in progress to return and the IO threads to exit, at
        most ``closing.CLOSE_WAIT_S`` (NOTE [ Closing the read-ahead ] in ``pyx/include/ll_readahead.h``)."""
        if not wait:
            self.native.stop()
            return
        closing.left_running(int(self.native.join(closing.CLOSE_WAIT_S)), "reads")


def _lat_bin(ns: int) -> int:
    """The reader's latency histogram bin of ``ns`` (``ll_lat_bin`` in ll_readahead.h: 4 bins
    per octave of microseconds)."""
    us = ns / 1000.0
    if us < 2.0 ** 0.25:
        return 0
    return min(int(_chain.LAT_BINS) - 1, int(math.floor(4 * math.log2(us))))


class ReadTally:
    """The reads a run did outside the read-ahead's IO threads: the kernel threads' own reads
    (each batch's ``BatchStatus.reads``) and the threads engine's ``dataset.read(i)`` of
    samples not read ahead (NOTE [ Every read counts ] in ``pyx/include/ll_readahead.h``).
    Thread-safe. :meth:`merged` adds them to the read-ahead's counters, so the Extract figures
    count every read."""

    def __init__(self) -> None:
        self.reads = 0
        self.bytes = 0
        self.ns = 0
        self.hist = [0] * int(_chain.LAT_BINS)
        self._lock = threading.Lock()

    def add(self, nbytes: int, ns: int) -> None:
        """One read of ``nbytes`` that took ``ns`` nanoseconds."""
        with self._lock:
            self.reads += 1
            self.bytes += int(nbytes)
            self.ns += int(ns)
            self.hist[_lat_bin(ns)] += 1

    def add_batch(self, reads: tuple | None) -> None:
        """A kernel pass's own reads: ``(reads, bytes, nanoseconds, histogram)`` or None."""
        if not reads or not reads[0]:
            return
        n, nbytes, ns, hist = reads
        with self._lock:
            self.reads += int(n)
            self.bytes += int(nbytes)
            self.ns += int(ns)
            for b, k in enumerate(hist):
                if k:
                    self.hist[b] += int(k)

    def merged(self, counters: dict | None) -> dict:
        """The read-ahead's ``counters`` (None: a run without one) with these reads added;
        ``inline_reads`` and ``inline_bytes`` say how many of them the decode threads did."""
        c = dict(counters) if counters is not None else {
            "reads": 0, "failures": 0, "bytes": 0, "lat_ns": 0, "cpu_ns": 0, "queue_ns": 0, "wait_ns": 0,
            "reading": 0, "depth": 0, "hist": [0] * len(self.hist), "slots_limit": 0, "adaptive": False,
            "inline": True}
        with self._lock:
            c["reads"] = c["reads"] + self.reads
            c["bytes"] = c["bytes"] + self.bytes
            c["lat_ns"] = c["lat_ns"] + self.ns
            c["hist"] = [a + b for a, b in zip(c["hist"], self.hist)]
            c["inline_reads"], c["inline_bytes"] = self.reads, self.bytes
        return c


def read_ahead_for(src: NativeSource | None, stream: np.ndarray, *, io_depth: int | None, **kw: Any) -> Any:
    """The read-ahead stage of a run over ``src``: a :class:`ReadAhead` for files and byte
    ranges, a :class:`~loaderlib._extract.remote.readahead.RemoteReadAhead` for samples in an object
    store (a BUFFERS source whose dataset reads samples with ``buffers(indices)``; NOTE [ Remote
    read-ahead ]), None with ``io_depth=0`` or for any other source. ``kw``: the stages'
    common arguments (batch_size, lookahead, timeout, budget_bytes, start, hint)."""
    if src is None or io_depth == 0:
        return None
    if src.kind in (SourceKind.FILES, SourceKind.SHARDS):
        return ReadAhead(src, stream, io_depth=io_depth, **kw)
    if (src.kind is SourceKind.BUFFERS and getattr(src.dataset, "_remote", None) is not None
            and callable(getattr(src.dataset, "buffers", None))):
        from .remote.readahead import RemoteReadAhead

        return RemoteReadAhead(src, stream, io_depth=io_depth, **kw)
    return None
