"""``Report``: what :func:`loaderlib.profiling.benchmark` measured, and the verdict."""

from __future__ import annotations

import dataclasses
import html
import json
from typing import Any

from ..stats import STAGES, Stats, _jsonable
from .verdict import Verdict

__all__ = ["Report"]


@dataclasses.dataclass(frozen=True)
class Report:
    """The result of one :func:`~loaderlib.profiling.benchmark` run.

    Rates and times cover the measured window (see NOTE [ Measured window ] in
    ``harness.py``); times are seconds.

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
        With a model step: share of the window the consumer waited for data.
    consumer_wait_s, model_s : float
        Time blocked in ``next()`` and time in the model step.
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
    peak_rss_bytes, rss_source : int, str
        Peak resident memory and how it was measured.
    stats : Stats or None
        The loader's last ``stats`` snapshot.
    series : dict
        ``t_s`` and ``samples_per_s``: delivered throughput over the window, 0.5 s bins.
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
    model_s: float
    consumer_alone_samples_per_s: float | None
    headspace: float | None
    stage_s: dict | None
    stage_mean_ms: dict | None
    busy_fraction: float | None
    producer_blocked_s: float | None
    cpu_cores_used: float
    cpus_available: int
    peak_rss_bytes: int
    rss_source: str
    stats: Stats | None
    series: dict
    verdict: Verdict

    @property
    def bottleneck(self) -> str | None:
        """``io``, ``decode``, ``transform``, ``python``, ``collate`` or ``model`` (see :class:`Verdict`)."""
        return self.verdict.bottleneck

    @property
    def stage_wall_fraction(self) -> float | None:
        """Stage thread time / (threads x measured wall time): how much of the wall the stages explain.

        Near 1 when the pipeline limits and its threads are saturated (every thread second
        of the window is attributed to a stage); lower when the pipeline waits on the model.
        """
        if self.stage_s is None or not self.num_threads or self.wall_s <= 0:
            return None
        return sum(self.stage_s.values()) / (self.num_threads * self.wall_s)

    @property
    def consumer_wall_fraction(self) -> float:
        """(consumer wait + model step) / measured wall time: the consumer's side, accounted."""
        return (self.consumer_wait_s + self.model_s) / self.wall_s if self.wall_s > 0 else 0.0

    # -- export --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of every field (JSON-serialisable)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["stats"] = self.stats.to_dict() if self.stats is not None else None
        d["verdict"] = self.verdict.to_dict()
        d["bottleneck"] = self.bottleneck
        d["stage_wall_fraction"] = self.stage_wall_fraction
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
        if self.ceiling_samples_per_s is not None:
            rows.append(("ceiling", f"{self.ceiling_samples_per_s:,.1f} samples/s (infinitely fast model)"))
        if self.accelerator_idle_fraction is not None:
            rows.append(("accelerator idle", f"{100 * self.accelerator_idle_fraction:.1f}%"))
        if self.consumer_alone_samples_per_s is not None:
            text = f"{self.consumer_alone_samples_per_s:,.1f} samples/s (infinitely fast data)"
            if self.headspace is not None:
                text += f", headspace {self.headspace:.2f}x"
            rows.append(("consumer alone", text))
        if self.busy_fraction is not None:
            rows.append(("pool busy", f"{100 * self.busy_fraction:.0f}%"))
        rows.append(("CPU", f"{self.cpu_cores_used:.2f} of {self.cpus_available} cores used"))
        rows.append(("peak RSS", f"{self.peak_rss_bytes / 2**20:,.0f} MiB ({self.rss_source})"))
        return rows

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
        out.append(f"  try: {self.verdict.suggestion})")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        p = ["<div class='loaderlib-report'><b>loaderlib benchmark</b><table>"]
        p += [f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
              f"{html.escape(v)}</td></tr>" for k, v in self._lines()]
        p.append("</table>")
        if self.stage_s is not None:
            p.append("<table><thead><tr><th>stage</th><th>thread s</th><th>share</th><th>ms/sample</th>"
                     "</tr></thead><tbody>")
            p += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in self._stage_rows()]
            p.append("</tbody></table>")
        p.append(f"<p><b>Bottleneck: {html.escape(str(self.bottleneck))}</b>: "
                 f"{html.escape(self.verdict.summary)}<br>Try: {html.escape(self.verdict.suggestion)}</p></div>")
        return "".join(p)

    def plot(self, fig: Any = None) -> Any:
        """Stage breakdown (with consumer wait and model time) and delivered throughput over time.

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
            draw_stage_bar(ax1, self.stage_s, title=f"stage breakdown: {self.bottleneck}-bound")
        else:
            ax1.text(0.5, 0.5, "no per-stage timings", ha="center", va="center")
            ax1.set_axis_off()
        draw_throughput(ax2, self.series["t_s"], self.series["samples_per_s"],
                        title=f"delivered throughput ({self.model_step})")
        if self.ceiling_samples_per_s:
            ax2.axhline(self.ceiling_samples_per_s, color="#55a868", ls="--", lw=1, label="ceiling")
            ax2.legend(fontsize=8)
        return fig
