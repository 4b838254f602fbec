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
the batch's samples. The pool's *capacity* is its threads times the wall time, credited as
the clock runs (a change of thread count counts from the moment it is reported). The busy
fraction is stage thread time over capacity, always over the same stretch of time (an
epoch, one time bin, or a window cut from the bins by ``stats.window_of``), computed by
the one function ``stats.busy_fraction``.

Each batch's stage time is spread over its wall time (``wall_ns`` ends when ``batch_done``
is called) into the time bins. A batch built while the previous one was still in flight
(NOTE [ Batch wall time ] in ``_engines/base.py``) did part of its work before its own wall
time began, so a bin can receive more stage time than the pool had in it; the excess is
moved back into the latest earlier bins that have room, which is where that work was done.
So no bin, and no window cut from bins, is ever busier than 100% of its threads. Thread
time that fits nowhere (a loader reporting more threads' work than it has threads) is kept
apart as ``unattributed`` rather than silently stretching the figure past 100%.

NOTE [ Epoch boundaries ]
The consumer's first wait of an epoch is the pipeline refilling from empty (sampler, plan,
first batches), a cost of starting an epoch rather than of any stage; it is recorded as the
epoch's *boundary wait*, apart from the steady-state waits the verdict reads. The other way
round, a warm next epoch (NOTE [ Warm epochs ] in ``loader.py``) builds its first batches
while the previous epoch is still consumed; their records arrive when the epoch starts and
their wall time lies before it. That part of their stage time is kept as the epoch's
*ahead* time (``Stats.ahead_stage_s``): it is real work of the epoch's samples, done in the
previous epoch's time, so it is not placed in this epoch's bins (``stats.window_of`` adds
it back when a window spans the boundary).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from .._checks import check_int
from . import stats as _stats
from .stats import STAGES, ExtractStats, Stats, busy_fraction

__all__ = ["STAGES", "StageRecorder", "Stats"]

_NSTAGES = len(STAGES)
_STAGE_INDEX = {name: i for i, name in enumerate(STAGES)}

class Recorder(Protocol):
    """What an engine calls on its recorder while it runs: a :class:`StageRecorder`, or a front
    that holds a warm run's records (``_engines.handoff.HeldRecorder``). Each call is cheap when
    ``enabled`` is false, and the engines skip reading clocks then (NOTE [ Recorder threading ])."""

    @property
    def enabled(self) -> bool: ...

    def batch_done(self, n_samples: int, stage_ns: Mapping[str, int], wall_ns: int, threads: int,
                   per_sample_ns: np.ndarray | None = None) -> None: ...

    def consumer_waited(self, ns: int) -> None: ...

    def producer_blocked(self, ns: int) -> None: ...

    def queue_depth(self, depth: int, capacity: int) -> None: ...

    def extract(self, counters: dict) -> None: ...

    def tokens(self, real: int, padding: int) -> None: ...

    def python_gil(self, stage: str, held: bool) -> None: ...


# Event kinds folded in under the batch lock (see NOTE [ Recorder threading ]).
_EV_WAIT = 0
_EV_BLOCKED = 1
_EV_QUEUE = 2

# How many bins before a batch's own may take its overflowing stage time.
_WALK_BACK = 8

# NOTE [ Per-batch log ]
# Besides the time bins (``series_interval``, 0.5 s by default) the recorder keeps each of the
# epoch's last BATCH_LOG batches: when it ended and its stage thread time. A bin mixes every
# batch that ended in it, so a window of a few bins holds only a few independent figures; the
# verdict's intervals (NOTE [ Verdict rules ] in ``loaderlib.profiling.verdict``) need one
# figure per batch, so a window of ten batches is ten observations whatever its length.
# 4096 entries of 8 numbers cost about 1 MB and cover the length of any window the harness and
# the dashboard judge at the usual batch rates.
BATCH_LOG = 4096


def _clock() -> int:
    # The profiling clock, looked up at each call so a test's clock reaches the recorder too.
    return _stats._clock()


class _Bin:
    """Accumulators of one time-series bin (``series_interval`` seconds of the epoch)."""

    __slots__ = ("batches", "boundary_ns", "capacity_ns", "index", "q_n", "q_sum", "samples", "stage_ns",
                 "threads", "wait_ns")

    def __init__(self, index: int, threads: int) -> None:
        self.index = index
        self.samples = 0
        self.batches = 0
        self.stage_ns = [0.0] * _NSTAGES
        self.capacity_ns = 0.0
        self.wait_ns = 0.0
        self.boundary_ns = 0.0
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
        series_len: int = 1200,
    ) -> None:
        check_int(sample_window, "sample_window", minimum=1)
        check_int(series_len, "series_len", minimum=1)
        if not series_interval > 0:
            raise ValueError(f"series_interval must be > 0, got {series_interval!r}")
        self._enabled = bool(enabled)
        self._lock = threading.Lock()
        self._events: collections.deque = collections.deque()
        self._gil: dict[str, bool] = {}
        self._window = int(sample_window)
        self._interval_ns = int(series_interval * 1e9)
        self._series_len = int(series_len)
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
        self._previous: Stats | None = None

    def _reset_epoch(self, num_threads: int, batch_size: int) -> None:
        # Caller holds the lock.
        self._events.clear()
        self._t0 = _clock()
        self._t_last = self._t0
        self._cap_t = self._t0          # capacity is credited up to here
        self._num_threads = int(num_threads)
        self._batch_size = int(batch_size)
        self._batches = 0
        self._samples = 0
        self._stage_ns = [0] * _NSTAGES
        self._ahead_ns = [0.0] * _NSTAGES
        self._unattributed_ns = 0.0
        self._wall_ns = 0
        self._capacity_ns = 0.0
        self._wait_ns = 0
        self._boundary_ns = 0
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
        self._bins: collections.deque = collections.deque([_Bin(0, self._num_threads)], maxlen=self._series_len)
        self._extract: dict | None = None
        self._tokens = [0, 0]   # tokens and padding positions delivered (token datasets)
        # Each batch's end, samples and stage thread time (NOTE [ Per-batch log ]).
        self._batch_log: collections.deque = collections.deque(maxlen=BATCH_LOG)

    # -- recording (engine side) ---------------------------------------------------------
    def epoch_started(self, num_threads: int, batch_size: int) -> None:
        """Start a new epoch: clear the previous epoch's figures and start its clock."""
        if not self._enabled:
            return
        with self._lock:
            ended = self._capture() if self._batches else None
            gil = dict(self._gil)
            self._reset_epoch(num_threads, batch_size)
            self._gil.update(gil)  # which steps hold the GIL is a property of the pipeline
        self._previous = _build_stats(*ended) if ended is not None else None

    def previous_epoch(self) -> Stats | None:
        """The final figures of the epoch before the current one (None if there was none).

        A reader that polls (the dashboard) sees an epoch's last moments here even when its
        last poll came before the epoch ended.
        """
        return self._previous

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
            Producer wall time for the batch, ending now (NOTE [ Batch wall time ]).
        threads : int
            Threads the pool had for the batch (its capacity from now on).
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
        wall_ns = max(0, int(wall_ns))
        with self._lock:
            self._fold_events()
            if self._num_threads == 0:  # no epoch_started: the first batch says how many threads
                self._num_threads = threads
            self._credit(now)  # the time up to now had the previous thread count
            self._t_last = max(self._t_last, now)
            self._batches += 1
            self._samples += n
            self._num_threads = threads
            st = self._stage_ns
            for j in range(_NSTAGES):
                st[j] += stage[j]
            self._place_stage(stage, now - wall_ns, now)
            self._batch_log.append((now, n, tuple(stage)))
            self._wall_ns += wall_ns
            b = self._bin(self._index(now - 1))  # a batch ending on a bin's edge belongs to the bin it ends
            if b is not None:   # None only after a jump longer than the series (an event stamped later)
                b.samples += n
                b.batches += 1
                b.threads = threads
            if n > 0:
                if rows is None:
                    self._push_rows(np.array([stage], dtype=np.float64) / n)
                    self._rows_from_batches += 1
                else:
                    self._push_rows(rows)
                    self._rows_from_samples += 1

    def consumer_waited(self, ns: int) -> None:
        """The user's ``next(iterator)`` blocked ``ns`` nanoseconds waiting for a batch (until now)."""
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

    def extract(self, counters: dict) -> None:
        """The read-ahead stage's latest counters (cumulative over the epoch); one assignment,
        no lock (NOTE [ Recorder threading ])."""
        if not self._enabled:
            return
        self._extract = counters

    def tokens(self, real: int, padding: int) -> None:
        """A token batch held ``real`` input positions with a token and ``padding`` without."""
        if not self._enabled:
            return
        with self._lock:
            self._tokens[0] += int(real)
            self._tokens[1] += int(padding)

    def python_gil(self, stage: str, held: bool) -> None:
        """Note whether the Python step of ``stage`` holds the GIL while it runs."""
        if not self._enabled:
            return
        if stage not in _STAGE_INDEX:
            raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
        self._gil[stage] = bool(held)

    # -- internals (caller holds the lock) -----------------------------------------------
    def _index(self, t: int) -> int:
        return max(0, (t - self._t0) // self._interval_ns)

    def _bin(self, index: int) -> _Bin | None:
        """The bin of ``index``, created (with the bins before it) if new; None if it fell out."""
        bins = self._bins
        last = bins[-1]
        if index > last.index:
            # Bins in which nothing finished are real: the pipeline delivered nothing then.
            # The deque keeps consecutive indices (a long jump drops every older bin).
            for i in range(max(last.index + 1, index - self._series_len + 1), index + 1):
                bins.append(_Bin(i, last.threads))
            return bins[-1]
        pos = index - bins[0].index
        return bins[pos] if pos >= 0 else None

    def _spread(self, a: int, b: int) -> list[tuple[_Bin, float]]:
        """The bins that ``[a, b]`` overlaps, each with its share of the interval."""
        a = max(a, self._t0)
        if b <= a:
            bin_ = self._bin(self._index(b - 1))
            return [(bin_, 1.0)] if bin_ is not None else []
        first, last = self._index(a), self._index(b - 1)
        if first == last:  # the common case: the whole interval inside one bin
            bin_ = self._bin(first)
            return [(bin_, 1.0)] if bin_ is not None else []
        interval = self._interval_ns
        first = max(self._index(a), self._bins[0].index)
        out = []
        for i in range(first, self._index(b - 1) + 1):
            lo = self._t0 + i * interval
            f = (min(b, lo + interval) - max(a, lo)) / (b - a)
            bin_ = self._bin(i)
            if f > 0 and bin_ is not None:
                out.append((bin_, f))
        return out

    def _credit(self, upto: int) -> None:
        """Credit the pool's capacity (threads x time) up to ``upto``."""
        start = self._cap_t
        if upto <= start:
            return
        ns = (upto - start) * self._num_threads
        self._capacity_ns += ns
        self._cap_t = upto
        if ns:
            for b, f in self._spread(start, upto):
                b.capacity_ns += f * ns

    def _place_stage(self, stage: list, a: int, b: int) -> None:
        """Spread a batch's stage time over ``[a, b]``, then move what exceeds a bin's capacity
        back into earlier bins with room (NOTE [ Stage time and busy fraction ])."""
        total = sum(stage)
        if total <= 0:
            return
        if a < self._t0:  # work done before the epoch started (NOTE [ Epoch boundaries ])
            before = (min(b, self._t0) - a) / (b - a)
            for j in range(_NSTAGES):
                self._ahead_ns[j] += before * stage[j]
            if b <= self._t0:
                return
            stage = [x * (1.0 - before) for x in stage]
            a = self._t0
        touched = self._spread(a, b)
        if not touched:
            self._unattributed_ns += total
            return
        for bin_, f in touched:
            sb = bin_.stage_ns
            for j in range(_NSTAGES):
                sb[j] += f * stage[j]
        lowest = touched[0][0].index
        carry = [0.0] * _NSTAGES
        bins = self._bins
        top = touched[-1][0].index - bins[0].index
        # The work that overflowed was done just before the batch's own wall time (beside the
        # previous batch), so a few bins back is far enough; it also bounds the cost per batch.
        for pos in range(top, max(-1, top - len(touched) - _WALK_BACK), -1):
            bin_ = bins[pos]
            sb = bin_.stage_ns
            for j in range(_NSTAGES):
                sb[j] += carry[j]
            have = sum(sb)
            excess = have - bin_.capacity_ns
            if excess > 1e-9 * have:
                keep = bin_.capacity_ns / have
                carry = [x * (1.0 - keep) for x in sb]
                bin_.stage_ns = [x * keep for x in sb]
            else:
                carry = [0.0] * _NSTAGES
                if bin_.index <= lowest:
                    break
        self._unattributed_ns += sum(carry)

    def _fold_events(self) -> None:
        ev = self._events
        while True:
            try:
                kind, a, c, t = ev.popleft()
            except IndexError:
                return
            self._t_last = max(self._t_last, t)
            if kind == _EV_WAIT:
                a = int(a)
                boundary = self._waits == 0  # NOTE [ Epoch boundaries ]
                self._waits += 1
                if boundary:
                    self._boundary_ns += a
                else:
                    self._wait_ns += a
                for b, f in self._spread(t - a, t):
                    if boundary:
                        b.boundary_ns += f * a
                    else:
                        b.wait_ns += f * a
            elif kind == _EV_BLOCKED:
                self._blocked_ns += int(a)
            else:
                self._q_depth = int(a)
                self._q_capacity = int(c)
                self._q_sum += int(a)
                self._q_n += 1
                qb = self._bin(self._index(t - 1))
                if qb is not None:
                    qb.q_sum += int(a)
                    qb.q_n += 1

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
        """A consistent copy of the current epoch's figures (cheap; safe while running).

        The figures end at the last thing recorded (a batch, a wait, a queue report), not at
        the moment of the call: a snapshot taken after the run has ended shows the run.
        """
        with self._lock:
            captured = self._capture()
        return _build_stats(*captured)

    def _capture(self) -> tuple:
        # Caller holds the lock.
        if self._enabled:
            self._fold_events()
            self._credit(self._t_last)
        rows = self._rows[: self._row_count].copy()
        interval = self._interval_ns
        elapsed = self._t_last - self._t0
        bins_out = []
        for x in self._bins:
            start = x.index * interval
            dur = min(interval, elapsed - start)
            if dur > 0 or (x.index == 0 and (x.samples or x.wait_ns or x.boundary_ns)):
                bins_out.append((start, max(dur, 1), _copy_bin(x)))
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
            "elapsed_ns": elapsed,
            "started_ns": self._t0,
            "stage_ns": tuple(self._stage_ns),
            "unattributed_ns": self._unattributed_ns,
            "ahead_ns": tuple(self._ahead_ns),
            "wall_ns": self._wall_ns,
            "capacity_ns": self._capacity_ns,
            "wait_ns": self._wait_ns,
            "boundary_ns": self._boundary_ns,
            "waits": self._waits,
            "blocked_ns": self._blocked_ns,
            "q_depth": self._q_depth,
            "q_capacity": self._q_capacity,
            "q_mean": self._q_sum / self._q_n if self._q_n else 0.0,
            "gil": dict(self._gil),
            "percentile_source": source,
            "extract": self._extract,
            "tokens": tuple(self._tokens),
            "batch_log": tuple(self._batch_log),
        }
        return state, rows, bins_out


def _copy_bin(b: _Bin) -> _Bin:
    c = _Bin(b.index, b.threads)
    c.samples, c.batches, c.stage_ns, c.capacity_ns = b.samples, b.batches, list(b.stage_ns), b.capacity_ns
    c.wait_ns, c.boundary_ns, c.q_sum, c.q_n = b.wait_ns, b.boundary_ns, b.q_sum, b.q_n
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

    cols: dict[str, list] = {k: [] for k in (
        "t_s", "dur_s", "samples", "batches", "samples_per_s", "capacity_s", "busy_fraction", "wait_s",
        "consumer_wait_fraction", "boundary_wait_s", "queue_depth", "threads")}
    per_stage: dict[str, list] = {name: [] for name in STAGES}
    for start, dur, b in bins:
        d = dur / 1e9
        cols["t_s"].append((start + dur) / 1e9)
        cols["dur_s"].append(d)
        cols["samples"].append(b.samples)
        cols["batches"].append(b.batches)
        cols["samples_per_s"].append(b.samples / d)
        cols["capacity_s"].append(b.capacity_ns / 1e9)
        cols["busy_fraction"].append(busy_fraction(sum(b.stage_ns), b.capacity_ns))
        cols["wait_s"].append(b.wait_ns / 1e9)
        cols["consumer_wait_fraction"].append(min(1.0, b.wait_ns / dur))
        cols["boundary_wait_s"].append(b.boundary_ns / 1e9)
        cols["queue_depth"].append(b.q_sum / b.q_n if b.q_n else float("nan"))
        cols["threads"].append(float(b.threads))
        for i, name in enumerate(STAGES):
            per_stage[name].append(b.stage_ns[i] / 1e9)
    series = {k: tuple(v) for k, v in cols.items()}
    series.update({f"stage_s.{name}": tuple(v) for name, v in per_stage.items()})

    attributed = sum(s["stage_ns"]) - s["unattributed_ns"] - sum(s["ahead_ns"])
    return Stats(
        enabled=s["enabled"],
        num_threads=s["num_threads"],
        batch_size=s["batch_size"],
        batches=s["batches"],
        samples=samples,
        elapsed_s=elapsed,
        started_s=s["started_ns"] / 1e9,
        samples_per_s=samples / elapsed if elapsed > 0 else 0.0,
        batches_per_s=s["batches"] / elapsed if elapsed > 0 else 0.0,
        stage_total_s=stage_total,
        stage_mean_ms=stage_mean,
        stage_p50_ms=p50,
        stage_p99_ms=p99,
        percentile_source=s["percentile_source"],
        producer_wall_s=s["wall_ns"] / 1e9,
        thread_capacity_s=s["capacity_ns"] / 1e9,
        busy_fraction=busy_fraction(attributed, s["capacity_ns"]),
        unattributed_s=s["unattributed_ns"] / 1e9,
        ahead_stage_s={name: s["ahead_ns"][i] / 1e9 for i, name in enumerate(STAGES)},
        consumer_wait_s=s["wait_ns"] / 1e9,
        boundary_wait_s=s["boundary_ns"] / 1e9,
        consumer_waits=s["waits"],
        producer_blocked_s=s["blocked_ns"] / 1e9,
        queue_depth=s["q_depth"],
        queue_capacity=s["q_capacity"],
        queue_depth_mean=s["q_mean"],
        gil_held=s["gil"],
        series=series,
        extract=ExtractStats.from_counters(s["extract"], elapsed) if s.get("extract") else None,
        tokens=s["tokens"][0],
        padding_tokens=s["tokens"][1],
        batch_log=tuple((t / 1e9, n, tuple(x / 1e9 for x in st)) for t, n, st in s["batch_log"]),
    )
