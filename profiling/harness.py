"""The harness: a loader's ceiling under an infinitely fast model, a simulated model's idle time.

NOTE [ Simulated model step ]
A float ``model_step`` is simulated with ``time.sleep``: while an accelerator runs a step,
the host thread that launched it waits (on a CUDA stream or a device future) without
holding the GIL and without using a core, which is what a sleep does. A busy loop would
instead hold the GIL and a core and slow the loader down in a way no accelerator does. A
callable ``model_step(batch)`` runs as given (a real model, or a user's stand-in).

NOTE [ Measured window ]
Everything the harness reports covers the measured window only: it opens once the
consumer has received and processed ``warmup_batches`` batches (so pool start-up, first
file-cache misses and allocation are left out; the first-batch latency is reported on its
own; the harness's own bookkeeping at the opening is left out too) and ends after
``seconds`` or ``epochs``. Per-stage figures are the differences of the loader's
``stats`` between the window's ends, summed over epochs (the recorder restarts at each
epoch).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..stats import STAGES, busy_fraction

__all__ = ["benchmark", "replay_consumer"]


# -- resources -------------------------------------------------------------------------------
class _ResourceMonitor:
    """CPU time and peak RSS of this process and its children, sampled in a thread.

    Uses psutil when it is installed: RSS of the whole process tree sampled every
    ``interval`` seconds, and the CPU time of every process in the tree. Listing the
    children scans every process of the machine with the GIL held (about 2 ms with 75
    processes), so the list is refreshed only every ``refresh`` seconds to keep the
    sampler from disturbing what it measures. Without psutil, ``resource.getrusage``: this
    process's peak RSS since it started, and the CPU time of this process plus its reaped
    children.
    """

    def __init__(self, interval: float = 0.25, refresh: float = 1.0) -> None:
        try:
            import psutil

            self._proc = psutil.Process()
            self.source = "psutil, process tree"
        except ImportError:
            self._proc = None
            self.source = "resource.getrusage, this process"
        self.interval = interval
        self.refresh = refresh
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu0 = 0.0
        self._t0 = 0.0
        self._dead_cpu = 0.0
        self._last_cpu: dict[int, float] = {}
        self._children: list = []
        self._t_children = -math.inf

    def _tree(self) -> list:
        import psutil

        now = time.perf_counter()
        if now - self._t_children >= self.refresh:
            self._t_children = now
            try:
                self._children = self._proc.children(recursive=True)
            except psutil.Error:
                self._children = []
        return [self._proc, *self._children]

    def _sample(self) -> None:
        if self._proc is None:
            import resource

            self.peak_rss = max(self.peak_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
            return
        import psutil

        rss = 0
        seen = {}
        for p in self._tree():
            try:
                rss += p.memory_info().rss
                t = p.cpu_times()
            except psutil.Error:  # the process exited between listing and reading it
                continue
            seen[p.pid] = t.user + t.system
        # CPU time of children that exited since the last sample is kept, not lost.
        for pid, cpu in self._last_cpu.items():
            if pid not in seen:
                self._dead_cpu += cpu
        self._last_cpu = seen
        self.peak_rss = max(self.peak_rss, rss)

    def _cpu(self) -> float:
        if self._proc is None:
            import resource

            a = resource.getrusage(resource.RUSAGE_SELF)
            b = resource.getrusage(resource.RUSAGE_CHILDREN)
            return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
        self._t_children = -math.inf  # an exact list at the ends of the window
        self._sample()
        return self._dead_cpu + sum(self._last_cpu.values())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._cpu0 = self._cpu()
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="loaderlib-benchmark-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """Stop sampling; return the CPU cores used on average since :meth:`start`."""
        wall = time.perf_counter() - self._t0
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        cpu = self._cpu() - self._cpu0
        return cpu / wall if wall > 0 else 0.0


# -- one pass over a loader ------------------------------------------------------------------
@dataclasses.dataclass
class _Phase:
    samples: int = 0
    batches: int = 0
    wall_s: float = 0.0
    first_batch_s: float = float("nan")
    wait_s: float = 0.0
    model_s: float = 0.0
    stage_s: dict | None = None
    capacity_s: float = 0.0
    blocked_s: float = 0.0
    stats: Any = None
    cores_used: float | None = None
    times: list = dataclasses.field(default_factory=list)  # (t since window start, samples)
    cached: list = dataclasses.field(default_factory=list)
    peak_rss: int = 0
    rss_source: str = ""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.wall_s if self.wall_s > 0 else 0.0


def _batch_len(batch: Any) -> int:
    x = batch
    while True:
        if isinstance(x, dict):
            x = next(iter(x.values()))
        elif isinstance(x, (tuple, list)) and x and not np.isscalar(x[0]):
            x = x[0]
        else:
            break
    shape = getattr(x, "shape", None)
    if shape:
        return int(shape[0])
    return len(x)


def _copy_batch(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _copy_batch(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_copy_batch(v) for v in batch)
    if isinstance(batch, np.ndarray):
        return batch.copy()
    clone = getattr(batch, "clone", None)  # torch tensors
    return clone() if callable(clone) else batch


def _model_fn(model_step: float | Callable[[Any], Any]) -> tuple[Callable[[Any], Any] | None, str]:
    if callable(model_step):
        return model_step, f"callable {getattr(model_step, '__name__', type(model_step).__name__)}"
    step = float(model_step)
    if step < 0 or not math.isfinite(step):
        raise ValueError(f"model_step must be a non-negative number of seconds or a callable, got {model_step!r}")
    if step == 0:
        return None, "0 (infinitely fast model)"
    return (lambda _batch: time.sleep(step)), f"{1e3 * step:g} ms (simulated, sleep)"


def _stage_delta(a: Any, b: Any, delivered: int) -> tuple[dict, float, float]:
    """Stage thread seconds, thread capacity and producer blocking of the window's samples.

    ``a``/``b`` are the loader's stats at the window's ends (``a`` None: from the epoch
    start). The pipeline runs ahead of the consumer by the prefetched batches, so the
    samples produced between ``a`` and ``b`` are not the ``delivered`` samples of the
    window; the per-sample cost of the produced ones is scaled to the delivered count.
    """
    if b is None:
        return {k: 0.0 for k in STAGES}, 0.0, 0.0
    a_stage = a.stage_total_s if a is not None else {k: 0.0 for k in STAGES}
    a_cap = a.thread_capacity_s if a is not None else 0.0
    a_blk = a.producer_blocked_s if a is not None else 0.0
    produced = b.samples - (a.samples if a is not None else 0)
    scale = delivered / produced if produced > 0 else 0.0
    return (
        {k: max(0.0, b.stage_total_s[k] - a_stage[k]) * scale for k in STAGES},
        max(0.0, b.thread_capacity_s - a_cap) * scale,
        max(0.0, b.producer_blocked_s - a_blk),
    )


def _stats_of(loader: Any) -> Any:
    if getattr(loader, "recorder", None) is None:
        return None
    return loader.stats


def _run_phase(
    loader: Any,
    step: Callable[[Any], Any] | None,
    seconds: float | None,
    epochs: int | None,
    warmup: int,
    cache: int,
    progress: Any,
) -> _Phase:
    ph = _Phase()
    has_stats = getattr(loader, "recorder", None) is not None
    if has_stats:
        ph.stage_s = {k: 0.0 for k in STAGES}
    monitor = _ResourceMonitor()
    seen = 0
    t_window = None
    t_last = 0.0
    t_progress = 0.0
    base = None
    done = False
    epoch = 0
    t_start = time.perf_counter()

    def open_window() -> None:
        # The bookkeeping comes first, so none of it is inside the window.
        nonlocal t_window, base, t_last
        base = _stats_of(loader) if has_stats else None
        monitor.start()
        t_window = t_last = time.perf_counter()

    while not done and (epochs is None or epoch < epochs):
        epoch += 1
        t_iter = time.perf_counter()
        it = iter(loader)
        if t_window is not None:
            # Starting a later epoch (sampler, plan, pool) is time the consumer waits for data.
            t_last = time.perf_counter()
            ph.wait_s += t_last - t_iter
            base = None  # the recorder restarted with this epoch
        elif warmup == 0:
            open_window()
        got_any = False
        window_samples_before = ph.samples
        try:
            while True:
                t = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    if t_window is not None:
                        # Waiting for the loader to say the epoch is over is part of the epoch.
                        t_last = time.perf_counter()
                        ph.wait_s += t_last - t
                    break
                t1 = time.perf_counter()
                got_any = True
                nb = _batch_len(batch)
                if seen == 0:
                    ph.first_batch_s = t1 - t_iter
                seen += 1
                if len(ph.cached) < cache:
                    ph.cached.append(_copy_batch(batch))
                if t_window is not None:
                    ph.wait_s += t1 - t
                ts = time.perf_counter()
                if step is not None:
                    step(batch)
                te = time.perf_counter()
                del batch
                if t_window is None:
                    if seen == warmup:  # the window opens after the last warmup batch
                        window_samples_before = ph.samples
                        open_window()
                    continue
                ph.model_s += te - ts
                ph.samples += nb
                ph.batches += 1
                ph.times.append((te - t_window, ph.samples))
                t_last = te
                if progress is not None and te - t_progress >= 0.1:
                    progress(te - t_window, ph.samples, ph.batches)
                    t_progress = time.perf_counter()
                if seconds is not None and te - t_window >= seconds:
                    done = True
                    break
        finally:
            if t_window is not None and has_stats:
                end = _stats_of(loader)
                stage, cap, blocked = _stage_delta(base, end, ph.samples - window_samples_before)
                for k in STAGES:
                    ph.stage_s[k] += stage[k]
                ph.capacity_s += cap
                ph.blocked_s += blocked
                ph.stats = end
            if t_window is not None and ph.cores_used is None and (
                    done or (epochs is not None and epoch >= epochs)):
                ph.cores_used = monitor.stop()  # before the loader's threads are shut down
            close = getattr(it, "close", None)
            if callable(close):
                close()
            del it
        if not got_any:
            break
        if epochs is None and seconds is None:
            break
        if t_window is None and time.perf_counter() - t_start > 600:
            raise RuntimeError("the loader delivered fewer batches than warmup_batches in 10 minutes")
    if t_window is None or ph.batches == 0:
        raise ValueError(f"the loader delivered {seen} batches, not more than warmup_batches={warmup}; "
                         "lower warmup_batches or give more data")
    if progress is not None:
        progress(t_last - t_window, ph.samples, ph.batches)
    # The window ends with the last batch consumed (or the last epoch's end), before the
    # iterator is closed: shutting a loader's threads down is not part of its throughput.
    ph.wall_s = t_last - t_window
    if ph.cores_used is None:
        ph.cores_used = monitor.stop()
    ph.peak_rss = monitor.peak_rss
    ph.rss_source = monitor.source
    return ph


def replay_consumer(
    batches: list,
    model_step: float | Callable[[Any], Any],
    seconds: float = 1.0,
    min_steps: int = 3,
) -> float:
    """Samples/s of the consumer alone, fed cached batches ("infinitely fast data").

    Parameters
    ----------
    batches : list
        Batches to replay in a cycle (copies, so no loader is involved).
    model_step : float or callable
        As for :func:`benchmark` (must not be 0).
    seconds : float
        How long to replay (at least ``min_steps`` steps).

    Returns
    -------
    float
        Samples per second the consumer processes when data is free.
    """
    step, _ = _model_fn(model_step)
    if step is None:
        return math.inf
    if not batches:
        raise ValueError("replay_consumer needs at least one batch")
    lens = [_batch_len(b) for b in batches]
    samples = 0
    k = 0
    t0 = time.perf_counter()
    while True:
        step(batches[k % len(batches)])
        samples += lens[k % len(batches)]
        k += 1
        if k >= min_steps and time.perf_counter() - t0 >= seconds:
            break
    return samples / (time.perf_counter() - t0)


def _throughput_series(times: list, interval: float = 0.5) -> dict:
    """Delivered samples/s per ``interval`` from (t, cumulative samples) points."""
    if not times:
        return {"t_s": (), "samples_per_s": ()}
    t = np.array([x[0] for x in times])
    c = np.array([x[1] for x in times], dtype=np.float64)
    end = float(t[-1])
    nbins = max(1, math.ceil(end / interval))
    edges = np.minimum(np.arange(1, nbins + 1) * interval, end)
    # Cumulative samples at each edge (step function: what had arrived by then).
    cum = np.concatenate([[0.0], c])[np.searchsorted(t, edges, side="right")]
    starts = np.concatenate([[0.0], edges[:-1]])
    dur = np.maximum(edges - starts, 1e-9)
    counts = np.diff(np.concatenate([[0.0], cum]))
    if nbins > 1 and dur[-1] < interval / 2:
        # A short last bin holds one or two batches: its rate is noise. Fold it into the previous.
        counts[-2] += counts[-1]
        dur[-2] += dur[-1]
        edges[-2] = edges[-1]
        counts, dur, edges = counts[:-1], dur[:-1], edges[:-1]
    rate = counts / dur
    return {"t_s": tuple(edges.tolist()), "samples_per_s": tuple(rate.tolist())}


class _Progress:
    """A tqdm.auto bar over one phase (seconds or batches), or nothing."""

    def __init__(self, enabled: bool, desc: str, seconds: float | None, batches: int | None) -> None:
        self.bar = None
        self.seconds = seconds
        if not enabled:
            return
        from tqdm.auto import tqdm

        if seconds is not None:
            self.bar = tqdm(total=round(seconds, 1), desc=desc, unit="s", leave=False,
                            bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s {postfix}")
        else:
            self.bar = tqdm(total=batches, desc=desc, unit="batch", leave=False)

    def __call__(self, elapsed: float, samples: int, batches: int) -> None:
        if self.bar is None:
            return
        if self.seconds is not None:
            self.bar.n = round(min(elapsed, self.seconds), 1)
        else:
            self.bar.n = batches
        self.bar.set_postfix_str(f"{samples / elapsed if elapsed > 0 else 0:,.0f} samples/s", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def benchmark(
    loader: Any,
    model_step: float | Callable[[Any], Any] = 0.0,
    seconds: float | None = None,
    epochs: int | None = None,
    warmup_batches: int = 5,
    *,
    ceiling: bool = True,
    replay: bool = True,
    progress: bool = False,
) -> Any:
    """Measure a loader against an infinitely fast or a simulated model, and say what limits it.

    Parameters
    ----------
    loader : DataLoader-like
        Anything iterable over batches; a ``loaderlib.DataLoader`` (or any object with the
        same ``recorder``/``stats``/``num_threads`` attributes) also gets the per-stage
        breakdown and a stage verdict. Its recorder is switched on for the run and restored.
    model_step : float or callable
        Seconds one model step takes (simulated, see NOTE [ Simulated model step ]), or a
        callable run on each batch. ``0`` is the infinitely fast model: the loader's ceiling.
    seconds : float, optional
        Length of the measured window. With ``epochs`` too, whichever ends first.
    epochs : int, optional
        Number of epochs to run (default 1 when ``seconds`` is not given either).
    warmup_batches : int
        Batches received before the window opens (NOTE [ Measured window ]). In epoch mode it
        is capped at a quarter of the batches, so small loaders still get a window.
    ceiling : bool
        With a non-zero ``model_step``, also measure the infinitely-fast-model ceiling first
        (one more run of the same length).
    replay : bool
        With a non-zero ``model_step``, also replay a few cached batches through the model
        step alone ("infinitely fast data") to measure the consumer's own rate.
    progress : bool
        Show a ``tqdm.auto`` progress bar per run.

    Returns
    -------
    Report
    """
    from .. import available_cpus
    from .report import Report
    from .verdict import diagnose

    step, desc = _model_fn(model_step)
    if seconds is not None and not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    if epochs is not None and (int(epochs) != epochs or epochs < 1):
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    if warmup_batches < 0:
        raise ValueError("warmup_batches must be >= 0")
    if seconds is None and epochs is None:
        epochs = 1
    try:
        n_batches = len(loader)
    except TypeError:
        n_batches = None
    warm = int(warmup_batches)
    expected = None
    if epochs is not None and n_batches is not None:
        expected = n_batches * epochs
        warm = min(warm, expected // 4)
    rec = getattr(loader, "recorder", None)
    was_enabled = rec.enabled if rec is not None else None
    if rec is not None:
        rec.enabled = True

    def run(fn: Callable[[Any], Any] | None, label: str, cache: int) -> _Phase:
        bar = _Progress(progress, label, seconds, None if expected is None else expected - warm)
        try:
            return _run_phase(loader, fn, seconds, epochs, warm, cache, bar)
        finally:
            bar.close()

    try:
        ceil_phase = None
        if step is None:
            main = run(None, "loader ceiling", 0)
        else:
            if ceiling:
                ceil_phase = run(None, "loader ceiling", 0)
            main = run(step, "with model step", 2 if replay else 0)
    finally:
        if rec is not None:
            rec.enabled = was_enabled

    consumer_alone = None
    if step is not None and replay and main.cached:
        consumer_alone = replay_consumer(main.cached, model_step, seconds=min(seconds or 1.0, 1.0))
    main.cached = []
    ceiling_sps = (ceil_phase or main).samples_per_s if (ceil_phase or step is None) else None
    ceiling_bps = (ceil_phase or main).batches_per_s if (ceil_phase or step is None) else None
    wait_frac = main.wait_s / main.wall_s if main.wall_s > 0 else 0.0
    stage_s = main.stage_s
    busy = None
    stage_mean_ms = None
    if stage_s is not None:
        # NOTE [ Busy fraction over the window ]: the pool's busy fraction is its stage thread
        # time over the thread time it had in the window (threads x wall). The recorder's own
        # figure sums threads x wall per batch, which counts twice the time of engines that
        # keep several batches in flight (their batch walls overlap); the window's figure
        # does not, and it also counts the time the pool idled on a full queue.
        pool = main.stats.num_threads if main.stats is not None and main.stats.num_threads else None
        busy = busy_fraction(sum(stage_s.values()), pool * main.wall_s if pool else main.capacity_s)
        stage_mean_ms = {k: (1e3 * v / main.samples if main.samples else 0.0) for k, v in stage_s.items()}
    threads = getattr(loader, "num_threads", None)
    verdict = diagnose(
        stage_s=stage_s,
        busy_fraction=busy,
        threads=threads if isinstance(threads, int) else None,
        cpus=available_cpus(),
        model_ran=step is not None,
        consumer_wait_fraction=wait_frac,
        cores_used=main.cores_used,
        gil_held=main.stats.gil_held if main.stats is not None else None,
        ceiling_samples_per_s=ceiling_sps,
        samples_per_s=main.samples_per_s,
        stage_mean_ms=stage_mean_ms,
    )
    peak_rss = max(main.peak_rss, ceil_phase.peak_rss if ceil_phase else 0)
    return Report(
        engine=getattr(loader, "engine", None),
        loader_type=type(loader).__name__,
        num_threads=threads if isinstance(threads, int) else None,
        batch_size=getattr(loader, "batch_size", None),
        model_step=desc,
        samples=main.samples,
        batches=main.batches,
        wall_s=main.wall_s,
        samples_per_s=main.samples_per_s,
        batches_per_s=main.batches_per_s,
        first_batch_s=(ceil_phase or main).first_batch_s,
        ceiling_samples_per_s=ceiling_sps,
        ceiling_batches_per_s=ceiling_bps,
        accelerator_idle_fraction=wait_frac if step is not None else None,
        consumer_wait_s=main.wait_s,
        model_s=main.model_s,
        consumer_alone_samples_per_s=consumer_alone,
        headspace=(ceiling_sps / consumer_alone) if (ceiling_sps and consumer_alone) else None,
        stage_s=stage_s,
        stage_mean_ms=stage_mean_ms,
        busy_fraction=busy,
        producer_blocked_s=main.blocked_s if stage_s is not None else None,
        cpu_cores_used=main.cores_used,
        cpus_available=available_cpus(),
        peak_rss_bytes=int(peak_rss),
        rss_source=main.rss_source,
        stats=main.stats,
        series=_throughput_series(main.times),
        verdict=verdict,
    )
