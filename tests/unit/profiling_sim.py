"""A simulated loader on an injected clock, for testing the profiling accounting without real time.

``SimLoader`` looks to the harness and the dashboard like a ``loaderlib.DataLoader`` (a
``recorder``, ``stats``, ``num_threads``, ``prefetch``, ``batch_size``, ``len``), but nothing
runs: a discrete-event model of one producer (the pool) feeding a prefetch queue decides
when each batch is finished and when the consumer would have to wait, and the
:class:`FakeClock` jumps from event to event. The recorder receives synthetic stage records
(thread time per stage, wall time, threads) exactly as an engine sends them, so everything
the harness, the verdict and the dashboard compute from them is deterministic.

Time passes only inside ``next()`` (waiting for a batch) and inside :meth:`SimLoader.model`
(the consumer's model step); the harness's own bookkeeping takes no time at all.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from loaderlib.profiling import STAGES, StageRecorder


class FakeClock:
    """A monotonic nanosecond clock that moves only when told to."""

    def __init__(self) -> None:
        self.t = 1_000_000_000

    def __call__(self) -> int:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += round(seconds * 1e9)

    def to(self, t_ns: int) -> None:
        self.t = max(self.t, int(t_ns))


class SimLoader:
    """A pipeline with a fixed cost per batch, on a :class:`FakeClock`.

    Parameters
    ----------
    clock : FakeClock
        The clock (the test installs it as ``loaderlib._observe.stats._clock``).
    n_batches : int
        Batches per epoch.
    batch_s : float or callable
        Seconds the pool needs per batch; a callable gets ``(epoch number from 1, batch
        index, start time in seconds)`` and returns them (to make a run noisy or disturbed).
    shares : dict or callable
        Stage -> share of the batch's stage thread time; a callable gets ``(epoch number from
        1, batch index)`` and returns them (batch-to-batch spread, scripted).
    busy : float
        Share of the pool's thread time spent in stages while it builds a batch.
    threads, batch_size, prefetch : int
        As a DataLoader's.
    startup_s : float
        Time from ``iter()`` until the pool starts the epoch's first batch (the refill).
    """

    engine = "sim"

    def __init__(self, clock, n_batches=1000, batch_s=0.01, shares=None, busy=0.95, threads=2,
                 batch_size=16, prefetch=2, startup_s=0.0, gil_held=None, extract=None):
        self.clock = clock
        self.n_batches = n_batches
        self.batch_s = batch_s
        self.shares = shares or {"decode": 0.9, "read": 0.05, "transform": 0.05}
        self.busy = busy
        self.num_threads = threads
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.startup_s = startup_s
        self.extract = extract   # read-stage counters an engine would report after each batch
        self.recorder = StageRecorder()
        self.iters = 0
        self._it = None
        if gil_held:
            for stage, held in gil_held.items():
                self.recorder.python_gil(stage, held)

    def __len__(self):
        return self.n_batches

    @property
    def stats(self):
        return self.recorder.snapshot()

    def __iter__(self):
        self.iters += 1
        self._it = _SimIter(self, self.iters)
        return self._it

    def model(self, seconds):
        """A model step of ``seconds``: the pipeline goes on meanwhile."""
        def step(_batch):
            it = self._it
            if it is None:
                self.clock.advance(seconds)
            else:
                it.run_until(self.clock.t + round(seconds * 1e9))
        return step


class _SimIter:
    def __init__(self, loader, number):
        self.loader = loader
        self.number = number
        self.rec = loader.recorder
        self.rec.epoch_started(loader.num_threads, loader.batch_size)
        self.ready = 0            # finished batches waiting in the queue
        self.started = 0          # batches the pool has started
        self.taken = 0            # batches handed to the consumer
        self.finish = None        # when the batch in progress finishes (ns), None when idle
        self._start(loader.clock.t + round(loader.startup_s * 1e9))

    def _cost(self, k, start_ns):
        b = self.loader.batch_s
        return b(self.number, k, start_ns / 1e9) if callable(b) else b

    def _start(self, at_ns):
        if self.started >= self.loader.n_batches:
            self.finish = None
            return
        self.cost = self._cost(self.started, at_ns)
        self.k = self.started
        self.finish = at_ns + round(self.cost * 1e9)
        self.started += 1

    def run_until(self, t_ns):
        """Let the pool work until ``t_ns``, recording each batch when it finishes."""
        ld = self.loader
        while self.finish is not None and self.finish <= t_ns:
            ld.clock.to(self.finish)
            threads = ld.num_threads
            thread_ns = self.cost * 1e9 * threads * ld.busy
            shares = ld.shares(self.number, self.k) if callable(ld.shares) else ld.shares
            stage = {k: int(thread_ns * shares.get(k, 0.0)) for k in STAGES}
            self.rec.batch_done(ld.batch_size, stage, round(self.cost * 1e9), threads)
            self.ready += 1
            self.rec.queue_depth(self.ready, ld.prefetch)
            if ld.extract is not None:
                self.rec.extract(ld.extract)
            if self.ready < ld.prefetch:
                self._start(self.finish)
            else:
                self.finish = None  # the queue is full: the pool waits for the consumer
        ld.clock.to(t_ns)

    def __iter__(self):
        return self

    def __next__(self):
        ld = self.loader
        t = ld.clock.t
        if self.ready == 0:
            if self.finish is None:  # nothing in progress and nothing ready: the epoch is over
                self.rec.consumer_waited(0)
                ld._it = None
                raise StopIteration
            self.run_until(self.finish)
        self.ready -= 1
        self.taken += 1
        self.rec.queue_depth(self.ready, ld.prefetch)
        self.rec.consumer_waited(ld.clock.t - t)
        if self.finish is None:  # the pool was blocked on a full queue: room again
            self._start(ld.clock.t)
        return np.zeros((ld.batch_size, 1), np.uint8), np.zeros(ld.batch_size, np.int64)

    def close(self):
        self.loader._it = None


class FakeMonitor:
    """Stands in for the harness's resource monitor: given CPU figures, no sampling."""

    cores = 1.0
    other_cores = 0.0
    top_others: ClassVar[list] = []

    def __init__(self, *args, **kwargs):
        self.source = "test"
        self.peak_rss = 123 * 2**20
        self.other_cores = type(self).other_cores
        self.top_others = list(type(self).top_others)

    def start(self):
        pass

    def stop(self):
        return type(self).cores
