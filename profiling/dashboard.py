"""A live bottleneck dashboard for notebooks: ``Dashboard(loader)``.

NOTE [ Dashboard drawing ]
The plots are drawn by matplotlib's Agg renderer into one ``Figure`` (no pyplot, see NOTE
[ Figures without pyplot ] in ``_plot.py``), saved as PNG and put into a
``widgets.Image``. A redraw costs about 25 ms, well inside the half-second update period.
This was chosen over ipympl (and bqplot) because it needs no frontend extension: it works
the same in JupyterLab, classic Notebook, VS Code, headless test runs (the widget's value
is just PNG bytes) and in a notebook exported to HTML with its widget state (the last
frame is in the state).

NOTE [ Dashboard history ]
The recorder keeps a time series of the current epoch only (``loader.stats`` is per epoch).
The dashboard appends one point per update to its own history (samples/s, consumer wait,
queue depth, pool busy, each over the last second of the recorder's series), so its plots
run on across epochs and show the effect of a knob moved mid-run.

NOTE [ Dashboard threading ]
The dashboard updates from its own daemon thread (ipywidgets sends state changes from any
thread), so a training loop in the same cell is never blocked by it. Widget *events* from
the browser (moving a knob) reach the kernel only when the kernel is idle, so for the knobs
to act on a running loader, the consumer must run outside the cell: a loop in a thread,
or :meth:`Dashboard.run_in_background`, which consumes the loader with a simulated model
step in a thread (the harness's infinitely-fast or simulated model). The update thread
ends when the dashboard is closed, when the loader is closed, or after ``idle_stop``
seconds without new batches once the consumer in the background has finished.
"""

from __future__ import annotations

import collections
import html
import io
import threading
import time
from collections.abc import Callable
from typing import Any

from ..stats import STAGES, Stats, busy_fraction

__all__ = ["Dashboard"]

# Seconds of the recorder's series that the stage bar and the verdict cover, and that each
# point of the dashboard's own history averages.
RECENT_S = 4.0
POINT_S = 1.0


def _loader_closed(loader: Any) -> bool:
    return bool(getattr(loader, "closed", False))


class Dashboard:
    """Live view of a running loader: throughput, stages, queue, verdict, and knobs.

    Parameters
    ----------
    loader : DataLoader-like
        A ``loaderlib.DataLoader`` (or an object with the same ``recorder``, ``stats``,
        settable ``num_threads`` and ``prefetch``). Its recorder is switched on.
    interval : float
        Seconds between updates (0.5: about twice a second).
    autostart : bool
        Start the update thread at once (otherwise call :meth:`start`, or :meth:`update`
        by hand).
    max_threads : int, optional
        Upper end of the threads knob (default: twice the CPUs available, at least 8).
    history : int
        Points of history the plots keep (one per update).

    Attributes
    ----------
    widget : ipywidgets.VBox
        The layout (shown when the dashboard is the last expression of a cell).
    updates : int
        How many times the dashboard has refreshed.
    last_stats : Stats or None
        The snapshot the current figures come from.
    history : collections.deque
        One point per update: ``(seconds since the dashboard started, samples/s, consumer
        wait fraction, queue depth, pool busy fraction, threads)``, each over the last
        ``POINT_S`` seconds of the loader's recorder.

    Notes
    -----
    See NOTE [ Dashboard history ]
The recorder keeps a time series of the current epoch only (``loader.stats`` is per epoch).
The dashboard appends one point per update to its own history (samples/s, consumer wait,
queue depth, pool busy, each over the last second of the recorder's series), so its plots
run on across epochs and show the effect of a knob moved mid-run.

NOTE [ Dashboard threading ] and NOTE [ Dashboard drawing ] in this module.
    """

    def __init__(self, loader: Any, *, interval: float = 0.5, autostart: bool = True,
                 max_threads: int | None = None, history: int = 600) -> None:
        try:
            import ipywidgets as widgets
        except ImportError:
            raise ImportError("the dashboard needs ipywidgets: pip install 'loaderlib[notebook]' "
                              "(or pip install ipywidgets)") from None

        from .. import available_cpus

        if getattr(loader, "recorder", None) is None:
            raise TypeError("Dashboard needs a loader with a stage recorder (loader.recorder), "
                            f"got {type(loader).__name__}")
        self.loader = loader
        self.interval = float(interval)
        loader.recorder.enabled = True
        self.updates = 0
        self.last_stats: Stats | None = None
        self.last_verdict = None
        self._model_ran = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: threading.Thread | None = None
        self._consumer_error: BaseException | None = None
        self._lock = threading.Lock()
        self._fig = None
        self._cpu = _CpuMeter()
        # The dashboard's own history: the recorder's series restarts with every epoch, the
        # plots should not (NOTE [ Dashboard history ]).
        self._t0 = time.monotonic()
        self.history: collections.deque = collections.deque(maxlen=int(history))

        cpus = available_cpus()
        top = max_threads or max(8, 2 * cpus)
        self.title = widgets.HTML()
        self.figures = widgets.HTML()
        self.image = widgets.Image(format="png", layout=widgets.Layout(width="100%", max_width="980px"))
        self.verdict = widgets.HTML()
        self.threads = widgets.IntSlider(value=_int(loader.num_threads, cpus), min=1, max=top,
                                         description="threads", continuous_update=False)
        self.prefetch = widgets.IntSlider(value=_int(getattr(loader, "prefetch", 2), 2), min=1, max=32,
                                          description="prefetch", continuous_update=False)
        self.threads.observe(self._on_threads, names="value")
        self.prefetch.observe(self._on_prefetch, names="value")
        self.widget = widgets.VBox([self.title, self.figures, self.image, self.verdict,
                                    widgets.HBox([self.threads, self.prefetch])])
        self.update()
        if autostart:
            self.start()

    # -- display ---------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    # -- knobs -----------------------------------------------------------------------------
    def _on_threads(self, change: dict) -> None:
        self.loader.num_threads = int(change["new"])

    def _on_prefetch(self, change: dict) -> None:
        self.loader.prefetch = int(change["new"])

    # -- updating --------------------------------------------------------------------------
    def update(self) -> Stats:
        """Refresh every widget from a new ``loader.stats`` snapshot; return that snapshot."""
        with self._lock:
            stats = self.loader.stats
            now = _recent(stats)
            cores = self._cpu.cores()
            from .verdict import diagnose

            self.last_verdict = diagnose(
                stage_s=now["stage_s"] if any(now["stage_s"].values()) else None,
                busy_fraction=now["busy"],
                threads=stats.num_threads or _int(self.loader.num_threads, 1),
                cpus=_cpus(),
                model_ran=self._model_ran,
                consumer_wait_fraction=now["wait_fraction"],
                cores_used=cores,
                gil_held=stats.gil_held,
                samples_per_s=now["samples_per_s"],
            )
            self.last_stats = stats
            if stats.batches:
                pt = _recent(stats, POINT_S)
                self.history.append((time.monotonic() - self._t0, pt["samples_per_s"], pt["wait_fraction"],
                                     float(stats.queue_depth), pt["busy"], float(stats.num_threads)))
            self.title.value = self._title_html(stats)
            self.figures.value = self._figures_html(stats, now, cores)
            self.verdict.value = self._verdict_html(stats)
            self.image.value = self._draw(stats, now)
            # Knobs follow the loader (another cell may have changed it).
            for slider, value in ((self.threads, self.loader.num_threads),
                                  (self.prefetch, getattr(self.loader, "prefetch", None))):
                v = _int(value, slider.value)
                if slider.value != v and slider.min <= v <= slider.max:
                    slider.value = v
            self.updates += 1
            return stats

    def start(self) -> None:
        """Start (or restart) the update thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="loaderlib-dashboard", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last_batches, idle_since = -1, time.monotonic()
        wait = self.interval
        while not self._stop.wait(wait):
            if _loader_closed(self.loader):
                break
            t = time.monotonic()
            stats = self.update()
            # A redraw holds the GIL; on a slow or busy machine, update less often rather
            # than take more than about a third of one core from the loader being watched.
            wait = max(self.interval, 2 * (time.monotonic() - t))
            if stats.batches != last_batches:
                last_batches, idle_since = stats.batches, time.monotonic()
            elif (self._consumer is not None and not self._consumer.is_alive()
                  and time.monotonic() - idle_since > 3 * self.interval):
                break  # the background run is over and nothing moves any more
        self.title.value = self._title_html(self.last_stats, stopped=True)

    @property
    def running(self) -> bool:
        """Whether the update thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop updating (the widgets keep their last values)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def close(self) -> None:
        """Stop updating and the background consumer, and close the widgets."""
        self._stop.set()
        if self._consumer is not None:
            self._consumer.join()
        self.stop()
        self.widget.close()

    # -- a consumer in the background ------------------------------------------------------
    def run_in_background(self, model_step: float | Callable[[Any], Any] = 0.0, seconds: float | None = None,
                          epochs: int | None = None) -> threading.Thread:
        """Consume the loader in a thread with a simulated model, so the knobs act live.

        Parameters
        ----------
        model_step : float or callable
            Seconds per batch (simulated with ``time.sleep``, see NOTE [ Simulated model
            step ] in ``harness.py``), a callable run on each batch, or 0 for an
            infinitely fast model.
        seconds, epochs : optional
            When to stop (whichever first); default one epoch. :meth:`close` stops it too.

        Returns
        -------
        threading.Thread
            The consumer thread (join it to wait for the end).
        """
        from .harness import _model_fn

        step, _ = _model_fn(model_step)
        self._model_ran = step is not None
        if seconds is None and epochs is None:
            epochs = 1
        if self._consumer is not None and self._consumer.is_alive():
            raise RuntimeError("a background run is already going")

        def consume() -> None:
            t0 = time.monotonic()
            epoch = 0
            try:
                while not self._stop.is_set() and (epochs is None or epoch < epochs):
                    epoch += 1
                    it = iter(self.loader)
                    try:
                        for batch in it:
                            if step is not None:
                                step(batch)
                            del batch
                            if self._stop.is_set() or (seconds is not None and time.monotonic() - t0 >= seconds):
                                return
                    finally:
                        close = getattr(it, "close", None)
                        if callable(close):
                            close()
            except BaseException as e:  # noqa: BLE001 -- shown in the banner, kept for the caller
                self._consumer_error = e
                self.verdict.value = f"<b style='color:#c44e52'>the loader raised: {html.escape(repr(e))}</b>"

        self._consumer = threading.Thread(target=consume, name="loaderlib-dashboard-consumer", daemon=True)
        self._consumer.start()
        self.start()
        return self._consumer

    @property
    def consumer_error(self) -> BaseException | None:
        """The exception the background consumer stopped with, if any."""
        return self._consumer_error

    # -- rendering ---------------------------------------------------------------------------
    def _title_html(self, stats: Stats | None, stopped: bool = False) -> str:
        engine = getattr(self.loader, "engine", "?")
        state = "stopped" if stopped else ("closed" if _loader_closed(self.loader) else "live")
        return (f"<b>loaderlib dashboard</b> &mdash; {html.escape(type(self.loader).__name__)} "
                f"(engine {html.escape(str(engine))}) <i>{state}</i>")

    def _figures_html(self, stats: Stats, now: dict, cores: float | None) -> str:
        cells = [
            ("samples/s (now)", f"{now['samples_per_s']:,.1f}"),
            ("samples/s (epoch)", f"{stats.samples_per_s:,.1f}"),
            ("samples", f"{stats.samples:,}"),
            ("threads", f"{stats.num_threads}"),
            ("pool busy", f"{100 * now['busy']:.0f}%"),
            ("queue", f"{stats.queue_depth}/{stats.queue_capacity}"),
            ("consumer waits", f"{100 * now['wait_fraction']:.0f}%"),
        ]
        if cores is not None:
            cells.append(("CPU cores", f"{cores:.2f}"))
        head = "".join(f"<th style='padding:0 10px'>{html.escape(k)}</th>" for k, _ in cells)
        body = "".join(f"<td style='padding:0 10px;text-align:center'>{html.escape(v)}</td>" for _, v in cells)
        return f"<table><tr>{head}</tr><tr>{body}</tr></table>"

    def _verdict_html(self, stats: Stats) -> str:
        v = self.last_verdict
        if v is None or stats.batches == 0:
            return "<div style='padding:4px'>waiting for batches&hellip;</div>"
        color = "#55a868" if v.bottleneck == "model" else "#dd8452"
        return (f"<div style='border-left:6px solid {color};padding:4px 8px;background:#f7f7f7'>"
                f"<b>{html.escape(str(v.bottleneck))}</b>: {html.escape(v.summary)}<br>"
                f"<small>try: {html.escape(v.suggestion)}</small></div>")

    def _build_figure(self) -> None:
        # Built once; updates only move data (re-laying out the figure each frame would cost
        # several times the drawing itself).
        from matplotlib.figure import Figure

        from ._plot import STAGE_COLORS

        fig = Figure(figsize=(10.0, 2.9), dpi=72)
        fig.subplots_adjust(left=0.06, right=0.95, bottom=0.2, top=0.88, wspace=0.55)
        ax1, ax2, ax3 = fig.subplots(1, 3, width_ratios=[1.3, 1, 1.2])
        a = self._art = {"fig": fig, "ax1": ax1, "ax2": ax2, "ax3": ax3}
        (a["sps"],) = ax1.plot([], [], color="#4c72b0", lw=1.5)
        ax1.set_xlabel("seconds")
        ax1.set_ylabel("samples/s", color="#4c72b0")
        ax1.set_title("throughput and accelerator idle", fontsize=9)
        ax1b = ax1.twinx()
        (a["idle"],) = ax1b.plot([], [], color="#c44e52", lw=1, ls="--")
        ax1b.set_ylim(0, 100)
        ax1b.set_ylabel("idle %", color="#c44e52")
        names = [*STAGES, "wait"]
        a["bars"] = [ax2.barh([0], [0.0], left=0.0, height=0.6, color=STAGE_COLORS[k], label=k)[0] for k in names]
        a["bar_names"] = names
        ax2.set_yticks([])
        ax2.set_ylim(-0.6, 1.4)
        ax2.set_xlabel("ms per sample (stages: thread time)")
        ax2.set_title(f"per-stage time, last {RECENT_S:g} s", fontsize=9)
        ax2.legend(loc="upper center", ncol=3, fontsize=7, frameon=False)
        (a["queue"],) = ax3.plot([], [], color=STAGE_COLORS["collate"], lw=1.5)
        ax3.set_xlabel("seconds")
        ax3.set_ylabel("queue depth", color=STAGE_COLORS["collate"])
        ax3.set_title("queue depth and pool busy", fontsize=9)
        ax3b = ax3.twinx()
        (a["busy"],) = ax3b.plot([], [], color="#55a868", lw=1)
        ax3b.set_ylim(0, 105)
        ax3b.set_ylabel("busy %", color="#55a868")
        self._fig = fig

    def _draw(self, stats: Stats, now: dict) -> bytes:
        if self._fig is None:
            self._build_figure()
        a = self._art
        hist = list(self.history)
        t = [h[0] for h in hist]
        sps = [h[1] for h in hist]
        a["sps"].set_data(t, sps)
        a["idle"].set_data(t, [100 * h[2] for h in hist])
        a["queue"].set_data(t, [h[3] for h in hist])
        a["busy"].set_data(t, [100 * h[4] for h in hist])
        x0, x1 = (t[0], t[-1]) if t else (0.0, 1.0)
        for ax in (a["ax1"], a["ax3"]):
            ax.set_xlim(x0, max(x1, x0 + 1.0))
        top = max(sps, default=0.0)
        a["ax1"].set_ylim(0, top * 1.1 if top > 0 else 1.0)
        a["ax3"].set_ylim(0, max(1, stats.queue_capacity, *(h[3] for h in hist)) + 0.5)
        n = now["samples"] or 1.0
        left = 0.0
        for bar, name in zip(a["bars"], a["bar_names"]):
            ms = 1e3 * (now["wait_s"] if name == "wait" else now["stage_s"][name]) / n
            bar.set_x(left)
            bar.set_width(ms)
            left += ms
        a["ax2"].set_xlim(0, left * 1.05 if left > 0 else 1.0)
        buf = io.BytesIO()
        self._fig.savefig(buf, format="png")
        return buf.getvalue()


def _recent(stats: Stats, seconds: float = RECENT_S) -> dict:
    """Figures over the last ``seconds`` of the recorder's series (the whole epoch if shorter)."""
    ser = stats.series
    t = ser["t_s"]
    if not t:
        return {"samples_per_s": 0.0, "busy": 0.0, "wait_fraction": 0.0, "wait_s": 0.0, "wall_s": 0.0, "samples": 0.0,
                "stage_s": {k: 0.0 for k in STAGES}}
    start = t[-1] - seconds
    idx = [i for i, x in enumerate(t) if x > start]
    prev = [0.0, *t]
    dur = [t[i] - prev[i] for i in idx]
    wall = sum(dur) or 1e-9
    samples = sum(ser["samples_per_s"][i] * d for i, d in zip(idx, dur))
    stage_s = {k: sum(ser[f"stage_s.{k}"][i] for i in idx) for k in STAGES}
    threads = ser["threads"][idx[-1]] or 1
    wait_s = sum(ser["consumer_wait_fraction"][i] * d for i, d in zip(idx, dur))
    return {
        "samples_per_s": samples / wall,
        # Pool busy over the interval, as the harness computes it (NOTE [ Busy fraction over
        # the window ] in harness.py).
        "busy": busy_fraction(sum(stage_s.values()), threads * wall),
        "wait_fraction": wait_s / wall,
        "wait_s": wait_s,
        "wall_s": wall,
        "samples": samples,
        "stage_s": stage_s,
    }


class _CpuMeter:
    """CPU cores this process used since the previous call (None without psutil)."""

    def __init__(self) -> None:
        try:
            import psutil

            self._proc = psutil.Process()
        except ImportError:
            self._proc = None
        self._last = self._read()

    def _read(self) -> tuple[float, float] | None:
        if self._proc is None:
            return None
        t = self._proc.cpu_times()
        return time.monotonic(), t.user + t.system

    def cores(self) -> float | None:
        cur = self._read()
        if cur is None or self._last is None:
            return None
        (t0, c0), (t1, c1) = self._last, cur
        self._last = cur
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else int(default)


def _cpus() -> int:
    from .. import available_cpus

    return available_cpus()
