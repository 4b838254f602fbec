"""The stage recorder: what every engine feeds while it runs, and ``loader.stats`` reads.

NOTE [ Recorder threading ]
The recorder is written to by up to three kinds of thread at once: the pipeline's producer
(one call to :meth:`StageRecorder.batch_done` per batch, possibly from several pool threads
in the Python engines), the consumer (:meth:`~StageRecorder.consumer_waited`, once per
``next()``), and whoever watches the queue (:meth:`~StageRecorder.queue_depth`). A reader
(``loader.stats``, the dashboard, the harness) may call :meth:`~StageRecorder.snapshot` at
any time. To keep the hot path cheap:

* ``batch_done`` takes one short lock; everything per batch is folded in there.
* ``consumer_waited``, ``producer_blocked`` and ``queue_depth`` take no lock: they append one
  tuple to a ``collections.deque``, whose ``append`` is atomic in CPython, and the events
  are folded into the totals under the batch lock (by the next ``batch_done`` or
  ``snapshot``), each in the time-series bin of its own timestamp. Several writers can
  call them at once without losing an event.
* ``python_gil`` assigns one dict item (atomic).
* Disabled, every method returns after one attribute test, and the engines skip reading
  clocks altogether (they pass ``timings=None`` to the kernels).

NOTE [ Stage time and busy fraction ]
``stage_ns`` is *thread time*: the nanoseconds that threads spent in a stage, summed over
the batch's samples. ``wall_ns`` is the producer's wall time for the batch and ``threads``
the number of threads that worked on it, so ``threads * wall_ns`` is the thread time that
was available. Their ratio, summed over batches, is the pool's busy fraction: near 1 means
the pool is saturated (more threads would help, if there are cores), well below 1 means the
pool waits for something else (the queue, the GIL, I/O it does not time).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping

import numpy as np

from .stats import STAGES, Stats, busy_fraction

__all__ = ["STAGES", "StageRecorder", "Stats"]

_NSTAGES = len(STAGES)
_STAGE_INDEX = {name: i for i, name in enumerate(STAGES)}

# Event kinds folded in under the batch lock (see NOTE [ Recorder threading ]).
_EV_WAIT = 0
_EV_BLOCKED = 1
_EV_QUEUE = 2

# The recorder's monotonic clock (a module global so tests can drive time explicitly).
_clock = time.perf_counter_ns


class _Bin:
    """Accumulators of one time-series bin (``series_interval`` seconds of the epoch)."""

    __slots__ = ("capacity_ns", "index", "q_n", "q_sum", "samples", "stage_ns", "threads", "wait_ns")

    def __init__(self, index: int, threads: int) -> None:
        self.index = index
        self.samples = 0
        self.stage_ns = [0] * _NSTAGES
        self.capacity_ns = 0
        self.wait_ns = 0
        self.q_sum = 0
        self.q_n = 0
        self.threads = threads


class StageRecorder:
    """Per-stage timings of one loader's current (or last) epoch.

    The engines call the recording methods; users read :meth:`snapshot` (``loader.stats``).
    All recording methods are no-ops when the recorder is disabled.

    Parameters
    ----------
    enabled : bool
        Record or not. Can be changed at any time through :attr:`enabled`.
    sample_window : int
        How many recent per-sample rows are kept for the p50/p99 figures.
    series_interval : float
        Width in seconds of one point of the time series (the dashboard redraws about twice
        a second, hence 0.5).
    series_len : int
        How many time-series points are kept (the most recent ones).

    Notes
    -----
    Thread-safe; see NOTE [ Recorder threading ] in this module for what each method costs.
    """

    def __init__(
        self,
        enabled: bool = True,
        *,
        sample_window: int = 8192,
        series_interval: float = 0.5,
        series_len: int = 240,
    ) -> None:
        if sample_window < 1 or series_len < 1 or not series_interval > 0:
            raise ValueError("sample_window and series_len must be >= 1 and series_interval > 0")
        self._enabled = bool(enabled)
        self._lock = threading.Lock()
        self._events: collections.deque = collections.deque()
        self._gil: dict[str, bool] = {}
        self._window = int(sample_window)
        self._interval_ns = int(series_interval * 1e9)
        self._series: collections.deque = collections.deque(maxlen=int(series_len))
        self._rows = np.zeros((self._window, _NSTAGES), dtype=np.float64)
        self.reset()

    # -- configuration -------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Whether the recorder records (and the engines read clocks)."""
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = bool(value)

    def reset(self) -> None:
        """Forget everything recorded (thread count and batch size included)."""
        with self._lock:
            self._reset_epoch(0, 0)
            self._gil.clear()

    def _reset_epoch(self, num_threads: int, batch_size: int) -> None:
        # Caller holds the lock.
        self._events.clear()
        self._t0 = _clock()
        self._t_last = self._t0
        self._num_threads = int(num_threads)
        self._batch_size = int(batch_size)
        self._batches = 0
        self._samples = 0
        self._stage_ns = [0] * _NSTAGES
        self._wall_ns = 0
        self._capacity_ns = 0
        self._wait_ns = 0
        self._waits = 0
        self._blocked_ns = 0
        self._q_depth = 0
        self._q_capacity = 0
        self._q_sum = 0
        self._q_n = 0
        self._row_pos = 0
        self._row_count = 0
        self._rows_from_samples = 0
        self._rows_from_batches = 0
        self._series.clear()
        self._bin = _Bin(0, self._num_threads)

    # -- recording (engine side) ---------------------------------------------------------
    def epoch_started(self, num_threads: int, batch_size: int) -> None:
        """Start a new epoch: clear the previous epoch's figures and start its clock."""
        if not self._enabled:
            return
        with self._lock:
            gil = dict(self._gil)
            self._reset_epoch(num_threads, batch_size)
            self._gil.update(gil)  # which steps hold the GIL is a property of the pipeline

    def batch_done(
        self,
        n_samples: int,
        stage_ns: Mapping[str, int],
        wall_ns: int,
        threads: int,
        per_sample_ns: np.ndarray | None = None,
    ) -> None:
        """Record one finished batch.

        Parameters
        ----------
        n_samples : int
            Samples in the batch.
        stage_ns : mapping of str to int
            Thread time in nanoseconds per stage (keys from :data:`STAGES`), summed over the
            batch's samples. Missing stages count as 0.
        wall_ns : int
            Producer wall time for the batch.
        threads : int
            Threads that worked on the batch.
        per_sample_ns : numpy.ndarray, optional
            ``(n_samples, k)`` nanoseconds per sample for the first ``k <= len(STAGES)``
            stages (the kernels' ``(N, 3)`` read/decode/transform timings fit as they are).
            Used for p50/p99; without it the batch's per-sample mean stands for each sample.
        """
        if not self._enabled:
            return
        now = _clock()
        stage = [0] * _NSTAGES
        for name, ns in stage_ns.items():
            try:
                stage[_STAGE_INDEX[name]] = int(ns)
            except KeyError:
                raise ValueError(f"unknown stage {name!r}; stages are {STAGES}") from None
        n = int(n_samples)
        rows = None
        if per_sample_ns is not None and n > 0:
            arr = np.asarray(per_sample_ns)
            if arr.ndim != 2 or arr.shape[0] != n or not 1 <= arr.shape[1] <= _NSTAGES:
                raise ValueError(
                    f"per_sample_ns must have shape ({n}, k) with 1 <= k <= {_NSTAGES}, got {arr.shape}"
                )
            rows = np.empty((n, _NSTAGES), dtype=np.float64)
            k = arr.shape[1]
            rows[:, :k] = arr
            for j in range(k, _NSTAGES):
                rows[:, j] = stage[j] / n
        threads = int(threads)
        wall_ns = int(wall_ns)
        with self._lock:
            self._fold_events()
            self._advance_bin(now)
            self._t_last = now
            self._batches += 1
            self._samples += n
            self._num_threads = threads
            st = self._stage_ns
            b = self._bin
            for j in range(_NSTAGES):
                st[j] += stage[j]
                b.stage_ns[j] += stage[j]
            self._wall_ns += wall_ns
            self._capacity_ns += threads * wall_ns
            b.samples += n
            b.capacity_ns += threads * wall_ns
            b.threads = threads
            if n > 0:
                if rows is None:
                    self._push_rows(np.array([stage], dtype=np.float64) / n)
                    self._rows_from_batches += 1
                else:
                    self._push_rows(rows)
                    self._rows_from_samples += 1

    def consumer_waited(self, ns: int) -> None:
        """The user's ``next(iterator)`` blocked ``ns`` nanoseconds waiting for a batch."""
        if not self._enabled:
            return
        self._events.append((_EV_WAIT, ns, 0, _clock()))

    def producer_blocked(self, ns: int) -> None:
        """The pipeline waited ``ns`` nanoseconds because the prefetch queue was full."""
        if not self._enabled:
            return
        self._events.append((_EV_BLOCKED, ns, 0, _clock()))

    def queue_depth(self, depth: int, capacity: int) -> None:
        """The prefetch queue holds ``depth`` ready batches out of ``capacity``."""
        if not self._enabled:
            return
        self._events.append((_EV_QUEUE, depth, capacity, _clock()))

    def python_gil(self, stage: str, held: bool) -> None:
        """Note whether the Python step of ``stage`` holds the GIL while it runs."""
        if not self._enabled:
            return
        if stage not in _STAGE_INDEX:
            raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
        self._gil[stage] = bool(held)

    # -- internals (caller holds the lock) -----------------------------------------------
    def _fold_events(self) -> None:
        ev = self._events
        while True:
            try:
                kind, a, c, t = ev.popleft()
            except IndexError:
                return
            self._advance_bin(t)  # each event lands in the series bin of its own time
            b = self._bin
            if kind == _EV_WAIT:
                self._wait_ns += int(a)
                self._waits += 1
                b.wait_ns += int(a)
            elif kind == _EV_BLOCKED:
                self._blocked_ns += int(a)
            else:
                self._q_depth = int(a)
                self._q_capacity = int(c)
                self._q_sum += int(a)
                self._q_n += 1
                b.q_sum += int(a)
                b.q_n += 1

    def _advance_bin(self, now: int) -> None:
        index = (now - self._t0) // self._interval_ns
        b = self._bin
        if index <= b.index:
            return
        self._series.append(b)
        # Bins in which nothing finished are real: the pipeline delivered nothing then.
        first_gap = max(b.index + 1, index - self._series.maxlen)
        for i in range(first_gap, index):
            self._series.append(_Bin(i, b.threads))
        self._bin = _Bin(index, b.threads)

    def _push_rows(self, rows: np.ndarray) -> None:
        w = self._window
        if rows.shape[0] >= w:
            self._rows[:] = rows[-w:]
            self._row_pos = 0
            self._row_count = w
            return
        end = self._row_pos + rows.shape[0]
        if end <= w:
            self._rows[self._row_pos:end] = rows
        else:
            k = w - self._row_pos
            self._rows[self._row_pos:] = rows[:k]
            self._rows[: end - w] = rows[k:]
        self._row_pos = end % w
        self._row_count = min(w, self._row_count + rows.shape[0])

    # -- reading -------------------------------------------------------------------------
    def snapshot(self) -> Stats:
        """A consistent copy of the current epoch's figures (cheap; safe while running)."""
        now = _clock()
        with self._lock:
            if self._enabled:
                self._fold_events()
                self._advance_bin(now)
            rows = self._rows[: self._row_count].copy()
            bins = list(self._series)
            cur = self._bin
            interval = self._interval_ns
            bins_out = [(x.index * interval, interval, x) for x in bins]
            if cur.samples or cur.wait_ns or cur.q_n:
                start = cur.index * interval
                dur = max(now - self._t0 - start, 1)
                bins_out.append((start, min(dur, interval), _copy_bin(cur)))
            if self._rows_from_samples and self._rows_from_batches:
                source = "mixed"
            elif self._rows_from_samples:
                source = "per-sample"
            elif self._rows_from_batches:
                source = "per-batch mean"
            else:
                source = "none"
            state = {
                "enabled": self._enabled,
                "num_threads": self._num_threads,
                "batch_size": self._batch_size,
                "batches": self._batches,
                "samples": self._samples,
                "elapsed_ns": self._t_last - self._t0,
                "stage_ns": tuple(self._stage_ns),
                "wall_ns": self._wall_ns,
                "capacity_ns": self._capacity_ns,
                "wait_ns": self._wait_ns,
                "waits": self._waits,
                "blocked_ns": self._blocked_ns,
                "q_depth": self._q_depth,
                "q_capacity": self._q_capacity,
                "q_mean": self._q_sum / self._q_n if self._q_n else 0.0,
                "gil": dict(self._gil),
                "percentile_source": source,
            }
        return _build_stats(state, rows, bins_out)


def _copy_bin(b: _Bin) -> _Bin:
    c = _Bin(b.index, b.threads)
    c.samples, c.stage_ns, c.capacity_ns = b.samples, list(b.stage_ns), b.capacity_ns
    c.wait_ns, c.q_sum, c.q_n = b.wait_ns, b.q_sum, b.q_n
    return c


def _build_stats(s: dict, rows: np.ndarray, bins: list) -> Stats:
    samples = s["samples"]
    elapsed = s["elapsed_ns"] / 1e9
    stage_total = {name: s["stage_ns"][i] / 1e9 for i, name in enumerate(STAGES)}
    stage_mean = {
        name: (s["stage_ns"][i] / samples / 1e6 if samples else 0.0) for i, name in enumerate(STAGES)
    }
    if rows.shape[0]:
        pct = np.percentile(rows, [50, 99], axis=0) / 1e6
        p50 = {name: float(pct[0, i]) for i, name in enumerate(STAGES)}
        p99 = {name: float(pct[1, i]) for i, name in enumerate(STAGES)}
    else:
        p50 = {name: 0.0 for name in STAGES}
        p99 = {name: 0.0 for name in STAGES}

    t_s, sps, busy, waitf, qd, thr = [], [], [], [], [], []
    per_stage: dict[str, list] = {name: [] for name in STAGES}
    for start, dur, b in bins:
        d = dur / 1e9
        t_s.append((start + dur) / 1e9)
        sps.append(b.samples / d)
        busy.append(busy_fraction(sum(b.stage_ns), b.capacity_ns))
        waitf.append(min(1.0, b.wait_ns / dur))
        qd.append(b.q_sum / b.q_n if b.q_n else float("nan"))
        thr.append(float(b.threads))
        for i, name in enumerate(STAGES):
            per_stage[name].append(b.stage_ns[i] / 1e9)
    series = {
        "t_s": tuple(t_s),
        "samples_per_s": tuple(sps),
        "busy_fraction": tuple(busy),
        "consumer_wait_fraction": tuple(waitf),
        "queue_depth": tuple(qd),
        "threads": tuple(thr),
    }
    series.update({f"stage_s.{name}": tuple(v) for name, v in per_stage.items()})

    return Stats(
        enabled=s["enabled"],
        num_threads=s["num_threads"],
        batch_size=s["batch_size"],
        batches=s["batches"],
        samples=samples,
        elapsed_s=elapsed,
        samples_per_s=samples / elapsed if elapsed > 0 else 0.0,
        batches_per_s=s["batches"] / elapsed if elapsed > 0 else 0.0,
        stage_total_s=stage_total,
        stage_mean_ms=stage_mean,
        stage_p50_ms=p50,
        stage_p99_ms=p99,
        percentile_source=s["percentile_source"],
        producer_wall_s=s["wall_ns"] / 1e9,
        thread_capacity_s=s["capacity_ns"] / 1e9,
        busy_fraction=busy_fraction(sum(s["stage_ns"]), s["capacity_ns"]),
        consumer_wait_s=s["wait_ns"] / 1e9,
        consumer_waits=s["waits"],
        producer_blocked_s=s["blocked_ns"] / 1e9,
        queue_depth=s["q_depth"],
        queue_capacity=s["q_capacity"],
        queue_depth_mean=s["q_mean"],
        gil_held=s["gil"],
        series=series,
    )
