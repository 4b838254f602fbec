"""The pieces every engine shares: the epoch plan, the prefetch queue, the driver thread.

NOTE [ Iterator state ]
Everything that belongs to one pass over the data lives in one typed :class:`RunState`,
created before the producer: the epoch, the seed, the epoch's stream of sample indices and
batch sizes (NOTE [ The epoch is one stream ] in ``sampler.py``), how far production has got
(``cursor``, ``next_batch``), how many batches were delivered to the user and how much of the
stream they consumed (``delivered``, ``position``), the batches in flight, and the samples
skipped. Producers read and advance it; nothing about a run lives anywhere else. A resume
needs only ``(epoch, carry, order key, delivered, position)``: the stream is recomputed and
production restarts at ``position``. The iterator the user holds is a thin handle on a
:class:`_Run` (state, producer, queue, driver thread); the driver references the run, never
the handle, so dropping the handle (``break`` out of a loop) finalises the run: the driver
stops, its threads are joined and its slots return to the arena.

NOTE [ Engine stages ]
Every engine is a :class:`Producer` with one interface: ``submit(task)`` starts work on one
batch of indices and returns a handle, ``finish(handle)`` returns the finished batch as
:class:`Produced` (or None when the stream ran out), ``cancel(handle)`` drops a batch that
will not be asked for, ``close()`` frees what it holds. The driver keeps
``producer.lookahead`` batches submitted, so the Python engines overlap the next batch's
samples with this batch's collation, and puts finished batches on the queue in order.
Producers read and advance the run's :class:`RunState` and nothing else about the run.

NOTE [ Batch wall time ]
The wall time a producer reports for a batch (the recorder turns it into pool capacity,
threads x wall, the denominator of the busy fraction) must not overlap the previous
batch's: with several batches in flight, "since this batch was submitted" counts the same
seconds twice and halves the busy fraction. The threads engine times each batch from the
previous batch's end (its sample stream restarts the clock there); the processes engine,
whose workers each hold batches, reports the time since the later of the batch's
submission and the previous batch's end (:func:`batch_wall`).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._autotune import Tuner, observe_batch
from .._extract.readahead import ReadAhead
from .._observe.recorder import Recorder
from .._threads import name_native_thread
from ..errors import LoaderError, LoaderTimeoutError, SampleFailure, SkipWarning, _add_context
from ..sampler import EpochOrder
from .depth import BatchDepth
from .handoff import _END, _BatchQueue, _Failure

_clock = time.perf_counter_ns
_log = logging.getLogger("loaderlib")


class _Stopped(Exception):
    """The iterator was closed while a batch was being produced."""


def annotate(exc: BaseException, index: int, source: str | None, engine: str) -> BaseException:
    """Attach the sample index and source to an exception raised by user code."""
    where = f"sample {index}" + (f" ({source!r})" if source else "")
    return _add_context(exc, f"loaderlib: raised while loading {where} in the {engine} engine",
                        sample_index=index, sample_source=source)


def batch_wall(start: int, previous_end: int, end: int) -> int:
    """A batch's wall time without the part that overlaps the previous batch's
    (NOTE [ Batch wall time ])."""
    return end - max(start, previous_end)


@dataclass
class Task:
    """One batch to produce: its number in the epoch, its indices and where they start."""

    number: int            # position of the batch in the epoch
    indices: np.ndarray    # int64 sample indices
    target: int            # samples the batch should hold
    start: int             # stream position of indices[0]


@dataclass
class Produced:
    """A finished batch, the stream position just after its last sample (loaded or skipped),
    and its size against the batch's target."""

    batch: Any
    end: int
    size: int
    target: int
    held_back: int = 0   # ns the driver waited at the batch cap before starting it (NOTE [ Batches in memory ])


class Producer:
    """The interface every engine implements (NOTE [ Engine stages ]).

    A handle (what ``submit`` returns and ``finish``/``cancel`` take) belongs to the producer
    that made it; the run only keeps it in order, so its type is each producer's own.
    """

    lookahead = 1
    #: Whether ``submit`` leases the batch's arena slot (else ``finish`` does; NOTE [ Warm slots ]).
    leases_at_submit = False
    reader: ReadAhead | None = None   # the run's read-ahead stage, if it has one (NOTE [ Read-ahead ])
    arena: Any = None                 # the BatchArena its batches lease slots of, if it has one

    def __init__(self, *, state: RunState, recorder: Recorder, on_error: str) -> None:
        self.state = state
        self.rec = recorder
        self.on_error = on_error

    def submit(self, task: Task) -> Any:
        return task

    def finish(self, handle: Any) -> Produced | None:
        raise NotImplementedError

    def cancel(self, handle: Any) -> None:
        pass

    def threads(self) -> int:
        """Threads a batch runs on now (the batch cap's tail estimate, NOTE [ Batches in memory ])."""
        return 1

    def done_producing(self) -> None:
        """The run's last batch is made: free what only production needs (NOTE [ Warm slots ])."""

    def close(self, wait: bool = True) -> None:
        pass

    # The gate (NOTE [ Batches in memory ]): producers that lease at submit may queue the next
    # batch into the slot the user still holds, behind a gate that slot's release opens.
    def gate_target(self) -> Any:
        """The lease a gated batch may follow now, or None (no gating)."""
        return None

    def continue_from(self, before: Producer) -> None:
        """This producer's run is the epoch after ``before``'s (a warm next epoch, NOTE
        [ Warm epochs ] in loader.py), started while ``before`` still produces: take over
        what the two can share (NOTE [ One team across epochs ] in native.py)."""

    def reads_issued(self) -> bool:
        """Whether the run's read-ahead has queued the reads of every sample it still needs
        (then the next epoch's reads may start, NOTE [ Warm epochs ] in loader.py)."""
        r = self.reader
        return (r is not None and not getattr(r, "inline", True)
                and getattr(r, "next", 0) >= getattr(getattr(r, "stream", None), "size", 1 << 62))

    def submit_after(self, task: Task, lease: Any) -> Any:
        """:meth:`submit` into ``lease``'s slot behind its gate."""
        return self.submit(task)

    def gate_closed(self, handle: Any) -> bool:
        """Whether ``handle`` waits behind a closed gate."""
        return False

    def wait_gate(self, handle: Any, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for ``handle``'s gate; whether it is still closed."""
        return False

    def gate_opened_ns(self, handle: Any) -> int:
        """When ``handle``'s gate opened (``perf_counter_ns``; 0: not gated or not yet)."""
        return 0

    def ungate(self, handle: Any) -> Any:
        """``handle`` again in a slot of its own, if its gate is still closed (else itself)."""
        return handle

    def timed_out(self) -> str | None:
        """The consumer gave up waiting: free what is stuck; returns what was done, for the error."""
        return None

    def skipped(self, index: int, source: str | None, reason: str) -> None:
        """Record a sample dropped by ``on_error="skip"`` (logged; the circuit breaker
        ``max_skipped`` raises once too many were)."""
        st = self.state
        failure = SampleFailure(int(index), source, reason, st.epoch)
        st.skipped.append(failure)
        _log.info("loaderlib: skipped sample %d%s in epoch %d: %s", failure.index,
                  f" ({source!r})" if source else "", st.epoch, reason)
        limit = st.max_skipped
        if limit is not None and len(st.skipped) > limit:
            listed = "; ".join(f"{f.index}{f' {f.source!r}' if f.source else ''}: {f.reason}"
                               for f in st.skipped[:10])
            more = f" (and {len(st.skipped) - 10} more)" if len(st.skipped) > 10 else ""
            raise LoaderError(f"{len(st.skipped)} samples failed in epoch {st.epoch}, more than max_skipped="
                              f"{limit}: the dataset looks broken. {listed}{more}")


class RunState:
    """All per-epoch state of one run (see NOTE [ Iterator state ]).

    Written by the driver thread (production) and by the consumer (delivery) under one lock;
    every field is plain data.
    """

    def __init__(self, order: EpochOrder, seed: int, *, delivered: int = 0, position: int = 0) -> None:
        self.order = order
        self.epoch = order.epoch
        self.seed = seed
        self.delivered = delivered       # batches handed to the user
        self.position = position         # stream samples consumed by delivered batches
        self.next_batch = delivered      # next batch number to plan
        self.cursor = position           # next stream position to plan
        self.generation = 0              # bumped when planned-ahead batches became invalid
        self.in_flight = 0               # batches submitted, not finished
        self.skipped: list = []          # SampleFailure of this run (on_error="skip")
        self.max_skipped: int | None = None   # the circuit breaker (DataLoader(max_skipped=...))
        self.lock = threading.Lock()
        self.stop = threading.Event()
        # Cleared while the run is a warm next epoch nobody iterates yet (NOTE [ Warm slots ]).
        self.live = threading.Event()
        self.live.set()

    @property
    def total(self) -> int:
        """Batches this epoch holds when every sample loads."""
        return len(self.order.targets)

    @property
    def exhausted(self) -> bool:
        """Every batch of the epoch has been planned."""
        return self.next_batch >= len(self.order.targets) or self.cursor >= self.order.stream.size

    def next_task(self) -> Task | None:
        """Plan the next batch: the next ``targets[k]`` samples of the stream."""
        with self.lock:
            if self.exhausted:
                return None
            k = self.next_batch
            t = self.order.targets[k]
            start = self.cursor
            idx = self.order.stream[start:start + t]
            self.next_batch += 1
            self.cursor += idx.size
            return Task(k, idx, t, start)

    def take(self, count: int) -> tuple[np.ndarray, int]:
        """The next ``count`` stream samples (on_error="skip" fills): ``(indices, start)``.

        Producers with one batch in flight call it; the samples are then no longer part of
        any later batch.
        """
        with self.lock:
            start = self.cursor
            idx = self.order.stream[start:start + max(0, count)]
            self.cursor += idx.size
            return idx, start

    def replan_from(self, position: int, next_batch: int) -> None:
        """Batches planned after ``next_batch - 1`` are void: plan again from ``position``.

        A producer with several batches in flight calls it when a fill consumed samples that
        later batches had been planned with (processes engine, on_error="skip").
        """
        with self.lock:
            self.cursor = position
            self.next_batch = next_batch
            self.generation += 1

    def delivered_batch(self, end: int) -> None:
        with self.lock:
            self.delivered += 1
            self.position = end

    def state_dict(self) -> dict:
        """The part of a loader state that belongs to this run (JSON-serialisable)."""
        with self.lock:
            return {
                "epoch": int(self.epoch), "delivered": int(self.delivered), "position": int(self.position),
                "carry": self.order.carry_in.tolist(),
                "order_key": self.order.key,
                "finished": bool(self.position >= self.order.stream.size or self.delivered >= self.total),
            }


class _Knobs:
    """Live settings shared by a loader and its running iterators."""

    def __init__(self, num_threads: int | None, prefetch: int, io_depth: int | None = None) -> None:
        self.num_threads = num_threads
        self.io_depth = io_depth   # reads in flight: None adapts, 0 reads in the kernel pass (NOTE [ Read-ahead ])
        self.read_hint: dict = {}  # the adaptive read-ahead's state, carried from epoch to epoch
        self._prefetch = prefetch
        self._queues: weakref.WeakSet = weakref.WeakSet()
        self.tuner: Tuner | None = None   # AUTOTUNE: observes delivered batches (NOTE [ Autotune ])
        self.depth: BatchDepth | None = None   # the default prefetch's batch cap (NOTE [ Batches in memory ])

    @property
    def prefetch(self) -> int:
        return self._prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._prefetch = value
        for q in list(self._queues):
            q.wake()


_RUN_SERIALS = itertools.count(1)

# NOTE [ Threads at interpreter exit ]
# Once the interpreter starts finalizing, a daemon thread that tries to take the GIL back
# (after a blocking call, a sleep, a contended lock, the start of a kernel team) never
# returns: CPython ends or parks it where it is, and a lock it holds stays taken for good.
# Objects dropped after that point (a loader kept in a module global, collected with its
# module) must therefore not wait for anything such a thread may hold. Two rules keep exit
# clean:
# - Work that ends a loader's threads runs before finalization, while every thread still
#   runs: the iterators' finalizers are ``weakref.finalize`` callbacks (run at exit), and a
#   DataLoader's warm next epoch (NOTE [ Warm epochs ] in loader.py) is dropped by one too
#   (``WarmStart.drop_at_exit``), joining its driver for at most ``EXIT_JOIN_S``.
# - No lock is held across a call that releases the GIL on a thread that may be a daemon
#   (``NativePlan._team_for`` starts and frees kernel teams outside its lock, and
#   ``NativePlan.close`` takes no lock). A script that ended while its warm epoch's driver
#   was starting the plan's team hung at exit this way (tests/unit/test_exit.py).

#: How often a driver waiting for a batch's gate checks that its run goes on and that the
#: consumer is not waiting for that batch while holding its slot (NOTE [ Batches in memory ]).
GATE_POLL_S = 0.01

#: How long dropping a warm run at interpreter exit waits for its driver thread.
EXIT_JOIN_S = 5.0


class WarmStart:
    """The next epoch's run (a Pipeline's next iteration's), started before it is asked for
    (NOTE [ Warm epochs ] in loader.py): handed out only to the order it was started for,
    closed otherwise. ``run`` is anything with ``close()``; None when nothing is started."""

    def __init__(self) -> None:
        self.key: Any = None
        self.run: Any = None

    def put(self, key: Any, run: Any) -> None:
        """Hold ``run``, started for ``key`` (closing what was held)."""
        self.drop()
        self.key, self.run = key, run

    def take(self, same: Callable[[Any, Any], bool]) -> Any:
        """The held run if ``same(key, run)`` says it is the one wanted (None otherwise; a
        run that is not is closed). Nothing is held afterwards."""
        key, run = self.key, self.run
        self.key = self.run = None
        if run is None:
            return None
        if same(key, run):
            return run
        run.close()
        return None

    def drop(self, join_s: float | None = None) -> None:
        """Close and forget the held run, if any; with ``join_s``, its driver is joined for at
        most that long (:meth:`_Run.close_bounded`)."""
        run = self.run
        self.key = self.run = None
        if run is not None and join_s is None:
            run.close()
        elif run is not None:
            run.close_bounded(join_s)

    def drop_at_exit(self) -> None:
        """:meth:`drop` for the interpreter's exit and a collected loader (NOTE [ Threads at
        interpreter exit ]): the driver is joined for at most ``EXIT_JOIN_S`` (maybe in user code)."""
        self.drop(EXIT_JOIN_S)


class _Run:
    """One pass over the data: its state, its producer, and (unless synchronous) the prefetch
    queue and driver thread (see NOTE [ Iterator state ])."""

    def __init__(self, *, state: RunState, producer: Producer, knobs: _Knobs, recorder: Recorder,
                 timeout: float | None, threaded: bool = True) -> None:
        self.state = state
        self.producer = producer
        self.knobs = knobs
        self.recorder = recorder
        self.timeout = timeout
        self.queue = _BatchQueue(knobs, recorder) if threaded else None
        self.pending: collections.deque = collections.deque()   # producer handles, in batch order
        self.held_back: collections.deque = collections.deque()  # per pending handle: ns waited at the batch cap
        self.thread: threading.Thread | None = None
        self.closed = False
        self.joined = False
        self.interrupted = False   # closed by a timeout or Ctrl-C: never wait for user code
        self.on_start: Callable[[], None] | None = None  # called once, on the producing thread, first
        self.room: Callable[[], bool] | None = None      # NOTE [ Warm slots ]: a batch slot is free (None: always)
        self.failed = False        # ended by an error (the loader then drops a warm next epoch)
        self.produced_all = False  # every batch made, the producer's production resources freed
        self._last_done = 0        # when the last batch was finished (a gated batch's held-back time)
        self.production_left = False   # produced_all, done_producing not called yet (NOTE [ The last batch first ])
        # NOTE [ Warm slots ]: the lease of a slot of the epoch before that this (warm) run's next
        # batch may follow behind a gate, or None; set by the loader.
        self.follow: Callable[[], Any] | None = None
        self._room_after: Any = None
        self.serial = next(_RUN_SERIALS)   # tells the AUTOTUNE tuner a new stream began (NOTE [ Autotune ])

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @staticmethod
    def warm_room(arena: Any, before: _Run | None) -> Callable[[], bool]:
        """A warm next epoch's ``room`` (NOTE [ Warm slots ]): a batch slot is free for it once
        ``before`` (the epoch still being consumed; held weakly) has made all its batches and
        the arena has a slot that was written before."""
        ahead = weakref.ref(before) if before is not None else None

        def room() -> bool:
            b = ahead() if ahead is not None else None
            return (b is None or b.closed or b.produced_all) and arena.has_room()

        return room

    @staticmethod
    def warm_follow(before: _Run | None) -> Callable[[], Any]:
        """A warm next epoch's ``follow`` (NOTE [ Warm slots ], NOTE [ Batches in memory ]): once
        ``before`` (held weakly) has planned all its batches, so it gates no more of its own,
        the lease of its slot that the user gives back next, for the warm run's batch to follow
        behind a gate: the next epoch's first batch then starts as a batch mid-epoch does,
        when the user gives back the slot, with no new slot and no Python thread in between."""
        ahead = weakref.ref(before) if before is not None else None

        def follow() -> Any:
            b = ahead() if ahead is not None else None
            if b is None or b.closed or not b.state.exhausted:
                return None
            return b.producer.gate_target()

        return follow

    def after_epoch(self, before: _Run | None, arena: Any) -> None:
        """Make this (warm, not started) run the epoch after ``before``, the one being
        consumed: it takes over ``before``'s kernel team (NOTE [ One team across epochs ] in
        native.py) and batch slots (NOTE [ Warm slots ]) as they come free."""
        if before is not None:
            self.producer.continue_from(before.producer)
        if arena is not None:
            self.room, self.follow = _Run.warm_room(arena, before), _Run.warm_follow(before)

    def start(self) -> None:
        if self.queue is not None:
            self.thread = threading.Thread(target=_drive, args=(self, self.queue), name="loaderlib-driver",
                                           daemon=True)
            self.thread.start()

    def step(self) -> Produced | None:
        """Produce the next batch, or None at the end of the epoch.

        Runs on the driver thread (or the caller's, with ``num_threads=0``). Keeps
        ``producer.lookahead`` batches submitted so the Python engines overlap batches.
        """
        st, prod = self.state, self.producer
        if self.on_start is not None:
            start, self.on_start = self.on_start, None
            start()
        while not st.stop.is_set():
            while len(self.pending) < prod.lookahead:
                if st.exhausted:
                    break   # nothing left to plan: never wait for room or at the cap for it
                after = None
                if not st.live.is_set() and self.room is not None:
                    if self.pending and not self.room():
                        # Finish the batch in production first (its slot may be the last free
                        # one), unless the next can follow another slot of the epoch before.
                        follow = self.follow if self.queue is not None else None
                        following = follow is not None
                        after = follow() if follow is not None else None
                        if after is None:
                            if following and not st.stop.is_set() and prod.gate_closed(self.pending[-1]):
                                # Its batch still waits for the user's slot: the epoch before's
                                # last batch, whose slot comes next, is not finished yet.
                                st.live.wait(0.005)
                                continue
                            break
                    elif not self.pending:
                        self._room_after = None
                        if not self._wait_room():
                            break
                        # or behind the gate of the epoch before's slot (never kept: it holds the user's batch)
                        after, self._room_after = self._room_after, None
                held = 0
                cap = getattr(self.knobs, "depth", None)
                if cap is not None and prod.leases_at_submit and after is None:
                    held = self._wait_cap(cap)
                    if held < 0:
                        after = self._gate_target()
                        if after is None:
                            break
                        held = 0
                task = st.next_task()
                if task is None:
                    break
                self.pending.append(prod.submit(task) if after is None else prod.submit_after(task, after))
                after = None
                self.held_back.append(held)
                st.in_flight += 1
            if not self.pending:
                return None
            generation = st.generation
            handle = self.pending.popleft()
            held = self.held_back.popleft()
            try:
                if prod.gate_closed(handle):
                    handle = self._wait_gate(handle)
                opened = prod.gate_opened_ns(handle)
                if opened and self._last_done:
                    held = max(0, opened - self._last_done)   # how long it waited for the user's slot
                out = prod.finish(handle)
                self._last_done = _clock()
            except BaseException:
                st.in_flight -= 1
                try:
                    prod.cancel(handle)   # stopped or failed mid-batch: its resources go back too
                except Exception:  # noqa: BLE001, S110
                    pass
                raise
            st.in_flight -= 1
            handle = None   # a native batch holds its kernel team: done_producing frees it below
            if st.generation != generation:
                self.cancel_pending()   # a fill consumed samples that batches planned ahead hold
            if not self.pending and st.exhausted and not self.produced_all:
                self.produced_all = True
                if self.queue is None:
                    prod.done_producing()
                else:
                    self.production_left = True   # NOTE [ The last batch first ]: _drive frees it
            if out is None:
                continue
            if st.order.drop_short and out.size < out.target:
                continue   # only the stream's end is short: last_batch="discard" drops it
            out.held_back = held
            return out
        return None

    def end_production(self) -> None:
        """Free what only production needs (``Producer.done_producing``) once the last batch
        is made, if not done yet.

        NOTE [ The last batch first ]
        The driver hands the epoch's last batch, and the end of the epoch behind it, to the
        consumer before the producer frees its kernel team, read-ahead and scratch (closing
        the read-ahead, joining idle threads and trimming the heap: 25-30 ms at the epoch
        boundaries of a profiling timeline at 64 ms per file, on 2 busy cores). A warm next epoch's first batch waits behind the gate
        of a slot the consumer gives back when it takes that last batch (NOTE [ Warm slots ]),
        so freeing first delayed the next epoch's first batch by the freeing, at every epoch
        boundary. When the queue is full (the model is the slower side) nothing waits for the
        last batch, and production is freed first, so the team does not outlive its epoch for
        as long as the consumer takes to get there."""
        if self.production_left:
            self.production_left = False
            self.producer.done_producing()

    def _wait_cap(self, depth: BatchDepth) -> int:
        """Wait until the next batch may lease a slot under the batch cap (NOTE [ Batches in
        memory ] in ``depth.py``). Returns the nanoseconds waited (0 when a slot was free at once),
        or -1 when the caller must not start a batch now: it has batches in production, whose
        delivery frees a slot, or the run stopped."""
        st = self.state
        ring = self.producer.arena
        threads = self.producer.threads()
        assert ring is not None   # only producers that lease at submit come here
        if ring.num_leased < depth.cap(threads):
            return 0
        if self.pending:
            return -1
        q = self.queue
        if q is None:
            depth.forced()   # num_threads=0: the caller asks for this batch itself
            return 0
        t0 = _clock()
        while True:
            depth.waiting = True
            try:
                if st.stop.is_set():
                    return -1
                if ring.num_leased < depth.cap(threads):
                    break
                if q.waiting and not len(q) and st.live.is_set():
                    depth.forced()   # the consumer holds every slot the cap allows
                    break
                depth.wait(0.05)
            finally:
                depth.waiting = False
        return _clock() - t0

    def _gate_target(self) -> Any:
        """The lease of the slot the next batch may follow behind a gate (NOTE [ Batches in
        memory ]), or None: only a live run with a driver thread and a batch in production
        gates (the synchronous run's caller is the one holding the slot)."""
        st = self.state
        if self.queue is None or not self.pending or st.stop.is_set() or not st.live.is_set():
            return None
        target = self.producer.gate_target()
        if target is None and self.follow is not None:
            target = self.follow()   # its first batches follow the epoch before's slots
        return target

    def _wait_gate(self, handle: Any) -> Any:
        """Wait until ``handle``'s gate opens (the user gave its slot back). A consumer that
        waits for this batch while it still holds that slot keeps batches: the batch is taken
        back and queued into a slot of its own, one more batch ahead (NOTE [ Batches in
        memory ]). Raises :class:`_Stopped` when the run stops."""
        st, prod, q = self.state, self.producer, self.queue
        depth = getattr(self.knobs, "depth", None)
        # Waits in C on the team's condition, which the gate's opening signals: no Python wake
        # sits between the release and this driver (the batch runs from the release on anyway),
        # and two runs' drivers at an epoch boundary never take each other's signal.
        while prod.wait_gate(handle, GATE_POLL_S):
            if st.stop.is_set():
                raise _Stopped()   # step() cancels the handle
            if q is None or (q.waiting and not len(q) and st.live.is_set()):
                if depth is not None:
                    depth.forced()
                return prod.ungate(handle)
        return handle

    def _wait_room(self) -> bool:
        """Wait for a slot a warm run may take.

        NOTE [ Warm slots ]
        A warm next epoch (NOTE [ Warm epochs ] in ``loader.py``) shares the loader's batch
        ring with the epoch still being consumed. Had it slots of its own, the ring would hold
        two epochs' worth of slots (queue, batches in production, the user's), all of them
        written and so resident (a float RN50 batch of 64 is 38.5 MB, and an epoch keeps two to
        five of them in the ring, NOTE [ Batches in memory ]). Instead a
        warm run starts a batch only while fewer slots are leased than the most ever leased at
        once (``BatchArena.has_room``) and the current epoch has made all its batches
        (``_Run.warm_room``; a Python engine's batch takes its slot only when it is assembled, so
        before that the count can look free while it is not, and the ring grew a slot in one
        run of the steady-state test): it reuses slots already in memory, the ones the current
        epoch gives back as the user takes its last batches, and so has its first batches
        ready at the boundary without new resident memory. Once iterated (``live``), it takes slots as any run.
        "Made all its batches" is ``produced_all``, set once the last batch is finished; the
        producer frees what only production needs (``done_producing``: the native engine's
        kernel team with its per-thread scratch, and its read-ahead) right after handing that
        batch on (NOTE [ The last batch first ]): each run has its own, and the two would
        otherwise be resident together at every epoch boundary.

        Waits until a slot is free, the run goes live, or it stops; False when it stopped.
        """
        st, room = self.state, self.room
        while not st.live.is_set() and not st.stop.is_set():
            if room is None or room():
                return True
            if self.follow is not None and self.queue is not None:
                target = self.follow()
                if target is not None:
                    self._room_after = target
                    return True
            st.live.wait(0.005)
        return not st.stop.is_set()

    def cancel_pending(self) -> None:
        while self.pending:
            h = self.pending.popleft()
            if self.held_back:
                self.held_back.popleft()
            self.state.in_flight -= 1
            try:
                self.producer.cancel(h)
            except Exception:  # noqa: BLE001, S110 - cancelling is best effort; close() frees the rest
                pass

    def close(self, wait: bool = True) -> None:
        """Stop the pipeline. ``wait=False`` (after a timeout or Ctrl-C) only signals: a
        Python call that is running cannot be interrupted, so its threads end on their own;
        the iterator's finaliser joins them later."""
        if not self.closed:
            self.closed = True
            self.state.stop.set()
            cap = getattr(self.knobs, "depth", None)
            if cap is not None:
                cap.wake()
            if self.queue is not None:
                self.queue.close()
            self.producer.close(wait=False)
        if wait and not self.joined and not self.interrupted:
            # After a timeout or Ctrl-C the driver may be stuck in user code: it is never
            # joined (it is a daemon thread and stops at its next check of ``stop``).
            self.joined = True
            t = self.thread
            if t is not None and t is not threading.current_thread():
                t.join()
            if self.queue is None:
                self.cancel_pending()
            if not self.interrupted:
                self.producer.close(wait=True)

    def close_bounded(self, join_s: float) -> None:
        """:meth:`close`, joining the driver thread for at most ``join_s`` seconds; one still
        running then (inside user code) is left as after a timeout (``interrupted``)."""
        self.close(wait=False)
        t = self.thread
        if t is not None and t is not threading.current_thread() and not self.joined:
            t.join(join_s)
            if t.is_alive():
                self.interrupted = True
                return
        self.close()


def _drive(run: _Run, queue: _BatchQueue) -> None:
    """Driver thread body: produce ``run``'s batches in order and put them on its ``queue``."""
    name_native_thread("ll-driver")   # NOTE [ Thread names ] in pyx/include/ll_pool.h
    try:
        while not run.state.stop.is_set():
            out = run.step()
            if out is None:
                break
            if run.production_left and queue.full():
                run.end_production()   # NOTE [ The last batch first ]
            if not queue.put(out):
                break
            if run.production_left:
                break   # the epoch's last batch: its end follows at once, the freeing after it
        queue.put(_END, force=True)
    except BaseException as e:  # noqa: BLE001 - delivered to the consumer, who raises it
        queue.put(_Failure(e), force=True)
    finally:
        run.cancel_pending()
        run.end_production()


class LoaderIterator:
    """Iterator over one epoch of a DataLoader (see NOTE [ Iterator state ]).

    ``state_dict()`` describes the position after the last batch it returned; the iterator
    pickles through that state (unpickling gives a fresh iterator of an equal loader that
    continues there). ``post`` holds the loader's steps for each delivered batch, applied in
    order as ``batch = step(batch, run_state)`` (its ``batch_transform``, then the torch
    conversion of ``output="torch"``).
    """

    def __init__(self, run: _Run | None, owner: Any = None, post: tuple = (),
                 start: Callable[[LoaderIterator], _Run] | None = None) -> None:
        self._post = post
        # ``for b in DataLoader(...)`` drops the loader at once: the iterator keeps it (and its
        # worker processes) alive. The loader refers back only weakly, so there is no cycle.
        self._owner = owner
        self._start = start   # makes the run at the first next() (NOTE [ Lazy iter ] in loader.py)
        self._started: _Run | None = None
        self._finalizer: Any = None
        if run is not None:
            self._bind(run)

    def _bind(self, run: _Run) -> _Run:
        self._started = run
        self._finalizer = weakref.finalize(self, _finish, run, self._owner)
        return run

    @property
    def _run(self) -> _Run:
        if self._started is not None:
            return self._started
        if self._start is None:
            raise RuntimeError("this iterator was closed before its first batch")
        start, self._start = self._start, None
        return self._bind(start(self))

    def __iter__(self) -> LoaderIterator:
        return self

    def __len__(self) -> int:
        if self._started is None:   # not started: the epoch the loader will run
            return max(0, len(self._owner) - self.delivered) if self._start is not None else 0
        st = self._run.state
        return max(0, st.total - st.delivered)

    @property
    def epoch(self) -> int:
        return self._owner.epoch if self._started is None else self._run.state.epoch

    @property
    def delivered(self) -> int:
        """Batches handed to the user so far in this epoch."""
        return int(self.state_dict()["delivered"]) if self._started is None else self._run.state.delivered

    def state_dict(self) -> dict:
        """The loader state that continues after the last batch this iterator returned."""
        return self._owner.state_dict() if self._started is None else self._owner._state_of(self._run.state)

    def __reduce__(self):
        return (_restore_iterator, (self._owner, self.state_dict()))

    def __next__(self) -> Any:
        if self._started is None and self._start is None:
            raise StopIteration   # closed before its first batch
        run = self._run
        if run.closed:
            raise StopIteration
        if run.queue is None:
            t0 = _clock()
            try:
                item = run.step()
                if run.recorder.enabled:   # next() made (or finished) the batch: the user waited for it
                    run.recorder.consumer_waited(_clock() - t0)
                    run.recorder.queue_depth(len(run.pending), max(1, run.producer.lookahead - 1))   # in production
            except BaseException:
                run.failed = True
                self.close()
                raise
            if item is None:
                self.close()
                _report_skips(run.state)
                raise StopIteration
        else:
            try:
                item = run.queue.get(run.timeout, f"batch {run.state.delivered} of epoch {run.state.epoch}")
            except LoaderTimeoutError as e:
                # The iterator is finished now, not when the exception (whose traceback holds
                # it) is collected: the loader drops a warm next epoch at once, whose batches
                # may be queued at the worker the timeout killed (NOTE [ Warm epochs ]).
                run.interrupted = True
                done = run.producer.timed_out()
                run.close(wait=False)
                self.close()
                if done:
                    raise LoaderTimeoutError(f"{e}; {done}") from None
                raise
            except BaseException:
                # Ctrl-C: stop the pipeline before the exception propagates, without waiting
                # for a Python call that may be the reason for it; finished as above.
                run.interrupted = True
                run.close(wait=False)
                self.close()
                raise
            if item is _END:
                self.close()
                _report_skips(run.state)
                raise StopIteration
            if isinstance(item, _Failure):
                run.failed = True
                self.close()
                exc = item.exc
                try:
                    raise exc
                finally:
                    # The traceback holds this frame: drop the locals that would close a cycle
                    # (exception -> traceback -> frame -> exception) and keep slots alive.
                    exc = item = None
        run.state.delivered_batch(item.end)
        depth = getattr(run.knobs, "depth", None)
        if depth is not None and run.queue is not None:
            depth.observe(item.held_back, run.queue.last_wait_ns, _clock())
        if run.knobs.tuner is not None:
            observe_batch(run.knobs.tuner, item.batch, run.serial)
        if self._owner is not None and (run.state.exhausted or run.producer.reads_issued()):
            self._owner._epoch_nearly_done(run)
        batch = item.batch
        for step in self._post:
            batch = step(batch, run.state)
        return batch

    def _swap(self, run: _Run) -> None:
        """Continue on ``run`` (``loader.flush()``): the old run is stopped and joined."""
        old = self._run
        self._finalizer.detach()
        old.close()
        self._bind(run)

    def close(self) -> None:
        """Stop the pipeline: join its threads, stop its work and free its slots. Idempotent."""
        self._start = None
        if self._finalizer is not None:
            self._finalizer()


def _report_skips(state: RunState) -> None:
    """One summary per epoch of the samples ``on_error="skip"`` dropped (log and warning)."""
    n = len(state.skipped)
    if not n:
        return
    first = state.skipped[0]
    text = (f"loaderlib: {n} sample{'s' if n != 1 else ''} skipped in epoch {state.epoch} (on_error='skip'); "
            f"first: sample {first.index}{f' {first.source!r}' if first.source else ''}: {first.reason}. "
            "All are in loader.errors.")
    _log.warning(text)
    warnings.warn(text, SkipWarning, stacklevel=3)


def _finish(run: _Run, owner: Any) -> None:
    """Close ``run`` and tell its loader (iterator closed, exhausted or dropped)."""
    run.close()
    if owner is not None:
        owner._iterator_closed(run)


def _restore_iterator(loader: Any, state: dict) -> LoaderIterator:
    loader.load_state_dict(state)
    return iter(loader)
