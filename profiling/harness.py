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
``seconds`` or ``epochs``. The ceiling run and the run with the model use the same warm-up
and the same length, so their rates compare like with like.

The window is accounted once, by ``loaderlib.stats.window_of`` (NOTE [ One accounting ]):
the consumer's side from the harness's own records of each batch (when ``next()`` returned
it, how long it blocked, how long the model step took, whether it was the first batch of
an epoch), the pipeline's side from the loader recorder's time bins of every epoch the
window overlaps, cut at the window's edges. Both sides read one clock
(``loaderlib.stats.clock_ns``), which tests replace to run the harness without real time.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ..stats import Delivery, clock_ns, split_window, window_of

__all__ = ["benchmark", "replay_consumer"]

# Length of one part of the window (the verdict's confidence compares the parts), and the
# most parts a window is cut into.
PART_S = 0.5
MAX_PARTS = 8


def _now() -> float:
    """Seconds on the profiling clock (the recorder's clock)."""
    return clock_ns() / 1e9


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
        self._others0: dict = {}
        self._machine0 = 0.0
        self.other_cores: float | None = None
        self.top_others: list = []

    def _tree(self) -> list:
        import psutil

        now = _now()
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

    def _others(self) -> tuple[float, dict]:
        """Machine-wide busy CPU seconds, and CPU seconds of every process outside this tree."""
        if self._proc is None:
            return 0.0, {}
        import psutil

        t = psutil.cpu_times()
        machine = t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + \
            getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)
        mine = {p.pid for p in self._tree()}
        others = {}
        for p in psutil.process_iter(["name", "cpu_times"]):
            if p.pid in mine or p.info["cpu_times"] is None:
                continue
            c = p.info["cpu_times"]
            others[p.pid] = (p.info["name"] or "?", c.user + c.system)
        return machine, others

    def start(self) -> None:
        self._cpu0 = self._cpu()
        self._machine0, self._others0 = self._others()
        self._t0 = _now()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="loaderlib-benchmark-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """Stop sampling; return the CPU cores used on average since :meth:`start`.

        Also sets :attr:`other_cores` (cores the rest of the machine used meanwhile) and
        :attr:`top_others` (the busiest other processes, ``(name, cores)``).
        """
        wall = _now() - self._t0
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        cpu = self._cpu() - self._cpu0
        mine = cpu / wall if wall > 0 else 0.0
        if self._proc is not None and wall > 0:
            machine, others = self._others()
            self.other_cores = max(0.0, (machine - self._machine0) / wall - mine)
            used = {}
            for pid, (name, c) in others.items():
                if pid in self._others0:
                    used[name] = used.get(name, 0.0) + max(0.0, c - self._others0[pid][1]) / wall
            self.top_others = sorted(((k, v) for k, v in used.items() if v >= 0.05), key=lambda x: -x[1])[:5]
        return mine


# -- one pass over a loader ------------------------------------------------------------------
@dataclasses.dataclass
class _Phase:
    """What one pass over the loader recorded; :meth:`window` accounts it."""

    seen: int = 0
    first_batch_s: float = float("nan")
    t_window: float = 0.0
    t_end: float = 0.0
    deliveries: list = dataclasses.field(default_factory=list)
    epochs: list = dataclasses.field(default_factory=list)  # the recorder's Stats of each epoch
    has_stats: bool = False
    buffered: float = 0.0
    stats: Any = None
    cores_used: float | None = None
    other_cores: float | None = None
    top_others: list = dataclasses.field(default_factory=list)
    cached: list = dataclasses.field(default_factory=list)
    peak_rss: int = 0
    rss_source: str = ""

    def window(self) -> Any:
        return window_of(self.epochs, self.t_window, self.t_end, self.deliveries)

    def parts(self) -> list:
        k = max(1, min(MAX_PARTS, int((self.t_end - self.t_window) / PART_S)))
        return split_window(self.epochs, self.t_window, self.t_end, k, self.deliveries)


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
    ph = _Phase(has_stats=getattr(loader, "recorder", None) is not None)
    monitor = _ResourceMonitor()
    t_window = None
    t_progress = 0.0
    done = False
    epoch = 0
    t_start = _now()

    def open_window() -> None:
        # The bookkeeping comes first, so none of it is inside the window.
        nonlocal t_window
        if ph.has_stats:
            st = loader.stats
            ph.buffered = float(st.queue_depth * (st.batch_size or 0))
        monitor.start()
        t_window = ph.t_window = ph.t_end = _now()

    while not done and (epochs is None or epoch < epochs):
        epoch += 1
        if t_window is None and warmup == 0:
            open_window()
        t_iter = _now()
        it = iter(loader)
        got_any = False
        first = True  # the next batch is the epoch's first (NOTE [ Epoch boundaries ])
        try:
            while True:
                t = _now()
                try:
                    batch = next(it)
                except StopIteration:
                    if t_window is not None:
                        # Waiting for the loader to say the epoch is over is an epoch boundary.
                        ph.t_end = _now()
                        ph.deliveries.append(Delivery(ph.t_end, 0, ph.t_end - t, 0.0, boundary=True))
                    break
                t1 = _now()
                got_any = True
                nb = _batch_len(batch)
                if ph.seen == 0:
                    ph.first_batch_s = t1 - t_iter
                ph.seen += 1
                if len(ph.cached) < cache:
                    ph.cached.append(_copy_batch(batch))
                ts = _now()
                if step is not None:
                    step(batch)
                te = _now()
                del batch
                if t_window is None:
                    first = False
                    if ph.seen == warmup:  # the window opens after the last warmup batch
                        open_window()
                    continue
                ph.deliveries.append(Delivery(t1, nb, t1 - (t_iter if first else t), te - ts, boundary=first))
                first = False
                ph.t_end = te
                if progress is not None and te - t_progress >= 0.1:
                    progress(te - t_window, sum(d.samples for d in ph.deliveries), len(ph.deliveries))
                    t_progress = _now()
                if seconds is not None and te - t_window >= seconds:
                    done = True
                    break
        finally:
            if ph.has_stats and t_window is not None:
                ph.stats = _stats_of(loader)
                ph.epochs.append(ph.stats)  # this epoch's bins (the recorder restarts with the next)
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
        if t_window is None and _now() - t_start > 600:
            raise RuntimeError("the loader delivered fewer batches than warmup_batches in 10 minutes")
    batches = sum(1 for d in ph.deliveries if d.samples)
    if t_window is None or batches == 0:
        raise ValueError(f"the loader delivered {ph.seen} batches, not more than warmup_batches={warmup}; "
                         "lower warmup_batches or give more data")
    if progress is not None:
        progress(ph.t_end - t_window, sum(d.samples for d in ph.deliveries), batches)
    # The window ends with the last batch consumed (or the last epoch's end), before the
    # iterator is closed: shutting a loader's threads down is not part of its throughput.
    if ph.cores_used is None:
        ph.cores_used = monitor.stop()
    ph.other_cores, ph.top_others = monitor.other_cores, monitor.top_others
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
    t0 = _now()
    while True:
        step(batches[k % len(batches)])
        samples += lens[k % len(batches)]
        k += 1
        if k >= min_steps and _now() - t0 >= seconds:
            break
    return samples / max(_now() - t0, 1e-9)


def _series(parts: list, t0: float) -> dict:
    """The window's parts as a time series: each part's end (seconds into the window), length,
    delivered rate, steady consumer wait and pool busy (the same accounting as the totals)."""
    return {
        "t_s": tuple(p.start_s + p.wall_s - t0 for p in parts),
        "dur_s": tuple(p.wall_s for p in parts),
        "samples_per_s": tuple(p.samples_per_s for p in parts),
        "wait_fraction": tuple(p.wait_fraction for p in parts),
        "busy_fraction": tuple(p.busy_fraction for p in parts),
    }


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
        Every figure from one accounting of the window (``report.window``). A window whose
        per-batch figures do not settle the answer (too few batches, or an interval around the
        consumer's wait or the leading stage's lead that straddles its line) gets
        ``report.bottleneck is None`` and a verdict that says "not enough evidence" and how many
        batches and seconds would settle it (NOTE [ Verdict rules ]).
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
    window = main.window()
    parts = main.parts()
    ceil_window = ceil_phase.window() if ceil_phase is not None else (window if step is None else None)
    ceiling_sps = ceil_window.samples_per_s if ceil_window is not None else None
    ceiling_bps = ceil_window.batches / ceil_window.wall_s if ceil_window is not None and ceil_window.wall_s else None
    has_stages = main.has_stats
    stage_mean_ms = ({k: (1e3 * v / window.samples if window.samples else 0.0) for k, v in window.stage_s.items()}
                     if has_stages else None)
    threads = getattr(loader, "num_threads", None)
    threads = threads if isinstance(threads, int) else None
    cpus = available_cpus()
    verdict = diagnose(
        window,
        parts=parts,
        threads=threads,
        cpus=cpus,
        model_ran=step is not None,
        cores_used=main.cores_used,
        gil_held=main.stats.gil_held if main.stats is not None else None,
        ceiling_samples_per_s=ceiling_sps if step is not None else None,
        buffered_samples=main.buffered,
        other_cores=main.other_cores,
        top_others=main.top_others,
        extract=getattr(main.stats, "extract", None) if main.stats is not None else None,
    )
    problems = window.problems()
    if problems:  # the accounting contradicts itself: say so rather than show it
        warnings.warn("loaderlib benchmark: inconsistent accounting: " + "; ".join(problems), RuntimeWarning,
                      stacklevel=2)
    peak_rss = max(main.peak_rss, ceil_phase.peak_rss if ceil_phase else 0)
    return Report(
        engine=getattr(loader, "engine", None),
        loader_type=type(loader).__name__,
        num_threads=threads,
        batch_size=getattr(loader, "batch_size", None),
        model_step=desc,
        samples=round(window.samples),
        batches=round(window.batches),
        wall_s=window.wall_s,
        samples_per_s=window.samples_per_s,
        batches_per_s=window.batches / window.wall_s if window.wall_s > 0 else 0.0,
        first_batch_s=(ceil_phase or main).first_batch_s,
        ceiling_samples_per_s=ceiling_sps,
        ceiling_batches_per_s=ceiling_bps,
        accelerator_idle_fraction=window.wait_fraction if step is not None else None,
        consumer_wait_s=window.consumer_wait_s,
        boundary_wait_s=window.boundary_wait_s,
        model_s=window.model_s,
        consumer_alone_samples_per_s=consumer_alone,
        headspace=(ceiling_sps / consumer_alone) if (ceiling_sps and consumer_alone) else None,
        stage_s=dict(window.stage_s) if has_stages else None,
        stage_mean_ms=stage_mean_ms,
        busy_fraction=window.busy_fraction if has_stages else None,
        producer_blocked_s=(sum(e.producer_blocked_s for e in main.epochs) if has_stages else None),
        cpu_cores_used=main.cores_used,
        cpus_available=cpus,
        other_cores=main.other_cores,
        peak_rss_bytes=int(peak_rss),
        rss_source=main.rss_source,
        stats=main.stats,
        window=window,
        parts=tuple(parts),
        ceiling_window=ceil_window if step is not None else None,
        problems=tuple(problems),
        series=_series(parts, main.t_window),
        verdict=verdict,
    )
