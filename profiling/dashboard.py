"""A live bottleneck dashboard for notebooks: ``Dashboard(loader)``.

NOTE [ Dashboard drawing ]
The plots are drawn by matplotlib into one ``Figure`` (no pyplot, see NOTE [ Figures without
pyplot ] in ``_plot.py``), saved as SVG (text as text, in a sans-serif font stack) and put
inline into a ``widgets.HTML``: sharp at any zoom or screen density, no frontend extension
needed, the same in JupyterLab, classic Notebook, VS Code, headless test runs and a
notebook exported to HTML with its widget state (the last frame is in the state, so the
export shows what the live view showed). The figure is built once with fixed margins wide
enough for every label (large rates print as "1.2k"), because a constrained layout on
every frame costs several times the drawing; a test checks that no text leaves the figure.
The update thread slows down rather than take more than a third of a core.

NOTE [ Dashboard static view ]
A widget shows only where a kernel or a saved widget state and the widget manager's
JavaScript are at hand: a static page (the docs site, GitHub's notebook viewer, nbviewer)
shows nothing of it. So the dashboard's MIME bundle carries, beside the widget view, a
static view of its last frame: ``image/png`` (the plots, drawn by the same figure) and
``text/html`` (the title, the figures strip, that image and the verdict), which a frontend
without widgets renders instead. Displayed with ``display(dash)`` or as a cell's last
expression, the output gets a display id, and every :meth:`Dashboard.update` called from
the notebook (not the update thread: a display update from a thread may be tied to a cell
that is no longer running) replaces that output's static view with the new frame, so a
notebook executed top to bottom keeps the final picture. The docs build keeps it
(``docs/_hooks.py``: it drops the widget view where a static one is beside it, and checks
that the dashboard page shows the image of each dashboard).

NOTE [ Dashboard history ]
The recorder keeps a time series of the current epoch only (``loader.stats`` is per epoch).
The dashboard keeps the last snapshot of the previous epoch too, so its "now" window (the
last ``RECENT_S`` seconds) runs across an epoch boundary, and it appends one point per
update to its own history (samples/s, steady consumer wait, queue depth, pool busy, each
over the last ``POINT_S`` seconds), so its plots run on across epochs and show the effect
of a knob moved mid-run. Epoch starts are marked on the plots; the consumer's wait for an
epoch's first batch is shown apart, never as a stage's fault (NOTE [ Epoch boundaries ]).

NOTE [ Dashboard now ]
Every "now" figure, the stage bar and the verdict come from one window
(``loaderlib.stats.window_of``) that ends at the last thing the recorder saw, not at the
wall clock: when the run ends, the figures freeze at the run's last seconds instead of
decaying towards zero, and the title says how long ago the last batch came.

NOTE [ Dashboard threading ]
The dashboard updates from its own daemon thread (ipywidgets sends state changes from any
thread), so a training loop in the same cell is never blocked by it. Widget *events* from
the browser (moving a knob) reach the kernel only when the kernel is idle, so for the knobs
to act on a running loader, the consumer must run outside the cell: a loop in a thread,
or :meth:`Dashboard.run_in_background`, which consumes the loader with a simulated model
step in a thread (the harness's infinitely-fast or simulated model). The update thread
ends when the dashboard is closed, when the loader is closed, or after ``idle_stop``
seconds without new batches once the consumer in the background has finished.

NOTE [ Dashboard autotune ]
With ``AUTOTUNE`` the tuner's decisions are in the snapshot (``Stats.autotune``: ``(time, knob,
old, new, reason)``, NOTE [ Autotune ] in ``loaderlib/_autotune.py``). The dashboard lists them
under the verdict, newest last, from the same snapshot as every other figure: they appear as
the tuner takes them, stay when the run ends (the snapshot keeps them) and are in the exported
HTML (the list is a ``widgets.HTML``, so its last value is in the widget state). The threads
and prefetch knobs follow the tuner's changes as they follow any other. A ``Pipeline`` is
watched through its head's engine stage (``Pipeline.head_loader``), re-read at each update
because after a complete ``cache`` later iterations run on another stage; its decisions are
all of the pipeline's tuners' (``Pipeline.stats["autotune"]``), timed from one origin.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import html
import io
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..stats import FONT_CSS, Stats, Window, clock_ns, split_window, window_of

__all__ = ["Dashboard"]

# Seconds of the recorder's series that the stage bar and the verdict cover, and that each
# point of the dashboard's own history averages.
RECENT_S = 4.0
POINT_S = 1.0
# The most autotune decisions listed (the newest; the count says how many there were).
AUTOTUNE_ROWS = 12
# The static view's image: pixels per inch of the 10 x 3.3 inch figure (NOTE [ Dashboard static view ]).
STATIC_DPI = 96
# The figures strip wraps into rows of cells at most this wide, in a box of at most 980 px.
CELL_PX = 150


def _loader_closed(loader: Any) -> bool:
    return bool(getattr(loader, "closed", False))


def _now() -> float:
    return clock_ns() / 1e9


class Dashboard:
    """Live view of a running loader: throughput, stages, queue, verdict, and knobs.

    Parameters
    ----------
    loader : DataLoader-like or Pipeline
        A ``loaderlib.DataLoader`` (or an object with the same ``recorder``, ``stats``,
        settable ``num_threads`` and ``prefetch``), or a ``loaderlib.Pipeline`` (its head's
        engine stage is watched, NOTE [ Dashboard autotune ]). Its recorder is switched on.
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
    autotune : ipywidgets.HTML
        The tuner's decisions (time, knob, old -> new, reason); empty when nothing is tuned.
    updates : int
        How many times the dashboard has refreshed.
    last_stats : Stats or None
        The snapshot the current figures come from.
    last_window : Window or None
        The "now" window every figure, the stage bar and the verdict read (NOTE [ Dashboard now ]).
    last_verdict : Verdict or None
        The verdict on :attr:`last_window`.
    history : collections.deque
        One point per update: ``(seconds since the dashboard started, samples/s, steady
        consumer wait fraction, queue depth, pool busy fraction, threads)``, each over the last
        ``POINT_S`` seconds the recorder saw.

    Notes
    -----
    See NOTE [ Dashboard history ], NOTE [ Dashboard now ], NOTE [ Dashboard threading ] and
    NOTE [ Dashboard drawing ] and NOTE [ Dashboard autotune ] in this module.
    """

    def __init__(self, loader: Any, *, interval: float = 0.5, autostart: bool = True,
                 max_threads: int | None = None, history: int = 600) -> None:
        try:
            import ipywidgets as widgets
        except ImportError:
            raise ImportError("the dashboard needs ipywidgets: pip install 'loaderlib[notebook]' "
                              "(or pip install ipywidgets)") from None

        from .. import available_cpus
        from ..pipeline import Pipeline

        if isinstance(loader, Pipeline):
            loader = _PipelineView(loader)
        if getattr(loader, "recorder", None) is None:
            raise TypeError("Dashboard needs a loader with a stage recorder (loader.recorder), "
                            f"got {type(loader).__name__}")
        self.loader = loader
        self.interval = float(interval)
        loader.recorder.enabled = True
        self.updates = 0
        self.last_stats: Stats | None = None
        self.last_window: Window | None = None
        self.last_verdict = None
        self._model_ran = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: threading.Thread | None = None
        self._consumer_error: BaseException | None = None
        self._lock = threading.Lock()
        self._fig = None
        self._cpu = _CpuMeter()
        self._prev_epochs: collections.deque = collections.deque(maxlen=64)  # earlier epochs' last snapshots
        self._epoch_starts: list[float] = []    # profiling-clock seconds
        self._t_seen = -1.0                     # end of the last window a history point covers
        self._t0 = _now()
        self._display_id: str | None = None      # NOTE [ Dashboard static view ]
        self._png: bytes | None = None
        self.history: collections.deque = collections.deque(maxlen=int(history))

        cpus = available_cpus()
        top = max_threads or max(8, 2 * cpus)
        box = f"{FONT_CSS}; max-width: 980px"
        self.title = widgets.HTML()
        self.figures = widgets.HTML()
        self.plots = widgets.HTML(layout=widgets.Layout(width="100%", max_width="980px"))
        self.verdict = widgets.HTML()
        self.autotune = widgets.HTML()
        self._box = box
        self.threads = widgets.IntSlider(value=_int(loader.num_threads, cpus), min=1, max=top,
                                         description="threads", continuous_update=False)
        self.prefetch = widgets.IntSlider(value=_int(getattr(loader, "prefetch", 2), 2), min=1, max=32,
                                          description="prefetch", continuous_update=False)
        self.threads.observe(self._on_threads, names="value")
        self.prefetch.observe(self._on_prefetch, names="value")
        self.widget = widgets.VBox([self.title, self.figures, self.plots, self.verdict, self.autotune,
                                    widgets.HBox([self.threads, self.prefetch])])
        # The knobs' labels too, in the exported HTML as well as live (no serif fallback).
        self.widget.add_class("loaderlib-dashboard")
        self.update()
        if autostart:
            self.start()

    # -- display ---------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        """The widget view, and a static view of the last frame beside it (NOTE [ Dashboard
        static view ]): ``image/png`` of the plots and ``text/html`` of the title, the
        figures, that image and the verdict."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = dict(bundle[0] if isinstance(bundle, tuple) else bundle or {})
        png = self.frame_png()
        data["image/png"] = base64.b64encode(png).decode("ascii")
        data["text/html"] = self.static_html(png)
        return data

    def _ipython_display_(self) -> None:
        import uuid

        from IPython.display import display

        if self._display_id is None:
            self._display_id = f"loaderlib-dashboard-{uuid.uuid4().hex}"
        display(self._repr_mimebundle_(), raw=True, display_id=self._display_id)

    def _refresh_display(self) -> None:
        """Replace the displayed output's static view with the current frame."""
        if self._display_id is None:
            return
        from IPython.display import update_display

        update_display(self._repr_mimebundle_(), raw=True, display_id=self._display_id)

    def frame_png(self) -> bytes:
        """The plots of the last frame as PNG bytes (``STATIC_DPI``)."""
        with self._lock:
            if self._fig is None:
                self._build_figure()
            buf = io.BytesIO()
            self._fig.savefig(buf, format="png", dpi=STATIC_DPI)
            self._png = buf.getvalue()
            return self._png

    def static_html(self, png: bytes | None = None) -> str:
        """The last frame as self-contained HTML: title, figures, the plots as an image, the
        verdict and the autotune decisions (NOTE [ Dashboard static view ])."""
        png = png if png is not None else self.frame_png()
        img = (f"<img class='loaderlib-dashboard-frame' alt='loaderlib dashboard plots' style='width:100%;"
               f"max-width:980px;height:auto' src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>")
        return (f"<div class='loaderlib-dashboard-static' style=\"{self._box}\">{self.title.value}"
                f"{self.figures.value}{img}{self.verdict.value}{self.autotune.value}</div>")

    # -- knobs -----------------------------------------------------------------------------
    def _on_threads(self, change: dict) -> None:
        self.loader.num_threads = int(change["new"])

    def _on_prefetch(self, change: dict) -> None:
        self.loader.prefetch = int(change["new"])

    # -- accounting ------------------------------------------------------------------------
    def _epochs(self, stats: Stats) -> list[Stats]:
        """The current epoch's snapshot and the last snapshots of the earlier epochs that end
        within ``RECENT_S`` of it (NOTE [ Dashboard history ])."""
        last = self.last_stats
        if last is not None and stats.started_s != last.started_s:
            # The epoch's final figures when the recorder kept them (our last poll may predate its end).
            ended = getattr(self.loader.recorder, "previous_epoch", lambda: None)()
            self._prev_epochs.append(ended if ended is not None and ended.started_s >= last.started_s else last)
            self._epoch_starts.append(stats.started_s)
        elif last is None and stats.batches:
            self._epoch_starts.append(stats.started_s)
        end = stats.started_s + stats.elapsed_s
        keep = [e for e in self._prev_epochs if e.started_s + e.elapsed_s > end - RECENT_S]
        return [*keep, stats]

    # -- updating --------------------------------------------------------------------------
    def update(self) -> Stats:
        """Refresh every widget from a new ``loader.stats`` snapshot; return that snapshot.

        Called from the notebook, it also replaces the displayed output's static view with
        the new frame (NOTE [ Dashboard static view ])."""
        stats = self._update()
        if threading.current_thread() is not self._thread:
            self._refresh_display()
        return stats

    def _update(self) -> Stats:
        from .. import available_cpus
        from .verdict import diagnose

        with self._lock:
            stats = self.loader.stats
            epochs = self._epochs(stats)
            end = stats.started_s + stats.elapsed_s
            start = max(end - RECENT_S, min(e.started_s for e in epochs))
            k = max(1, round((end - start) / 0.5))
            now = window_of(epochs, start, end)
            parts = split_window(epochs, start, end, k)
            self._cpu.sample()
            cpu = self._cpu.cores(start, end)
            cores, others = cpu if cpu is not None else (None, None)
            self.last_verdict = diagnose(
                now,
                parts=parts,
                threads=stats.num_threads or _int(self.loader.num_threads, 1),
                cpus=available_cpus(),
                model_ran=self._model_ran,
                cores_used=cores,
                other_cores=others,
                gil_held=stats.gil_held,
                extract=stats.extract,
            )
            self.last_stats = stats
            self.last_window = now
            if stats.batches and end > self._t_seen:
                self._t_seen = end
                pt = window_of(epochs, max(end - POINT_S, start), end)
                self.history.append((end - self._t0, pt.samples_per_s, pt.wait_fraction,
                                     float(stats.queue_depth), pt.busy_fraction, float(stats.num_threads)))
            self.title.value = self._title_html(stats)
            self.figures.value = self._figures_html(stats, now, cores, others)
            self.verdict.value = self._verdict_html(stats)
            self.autotune.value = self._autotune_html(stats)
            self.plots.value = self._draw(stats, now)
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
            stats = self._update()
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
        kind = type(getattr(self.loader, "pipeline", self.loader)).__name__
        if _loader_closed(self.loader):
            state = "closed"
        elif self._consumer is not None and not self._consumer.is_alive():
            state = "run finished: figures frozen at its last seconds"
        elif stopped:
            state = "stopped"
        else:
            state = "live"
        if stats is not None and stats.batches and state == "live":
            ago = _now() - (stats.started_s + stats.elapsed_s)
            if ago > 2 * max(self.interval, 0.5):
                state = f"live, no batch for {ago:.0f} s: figures show the last seconds with batches"
        style = ("<style>.loaderlib-dashboard, .loaderlib-dashboard .widget-label, .loaderlib-dashboard "
                 f".widget-readout {{{FONT_CSS}}}</style>")
        return (f"{style}<div style=\"{self._box}\"><span style='font-size:16px;font-weight:600'>loaderlib dashboard"
                f"</span> &mdash; {html.escape(kind)} (engine {html.escape(str(engine))}) "
                f"<i>{html.escape(state)}</i></div>")

    def _figures_html(self, stats: Stats, now: Window, cores: float | None, others: float | None = None) -> str:
        cells = [
            (f"samples/s (last {now.wall_s:.0f} s)", f"{now.samples_per_s:,.1f}"),
            ("samples/s (epoch)", f"{stats.samples_per_s:,.1f}"),
            ("samples", f"{stats.samples:,}"),
            ("threads", f"{stats.num_threads}"),
            ("pool busy", f"{100 * now.busy_fraction:.0f}%"),
            ("queue", f"{stats.queue_depth}/{stats.queue_capacity}"),
            ("consumer waits", f"{100 * now.wait_fraction:.0f}%"),
            ("epoch starts", f"{100 * now.boundary_fraction:.0f}%"),
        ]
        if stats.tokens or stats.padding_tokens:
            cells[2:2] = [("tokens/s (epoch)", f"{stats.tokens_per_s:,.0f}"),
                          ("padding", f"{100 * stats.padding_share:.1f}%")]
        if cores is not None:
            cells.append(("CPU cores", f"{cores:.2f}"))
        if others is not None:
            cells.append(("other processes", f"{others:.2f} cores"))
        ex = getattr(stats, "extract", None)
        if ex is not None and ex.reads:
            # NOTE [ Read-ahead ]: the Extract stage beside the compute figures; every read, the
            # decode threads' own included (NOTE [ Every read counts ] in include/ll_readahead.h).
            cells += [
                ("reads in flight", f"{ex.reads_in_flight}/{ex.io_depth}" + (" (adaptive)" if ex.adaptive else "")),
                ("reads", f"{ex.reads:,}" + (f" ({ex.inline_reads:,} by decode threads)" if ex.inline_reads else "")),
                ("read latency p50/p95", f"{ex.latency_p50_ms:.2f}/{ex.latency_p95_ms:.2f} ms"),
                ("read MB/s", f"{ex.bytes_per_s / 1e6:,.1f}"),
                ("waited for bytes", f"{ex.read_wait_s:.2f} thread-s"),
            ]
        else:
            cells.append(("reads", "not counted (samples from memory, Python or workers)"))
        per_source = getattr(stats, "sources", None) or {}
        if per_source:   # a MixtureDataset: samples delivered per source this epoch
            cells.append(("per source", ", ".join(f"{k.split(' ', 1)[0]} {v:,}" for k, v in per_source.items())))
        mem = getattr(stats, "memory", None) or {}
        if mem:
            cells.append(("memory", ", ".join(f"{k} {v / 2**20:,.0f} MB" for k, v in mem.items())))
        # One cell per figure (label over value), wrapping into rows: 15 columns of a table
        # overflowed a 1,280 px page.
        cell = (f"<div class='loaderlib-kpi' style='box-sizing:border-box;width:{CELL_PX}px;padding:2px 6px;"
                "text-align:center'><div style='font-weight:600'>{}</div><div>{}</div></div>")
        body = "".join(cell.format(html.escape(k), html.escape(v)) for k, v in cells)
        return (f"<div class='loaderlib-kpis' style=\"{self._box};display:flex;flex-wrap:wrap;"
                f"row-gap:4px\">{body}</div>")

    def _verdict_html(self, stats: Stats) -> str:
        v = self.last_verdict
        if v is None or stats.batches == 0:
            return f"<div style=\"{self._box};padding:4px\">waiting for batches&hellip;</div>"
        color = "#55a868" if v.bottleneck == "model" else ("#999999" if not v.enough else "#dd8452")
        name = v.bottleneck if v.enough else "gathering evidence"
        notes = "".join(f"<br>note: {html.escape(n)}" for n in v.notes)
        return (f"<div style=\"{self._box};border-left:6px solid {color};padding:6px 10px;background:#f7f7f7\">"
                f"<b>{html.escape(str(name))}</b>: {html.escape(v.summary)}<br>"
                f"try: {html.escape(v.suggestion)}{notes}</div>")

    def _autotune_html(self, stats: Stats) -> str:
        """The tuner's decisions in ``stats`` as a table, newest last (NOTE [ Dashboard autotune ])."""
        rows = tuple(getattr(stats, "autotune", ()) or ())
        if not rows:
            return ""
        shown = rows[-AUTOTUNE_ROWS:]
        more = f", the last {len(shown)} shown" if len(shown) < len(rows) else ""
        cell = "<td style='padding:0 10px;vertical-align:top'>{}</td>"
        head = "".join(f"<th style='padding:0 10px;font-weight:600;text-align:left'>{k}</th>"
                       for k in ("t (s)", "knob", "change", "why"))
        body = "".join(
            "<tr>" + "".join(cell.format(html.escape(v)) for v in (f"{t:.1f}", str(knob), f"{old} \u2192 {new}",
                                                                   str(reason))) + "</tr>"
            for t, knob, old, new, reason in shown)
        n = len(rows)
        return (f"<div style=\"{self._box};padding:4px 0\"><b>autotune</b>: {n} decision{'s' if n != 1 else ''}"
                f"{more} (t: seconds since the loader or pipeline was made)<table><tr>{head}</tr>{body}</table></div>")

    def _build_figure(self) -> None:
        # Built once; updates only move data. A fixed layout, wide enough margins for every label: a constrained layout per frame
        # would cost several times the drawing itself (NOTE [ Dashboard drawing ]).
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter

        from ._plot import LABEL_PT, STAGE_COLORS, TITLE_PT, _style

        fig = Figure(figsize=(10.0, 3.3))
        fig.subplots_adjust(left=0.065, right=0.925, bottom=0.16, top=0.9, wspace=0.62)
        ax1, ax2, ax3 = fig.subplots(1, 3, width_ratios=[1.3, 1, 1.2])
        compact = FuncFormatter(lambda v, _pos: f"{v / 1000:g}k" if abs(v) >= 1000 else f"{v:g}")
        ax1.yaxis.set_major_formatter(compact)
        a = self._art = {"fig": fig, "ax1": ax1, "ax2": ax2, "ax3": ax3}
        (a["sps"],) = ax1.plot([], [], color="#4c72b0", lw=1.8, label="samples/s")
        ax1.set_xlabel("seconds", fontsize=LABEL_PT)
        ax1.set_ylabel("samples/s", color="#4c72b0", fontsize=LABEL_PT)
        ax1.set_title("throughput and accelerator idle", fontsize=TITLE_PT)
        ax1b = ax1.twinx()
        (a["idle"],) = ax1b.plot([], [], color="#c44e52", lw=1.2, ls="--", label="idle %")
        ax1b.set_ylim(0, 100)
        ax1b.set_ylabel("idle %", color="#c44e52", fontsize=LABEL_PT)
        a["ax1b"] = ax1b
        a["stage_color"] = STAGE_COLORS
        (a["queue"],) = ax3.plot([], [], color=STAGE_COLORS["collate"], lw=1.8)
        ax3.set_xlabel("seconds", fontsize=LABEL_PT)
        ax3.set_ylabel("queue depth", color=STAGE_COLORS["collate"], fontsize=LABEL_PT)
        ax3.set_title("queue depth and pool busy", fontsize=TITLE_PT)
        ax3b = ax3.twinx()
        (a["busy"],) = ax3b.plot([], [], color="#55a868", lw=1.2)
        ax3b.set_ylim(0, 105)
        ax3b.set_ylabel("busy %", color="#55a868", fontsize=LABEL_PT)
        a["ax3b"] = ax3b
        for ax in (ax1, ax1b, ax3, ax3b):
            ax.tick_params(labelsize=9)
        _style(ax1)
        _style(ax3)
        a["marks"] = []
        self._fig = fig

    def _draw(self, stats: Stats, now: Window) -> str:
        from ._plot import draw_stage_bar, figure_svg

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
        for m in a["marks"]:
            m.remove()
        a["marks"] = [a["ax1"].axvline(s - self._t0, color="#888888", ls=":", lw=1)
                      for s in self._epoch_starts if x0 <= s - self._t0 <= x1]
        top = max(sps, default=0.0)
        a["ax1"].set_ylim(0, top * 1.15 if top > 0 else 1.0)
        a["ax3"].set_ylim(0, max(1, stats.queue_capacity, *(h[3] for h in hist)) + 0.5)
        a["ax2"].clear()
        draw_stage_bar(a["ax2"], now.stage_s, title=f"stage shares, last {now.wall_s:.0f} s")
        return figure_svg(self._fig, text=True)


class _PipelineView:
    """What the dashboard watches of a ``Pipeline``: the loader of its head's engine stage,
    re-read on each access, with every tuner's decisions (NOTE [ Dashboard autotune ])."""

    closed = False

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self._head = pipeline.head_loader
        if self._head is None:
            raise TypeError(f"the dashboard watches an engine stage, and {pipeline!r} runs none "
                            "(add a map of loaderlib transforms or a batch after the source)")

    def _current(self) -> Any:
        head = self.pipeline.head_loader
        if head is not None and head is not self._head:
            # Another stage runs now (after a complete cache): record it as the first one was.
            head.recorder.enabled = self._head.recorder.enabled
            self._head = head
        return self._head

    @property
    def recorder(self) -> Any:
        return self._current().recorder

    @property
    def stats(self) -> Stats:
        return dataclasses.replace(self._current().stats, autotune=tuple(self.pipeline.stats["autotune"]))

    @property
    def engine(self) -> str:
        return self._current().engine

    @property
    def num_threads(self) -> int:
        return self._current().num_threads

    @num_threads.setter
    def num_threads(self, value: int) -> None:
        self._current().num_threads = value

    @property
    def prefetch(self) -> int:
        return self._current().prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._current().prefetch = value

    def __iter__(self) -> Iterator:
        return iter(self.pipeline)


class _CpuMeter:
    """CPU seconds of this process and of the whole machine, sampled at each update, to give the
    cores this process and all others used over any window between samples (None without psutil)."""

    def __init__(self, keep: int = 256) -> None:
        try:
            import psutil

            self._psutil = psutil
            self._proc = psutil.Process()
        except ImportError:
            self._proc = None
        self._samples: collections.deque = collections.deque(maxlen=keep)
        self.sample()

    def sample(self) -> None:
        if self._proc is None:
            return
        t = self._proc.cpu_times()
        m = self._psutil.cpu_times()
        busy = m.user + m.system + getattr(m, "nice", 0.0) + getattr(m, "irq", 0.0) + \
            getattr(m, "softirq", 0.0) + getattr(m, "steal", 0.0)
        self._samples.append((_now(), t.user + t.system, busy))

    def cores(self, start: float, end: float) -> tuple[float, float] | None:
        """``(this process, every other process)`` cores used between the samples nearest
        ``start`` and ``end``."""
        s = list(self._samples)
        if len(s) < 2:
            return None
        a = min(s, key=lambda x: abs(x[0] - start))
        b = min(s, key=lambda x: abs(x[0] - end))
        if b[0] - a[0] < 0.2:
            a, b = s[-2], s[-1]
        if b[0] <= a[0]:
            return None
        mine = (b[1] - a[1]) / (b[0] - a[0])
        return mine, max(0.0, (b[2] - a[2]) / (b[0] - a[0]) - mine)


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else int(default)
