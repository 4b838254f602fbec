"""How many batches the native engine keeps in memory with the default ``prefetch``.

NOTE [ Batches in memory ]
Every batch slot that has been written stays resident: a float RN50 batch of 64 is 38.5 MB,
so the batches, not the code, are a loader's memory. ``for x, y in loader`` still holds the
previous batch while ``next()`` runs (the names are rebound only when it returns), so the
user's batch and the one being handed over are two slots however little is prefetched.
With the default ``prefetch``, the native engine keeps at most ``1 + ahead`` slots leased
over the whole ring (a warm next epoch's batches count too, NOTE [ Warm slots ]): the user's
and ``ahead`` ready or in production.

- Before leasing a slot for the next batch, the driver checks the count. At the cap it first
  finishes what it has in production, then waits for a release: each lease's end signals
  :attr:`BatchDepth.signal` (``SlotRing.on_release``; a ``queue.SimpleQueue``, whose
  ``put`` never blocks and may run inside a dealloc, on any thread, even at exit).
- At 1 ahead the kernel team would idle between batches, from a batch's last image until the
  next batch is queued: the tail (the other threads have nothing to claim, NOTE [ One queue
  across batches ]) and the hand-over (the driver completes the batch, the consumer takes it
  and gives the previous one back, the driver wakes, leases the freed slot and queues the next
  one). A timeline of the hand-over (a profiling script timing each step of the float RN50
  chain at 2 pinned threads on the ImageNet-like photos, a loaded shared machine; medians per
  batch) put the driver's part after the release, its wake-up (~60 us) and its set-up of the
  next batch (lease, reads, the kernel call: ~350 us, with a mean of 2.7 ms under load), at
  about half of the gap between two batches (1.5 ms median). So the next batch is queued
  ahead of time instead, aimed at the slot the user still holds (NOTE [ Successor leases ] in
  pyx/_arena.pyx): while one batch is in production and the user holds the previous one, the
  driver leases that slot a second time, queues the batch after next on the kernel team
  behind a closed gate (``ll_pool_submit_gated``), and its reads go out at once; the holder's
  release opens the gate in C, in the lease's dealloc, so the kernel threads start it with no
  Python thread in between. The tail and the driver's completion of the batch before (the
  consumer must have it to give its slot back) remain: the same script, in three rounds
  alternating with the code before, timed from a batch's completion (as the driver saw it) to
  the next batch's start a median of 3.0 / 5.0 / 3.5 ms per batch before and 0.69 / 0.70 /
  0.80 ms (to the gate's opening) with it, on a loaded machine. The gated batch's
  ``held_back`` is the time from the batch before's completion to its gate's opening.
  No batch is gated while the read-ahead reads ahead (``NativeProducer.gate_target``): queued
  early, a batch attaches positions whose reads were not queued yet, which the kernel threads
  then read themselves at the storage's latency (through latencyfs the gate cost 35% of the
  throughput at 4 ms per file and 20% at 16 ms), and where reads are waited for, the hand-over
  is a small share of a batch anyway. Warm local files, read inline, are where it counts.
  A consumer that waits for the gated batch while still holding its slot keeps batches: the
  driver (which waits for the gate in C, ``ll_pool_wait_open``, checking every
  ``GATE_POLL_S``) takes it back unrun (``ll_pool_withdraw``, its reads given up) and queues it
  into a slot of its own, one more ahead, as below. A warm next epoch queues its first batch
  behind the gate of the user's slot of the epoch before (``_Run.warm_follow``), and its second
  behind the epoch before's last slot as soon as that batch is finished, on the same kernel
  team (NOTE [ One team across epochs ] in native.py), so the user waits at an epoch start
  about as long as mid-epoch (docs/measurements.md, epoch boundaries).
  With a model slower than the loader the cap costs nothing: the next batch is ready before it
  is asked for. When the loader is the bottleneck, ``benchmarks/scaling.py --pin --prefetch
  default,2`` measured (before the gate) 0.90x and 0.94x of ``prefetch=2`` at 2 threads with
  batches of 64, the float RN50 chain after a warm-up epoch, for half the batch memory; with
  the gate, on the ImageNet-like photos and a quiet machine, 0.939x, 0.977x, 0.965x, 0.945x and
  0.998x in five runs (``--threads 2 --repeat 3|5 --epochs 4``), and 1.011x at 1 thread. Two
  ahead, in runs alternating with those, gave 0.976x, 1.071x, 1.051x, 1.026x and 1.036x, but
  its third slot raised the float32 bench's peak PSS from 0.52-0.54x to 0.79x the lightest
  peer's (benchmarks/loader.py --peers), past the 0.75x the project keeps to, so small teams
  stay at one ahead and a loader-bound job with memory to spare passes ``prefetch=2``. The rest
  is taken without a slot: while the gate is closed, idle kernel threads run up to four items
  each of the gated batch into scratch of their own and copy them into place when the gate
  opens (NOTE [ Staged items ] in pyx/include/ll_pool.h), so the tail and the hand-over are
  spent on the next batch, for at most an eighth of a batch's outputs in scratch (8 items,
  4.8 MB, for float RN50 batches of 64). The fewer images each thread gets per batch, the larger the tail's share, so ``ahead``
  starts at 1 only for small teams, at most ``1 + batch_size / SMALL_TEAM`` threads (2
  threads with batches of 64, 6 with 256), and at 2 otherwise (two batches in production, as
  the engine's lookahead plans: 16 threads keep 3 slots).
- A consumer that keeps batches (a list of them, gradient accumulation) would wait for ever
  once it holds every slot the cap allows: when it waits with nothing queued and nothing in
  production, the driver takes one more slot and ``ahead`` rises by one (up to ``most``), so
  it pays that stall once per batch it keeps.
- A deeper queue helps a consumer whose pace varies: it absorbs a slow batch with the time
  the driver spent waiting at the cap before it. Per delivered batch, ``min(driver waited at
  the cap before making it, consumer waited for it)`` is the time one more batch ahead would
  have saved; when that sums to more than ``GROW_SHARE`` of ``WINDOW`` batches' wall time,
  ``ahead`` rises by one, up to ``most`` (the depth an explicit ``prefetch`` would default to,
  within ``ram_budget``). It measures only the driver's wait at the cap, so the hand-over of a
  loader-bound run (the consumer waits for every batch, the driver only while the consumer
  rebinds its names) does not raise it: that cost is the one described above.
- An explicit ``prefetch`` (or ``AUTOTUNE``) turns this off: the queue holds that many ready
  batches, as before.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

_clock = time.perf_counter_ns

#: Images per batch for each kernel thread past the first up to which ``ahead`` starts at 1.
SMALL_TEAM = 50
#: Share of a window's wall time that one more batch ahead must have saved to be taken.
GROW_SHARE = 0.03
#: Batches per measuring window of the growth rule: long enough that one stall of the consumer
#: (a garbage collection, another thread holding the GIL) does not count as a pattern.
WINDOW = 64


def start_ahead(threads: int, batch_size: int) -> int:
    """Batches ahead of the user's to start with (NOTE [ Batches in memory ]): 1 for a small
    team (at most ``1 + batch_size / SMALL_TEAM`` threads), else 2."""
    return 1 if max(0, int(threads) - 1) * SMALL_TEAM <= max(1, int(batch_size)) else 2


class BatchDepth:
    """The batch-slot cap of one loader's native runs (NOTE [ Batches in memory ]).

    Parameters
    ----------
    batch_size : int
        Samples per batch (the tail estimate's unit).
    most : int
        The most batches ahead of the user's it ever allows by itself.
    """

    def __init__(self, batch_size: int, most: int) -> None:
        self.batch_size = max(1, int(batch_size))
        self.most = max(1, int(most))
        self.ahead = 1                      # raised to start_ahead by cap(), then by the rules
        self.signal: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting = False                # a driver waits on ``signal``
        self.decisions: list[tuple[int, int, str]] = []   # (ahead before, after, why)
        self._saved = 0
        self._count = 0
        self._t0: int | None = None
        self._lock = threading.Lock()

    def cap(self, threads: int) -> int:
        """Slots that may be leased at once now: the user's and ``ahead``."""
        start = min(self.most, start_ahead(threads, self.batch_size))
        if self.ahead < start:
            self.ahead = start
        return 1 + self.ahead

    def wake(self) -> None:
        """Wake a waiting driver (a slot was released, the consumer started waiting, or the run
        stops). Never blocks; safe in a dealloc and at interpreter exit."""
        if self.waiting:
            self.signal.put(None)

    def wait(self, timeout: float) -> None:
        """Block until :meth:`wake` or ``timeout`` seconds (the caller sets ``waiting`` first
        and checks its condition after setting it, so no wake is lost)."""
        try:
            self.signal.get(timeout=timeout)
            while True:
                self.signal.get_nowait()
        except queue.Empty:
            pass

    def forced(self) -> None:
        """The consumer waits for a batch and holds every slot the cap allows: one more."""
        with self._lock:
            if self.ahead < self.most:
                self.decisions.append((self.ahead, self.ahead + 1, "the consumer keeps batches: it waited while "
                                       "holding every slot the cap allowed"))
                self.ahead += 1

    def observe(self, held_back_ns: int, waited_ns: int, now_ns: int) -> None:
        """One delivered batch: the driver waited ``held_back_ns`` at the cap before making it
        and the consumer ``waited_ns`` for it; ``now_ns`` is the delivery time."""
        with self._lock:
            if self._t0 is None:
                self._t0 = now_ns
                return
            self._saved += min(max(0, int(held_back_ns)), max(0, int(waited_ns)))
            self._count += 1
            if self._count < WINDOW:
                return
            wall = now_ns - self._t0
            if wall > 0 and self._saved > GROW_SHARE * wall and self.ahead < self.most:
                self.decisions.append((self.ahead, self.ahead + 1, f"one more batch ahead would have saved "
                                       f"{100 * self._saved / wall:.1f}% of the last {self._count} batches' time"))
                self.ahead += 1
            self._t0, self._saved, self._count = now_ns, 0, 0

    def describe(self, threads: int) -> str:
        """One line for ``explain()``."""
        cap = self.cap(threads)
        return (f"at most {cap} batches in memory (the one you hold and {cap - 1} ahead; adaptive, up to "
                f"{1 + self.most}: pass prefetch=N for a fixed queue)")



def depth_for(loader: Any) -> BatchDepth | None:
    """The batch cap of a DataLoader with the default prefetch (None otherwise): native engine
    only (the Python engines take a batch's slot when it is assembled, not when it starts),
    not token batches (small, and made on the consumer's thread), at most the default queue's
    depth ahead, within ``ram_budget``."""
    if not loader._adaptive_depth or loader.engine != "native" or loader._iterable:
        return None
    if loader._analysis.token_batches:
        return None   # small batches, no driver (NOTE [ Token batches driven by the consumer ] in native.py)
    from .._autotune import batch_nbytes

    most = loader._knobs.prefetch
    per_batch = batch_nbytes(loader)
    if loader.ram_budget is not None and per_batch:
        most = min(most, loader.ram_budget // per_batch - 1)
    return BatchDepth(loader.batch_size, max(1, most))
