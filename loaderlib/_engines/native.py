"""The native engine: one nogil kernel pass per batch, straight into an arena slot.

Follows NOTE [ Engine stages ] in ``base.py``. The threads engine runs the same producer as
the native prefix of a chain whose tail is Python (``threads.HybridProducer``).
"""

from __future__ import annotations

import collections
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _threads
from .._ext import _arena, _tokens
from .._extract.readahead import ReadAhead, ReadTally, read_ahead_for
from .._extract.source import NativeSource, SourceKind, native_error
from .._observe.recorder import Recorder
from .._worker_info import WorkerInfo, set_thread_info, worker_seed
from ..arena import BatchArena, BatchLayout
from ..batchify import finish_native
from ..errors import DecodeWarning, LoaderTimeoutError
from .base import Produced, Producer, RunState, Task, _clock, _Knobs, batch_wall


def kernel_threads(knobs: _Knobs) -> int:
    """Threads a kernel call uses now (``num_threads=0``: the calling thread alone)."""
    n = knobs.num_threads
    return 1 if n == 0 else _threads.resolve_num_threads(n)


def native_worker_init(init: Any, n: int, seed: int, dataset: Any) -> None:
    """Run a loader's ``worker_init_fn`` for the native engine's ``n`` kernel thread slots.

    The native engine has no Python workers and its kernel threads persist: as with
    persistent workers, ``worker_init_fn`` runs once per kernel thread slot, before the first
    batch, on the driver thread, with that slot's worker info."""
    try:
        for wid in range(n):
            set_thread_info(WorkerInfo(wid, n, worker_seed(seed, wid), dataset))
            init(wid)
    finally:
        set_thread_info(None)



@dataclass
class _NativeBatch:
    """A native batch in flight: its slot, its queued kernel pass and what finishing needs."""

    idx: np.ndarray
    target: int
    end: int
    views: list
    timings: np.ndarray | None
    pending: Any            # PendingBatch (None when nothing was queued)
    threads: int
    t_start: int
    number: int | None      # the batch's number in the epoch (None: nothing is planned past it)
    lease: Any = None       # its slot's lease (a successor lease when queued behind a gate)
    gated: bool = False     # queued behind the gate of the slot the user holds (NOTE [ Batches in memory ])


@dataclass
class _TokenBatch:
    """A token batch queued on the kernel team: its task, its slot and the pending rows."""

    task: Task
    views: list
    lease: Any
    gather: Any
    threads: int
    t_start: int


class NativeProducer(Producer):
    """One kernel job per batch straight into an arena slot; labels gathered with ``take``.

    ``submit`` queues the batch on the plan's kernel threads and ``finish`` waits for it, so
    with ``lookahead = 2`` the next batch is queued while this one runs and the threads go
    from one to the next without a pause (NOTE [ One queue across batches ] in
    ``pyx/include/ll_pool.h``). Owns its compiled plan (and so the plan's threads, decoders
    and scratch buffers) for the run; nothing is lent out or handed back.
    """

    lookahead = 2            # batches in production: the next one is queued while this one runs
    team_handed_on = False   # a warm next epoch runs on this run's kernel team (NOTE [ One team across epochs ])

    def __init__(self, *, src: NativeSource, plan: Any, shards: tuple, state: RunState, arena: BatchArena,
                 knobs: _Knobs, recorder: Recorder, on_error: str, batch_size: int, timeout: float | None = None,
                 read_budget: int | None = None) -> None:
        super().__init__(state=state, recorder=recorder, on_error=on_error)
        src = src.at_epoch(state.epoch, state.seed)   # NOTE [ Datasets that change with the epoch ]
        self.src = src
        self.knobs = knobs
        # start() leases (images; tokens queued on the team, NOTE [ Token rows on the kernel team ]);
        # arrays are taken at finish
        self.leases_at_submit = src.kind is not SourceKind.ARRAYS
        # NOTE [ Token batches driven by the consumer ]
        # A token batch is about a tenth of a millisecond of kernel work (64 x 2,048 rows on
        # one core), so a driver thread's hand-over (its wake-up, the queue, the GIL passed
        # between it and the consumer each way) cost as much as the batch: with one, a
        # DataLoader made about half its kernel loop's tokens/s at the default prefetch
        # (benchmarks/token_slots.py) and took 0.0014 / 0.0013 CPU s per M tokens at 2,048 /
        # 8,192 where it now takes 0.0012 / 0.0009 (benchmarks/tokens.py; both runs are in
        # docs/tokens-benchmark.md). Token runs therefore have no driver thread: the
        # consumer's next() finishes the oldest batch in production and queues new ones on the
        # kernel team, which writes them while the user's step runs; ``prefetch`` batches stay
        # in production beyond the one next() returns. What a driver thread did besides is not
        # needed here: a token batch is never short (the kernel fails a bad row, naming it, and
        # has no skip to refill) and runs no user code; a batch fetched by range waits for its
        # chunks within the loader's ``timeout``, one whose files are downloaded whole
        # (``remote_reads="files"``) for the shard cache, whose requests have the store's
        # timeouts and retries. The batch cap of NOTE [ Batches in memory ] does not apply
        # either (depth_for): a batch is 1.5 MiB at 64 x 2,048.
        self.inline = src.kind is SourceKind.TOKENS
        if self.inline:   # the batch next() returns and ``prefetch`` more (the run's value)
            self.lookahead = 1 + max(1, int(knobs.prefetch))
        self.timeout = timeout
        self._team: Any = None   # the token rows' kernel team (created at the first token batch)
        self.plan = plan
        # NOTE [ Read-ahead ] (include/ll_readahead.h): reads apart from the kernel threads.
        self.reader: ReadAhead | None = None
        self.tally = ReadTally()   # the kernel threads' own reads (NOTE [ Every read counts ])
        depth = getattr(knobs, "io_depth", None)
        if plan is not None:   # NOTE [ Remote read-ahead ] too (_extract/remote/readahead.py), via read_ahead_for
            # Under the batch cap (NOTE [ Batches in memory ]) fewer batches run at once than the lookahead.
            cap = getattr(knobs, "depth", None)
            running = self.lookahead if cap is None else min(self.lookahead, cap.cap(self.threads()) - 1)
            self.reader = read_ahead_for(src, state.order.stream, io_depth=depth, batch_size=batch_size,
                                         lookahead=running, timeout=timeout, budget_bytes=read_budget,
                                         start=state.cursor, hint=getattr(knobs, "read_hint", None))
        if self.reader is not None:
            # The first reads go out now: a warm next epoch (NOTE [ Warm slots ]) waits for a batch
            # slot before its first batch, but its reads need none, so they cross the boundary.
            self.reader.top_up(state.cursor)
        self.shards = shards          # per output part: num_shards (None: plain array) or a Pad
        self.arena = arena
        # Leases (weakly) of the batches finished and handed on, oldest first: the slots a gated
        # batch may follow (NOTE [ Batches in memory ]).
        self._handed: collections.deque = collections.deque(maxlen=8)
        self._layouts: dict[int, BatchLayout] = {}
        self._prev_end = 0            # NOTE [ Batch wall time ]
        self._arrays: Sequence[np.ndarray] = src.arrays or ()   # SourceKind.ARRAYS
        self._take_mode = src.take_mode   # np.take's mode for stream indices (NOTE [ Virtual indices ])
        if src.kind is SourceKind.TOKENS:
            parts = src.dataset.token_parts(batch_size)
        elif src.kind is SourceKind.ARRAYS:
            parts = [((batch_size, *a.shape[1:]), a.dtype) for a in self._arrays]
        else:
            parts = [((batch_size, *plan.sample_shape), plan.dtype)]
            if src.labels is not None:
                parts.append(((batch_size, *src.labels.shape[1:]), src.labels.dtype))
        self._part_specs = [(shape[1:], dtype) for shape, dtype in parts]
        # The whole ring now: mapping a slot costs microseconds, its pages are faulted in by
        # the first batch written to it (NOTE [ Large slots come from mmap ]).
        arena.reserve(self._layout(batch_size))

    def threads(self) -> int:
        """Kernel threads a batch runs on now."""
        return kernel_threads(self.knobs)

    def _layout(self, n: int) -> BatchLayout:
        lay = self._layouts.get(n)
        if lay is None:
            parts = (self.src.dataset.token_parts(n) if self.src.kind is SourceKind.TOKENS
                     else [((n, *s), d) for s, d in self._part_specs])
            lay = self._layouts[n] = BatchLayout.of(parts)
        return lay

    def continue_from(self, before: Producer) -> None:
        """Run on the kernel team of ``before``, the epoch before this one, when it has one.

        NOTE [ One team across epochs ]
        Each run compiles its own plan, and a plan starts its kernel team at its first batch.
        A warm next epoch (NOTE [ Warm epochs ] in loader.py) instead runs on the team of the
        epoch before, with its decoders and per-thread scratch: its first batch, queued behind
        the gate of the user's slot (NOTE [ Warm slots ] in base.py), then follows the epoch
        before's last batch on the same queue as a batch mid-epoch does. With a team of its own
        the first batch of every epoch ran while the team before was joined and the heap
        trimmed, and grew its threads' scratch afresh: at 64 ms per file (latencyfs, 2 threads,
        a profiling timeline) it took 142 ms from its gate's opening against 75-88 ms for the
        batches after it. The team goes when no run's plan or queued batch holds it."""
        plan = getattr(before, "plan", None)
        if self.plan is not None and plan is not None and self.plan.share_team(plan):
            before.team_handed_on = True   # type: ignore[attr-defined]

    def done_producing(self) -> None:
        # The last batch is made: the kernel team, its scratch and the read-ahead go now, not
        # when the user has taken the last batches (NOTE [ Warm slots ]); a team the next
        # epoch runs on stays (NOTE [ One team across epochs ]), and so does its scratch.
        trim = self.plan is not None and not self.team_handed_on
        self.close()
        self.reader = None
        if trim:
            _arena.release_free_memory()   # its threads' scratch, before the next run's team grows its own

    def close(self, wait: bool = True) -> None:
        # The token team's threads stop once no queued batch holds it (each holds its team).
        self._team = None
        if self.reader is not None:
            self.reader.close()   # queued reads dropped; batches waiting for bytes give up
        if wait:
            plan, self.plan = self.plan, None
            if plan is not None:
                plan.close()   # its kernel threads stop now (no batch of this run is queued)
            if self.reader is not None:
                # Reads in progress return and the IO threads exit before close() does
                # (NOTE [ Closing the read-ahead ] in pyx/include/ll_readahead.h).
                self.reader.close(wait=True)

    def _finish_arrays(self, task: Task) -> Produced:
        idx = task.indices
        t0 = _clock()
        _lease, views = self.arena.acquire(self._layout(idx.size))
        for a, v in zip(self._arrays, views):
            np.take(a, self.src.rows(idx), axis=0, out=v, mode=self._take_mode)
        if self.rec.enabled:
            dt = _clock() - t0
            self.rec.batch_done(idx.size, {"collate": dt}, dt, 1)
        return Produced(self._structure(views), task.start + idx.size, idx.size, task.target)

    def _token_team(self, threads: int) -> Any:
        team = self._team
        if team is None or not team.usable or team.size < threads:
            team = self._team = _tokens.TokenTeam(threads)
        return team

    def _start_tokens(self, task: Task) -> _TokenBatch:
        """Queue a token batch's rows on the run's kernel team, into a slot leased now
        (NOTE [ Token rows on the kernel team ] in loaderlib/_datasets/tokens/dataset.py)."""
        idx = task.indices
        t0 = _clock()
        ds = self.src.dataset
        rows = self.src.data_index(idx)
        lease, views = self.arena.acquire(self._layout(idx.size))
        threads = self.threads()
        gather = ds.start_gather(rows, views, team=self._token_team(threads), num_threads=threads,
                                 timed=self.rec.enabled, read_ahead=True)   # NOTE [ Token read-ahead ]
        return _TokenBatch(task, views, lease, gather, threads, t0)

    def _finish_tokens(self, b: _TokenBatch) -> Produced:
        """Wait for a token batch and hand it on (NOTE [ Token batches ])."""
        idx = b.task.indices
        try:
            real = b.gather.wait(self.timeout)
        except LoaderTimeoutError as e:   # the wait's own timeout (Gather.wait)
            raise LoaderTimeoutError(f"no batch within timeout={self.timeout} s while batch {b.task.number} of epoch "
                                     f"{self.state.epoch} waited for its token chunks from the store ({e}; raise "
                                     "DataLoader(timeout=...) if the store is just slow)") from None
        batch = self.src.dataset.token_batch(b.views, idx.size)
        read = getattr(b.gather, "read", None)   # chunks fetched by range (NOTE [ Token files read by range ])
        if read is not None:
            self.tally.add(*read)
            if self.rec.enabled:
                self.rec.extract(self.tally.merged(None))
        if self.rec.enabled:
            now = _clock()
            wall = batch_wall(b.t_start, self._prev_end, now)
            self._prev_end = now
            self.rec.batch_done(idx.size, {"collate": b.gather.thread_ns}, wall, b.threads)
            self.rec.tokens(real, idx.size * batch["input_ids"].shape[1] - real)
        return Produced(batch, b.task.start + idx.size, idx.size, b.task.target)

    def _structure(self, views: list) -> Any:
        out = [finish_native(v, k) for v, k in zip(views, self.shards)]
        return out[0] if len(out) == 1 else tuple(out)

    def submit(self, task: Task) -> Any:
        if self.src.kind is SourceKind.TOKENS:
            return self._start_tokens(task)
        if self.src.gathered:
            return task
        return self.start(task.indices, task.target, task.start + task.indices.size, task.number)

    def gate_target(self) -> Any:
        """The lease of the oldest batch handed on whose slot may take a gated successor (the
        slot the user gives back next), or None (NOTE [ Batches in memory ])."""
        if self.src.gathered:
            return None
        if self.reader is not None and not getattr(self.reader, "inline", True):
            # Reading ahead, a batch queued early attaches positions whose reads were not queued
            # yet, and the kernel threads then read those themselves (at the storage's latency):
            # through latencyfs the gate cost 35% at 4 ms and 20% at 16 ms per file (storage.py
            # --latencies 4,16, two rounds against the code before the gate, quiet machine).
            # Where reads are waited for, the hand-over the gate hides is a small share anyway.
            return None
        handed = self._handed
        while handed and handed[0]() is None:
            handed.popleft()
        for ref in handed:
            lease = ref()
            if lease is not None and self.arena.can_follow(lease):
                return lease
        return None

    def submit_after(self, task: Task, lease: Any) -> Any:
        """:meth:`submit` into ``lease``'s slot, queued behind a gate that the lease's release
        opens (NOTE [ Successor leases ] in pyx/_arena.pyx)."""
        return self.start(task.indices, task.target, task.start + task.indices.size, task.number, after=lease)

    def gate_closed(self, handle: Any) -> bool:
        return isinstance(handle, _NativeBatch) and handle.gated and handle.pending.gated()

    def wait_gate(self, handle: Any, timeout: float) -> bool:
        if not isinstance(handle, _NativeBatch) or not handle.gated:
            return False
        return handle.pending.wait_open(timeout)

    def gate_opened_ns(self, handle: Any) -> int:
        """When ``handle``'s gate opened (``perf_counter_ns`` clock; 0: not gated or not yet)."""
        if not isinstance(handle, _NativeBatch) or not handle.gated or handle.pending is None:
            return 0
        return int(handle.pending.handle.opened_ns)

    def ungate(self, handle: Any) -> Any:
        """Take back a gated batch whose gate is still closed and queue it again into a slot
        of its own (the consumer keeps the batch it follows); unchanged when the gate opened."""
        if not self.gate_closed(handle) or not handle.pending.withdraw():
            return handle
        self.arena.clear_gate(handle.lease)
        b = handle
        handle = None
        views, b.views, b.lease, b.pending = b.views, None, None, None
        del views
        return self.start(b.idx, b.target, b.end, b.number)

    def cancel(self, handle: Any) -> None:
        if isinstance(handle, _TokenBatch):
            # Its slot goes back only once the kernels are done with it; rows still waiting for
            # chunks from the store are given up, not waited for.
            handle.gather.abandon()
            return
        if isinstance(handle, _NativeBatch) and handle.pending is not None:
            if handle.gated and handle.pending.withdraw():
                self.arena.clear_gate(handle.lease)   # nothing ran: its slot stays the holder's
                return
            handle.pending.wait()   # its slot goes back only once the kernels are done with it

    def finish(self, handle: Any) -> Produced | None:
        if self.src.kind is SourceKind.ARRAYS:
            return self._finish_arrays(handle)
        if isinstance(handle, _TokenBatch):
            return self._finish_tokens(handle)
        res = self.complete(handle)
        if res is None:
            return None
        out, _sel, stages, rows, nthreads, wall, end = res
        if handle.lease is not None:
            self._handed.append(weakref.ref(handle.lease))
        if self.rec.enabled:
            self.rec.batch_done(len(out[0]), stages, wall, nthreads, rows)
        return Produced(self._structure(out), end, len(out[0]), handle.target)

    def produce(self, idx: np.ndarray, n: int, end: int) -> tuple | None:
        """Run the plan for ``idx`` into a slot and wait: :meth:`start` then :meth:`complete`."""
        return self.complete(self.start(idx, n, end))

    def start(self, idx: np.ndarray, n: int, end: int, number: int | None = None, after: Any = None) -> _NativeBatch:
        """Lease a slot for ``n`` samples and queue the kernel pass of ``idx`` into it. ``end``
        is the stream position after ``idx``; ``number`` the batch's number in the epoch when
        later batches may already be planned. ``after``: the lease of a slot still held whose
        release starts the pass (a successor lease and a gate, NOTE [ Batches in memory ]); a
        free slot as usual when that slot cannot take one."""
        nthreads = kernel_threads(self.knobs)
        t_start = _clock()
        got = self.arena.acquire_after(after, self._layout(n)) if after is not None and idx.size else None
        gated = got is not None
        lease, views = got if got is not None else self.arena.acquire(self._layout(n))
        k = idx.size
        tim = np.zeros((k, 3), np.int64) if self.rec.enabled else None
        st_run = self.state
        pending = None
        if k:
            reader = self.reader
            if reader is not None:
                reader.top_up(end - k)
            pending = self.src.run(self.plan, idx, views[0][:k], seed=st_run.seed, epoch=st_run.epoch,
                                   num_threads=min(nthreads, k), timings=tim, wait=False,
                                   positions=np.arange(end - k, end, dtype=np.int64), reader=reader, gated=gated)
            if reader is not None:
                reader.attached(end)
            if gated:
                self.arena.set_gate(lease, pending.handle)
        return _NativeBatch(idx, n, end, views, tim, pending, nthreads, t_start, number, lease, gated)

    def complete(self, b: _NativeBatch) -> tuple | None:
        """Wait for a started batch; with on_error="skip", fill it up to its target from the
        stream (NOTE [ The epoch is one stream ]).

        Returns ``(arrays, indices, stage_ns, per_sample_ns, threads, wall_ns, end)`` or None
        when no sample could be loaded; ``arrays`` are the images (and labels) views and
        ``end`` the stream position after the last sample used or skipped.
        """
        n, end, views, nthreads = b.target, b.end, b.views, b.threads
        # A batch started before recording was switched on has no timings: it is not recorded.
        recording = self.rec.enabled and b.timings is not None
        images = views[0]
        stage = np.zeros(3, np.int64)
        per_sample: list[np.ndarray] = []
        final: list[np.ndarray] = []
        filled = 0
        todo = b.idx
        st_run = self.state
        seed, epoch = st_run.seed, st_run.epoch
        first, tim = b.pending, b.timings
        todo_start = end - todo.size
        while todo.size:
            k = todo.size
            if first is not None:
                st, first = first.result(), None
            else:   # a fill after failures (rare): run it and wait
                tim = np.zeros((k, 3), np.int64) if recording else None
                st = self.src.run(self.plan, todo, images[filled:filled + k], seed=seed, epoch=epoch,
                                  num_threads=min(nthreads, k), timings=tim, reader=self.reader,
                                  positions=np.arange(todo_start, todo_start + k, dtype=np.int64))
            self.tally.add_batch(getattr(st, "reads", None))
            if recording and tim is not None:
                stage += tim.sum(axis=0)
                per_sample.append(tim)
            for j, why in getattr(st, "warnings", {}).items():
                # Decoded, but libjpeg had to recover from corrupt data (e.g. a truncated file).
                warnings.warn(f"sample {int(todo[j])} {self.src.source(todo[j])!r} decoded from corrupt data "
                              f"({why}); pass Decode(strict=True) to refuse such images", DecodeWarning,
                              stacklevel=2)
            ok = np.asarray(st.ok, dtype=bool)
            if ok.all():
                final.append(todo)
                filled += k
            else:
                bad = np.flatnonzero(~ok)
                if self.on_error == "raise":
                    raise native_error(self.src, st, bad[0], todo)
                for j in bad.tolist():
                    err = native_error(self.src, st, j, todo)   # a DecodeError or RemoteReadError
                    self.skipped(todo[j], self.src.source(todo[j]), err.reason)
                good = np.flatnonzero(ok)
                if good.size:
                    # Rare path (failures only): move the good samples up, closing the gaps.
                    block = images[filled:filled + k]
                    block[:good.size] = block[good]
                final.append(todo[good])
                filled += good.size
            need = n - filled
            if need > 0 and self.on_error == "skip":
                if b.number is not None:
                    # The fill is the next samples of the stream (NOTE [ The epoch is one
                    # stream ]); the batch queued behind this one was planned with them, so it
                    # is void and planned again after the fill (the driver cancels it).
                    st_run.replan_from(end, b.number + 1)
                    b.number = None
                todo, start = st_run.take(need)
                end = start + todo.size
                todo_start = start
            else:
                todo = todo[:0]
        reader = self.reader
        if reader is not None:
            reader.adapt(nthreads)
            reader.top_up()
        if recording and (reader is not None or self.tally.reads):
            self.rec.extract(self.tally.merged(reader.counters() if reader is not None else None))
        if filled == 0:
            return None
        sel = np.concatenate(final) if len(final) > 1 else final[0]
        out = [images[:filled]]
        t_col = _clock()
        if self.src.labels is not None:
            lab = views[1][:filled]
            np.take(self.src.labels, self.src.rows(sel), axis=0, out=lab, mode=self._take_mode)
            out.append(lab)
        now = _clock()
        stages: dict[str, int] = {}
        rows: np.ndarray | None = None
        if recording:
            stages = {"read": int(stage[0]), "decode": int(stage[1]), "transform": int(stage[2]),
                      "collate": now - t_col}
            rows = np.concatenate(per_sample)[:filled] if per_sample else None
        wall = batch_wall(b.t_start, self._prev_end, now)
        self._prev_end = now
        return out, sel, stages, rows, nthreads, wall, end

