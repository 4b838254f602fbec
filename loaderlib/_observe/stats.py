"""``Stats``: the snapshot of a loader's per-stage timings (what ``loader.stats`` returns), and
the one accounting every profiling figure is computed with (``Window``, ``window_of``); public
in ``loaderlib.stats``.

NOTE [ One accounting ]
The recorder, the harness's report, the verdict and the dashboard must never contradict each
other, so they share one definition of every figure:

* one clock (:func:`clock_ns`): the recorder's time bins, the harness's window and the
  dashboard's "now" are on it;
* one place for stage time: the recorder puts each batch's stage thread time into time bins,
  never more than the pool's threads can hold (NOTE [ Stage time and busy fraction ] in
  ``recorder.py``), and keeps apart what does not fit and what a warm epoch did ahead;
* one window: :func:`window_of` cuts any stretch of time out of the bins (in proportion at
  its edges) and, when the harness watched the consumer, out of its deliveries; the result,
  a :class:`Window`, holds every figure shown (rate, stage shares, busy, steady wait, wait at
  epoch boundaries, model time); :func:`split_window` cuts the same stretch into parts whose
  agreement is the verdict's confidence;
* one busy formula (:func:`busy_fraction`), one share formula (:attr:`Window.stage_share`),
  and the invariants they keep, checked by :meth:`Window.problems`: busy <= 100% of the
  threads, shares summing to 100%, steady wait + boundary wait + model time <= wall time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

STAGES: tuple[str, ...] = ("read", "decode", "transform", "python", "collate")
"""The pipeline stages every engine times, in pipeline order."""

__all__ = ["STAGES", "Delivery", "ExtractStats", "Stats", "Window", "busy_fraction", "clock_ns", "split_window", "window_of"]

# The one profiling clock (monotonic nanoseconds). The recorder stamps its bins with it, the
# harness opens and closes its window with it and the dashboard reads "now" from it, so their
# times line up. Tests replace it in this module
# (``monkeypatch.setattr(loaderlib._observe.stats, "_clock", fake)``).
_clock = time.perf_counter_ns

# Relative tolerance of the invariant checks (float sums of nanosecond counts).
_EPS = 1e-6

FONT_CSS = ("font-family: system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, "
            "'Liberation Sans', 'DejaVu Sans', sans-serif; font-size: 14px; line-height: 1.45")
"""The font every HTML view of the profiling figures sets explicitly (never a serif fallback)."""


def clock_ns() -> int:
    """The profiling clock in nanoseconds (monotonic; shared by recorder, harness and dashboard)."""
    return _clock()


def busy_fraction(stage_s: float, capacity_s: float) -> float:
    """How saturated a pool was: thread time spent in stages over thread time it had.

    ``capacity_s`` is the pool's threads times the wall time of the window (NOTE [ Stage time
    and busy fraction ] in ``recorder.py``). The recorder, the harness, the report, the verdict
    and the dashboard all compute the busy fraction with this function, over a
    :class:`Window` built by :func:`window_of`; only the window differs.
    """
    return stage_s / capacity_s if capacity_s > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One batch as the consumer saw it (the harness's records; times on the profiling clock).

    Attributes
    ----------
    t : float
        Seconds (profiling clock) when ``next()`` returned the batch.
    samples : int
        Samples in the batch.
    wait_s : float
        How long that ``next()`` blocked (ending at ``t``).
    model_s : float
        How long the model step on the batch took (starting at ``t``).
    boundary : bool
        The wait was an epoch boundary (the first batch of an epoch, or the end of one): the
        pipeline refilling, shown apart and never blamed on a stage.
    """

    t: float
    samples: int
    wait_s: float
    model_s: float = 0.0
    boundary: bool = False


@dataclasses.dataclass(frozen=True)
class Window:
    """One stretch of a run, accounted once: what report, verdict and dashboard all read.

    Built by :func:`window_of` from the recorder's time bins (pipeline side) and, when a
    consumer was watched (the harness), its deliveries (consumer side). Every figure the
    profiling tools show is one of these attributes or properties (NOTE [ One accounting ]).

    Attributes
    ----------
    start_s, wall_s : float
        Where the window starts (profiling clock, seconds) and how long it is.
    samples, batches : float
        Samples and batches delivered in the window (produced, when no consumer was
        watched). Fractional when a recorder bin straddles the window's edge.
    stage_s : dict
        Stage thread seconds the recorder placed inside the window.
    capacity_s : float
        Thread seconds the pool had in the window (threads x wall, summed over bins).
    threads : int
        The most threads the pool had in the window.
    consumer_wait_s : float
        Time the consumer blocked in ``next()`` in steady state.
    boundary_wait_s : float
        Time the consumer waited at epoch boundaries (the refill at each epoch start).
    model_s : float
        Time in the model step (0 when no consumer was watched).
    unattributed_s : float
        Stage thread time the recorder could not place within the pool's capacity (0 unless a
        loader reports more thread time than its threads can have had).
    epochs : int
        Epoch starts inside the window.
    batch_stage_s : tuple
        Stage thread seconds (in :data:`STAGES` order) of each batch the pipeline finished in
        the window, oldest first (NOTE [ Per-batch log ] in ``recorder.py``).
    batch_waits : tuple
        ``(wait_s, model_s)`` of each batch the consumer received in the window, in order,
        epoch boundaries left out (empty when no consumer was watched).
    """

    start_s: float
    wall_s: float
    samples: float
    batches: float
    stage_s: dict
    capacity_s: float
    threads: int
    consumer_wait_s: float
    boundary_wait_s: float
    model_s: float = 0.0
    unattributed_s: float = 0.0
    epochs: int = 0
    batch_stage_s: tuple = ()
    batch_waits: tuple = ()

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def busy_fraction(self) -> float:
        """Stage thread time over the pool's capacity in the window (:func:`busy_fraction`)."""
        return busy_fraction(sum(self.stage_s.values()), self.capacity_s)

    @property
    def stage_share(self) -> dict:
        """Each stage's share of the window's stage thread time; sums to 1 (all 0 when none ran)."""
        total = sum(self.stage_s.values())
        return {k: (self.stage_s.get(k, 0.0) / total if total > 0 else 0.0) for k in STAGES}

    @property
    def wait_fraction(self) -> float:
        """Steady-state consumer wait over the window (epoch boundaries left out)."""
        return self.consumer_wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def boundary_fraction(self) -> float:
        """Consumer wait at epoch boundaries over the window."""
        return self.boundary_wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def has_stages(self) -> bool:
        return any(v > 0 for v in self.stage_s.values())

    def problems(self) -> list[str]:
        """The invariants this window breaks (empty when it is consistent).

        Checked: busy <= 100% of the pool's threads; stage shares sum to 100% (or all zero);
        steady wait + boundary wait + model time <= wall time; nothing negative.
        """
        out = []
        stage = sum(self.stage_s.values())
        if stage > self.capacity_s * (1 + _EPS) + 1e-12:
            out.append(f"stage thread time {stage:.6g} s exceeds the pool's {self.capacity_s:.6g} s "
                       f"(busy {100 * self.busy_fraction:.1f}% > 100%)")
        share = sum(self.stage_share.values())
        if stage > 0 and abs(share - 1.0) > _EPS:
            out.append(f"stage shares sum to {100 * share:.4f}%, not 100%")
        consumer = self.consumer_wait_s + self.boundary_wait_s + self.model_s
        if consumer > self.wall_s * (1 + _EPS) + 1e-9:
            out.append(f"consumer time {consumer:.6g} s exceeds the window's {self.wall_s:.6g} s")
        negative = [k for k, v in (("wall_s", self.wall_s), ("samples", self.samples),
                                   ("capacity_s", self.capacity_s), ("consumer_wait_s", self.consumer_wait_s),
                                   ("boundary_wait_s", self.boundary_wait_s), ("model_s", self.model_s),
                                   *self.stage_s.items()) if v < 0]
        if negative:
            out.append("negative figures: " + ", ".join(negative))
        return out

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["batch_stage_s"] = len(self.batch_stage_s)   # counts: the per-batch figures are the verdict's input
        d["batch_waits"] = len(self.batch_waits)
        d.update(samples_per_s=self.samples_per_s, busy_fraction=self.busy_fraction,
                 stage_share=self.stage_share, wait_fraction=self.wait_fraction,
                 boundary_fraction=self.boundary_fraction)
        return _jsonable(d)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _bins(stats: Stats) -> Iterable[tuple]:
    """``(start, end, samples, batches, stage dict, capacity, wait, boundary, threads)`` per bin,
    start and end on the profiling clock in seconds."""
    ser = stats.series
    base = stats.started_s
    for i, end in enumerate(ser["t_s"]):
        dur = ser["dur_s"][i]
        yield (base + end - dur, base + end, ser["samples"][i], ser["batches"][i],
               {k: ser[f"stage_s.{k}"][i] for k in STAGES}, ser["capacity_s"][i], ser["wait_s"][i],
               ser["boundary_wait_s"][i], ser["threads"][i])


def window_of(
    epochs: Sequence[Stats],
    start_s: float,
    end_s: float,
    deliveries: Sequence[Delivery] | None = None,
    *,
    closed: bool = True,
) -> Window:
    """Account ``[start_s, end_s]`` (profiling clock, seconds) once, from recorder bins and deliveries.

    Parameters
    ----------
    epochs : sequence of Stats
        Snapshots of the epochs that overlap the window (the recorder restarts each epoch);
        their time bins are cut at the window's edges, each bin's figures taken in proportion
        to the part of it inside the window.
    start_s, end_s : float
        The window, in seconds of :func:`clock_ns`.
    deliveries : sequence of Delivery, optional
        The consumer's view. When given, samples, waits and model time come from it (a
        batch counts when ``next()`` returned it inside the window; waits and model time in
        proportion to their overlap). Otherwise they come from the recorder (produced samples,
        the waits the loader reported).

    Returns
    -------
    Window
    """
    wall = max(0.0, end_s - start_s)
    stage = {k: 0.0 for k in STAGES}
    cap = samples = batches = wait = boundary = model = unattributed = 0.0
    threads = 0
    n_epochs = 0
    per_batch = []
    for st in epochs:
        per_batch += [sd for t, _n, sd in st.batch_log if start_s <= t and (t < end_s or (closed and t == end_s))]
        if start_s < st.started_s < end_s:
            # An epoch starting inside the window: the work done ahead for it was done inside too.
            n_epochs += 1
            for k in STAGES:
                stage[k] += st.ahead_stage_s.get(k, 0.0)
        covered = 0.0
        for b0, b1, n, nb, sd, c, w, bw, th in _bins(st):
            f = _overlap(b0, b1, start_s, end_s) / (b1 - b0) if b1 > b0 else 0.0
            if f <= 0:
                continue
            covered += f
            for k in STAGES:
                stage[k] += f * sd[k]
            cap += f * c
            samples += f * n
            batches += f * nb
            wait += f * w
            boundary += f * bw
            threads = max(threads, int(th))
        if covered and st.unattributed_s:
            unattributed += st.unattributed_s
    total = sum(stage.values())
    if total > cap:
        # Work done ahead is placed by epoch, not by bin; what does not fit the window's
        # capacity is reported, never shown as a pool busier than its threads.
        keep = cap / total
        stage = {k: v * keep for k, v in stage.items()}
        unattributed += total - cap
    waits = []
    if deliveries is not None:
        samples = batches = wait = boundary = model = 0.0
        n_epochs = 0
        for d in deliveries:
            if start_s <= d.t and (d.t < end_s or (closed and d.t == end_s)) and d.samples:
                samples += d.samples
                batches += 1
                n_epochs += d.boundary
                if not d.boundary:
                    waits.append((d.wait_s, d.model_s))
            w = _overlap(d.t - d.wait_s, d.t, start_s, end_s)
            if d.boundary:
                boundary += w
            else:
                wait += w
            model += _overlap(d.t, d.t + d.model_s, start_s, end_s)
    return Window(start_s=start_s, wall_s=wall, samples=samples, batches=batches, stage_s=stage,
                  capacity_s=cap, threads=threads, consumer_wait_s=wait, boundary_wait_s=boundary,
                  model_s=model, unattributed_s=unattributed, epochs=n_epochs, batch_stage_s=tuple(per_batch),
                  batch_waits=tuple(waits))


def split_window(
    epochs: Sequence[Stats],
    start_s: float,
    end_s: float,
    parts: int,
    deliveries: Sequence[Delivery] | None = None,
) -> list[Window]:
    """:func:`window_of` over ``parts`` equal consecutive pieces of ``[start_s, end_s]``.

    The pieces' spread is the confidence the verdict reports (NOTE [ Verdict rules ] in
    ``loaderlib.profiling.verdict``).
    """
    parts = max(1, int(parts))
    step = (end_s - start_s) / parts
    edges = [start_s + i * step for i in range(parts)] + [end_s]
    return [window_of(epochs, edges[i], edges[i + 1], deliveries, closed=i == parts - 1) for i in range(parts)]


@dataclasses.dataclass(frozen=True)
class ExtractStats:
    """The read-ahead stage of one epoch (NOTE [ Read-ahead ] in ``pyx/include/ll_readahead.h``).

    Attributes
    ----------
    io_depth : int
        Reads in flight allowed now (the IO threads that may read at once).
    adaptive : bool
        Whether the depth adapts (``io_depth=None`` or ``ll.AUTOTUNE``; NOTE [ Read-ahead depth ]).
    reads_in_flight : int
        Reads in progress when the figures were taken.
    reads, failures : int
        Reads completed this epoch, and those that failed.
    bytes : int
        Bytes read; ``bytes_per_s`` over the epoch's elapsed time.
    latency_mean_ms, latency_p50_ms, latency_p95_ms : float
        Time one read took on an IO thread (the percentiles from a histogram of 4 bins per
        octave, so within 19%); 0 before any read.
    read_cpu_s : float
        CPU time the IO threads spent reading (system calls and copies).
    read_wait_s : float
        Time the decode threads waited for bytes that had not arrived (thread seconds).
    queued_wait_ms : float
        Mean time a read waited in the queue for a free IO thread.
    slots_limit : int
        Samples' bytes the stage may hold at once (its memory bound).
    inline : bool
        Whether the decode threads read their own samples now, reads being CPU work (warm
        page cache; NOTE [ Reads that are work ]), with one batch in 8 still read ahead.
    inline_reads, inline_bytes : int
        Of ``reads`` and ``bytes``, those the decode threads did themselves (samples not
        read ahead). Every read counts: the latency figures cover both kinds
        (NOTE [ Every read counts ] in ``pyx/include/ll_readahead.h``).
    """

    io_depth: int
    adaptive: bool
    reads_in_flight: int
    reads: int
    failures: int
    bytes: int
    bytes_per_s: float
    latency_mean_ms: float
    latency_p50_ms: float
    latency_p95_ms: float
    read_cpu_s: float
    read_wait_s: float
    queued_wait_ms: float
    slots_limit: int
    inline: bool = False
    inline_reads: int = 0
    inline_bytes: int = 0

    def line(self) -> str:
        """The Extract stage in one line, as the text report, the dashboard and ``explain()``
        show it: depth, reads in flight, reads and bytes/s, latency p50/p95, the read wait."""
        if self.io_depth:
            depth = f"io_depth {self.io_depth}" + (" (adaptive" + (", decode threads reading" if self.inline else "")
                                                   + ")" if self.adaptive else " (fixed)")
        else:
            depth = "no read-ahead (the decode threads read)"
        by = (f", {self.inline_reads:,} by the decode threads" if self.inline_reads and self.inline_reads < self.reads
              else ", all by the decode threads" if self.inline_reads else "")
        fails = f", {self.failures:,} failed" if self.failures else ""
        return (f"{depth}; {self.reads_in_flight} reads in flight; {self.reads:,} reads{by}{fails}, "
                f"{self.bytes_per_s / 1e6:,.1f} MB/s; latency p50/p95 {self.latency_p50_ms:.2f}/"
                f"{self.latency_p95_ms:.2f} ms; decode threads waited {self.read_wait_s:.2f} thread-s for bytes")

    @classmethod
    def from_counters(cls, c: dict, elapsed_s: float) -> ExtractStats:
        """From the read-ahead stage's counters (``ReadAhead.counters()``)."""
        reads = int(c["reads"])
        hist = list(c["hist"])

        def pct(q: float) -> float:
            total = sum(hist)
            if total <= 0:
                return 0.0
            seen = 0
            for b, n in enumerate(hist):
                seen += n
                if n and seen >= q * total:
                    return 2.0 ** ((b + 1) / 4) / 1000.0
            return 2.0 ** (len(hist) / 4) / 1000.0

        return cls(io_depth=int(c["depth"]), adaptive=bool(c.get("adaptive", False)),
                   reads_in_flight=int(c["reading"]), reads=reads, failures=int(c["failures"]),
                   bytes=int(c["bytes"]), bytes_per_s=c["bytes"] / elapsed_s if elapsed_s > 0 else 0.0,
                   latency_mean_ms=c["lat_ns"] / reads / 1e6 if reads else 0.0, latency_p50_ms=pct(0.5),
                   latency_p95_ms=pct(0.95), read_cpu_s=c["cpu_ns"] / 1e9, read_wait_s=c["wait_ns"] / 1e9,
                   queued_wait_ms=c["queue_ns"] / reads / 1e6 if reads else 0.0,
                   slots_limit=int(c.get("slots_limit", 0)), inline=bool(c.get("inline", False)),
                   inline_reads=int(c.get("inline_reads", 0)), inline_bytes=int(c.get("inline_bytes", 0)))


@dataclasses.dataclass(frozen=True)
class Stats:
    """Per-stage timings of one epoch (the current one while a loader runs).

    Produced by :meth:`loaderlib.profiling.recorder.StageRecorder.snapshot`; immutable, so
    it can be kept and compared. Times are seconds unless the name says ``_ms``.

    Attributes
    ----------
    enabled : bool
        Whether the recorder was recording. When False every figure is 0.
    num_threads, batch_size : int
        Threads working on the last batch, and the loader's batch size.
    batches, samples : int
        Batches and samples the pipeline produced so far this epoch.
    elapsed_s : float
        From the start of the epoch to the last thing recorded (a batch or a consumer wait).
    started_s : float
        When the epoch started, in seconds of the profiling clock (:func:`clock_ns`).
    samples_per_s, batches_per_s : float
        Production rates over ``elapsed_s``.
    stage_total_s : dict
        Thread time per stage (see :data:`STAGES`), summed over samples.
    stage_mean_ms, stage_p50_ms, stage_p99_ms : dict
        Per-sample mean, median and 99th percentile of each stage, in milliseconds. The
        percentiles cover the most recent samples (the recorder's window); see
        ``percentile_source`` for whether they are per sample or per-batch means.
    percentile_source : str
        ``"per-sample"``, ``"per-batch mean"``, ``"mixed"`` or ``"none"``.
    producer_wall_s : float
        Sum of the producer's wall time per batch.
    thread_capacity_s : float
        Thread time the pool had: its threads times the epoch's elapsed time.
    busy_fraction : float
        Stage thread time placed in the epoch's bins over ``thread_capacity_s`` (never above
        1; NOTE [ Stage time and busy fraction ] in ``recorder.py``).
    unattributed_s : float
        Stage thread time that did not fit in the pool's capacity (0 for a consistent loader).
    ahead_stage_s : dict
        Stage thread time of this epoch's samples done before it started (a warm epoch built
        ahead while the previous one was consumed; NOTE [ Epoch boundaries ] in
        ``recorder.py``). Counted in ``stage_total_s``, not in the busy fraction.
    consumer_wait_s : float
        Time the consumer's ``next()`` blocked waiting for a batch in steady state;
        ``consumer_waits`` counts every call that reported.
    boundary_wait_s : float
        The consumer's wait for the epoch's first batch (the pipeline refilling), apart.
    producer_blocked_s : float
        Time the pipeline waited on a full prefetch queue.
    queue_depth, queue_capacity : int
        Last reported prefetch queue depth and capacity; ``queue_depth_mean`` their mean.
    gil_held : dict
        Stage name -> whether its Python step holds the GIL (only stages with Python steps).
    series : dict
        A short time series, one point per recorder interval (0.5 s by default): ``t_s``
        (end of the interval, seconds since the epoch start), ``dur_s`` (its length; the last
        one ends at the last thing recorded), ``samples`` and ``batches`` (produced),
        ``samples_per_s``, ``capacity_s``, ``busy_fraction``, ``wait_s``,
        ``consumer_wait_fraction``, ``boundary_wait_s``, ``queue_depth``, ``threads``, and
        ``stage_s.<stage>`` (thread seconds spent in the stage in that interval).
        :func:`window_of` reads it.
    batch_log : tuple
        ``(end_s, samples, stage seconds in STAGES order)`` of the epoch's most recent batches
        (up to 4096; NOTE [ Per-batch log ] in ``recorder.py``), end on the profiling clock.
        :func:`window_of` reads it; :meth:`to_dict` leaves it out.
    autotune : tuple
        The ``AUTOTUNE`` tuner's decisions, oldest first: ``(time_s, knob, old, new, reason)``
        (NOTE [ Autotune ] in ``_autotune.py``), ``reason`` holding the measured rates compared;
        empty when nothing is tuned. ``time_s`` counts seconds on the profiling clock (the
        clock of ``started_s``) since the loader was created, or for a pipeline's engine stage
        since the pipeline was made.
    extract : ExtractStats or None
        The read-ahead stage (reads in flight, read latency p50/p95, bytes/s, read CPU and
        read wait); None when the loader reads inside the decode threads.
    memory : dict
        Bytes the loader holds now, by part (``DataLoader.memory()``); empty from a bare
        recorder.
    sources : dict
        For a :class:`~loaderlib.MixtureDataset`: samples of each source (named ``[k] repr``)
        delivered so far in the current or last epoch; empty for other datasets.
    tokens, padding_tokens : int
        For a :class:`~loaderlib.TokenDataset`: input positions produced holding a token, and
        holding padding (``tokens_per_s`` and ``padding_share`` derive from them); 0 otherwise.
    """

    enabled: bool
    num_threads: int
    batch_size: int
    batches: int
    samples: int
    elapsed_s: float
    started_s: float
    samples_per_s: float
    batches_per_s: float
    stage_total_s: dict
    stage_mean_ms: dict
    stage_p50_ms: dict
    stage_p99_ms: dict
    percentile_source: str
    producer_wall_s: float
    thread_capacity_s: float
    busy_fraction: float
    unattributed_s: float
    ahead_stage_s: dict
    consumer_wait_s: float
    boundary_wait_s: float
    consumer_waits: int
    producer_blocked_s: float
    queue_depth: int
    queue_capacity: int
    queue_depth_mean: float
    gil_held: dict
    series: dict
    autotune: tuple = ()
    extract: ExtractStats | None = None
    memory: dict = dataclasses.field(default_factory=dict)
    batch_log: tuple = ()
    sources: dict = dataclasses.field(default_factory=dict)
    tokens: int = 0
    padding_tokens: int = 0

    # -- derived figures -----------------------------------------------------------------
    @property
    def stage_share(self) -> dict:
        """Each stage's fraction of the total stage thread time (0 when nothing ran)."""
        total = sum(self.stage_total_s.values())
        return {k: (v / total if total > 0 else 0.0) for k, v in self.stage_total_s.items()}

    @property
    def dominant_stage(self) -> str | None:
        """The stage with the most thread time, or None when nothing was recorded."""
        if not any(self.stage_total_s.values()):
            return None
        return max(self.stage_total_s, key=lambda k: self.stage_total_s[k])

    @property
    def consumer_wait_fraction(self) -> float:
        """Consumer wait as a fraction of the epoch's elapsed time."""
        return min(1.0, self.consumer_wait_s / self.elapsed_s) if self.elapsed_s > 0 else 0.0

    # -- export --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of every field (JSON-serialisable; NaN becomes None)."""
        d = dataclasses.asdict(self)
        del d["batch_log"]   # thousands of entries; the series and totals say it in short
        d["stage_share"] = self.stage_share
        d["consumer_wait_fraction"] = self.consumer_wait_fraction
        d["tokens_per_s"] = self.tokens_per_s
        d["padding_share"] = self.padding_share
        return _jsonable(d)

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as a JSON string (``kwargs`` go to :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), **kwargs)

    # -- display -------------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, str, str, str, str, str]]:
        share = self.stage_share
        return [
            (
                name,
                f"{self.stage_total_s[name]:.3f}",
                f"{100 * share[name]:.1f}%",
                f"{self.stage_mean_ms[name]:.3f}",
                f"{self.stage_p50_ms[name]:.3f}",
                f"{self.stage_p99_ms[name]:.3f}",
            )
            for name in STAGES
        ]

    @property
    def tokens_per_s(self) -> float:
        """Tokens (not padding) produced per second over ``elapsed_s`` (token datasets)."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def padding_share(self) -> float:
        """The share of produced input positions that are padding (token datasets)."""
        total = self.tokens + self.padding_tokens
        return self.padding_tokens / total if total else 0.0

    def _summary(self) -> list[str]:
        if not self.enabled:
            return ["recording disabled (loader.recorder.enabled = False)"]
        lines = [
            (f"{self.samples} samples in {self.batches} batches over {self.elapsed_s:.2f} s: "
            f"{self.samples_per_s:,.1f} samples/s, {self.batches_per_s:.2f} batches/s"),
            (f"threads {self.num_threads}, pool busy {100 * self.busy_fraction:.0f}%, "
            f"consumer waited {self.consumer_wait_s:.3f} s ({100 * self.consumer_wait_fraction:.0f}%) "
            f"plus {self.boundary_wait_s:.3f} s for the epoch's first batch, "
            f"producer blocked {self.producer_blocked_s:.3f} s"),
        ]
        if self.tokens or self.padding_tokens:
            lines.append(f"{self.tokens:,} tokens: {self.tokens_per_s:,.0f} tokens/s, "
                         f"padding {100 * self.padding_share:.1f}% of positions")
        if self.queue_capacity:
            lines.append(
                f"prefetch queue {self.queue_depth}/{self.queue_capacity} (mean {self.queue_depth_mean:.1f})"
            )
        held = [k for k, v in self.gil_held.items() if v]
        if held:
            lines.append("Python steps holding the GIL: " + ", ".join(held))
        return lines

    def __repr__(self) -> str:
        out = ["Stats(" + self._summary()[0]]
        out += ["  " + line for line in self._summary()[1:]]
        if self.enabled:
            head = ("stage", "thread s", "share", "mean ms", "p50 ms", "p99 ms")
            rows = [head, *self._rows()]
            widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
            for r in rows:
                out.append(
                    "  " + r[0].ljust(widths[0]) + "  "
                    + "  ".join(c.rjust(w) for c, w in zip(r[1:], widths[1:]))
                )
            out.append(f"  (percentiles: {self.percentile_source})")
        out[-1] += ")"
        return "\n".join(out)

    def _repr_html_(self) -> str:
        import html  # here, not at import: NOTE [ What import costs ] in loaderlib/__init__.py

        parts = [f"<div class='loaderlib-stats' style=\"{FONT_CSS}\"><b>loaderlib Stats</b><br>"]
        parts += [html.escape(line) + "<br>" for line in self._summary()]
        if self.enabled:
            parts.append("<table><thead><tr>")
            parts += [
                f"<th>{h}</th>" for h in ("stage", "thread s", "share", "mean ms", "p50 ms", "p99 ms")
            ]
            parts.append("</tr></thead><tbody>")
            for r in self._rows():
                parts.append(
                    "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                )
            parts.append("</tbody></table>")
        parts.append("</div>")
        return "".join(parts)

    def plot(self, fig: Any = None) -> Any:
        """Draw the stage breakdown and the throughput over time with matplotlib.

        Parameters
        ----------
        fig : matplotlib.figure.Figure, optional
            Figure to draw into (cleared first); a new one otherwise.

        Returns
        -------
        matplotlib.figure.Figure
        """
        from ..profiling._plot import plot_stats  # drawing lives with the profiling tools

        return plot_stats(self, fig=fig)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return _jsonable(x.item())
    return x
