"""``Stats``: the snapshot of a loader's per-stage timings (what ``loader.stats`` returns)."""

from __future__ import annotations

import dataclasses
import html
import json
import math
from typing import Any

STAGES: tuple[str, ...] = ("read", "decode", "transform", "python", "collate")
"""The pipeline stages every engine times, in pipeline order."""

__all__ = ["STAGES", "Stats", "busy_fraction"]


def busy_fraction(stage_s: float, capacity_s: float) -> float:
    """How saturated a pool was: thread time spent in stages over thread time it had.

    ``capacity_s`` is the threads times the wall time they were there for (NOTE [ Stage time
    and busy fraction ] in ``_recorder.py``). The recorder, the harness and the dashboard all
    compute the busy fraction with this function; only the window differs.
    """
    return stage_s / capacity_s if capacity_s > 0 else 0.0


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
        From the start of the epoch to the last finished batch.
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
        Thread time available to the pool (threads x batch wall time, summed).
    busy_fraction : float
        ``sum(stage_total_s) / thread_capacity_s``: how saturated the pool was.
    consumer_wait_s : float
        Time the consumer's ``next()`` blocked waiting for a batch; ``consumer_waits`` counts
        the calls that reported.
    producer_blocked_s : float
        Time the pipeline waited on a full prefetch queue.
    queue_depth, queue_capacity : int
        Last reported prefetch queue depth and capacity; ``queue_depth_mean`` their mean.
    gil_held : dict
        Stage name -> whether its Python step holds the GIL (only stages with Python steps).
    series : dict
        A short time series, one point per recorder interval (0.5 s by default): ``t_s``
        (end of the interval, seconds since the epoch start), ``samples_per_s``,
        ``busy_fraction``, ``consumer_wait_fraction``, ``queue_depth``, ``threads``, and
        ``stage_s.<stage>`` (thread seconds spent in the stage in that interval).
    autotune : tuple
        The ``AUTOTUNE`` tuner's decisions, oldest first: ``(time_s, knob, old, new, reason)``
        (NOTE [ Autotune ] in ``_autotune.py``); empty when nothing is tuned.
    """

    enabled: bool
    num_threads: int
    batch_size: int
    batches: int
    samples: int
    elapsed_s: float
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
    consumer_wait_s: float
    consumer_waits: int
    producer_blocked_s: float
    queue_depth: int
    queue_capacity: int
    queue_depth_mean: float
    gil_held: dict
    series: dict
    autotune: tuple = ()

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
        return max(self.stage_total_s, key=self.stage_total_s.get)

    @property
    def consumer_wait_fraction(self) -> float:
        """Consumer wait as a fraction of the epoch's elapsed time."""
        return min(1.0, self.consumer_wait_s / self.elapsed_s) if self.elapsed_s > 0 else 0.0

    # -- export --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain ``dict`` of every field (JSON-serialisable; NaN becomes None)."""
        d = dataclasses.asdict(self)
        d["stage_share"] = self.stage_share
        d["consumer_wait_fraction"] = self.consumer_wait_fraction
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

    def _summary(self) -> list[str]:
        if not self.enabled:
            return ["recording disabled (loader.recorder.enabled = False)"]
        lines = [
            (f"{self.samples} samples in {self.batches} batches over {self.elapsed_s:.2f} s: "
            f"{self.samples_per_s:,.1f} samples/s, {self.batches_per_s:.2f} batches/s"),
            (f"threads {self.num_threads}, pool busy {100 * self.busy_fraction:.0f}%, "
            f"consumer waited {self.consumer_wait_s:.3f} s ({100 * self.consumer_wait_fraction:.0f}%), "
            f"producer blocked {self.producer_blocked_s:.3f} s"),
        ]
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
        parts = ["<div class='loaderlib-stats'><b>loaderlib Stats</b><br>"]
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
        from .profiling._plot import plot_stats  # drawing lives with the profiling tools

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
