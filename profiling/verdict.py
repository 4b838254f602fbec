"""The bottleneck verdict: which stage limits a loader, the numbers that say so, what to try.

NOTE [ Verdict rules ]
The verdict is decided from measured numbers only, in this order:

1. Model or data. When a model step ran (simulated or real), the harness measured how long
   the consumer's ``next()`` blocked waiting for a batch. If that wait is under
   ``MODEL_BOUND_WAIT`` (10%) of the measured wall time, the accelerator was almost never
   idle on data: the verdict is ``model``. The loader's ceiling (the same loader consumed
   by an infinitely fast model) next to the rate with the model shows the margin.
   With ``model_step=0`` the consumer is infinitely fast, so the pipeline is the limit by
   construction and step 1 is skipped.
2. Which stage. Otherwise the data pipeline limits, and the limiting stage is the one with
   the largest share of *thread time* over the measured window (see NOTE [ Stage time and
   busy fraction ] in ``recorder.py``): ``read`` -> ``io``, ``decode``, ``transform``,
   ``python`` (user Python steps), ``collate``. Thread time is what a stage costs the pool
   whatever the thread count, so the largest share is the stage whose speed-up (or whose
   extra threads) raises the pipeline's rate most. A loader that exposes no per-stage
   timings gets no stage (``bottleneck is None``), only step 1.
3. What to try, from the pool's busy fraction (stage thread time / threads x wall, see
   NOTE [ Busy fraction over the window ] in ``harness.py``), the thread count, the CPUs
   available and the CPU cores the process actually used:
   * a ``python`` stage on several threads while the process used about one core
     (``GIL_CORES``): the GIL runs the Python steps one at a time; more threads cannot
     help; move the step into native transforms or run it in worker processes;
   * ``io`` or ``python`` with the process using far fewer cores than busy threads
     (``cores_used < IO_WAIT_CORES x threads x busy``): the threads are blocked (reads,
     sleeps, network), not computing, so they do not hold the GIL either: more threads
     than cores help; or make reads cheaper (one record file);
   * a Python step the engine flags as holding the GIL: same advice as the first case;
   * a native stage (decode, transform, collate: pure computation) whose busy threads got
     fewer cores than ``CONTENDED_CORES x min(threads, CPUs) x busy``: other processes
     took the CPUs, so the figures understate the loader; say so first;
   * a saturated pool (busy >= ``SATURATED``) with fewer threads than CPUs: add threads;
   * a saturated pool on every CPU: make the stage cheaper (stage-specific advice);
   * an unsaturated pool (busy < ``SATURATED``): the threads wait on something that no
     stage times (the GIL, the driver, a small prefetch queue); say so.
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from ..stats import STAGES

__all__ = ["BOTTLENECKS", "Verdict", "diagnose"]

BOTTLENECKS = ("io", "decode", "transform", "python", "collate", "model")
_STAGE_TO_BOTTLENECK = {"read": "io", "decode": "decode", "transform": "transform",
                        "python": "python", "collate": "collate"}

MODEL_BOUND_WAIT = 0.10
SATURATED = 0.80
IO_WAIT_CORES = 0.5
GIL_CORES = (0.6, 1.3)
CONTENDED_CORES = 0.7

_CHEAPER = {
    "io": "pack the files into one RecordFileDataset (ll.write_records) read with pread, or move the "
          "data to faster storage / the page cache",
    "decode": "decode less: keep RandomResizedCrop/CenterCrop/Resize straight after decoding (crop-region decode: the native "
              "engine then decodes only the crop, DCT-scaled), store the JPEGs at a smaller size, or add cores",
    "transform": "make the chain cheaper: crop before resizing, emit uint8 and normalize on the "
                 "accelerator, or drop augmentations that cost more than they give",
    "python": "move the Python step into loaderlib.transforms (it then runs natively, without the GIL) "
              "or make it call numpy/OpenCV on whole arrays",
    "collate": "use the native batchify (Stack into the batch arena) instead of a Python batchify_fn",
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What limits a loader, with the numbers that decided it and the next thing to try.

    Attributes
    ----------
    bottleneck : str or None
        One of ``io``, ``decode``, ``transform``, ``python``, ``collate``, ``model``; None when
        the data pipeline limits but the loader exposes no per-stage timings.
    summary : str
        One line, e.g. ``"decode-bound at 2 threads with 98% busy"``.
    suggestion : str
        The next thing to try, in plain words.
    evidence : dict
        The measured numbers the rules used (see NOTE [ Verdict rules ]).
    """

    bottleneck: str | None
    summary: str
    suggestion: str
    evidence: dict

    def __str__(self) -> str:
        return f"{self.summary}: {self.suggestion}"

    def __repr__(self) -> str:
        ev = ", ".join(f"{k}={_fmt(v)}" for k, v in self.evidence.items())
        return f"Verdict({self.bottleneck!r}: {self.summary}\n  try: {self.suggestion}\n  evidence: {ev})"

    def _repr_html_(self) -> str:
        ev = "".join(f"<li>{html.escape(k)}: {html.escape(_fmt(v))}</li>" for k, v in self.evidence.items())
        return (f"<div class='loaderlib-verdict'><b>{html.escape(self.summary)}</b><br>"
                f"Try: {html.escape(self.suggestion)}<ul>{ev}</ul></div>")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


def diagnose(
    *,
    stage_s: dict | None,
    busy_fraction: float | None,
    threads: int | None,
    cpus: int,
    model_ran: bool,
    consumer_wait_fraction: float,
    cores_used: float | None = None,
    gil_held: dict | None = None,
    ceiling_samples_per_s: float | None = None,
    samples_per_s: float | None = None,
    stage_mean_ms: dict | None = None,
) -> Verdict:
    """Apply NOTE [ Verdict rules ] to measured numbers.

    Parameters
    ----------
    stage_s : dict or None
        Thread seconds per stage over the measured window (None: no per-stage timings).
    busy_fraction : float or None
        Stage thread time / (threads x producer wall time) over the window.
    threads : int or None
        The loader's thread count.
    cpus : int
        CPUs available to the process.
    model_ran : bool
        Whether a (simulated or real) model step consumed the batches.
    consumer_wait_fraction : float
        Share of the measured wall time the consumer spent blocked in ``next()``.
    cores_used : float, optional
        CPU time of the process tree / wall time over the window.
    gil_held : dict, optional
        Stage -> whether its Python step holds the GIL (from the engine).
    ceiling_samples_per_s, samples_per_s : float, optional
        The infinitely-fast-model rate and the rate of the run being judged.
    stage_mean_ms : dict, optional
        Per-sample mean per stage, quoted in the evidence.

    Returns
    -------
    Verdict
    """
    ev: dict[str, Any] = {"consumer_wait_fraction": consumer_wait_fraction}
    if model_ran:
        ev["accelerator_idle_fraction"] = consumer_wait_fraction
    if samples_per_s is not None:
        ev["samples_per_s"] = samples_per_s
    if ceiling_samples_per_s is not None:
        ev["ceiling_samples_per_s"] = ceiling_samples_per_s

    # Rule 1: model or data.
    if model_ran and consumer_wait_fraction < MODEL_BOUND_WAIT:
        margin = ""
        if ceiling_samples_per_s and samples_per_s:
            margin = (f"; the loader alone delivers {ceiling_samples_per_s:,.0f} samples/s, "
                      f"{ceiling_samples_per_s / samples_per_s:.1f}x what the model consumes")
        return Verdict(
            "model",
            f"model-bound: the accelerator waited for data only {100 * consumer_wait_fraction:.0f}% of the time",
            "the loader keeps up" + margin + ": speed up the model step (larger batch, mixed precision, "
            "compiled model), or give the loader fewer threads and the CPU to something else",
            ev,
        )

    if not stage_s or not any(stage_s.values()):
        ev["note"] = "the loader exposes no per-stage timings"
        return Verdict(
            None,
            ("data-bound: the accelerator waited for data "
             f"{100 * consumer_wait_fraction:.0f}% of the time" if model_ran else "data-bound (no model step)"),
            "the loader exposes no per-stage timings; run a loaderlib DataLoader to see which stage limits",
            ev,
        )

    # Rule 2: the stage with the largest share of thread time.
    total = sum(stage_s.values())
    share = {k: stage_s.get(k, 0.0) / total for k in STAGES}
    stage = max(share, key=share.get)
    kind = _STAGE_TO_BOTTLENECK[stage]
    ev["stage_share"] = share
    ev["stage"] = stage
    if stage_mean_ms:
        ev["stage_mean_ms"] = stage_mean_ms.get(stage, 0.0)
    busy = busy_fraction if busy_fraction is not None else 0.0
    ev["busy_fraction"] = busy
    ev["threads"] = threads
    ev["cpus"] = cpus
    if cores_used is not None:
        ev["cores_used"] = cores_used
    n = threads or 1
    where = f"at {n} thread{'s' if n != 1 else ''} with {100 * busy:.0f}% busy"
    summary = f"{kind}-bound {where} ({100 * share[stage]:.0f}% of thread time in {stage})"
    if model_ran:
        summary += f", accelerator idle {100 * consumer_wait_fraction:.0f}%"

    # Rule 3: what to try.
    gil = bool(gil_held and gil_held.get(stage))
    off_cpu = cores_used is not None and cores_used < IO_WAIT_CORES * n * busy
    gil_serialised = (kind == "python" and n >= 2 and cores_used is not None
                      and GIL_CORES[0] <= cores_used <= GIL_CORES[1])
    if gil_serialised:
        ev["gil_held"] = True
        tip = (f"{n} threads ran the Python step but the process used only {cores_used:.1f} cores: the GIL "
               "runs it one thread at a time, so more threads cannot help: " + _CHEAPER["python"]
               + ", or run it in worker processes (num_workers > 0)")
    elif kind in ("io", "python") and off_cpu:
        what = "reads" if kind == "io" else "the Python step (sleeping or blocked, so not holding the GIL)"
        tip = (f"the threads mostly wait on {what}: {cores_used:.1f} cores used by {n} busy threads, so more "
               f"threads than cores help here (try num_threads={max(2 * n, cpus)}), or " + _CHEAPER[kind])
    elif gil:
        ev["gil_held"] = True
        tip = ("this Python step holds the GIL, so more threads cannot help: " + _CHEAPER["python"]
               + ", or run it in worker processes (num_workers > 0)")
    elif kind in ("decode", "transform", "collate") and cores_used is not None and (
            cores_used < CONTENDED_CORES * min(n, cpus) * busy):
        tip = (f"the {n} busy threads got only {cores_used:.1f} cores: other processes compete for the "
               "CPUs (measure on a quieter machine); then " + (f"add threads (num_threads={n} -> {cpus}), or "
                                                               if n < cpus else "") + _CHEAPER[kind])
    elif busy >= SATURATED and n < cpus:
        tip = f"add threads (num_threads={n} -> {cpus}), or " + _CHEAPER[kind]
    elif busy >= SATURATED:
        tip = f"every CPU is busy ({cpus}): " + _CHEAPER[kind]
    else:
        tip = (f"the pool is busy only {100 * busy:.0f}% of the time, so threads wait on something no stage "
               "times (the GIL, the driver, a small prefetch queue): raise prefetch, check Python steps; "
               "the stage to make cheaper is still " + stage + ": " + _CHEAPER[kind])
    return Verdict(kind, summary, tip, ev)
