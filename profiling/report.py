"""``Report``: what :func:`loaderlib.profiling.benchmark` measured, and the verdict."""

from __future__ import annotations

import dataclasses
import html
import json
from typing import Any

from .._observe.stats import _jsonable
from ..stats import FONT_CSS, STAGES, Stats, Window
from .verdict import Verdict

__all__ = ["Report"]


def _extract_line(stats: Stats | None) -> str:
    """The Extract stage's line of a report (NOTE [ Every read counts ] in
    ``pyx/include/ll_readahead.h``): every read the loader did, or why none was counted."""
    ex = getattr(stats, "extract", None) if stats is not None else None
    if ex is not None and ex.reads:
        return ex.line()
    if stats is None or not getattr(stats, "enabled", True):
        return "not measured (the loader's recorder was off)"
    return ("no reads counted: the samples came from memory, a Python dataset's own reads or worker processes, "
            "which the Extract stage does not see")


@dataclasses.dataclass(frozen=True)
class Report:
    """The result of one :func:`~loaderlib.profiling.benchmark` run.

    Rates and times cover the measured window (see NOTE [ Measured window ] in
    ``harness.py``), accounted once (:attr:`window`); times are seconds.

    Attributes
    ----------
    engine, loader_type : str
        ``loader.engine`` (None if it has none) and the loader's class name.
    num_threads, batch_size : int or None
        The loader's settings.
    model_step : str
        What consumed the batches, in words.
    samples, batches, wall_s, samples_per_s, batches_per_s
        Delivered to the consumer in the window.
    first_batch_s : float
        From ``iter(loader)`` to the first batch.
    ceiling_samples_per_s, ceiling_batches_per_s : float or None
        The same loader under an infinitely fast model (None if not measured).
    accelerator_idle_fraction : float or None
        With a model step: share of the window the consumer waited for data in steady state.
    consumer_wait_s, boundary_wait_s, model_s : float
        Time blocked in ``next()`` in steady state, time blocked at epoch boundaries (the
        refill at each epoch start, apart), and time in the model step.
    consumer_alone_samples_per_s : float or None
        The model step fed cached batches ("infinitely fast data").
    headspace : float or None
        ``ceiling / consumer_alone``: above 1 the loader could feed a faster consumer.
    stage_s, stage_mean_ms : dict or None
        Thread seconds per stage in the window, and per delivered sample in ms.
    busy_fraction : float or None
        Stage thread time / thread time available to the loader's pool.
    producer_blocked_s : float or None
        Time the pipeline waited on a full prefetch queue.
    cpu_cores_used, cpus_available : float, int
        CPU time of the process tree / wall time, and the CPUs the process may use.
    other_cores : float or None
        CPU cores the rest of the machine used during the window (None without psutil).
    peak_rss_bytes, rss_source : int, str
        Peak resident memory and how it was measured.
    stats : Stats or None
        The loader's last ``stats`` snapshot.
    window : Window
        The one accounting every figure above comes from.
    parts : tuple of Window
        The window cut into consecutive parts (about 0.5 s each): the verdict's confidence.
    ceiling_window : Window or None
        The ceiling run's window (same warm-up and length), when a model step ran.
    problems : tuple of str
        Invariants the window breaks (empty for a consistent loader; see
        :meth:`loaderlib.stats.Window.problems`).
    series : dict
        The parts as a time series: ``t_s`` (end of each part, seconds into the window),
        ``dur_s``, ``samples_per_s``, ``wait_fraction``, ``busy_fraction``.
    verdict : Verdict
        What limits the loader; see :attr:`bottleneck`.
    """

    engine: str | None
    loader_type: str
    num_threads: int | None
    batch_size: int | None
    model_step: str
    samples: int
    batches: int
    wall_s: float
    samples_per_s: float
    batches_per_s: float
    first_batch_s: float
    ceiling_samples_per_s: float | None
    ceiling_batches_per_s: float | None
    accelerator_idle_fraction: float | None
    consumer_wait_s: float
    boundary_wait_s: float
    model_s: float
    consumer_alone_samples_per_s: float | None
    headspace: float | None
    stage_s: dict | None
    stage_mean_ms: dict | None
    busy_fraction: float | None
    producer_blocked_s: float | None
    cpu_cores_used: float
    cpus_available: int
    other_cores: float | None
    peak_rss_bytes: int
    rss_source: str
    stats: Stats | None
    window: Window
    parts: tuple
    ceiling_window: Window | None
    problems: tuple
    series: dict
    verdict: Verdict

    @property
    def bottleneck(self) -> str | None:
        """``io``, ``decode``, ``transform``, ``python``, ``collate`` or ``model`` (see :class:`Verdict`)."""
        return self.verdict.bottleneck

    @property
    def consumer_wall_fraction(self) -> float:
        """(steady wait + boundary wait + model step) / measured wall time: the consumer's side, accounted."""
        if self.wall_s <= 0:
            return 0.0
        return (self.consumer_wait_s + self.boundary_wait_s + self.model_s) / self.wall_s

    # -- export --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of every field (JSON-serialisable)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["stats"] = self.stats.to_dict() if self.stats is not None else None
        d["verdict"] = self.verdict.to_dict()
        d["window"] = self.window.to_dict()
        d["parts"] = [p.to_dict() for p in self.parts]
        d["ceiling_window"] = self.ceiling_window.to_dict() if self.ceiling_window is not None else None
        d["bottleneck"] = self.bottleneck
        d["consumer_wall_fraction"] = self.consumer_wall_fraction
        return _jsonable(d)

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), **kwargs)

    # -- display -------------------------------------------------------------------------
    def _lines(self) -> list[tuple[str, str]]:
        who = self.loader_type + (f" (engine {self.engine})" if self.engine else "")
        rows = [
            ("loader", who + (f", {self.num_threads} threads" if self.num_threads else "")
             + (f", batch {self.batch_size}" if self.batch_size else "")),
            ("model step", self.model_step),
            ("throughput", (f"{self.samples_per_s:,.1f} samples/s, {self.batches_per_s:,.2f} batches/s "
                           f"({self.samples} samples in {self.wall_s:.2f} s)")),
            ("first batch", f"{1e3 * self.first_batch_s:,.0f} ms"),
        ]
        st = self.stats
        if st is not None and getattr(st, "tokens", 0) and st.samples:
            # token datasets: the window's rate in tokens, at the epoch's tokens per sample
            rows.insert(3, ("tokens", f"{self.samples_per_s * st.tokens / st.samples:,.0f} tokens/s, padding "
                                      f"{100 * st.padding_share:.1f}% of positions"))
        if self.ceiling_samples_per_s is not None:
            rows.append(("ceiling", f"{self.ceiling_samples_per_s:,.1f} samples/s (infinitely fast model)"))
        if self.accelerator_idle_fraction is not None:
            rows.append(("accelerator idle", f"{100 * self.accelerator_idle_fraction:.1f}% in steady state"))
        if self.boundary_wait_s > 0:
            rows.append(("epoch boundaries", (f"{100 * self.boundary_wait_s / self.wall_s:.1f}% of the window waiting "
                         f"for an epoch's first batch ({self.window.epochs} epoch starts; no stage blamed)")))
        if self.consumer_alone_samples_per_s is not None:
            text = f"{self.consumer_alone_samples_per_s:,.1f} samples/s (infinitely fast data)"
            if self.headspace is not None:
                text += f", headspace {self.headspace:.2f}x"
            rows.append(("consumer alone", text))
        if self.busy_fraction is not None:
            rows.append(("pool busy", f"{100 * self.busy_fraction:.0f}%"))
        rows.append(("Extract", _extract_line(self.stats)))
        cpu = f"{self.cpu_cores_used:.2f} of {self.cpus_available} cores used"
        if self.other_cores is not None:
            cpu += f"; other processes used {self.other_cores:.2f}"
        rows.append(("CPU", cpu))
        if self.verdict.confidence is not None:
            rows.append(("confidence", f"{100 * self.verdict.confidence:.0f}% of {len(self.parts)} parts agree"))
        rows.append(("peak RSS", f"{self.peak_rss_bytes / 2**20:,.0f} MiB ({self.rss_source})"))
        return rows

    @property
    def extract(self) -> Any:
        """The read stage's figures of the last epoch measured (``stats.extract``; None when
        no read was counted)."""
        return getattr(self.stats, "extract", None) if self.stats is not None else None

    def _stage_rows(self) -> list[tuple[str, str, str, str]]:
        if self.stage_s is None:
            return []
        total = sum(self.stage_s.values()) or 1.0
        return [(k, f"{self.stage_s[k]:.3f}", f"{100 * self.stage_s[k] / total:.1f}%",
                 f"{self.stage_mean_ms[k]:.3f}") for k in STAGES]

    def __repr__(self) -> str:
        out = ["Report("]
        width = max(len(k) for k, _ in self._lines())
        out += [f"  {k.ljust(width)}  {v}" for k, v in self._lines()]
        if self.stage_s is not None:
            head = ("stage", "thread s", "share", "ms/sample")
            rows = [head, *self._stage_rows()]
            w = [max(len(r[i]) for r in rows) for i in range(4)]
            for r in rows:
                out.append("  " + r[0].ljust(w[0]) + "  " + "  ".join(c.rjust(x) for c, x in zip(r[1:], w[1:])))
        out.append(f"  bottleneck: {self.bottleneck}: {self.verdict.summary}")
        out.append(f"  try: {self.verdict.suggestion}")
        out += [f"  note: {n}" for n in self.verdict.notes]
        out += [f"  accounting problem: {p}" for p in self.problems]
        out[-1] += ")"
        return "\n".join(out)

    def _repr_html_(self) -> str:
        p = [(f"<div class='loaderlib-report' style=\"{FONT_CSS}\"><b>loaderlib benchmark</b>"
             "<table style='border-collapse:collapse'>")]
        p += [f"<tr><th style='text-align:left;padding:1px 12px 1px 0'>{html.escape(k)}</th>"
              f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in self._lines()]
        p.append("</table>")
        if self.stage_s is not None:
            p.append("<table><thead><tr><th>stage</th><th>thread s</th><th>share</th><th>ms/sample</th>"
                     "</tr></thead><tbody>")
            p += ["<tr>" + "".join(f"<td style='text-align:right;padding:1px 8px'>{html.escape(c)}</td>" for c in r)
                  + "</tr>" for r in self._stage_rows()]
            p.append("</tbody></table>")
        p.append(f"<p><b>Bottleneck: {html.escape(str(self.bottleneck))}</b>: "
                 f"{html.escape(self.verdict.summary)}<br>Try: {html.escape(self.verdict.suggestion)}</p>")
        p += [f"<p>Note: {html.escape(n)}</p>" for n in self.verdict.notes]
        p += [f"<p style='color:#c44e52'>Accounting problem: {html.escape(x)}</p>" for x in self.problems]
        p.append("</div>")
        return "".join(p)

    def plot(self, fig: Any = None) -> Any:
        """Stage shares (labelled in percent) and delivered throughput over the window's parts.

        The figure lays itself out (constrained layout, legends inside the figure), so
        ``fig.savefig(path)`` keeps every label and legend.

        Returns
        -------
        matplotlib.figure.Figure
        """
        from ._plot import draw_stage_bar, draw_throughput, new_figure

        if fig is None:
            fig = new_figure()
        else:
            fig.clear()
        ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.3])
        if self.stage_s is not None:
            title = (f"stage shares: {self.bottleneck}-bound" if self.bottleneck
                     else "stage shares (verdict: " + ("not enough evidence)" if not self.verdict.enough
                                                       else "none)"))
            draw_stage_bar(ax1, self.stage_s, title=title)
        else:
            ax1.text(0.5, 0.5, "no per-stage timings", ha="center", va="center")
            ax1.set_axis_off()
        draw_throughput(ax2, self.series["t_s"], self.series["samples_per_s"], self.series["dur_s"],
                        title=f"delivered throughput ({self.model_step})")
        if self.ceiling_samples_per_s:
            ax2.axhline(self.ceiling_samples_per_s, color="#55a868", ls="--", lw=1.2,
                        label=f"ceiling {self.ceiling_samples_per_s:,.0f}/s")
            top = max([self.ceiling_samples_per_s, *self.series["samples_per_s"]])
            ax2.set_ylim(0, 1.25 * top)
            ax2.legend(loc="upper right", frameon=False)
        return fig
