"""The bottleneck verdict: which stage limits a loader, the numbers that say so, what to try.

NOTE [ Verdict rules ]
The verdict is decided from one :class:`~loaderlib.stats.Window` (NOTE [ One accounting ]
in ``loaderlib/_observe/stats.py``) and the same window cut into ``parts`` (about half a second
each), in this order:

0. Enough evidence, in proportion to the effect. Each decision below compares a measured
   quantity with a line: the consumer's steady-state wait with ``MODEL_BOUND_WAIT`` (rule 1),
   the lead of the largest stage's share of thread time over the next one's with 0 (rule 2).
   The quantity is measured once per batch (the consumer's wait over wait + model step from
   the harness's deliveries; each batch's stage thread time from the recorder's per-batch log,
   NOTE [ Per-batch log ] in ``_observe/recorder.py``), consecutive batches are grouped into at most
   ``MAX_BLOCKS`` blocks (batch means: neighbouring batches share a queue state, blocks are
   close to independent), and a one-sided Student-t interval at ``LEVEL`` (99%) is put
   around the blocks' mean, its spread never taken below ``SD_FLOOR`` (a scripted or very
   regular run would otherwise look infinitely sure). The decision stands when the interval
   lies wholly on one side of its line; with an interval that straddles the line (or a single
   batch, which has no spread to measure), the verdict is "not enough evidence", what the
   figures point at so far, and how many batches (and seconds) would make the interval clear
   the line at the measured spread. There is no fixed floor on the batches: the interval alone
   decides, and it is wide when the batches are few (the t quantile is 31.8 at 2 batches, 6.97
   at 3, 3.36 at 6). At the spread floor, 3 steady-state batches settle a wait under 2% (a
   model 10x slower than the loader: a 6 s window over a 1.5 s model step holds about 4) and a
   lead of more than 8 points; 2 batches settle only a lead of more than 45 points with
   batches that agree. A 2x separation (a wait near 0 or near 50%, one stage with twice the
   next one's time) clears its line within 8-10 batches at a typical spread; a 5% difference
   needs hundreds. (Round 3 kept a floor of 6 batches on top of the interval; it left a 10x
   separation undecided in windows of 3-5 batches, and ``benchmarks/verdict_check.py`` found
   no wrong answer without it.)
   Batches that were already waiting in the prefetch queue when the window opened are left
   out of the wait (they say nothing about the pipeline's rate), as many as the queue lost
   over the window (batches taken minus batches the pipeline finished in it): a queue the
   pipeline kept full hid no wait. Without per-batch figures (a window built from the
   recorder's bins alone, as on the dashboard) the window's parts stand for the blocks.
   Why 99% and not 99.5%: on a 2-core machine at load average 13-19, per-batch stage times
   carry preemption noise of several milliseconds, and at 99.5% one run of 33 batches with a
   2.4x separation (decode 67%, transform 32%) stayed undecided (lead 31% +- 31%); at 99% it
   decides. A wrong answer still needs the whole interval on the wrong side of the line.
   The dashboard judges again at every update (repeated looks raise the chance that one of
   them is wrong); its parts are half a second each, so it decides a large separation after
   1-1.5 s of data (2-3 parts, each the mean of many batches) and a 2x one after about 4-5 s.
   Measured with ``benchmarks/verdict_check.py`` (its docstring has the table).
1. Model or data. When a model step ran, the steady-state share of the window the consumer
   blocked in ``next()`` decides: under ``MODEL_BOUND_WAIT`` (10%) the accelerator was almost
   never idle on data and the verdict is ``model``. Waits at epoch boundaries (the refill at
   each epoch start, NOTE [ Epoch boundaries ] in ``_observe/recorder.py``) are not part of it: they
   are reported apart, never blamed on a stage. With ``model_step=0`` the consumer is
   infinitely fast, so the pipeline is the limit by construction.
2. Which stage. Otherwise the limiting stage is the one with the largest share of *thread
   time* in the window (NOTE [ Stage time and busy fraction ] in ``_observe/recorder.py``):
   ``read`` -> ``io``, ``decode``, ``transform``, ``python``, ``collate``. Thread time is what a
   stage costs the pool whatever the thread count, so the largest share is the stage whose
   speed-up raises the rate most. A loader with no per-stage timings gets no stage.
3. Confidence, reported: the share of the window's parts that give the same answer as the
   whole window, and the spread of their delivered rates (the decision is rule 0's).
4. What to try, from the window's busy fraction, the thread count, the CPUs available and
   the CPU cores the process actually used:
   * a ``python`` stage on several threads while the process used about one core
     (``GIL_CORES``): the GIL runs the Python steps one at a time;
   * ``io`` or ``python`` with the process using far fewer cores than busy threads
     (``cores_used < IO_WAIT_CORES x busy threads``): the threads are blocked (reads,
     sleeps), not computing: more threads than cores help, or make reads cheaper;
   * a Python step the engine flags as holding the GIL: as in the first case;
   * a saturated pool (busy >= ``SATURATED``) with fewer threads than CPUs: add threads;
   * a saturated pool on every CPU: make the stage cheaper (stage-specific advice);
   * an unsaturated pool: the threads wait on something no stage times; say so.
   On a full machine (other processes used the cores this process did not get), CPU use
   cannot tell a GIL-bound Python step from a blocked one: the advice says so instead.
   Competing load is named whenever the process got fewer cores than its busy threads
   (``cores_used < CONTENDED_CORES x min(busy threads, CPUs)``) while other processes used
   at least ``OTHER_CORES`` cores: the figures then understate the loader.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Sequence
from typing import Any

from .._extract.readahead import HEADROOM
from .._observe.stats import _jsonable
from ..stats import STAGES, Window

__all__ = ["BOTTLENECKS", "Verdict", "diagnose"]

BOTTLENECKS = ("io", "decode", "transform", "python", "collate", "model")
_STAGE_TO_BOTTLENECK = {"read": "io", "decode": "decode", "transform": "transform",
                        "python": "python", "collate": "collate"}

MODEL_BOUND_WAIT = 0.10
SATURATED = 0.80
IO_WAIT_CORES = 0.5
GIL_CORES = (0.6, 1.3)
CONTENDED_CORES = 0.7
OTHER_CORES = 0.25
MAX_BLOCKS = 16
# The fewest batches that can settle the clearest case at the spread floor (a wait of 0, rule 1).
_FEWEST = 3
LEVEL = 0.99
SD_FLOOR = 0.02
BOUNDARY_NOTE = 0.02

_CHEAPER = {
    "io": "pack the files into one RecordFileDataset (ll.write_records) read with pread, or move the "
          "data to faster storage / the page cache",
    "decode": "decode less: keep RandomResizedCrop/CenterCrop/Resize straight after decoding (crop-region decode: the native "
              "engine then decodes only the crop, DCT-scaled), store the JPEGs at a smaller size "
              "(python -m loaderlib pack --max-side 256 --quality 90), or add cores",
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
        there is not enough evidence (``enough`` is False) or the data pipeline limits but
        the loader exposes no per-stage timings.
    summary : str
        One line, e.g. ``"decode-bound at 2 threads with 98% busy"``.
    suggestion : str
        The next thing to try, in plain words (or how long to run, without enough evidence).
    evidence : dict
        The measured numbers the rules used (see NOTE [ Verdict rules ]).
    enough : bool
        Whether the window was long and steady enough for a verdict.
    confidence : float or None
        Share of the window's parts that give the same answer (None without parts).
    notes : tuple of str
        What else the figures show: epoch boundaries, competing load, a disturbed ceiling.
    seconds_needed : float or None
        Without enough evidence: how long a window to measure.
    """

    bottleneck: str | None
    summary: str
    suggestion: str
    evidence: dict
    enough: bool = True
    confidence: float | None = None
    notes: tuple = ()
    seconds_needed: float | None = None

    def __str__(self) -> str:
        text = f"{self.summary}: {self.suggestion}"
        return text + "".join(f"\n  note: {n}" for n in self.notes)

    def __repr__(self) -> str:
        ev = ", ".join(f"{k}={_fmt(v)}" for k, v in self.evidence.items())
        notes = "".join(f"\n  note: {n}" for n in self.notes)
        return f"Verdict({self.bottleneck!r}: {self.summary}\n  try: {self.suggestion}{notes}\n  evidence: {ev})"

    def _repr_html_(self) -> str:
        from ..stats import FONT_CSS

        ev = "".join(f"<li>{html.escape(k)}: {html.escape(_fmt(v))}</li>" for k, v in self.evidence.items())
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f"<div class='loaderlib-verdict' style=\"{FONT_CSS}\"><b>{html.escape(self.summary)}</b><br>"
                f"Try: {html.escape(self.suggestion)}" + (f"<ul>{notes}</ul>" if notes else "")
                + f"<details><summary>evidence</summary><ul>{ev}</ul></details></div>")

    def to_dict(self) -> dict:
        return _jsonable(dataclasses.asdict(self))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


# One-sided Student-t quantiles at LEVEL (0.99) for 1..30 degrees of freedom; beyond, the
# Cornish-Fisher expansion around the normal quantile (within 1e-3 of the exact value there).
_T99 = (31.821, 6.965, 4.541, 3.747, 3.365, 3.143, 2.998, 2.896, 2.821, 2.764, 2.718, 2.681, 2.650, 2.624,
        2.602, 2.583, 2.567, 2.552, 2.539, 2.528, 2.518, 2.508, 2.500, 2.492, 2.485, 2.479, 2.473, 2.467,
        2.462, 2.457)
_Z99 = 2.3263478740408


def _t_quantile(df: int) -> float:
    """The one-sided ``LEVEL`` quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        return math.inf
    if df <= len(_T99):
        return _T99[df - 1]
    z, v = _Z99, float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


@dataclasses.dataclass(frozen=True)
class _Interval:
    """A measured quantity's mean over blocks of batches and its one-sided half-width."""

    mean: float
    half: float
    sd_batch: float   # the spread of one batch's figure (for how many batches would settle it)
    blocks: int
    batches: int

    def side(self, line: float) -> int:
        """+1 when the whole interval is above ``line``, -1 when below, 0 when it straddles it."""
        if self.mean - self.half > line:
            return 1
        if self.mean + self.half < line:
            return -1
        return 0

    def batches_to_clear(self, line: float) -> int | None:
        """Batches that would put the interval on one side of ``line`` at the measured spread."""
        gap = abs(self.mean - line)
        if gap <= 1e-9:
            return None
        for n in range(2, MAX_BLOCKS + 1):
            if _t_quantile(n - 1) * self.sd_batch / math.sqrt(n) < gap:
                return n
        return math.ceil((_t_quantile(MAX_BLOCKS - 1) * self.sd_batch / gap) ** 2)


def _interval(items: Sequence[Any], stat: Any) -> _Interval | None:
    """``stat`` of consecutive blocks of ``items`` (at most MAX_BLOCKS blocks: batch means)."""
    n = len(items)
    if n == 0:
        return None
    k = min(MAX_BLOCKS, n)
    edges = [round(i * n / k) for i in range(k + 1)]
    vals = [v for v in (stat(items[edges[i]:edges[i + 1]]) for i in range(k)) if v is not None]
    if not vals:
        return None
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else math.inf
    sd = max(sd, SD_FLOOR)
    half = _t_quantile(len(vals) - 1) * sd / math.sqrt(len(vals))
    # One value has no spread: plan the batches that would settle it at the floor's.
    per_batch = sd * math.sqrt(n / len(vals)) if len(vals) > 1 else SD_FLOOR
    return _Interval(mean, half, per_batch, len(vals), n)


def _wait_share(block: Sequence[tuple]) -> float | None:
    total = sum(w + m for w, m in block)
    return sum(w for w, _ in block) / total if total > 0 else None


def _lead(top: int, second: int) -> Any:
    def stat(block: Sequence[tuple]) -> float | None:
        total = sum(sum(b) for b in block)
        return (sum(b[top] for b in block) - sum(b[second] for b in block)) / total if total > 0 else None
    return stat


def _unit(unit: str, n: int) -> str:
    return {"batches": "batch", "parts": "part"}[unit] if n == 1 else unit


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _answer(w: Window, model_ran: bool) -> str | None:
    """The whole decision (model, a stage kind, or None for data without stages) for one window."""
    if model_ran and w.wait_fraction < MODEL_BOUND_WAIT:
        return "model"
    if not w.has_stages:
        return None
    share = w.stage_share
    return _STAGE_TO_BOTTLENECK[max(share, key=share.get)]


def _evidence(w: Window, parts: Sequence[Window], model_ran: bool, buffered_samples: float,
              ev: dict) -> tuple[str | None, int | None]:
    """Rule 0 of NOTE [ Verdict rules ]: None when the evidence decides (``ev["decided"]`` then
    holds the answer), else why not and how many batches would settle it."""
    if w.batch_waits:
        waits: list = list(w.batch_waits)
        unit = "batches"
    else:
        waits = [(p.consumer_wait_s, max(0.0, p.wall_s - p.consumer_wait_s - p.boundary_wait_s))
                 for p in parts if p.wall_s > 0]
        unit = "parts"
    if w.batch_stage_s:
        stages: list = [b for b in w.batch_stage_s if sum(b) > 0]
        stage_unit = "batches"
    else:
        stages = [tuple(p.stage_s.get(k, 0.0) for k in STAGES) for p in parts if p.has_stages]
        stage_unit = "parts"

    if model_ran:
        skip = 0
        if w.batch_waits and buffered_samples > 0 and w.batches > 0:
            skip = min(len(waits), math.ceil(buffered_samples / (w.samples / w.batches) - 1e-9))
            if w.batch_stage_s:
                # Only what the queue lost over the window was fed from its stock: a queue the
                # pipeline kept full (it produced as many batches as were taken) hid no wait.
                skip = min(skip, max(0, len(waits) - len(w.batch_stage_s)))
            ev["buffered_batches"] = skip
        steady = waits[skip:]
        iv = _interval(steady, _wait_share)
        if iv is None:   # neither a wait nor a model step was timed: nothing to judge the model on
            if skip and not steady:
                return (f"it held {len(waits)} batches, all already waiting in the prefetch queue when it opened",
                        _FEWEST + skip)
            return f"its {len(steady)} {unit} timed no consumer wait or model step", None
        if iv.blocks < 2:
            held = (f"it held {len(steady)} {_unit(unit, len(steady))} in steady state" if not skip else
                    f"it held {len(waits)} batches, the first {skip} already waiting in the prefetch queue when it "
                    f"opened, leaving {len(steady)}")
            need = iv.batches_to_clear(MODEL_BOUND_WAIT)
            return held + " (an interval needs at least 2)", (need if need is not None else _FEWEST) + skip
        ev["wait_interval"] = (iv.mean - iv.half, iv.mean + iv.half)
        side = iv.side(MODEL_BOUND_WAIT)
        if side == 0:
            need = iv.batches_to_clear(MODEL_BOUND_WAIT)
            return (f"over {iv.batches} {unit} the accelerator waited {_pct(iv.mean)} \u00b1 {_pct(iv.half)} of the "
                    f"time, which does not settle whether it is under {_pct(MODEL_BOUND_WAIT)} (the model limits) "
                    "or over (the data does)"), (need + skip if need is not None else None)
        if side < 0:
            ev["decided"] = "model"
            return None, None
    if not w.has_stages:
        ev["decided"] = None
        return None, None
    if not stages:
        return f"it held no {stage_unit} with stage timings", _FEWEST
    totals = [sum(b[i] for b in stages) for i in range(len(STAGES))]
    order = sorted(range(len(STAGES)), key=lambda i: -totals[i])
    top, second = order[0], order[1]
    iv = _interval(stages, _lead(top, second))
    if iv is None:
        return f"its {len(stages)} {stage_unit} timed no stage", None
    if iv.blocks < 2:
        need = iv.batches_to_clear(0.0)
        return (f"it held {len(stages)} {_unit(stage_unit, len(stages))} with stage timings "
                "(an interval needs at least 2)"), need if need is not None else _FEWEST
    ev["stage_lead_interval"] = (iv.mean - iv.half, iv.mean + iv.half)
    if iv.side(0.0) > 0:
        ev["decided"] = _STAGE_TO_BOTTLENECK[STAGES[top]]
        return None, None
    need = iv.batches_to_clear(0.0)
    total = sum(totals)
    return (f"over {iv.batches} {stage_unit} {STAGES[top]} and {STAGES[second]} took {_pct(totals[top] / total)} "
            f"and {_pct(totals[second] / total)} of thread time; the lead, {_pct(iv.mean)} \u00b1 {_pct(iv.half)}, "
            "does not settle which of them limits"), need


def _spread(values: list) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / 2 / mean if mean > 0 else None


def diagnose(
    window: Window,
    *,
    parts: Sequence[Window] = (),
    threads: int | None,
    cpus: int,
    model_ran: bool,
    cores_used: float | None = None,
    gil_held: dict | None = None,
    ceiling_samples_per_s: float | None = None,
    buffered_samples: float = 0.0,
    other_cores: float | None = None,
    top_others: Sequence[tuple[str, float]] = (),
    extract: Any = None,
) -> Verdict:
    """Apply NOTE [ Verdict rules ] to one accounted window.

    Parameters
    ----------
    window : loaderlib.stats.Window
        The measured window (:func:`loaderlib.stats.window_of`).
    parts : sequence of Window
        The same window cut into consecutive parts (:func:`loaderlib.stats.split_window`);
        their agreement is the verdict's reported confidence, and they stand for the batches
        when the window has no per-batch figures.
    threads : int or None
        The loader's thread count.
    cpus : int
        CPUs available to the process.
    model_ran : bool
        Whether a (simulated or real) model step consumed the batches.
    cores_used : float, optional
        CPU time of the process tree / wall time over the window.
    gil_held : dict, optional
        Stage -> whether its Python step holds the GIL (from the engine).
    ceiling_samples_per_s : float, optional
        The infinitely-fast-model rate over a window of the same length.
    buffered_samples : float
        Samples already waiting in the prefetch queue when the window opened (their batches
        are left out of the consumer's wait).
    other_cores : float, optional
        CPU cores other processes on the machine used over the window.
    top_others : sequence of (name, cores)
        The other processes that used the most CPU, named in the competing-load note.
    extract : loaderlib.stats.ExtractStats, optional
        The read-ahead stage's figures (``stats.extract``): an ``io`` verdict then names the
        storage latency, the reads in flight and the depth (NOTE [ Storage in the verdict ]).

    Returns
    -------
    Verdict
    """
    w = window
    ev: dict[str, Any] = {"window_s": w.wall_s, "batches": w.batches, "samples_per_s": w.samples_per_s,
                          "consumer_wait_fraction": w.wait_fraction, "boundary_wait_fraction": w.boundary_fraction}
    if model_ran:
        ev["accelerator_idle_fraction"] = w.wait_fraction
    if ceiling_samples_per_s is not None:
        ev["ceiling_samples_per_s"] = ceiling_samples_per_s
    n = threads or w.threads or 1
    busy = w.busy_fraction
    busy_threads = busy * n
    if w.has_stages:
        ev["stage_share"] = w.stage_share
        ev["busy_fraction"] = busy
    ev["threads"] = n
    ev["cpus"] = cpus
    if cores_used is not None:
        ev["cores_used"] = cores_used

    notes: list[str] = []
    if w.boundary_fraction >= BOUNDARY_NOTE:
        notes.append(f"epoch boundaries: the consumer waited {100 * w.boundary_fraction:.0f}% of the window for the "
                     f"first batch of an epoch ({w.epochs} epoch start{'s' if w.epochs != 1 else ''}), the pipeline "
                     "refilling; that is not counted against any stage (fewer, longer epochs make it smaller)")
    contended = (cores_used is not None and w.has_stages and busy_threads > 0
                 and cores_used < CONTENDED_CORES * min(busy_threads, cpus))
    # Only a full machine takes cores away (a GIL-bound or blocked step also leaves busy threads without cores).
    full = (cores_used is not None and other_cores is not None and other_cores >= OTHER_CORES
            and cores_used + other_cores >= 0.8 * cpus)
    if contended and full:
        who = ", ".join(f"{name} {c:.1f}" for name, c in top_others[:3])
        notes.append(f"competing load: other processes used {other_cores:.1f} of {cpus} cores"
                     + (f" ({who})" if who else "") + f" while {busy_threads:.1f} threads were busy and this "
                     f"process got {cores_used:.1f} cores: the figures understate the loader; measure on a "
                     "quieter machine")
        ev["other_cores"] = other_cores
    rates = [p.samples_per_s for p in parts if p.wall_s > 0]
    spread = _spread(rates)
    if spread is not None:
        ev["rate_spread"] = spread
    if ceiling_samples_per_s and w.samples_per_s > ceiling_samples_per_s * (1 + max(0.05, spread or 0.0)):
        over = w.samples_per_s / ceiling_samples_per_s - 1
        notes.append(f"the ceiling run was disturbed: this run delivered {w.samples_per_s:,.0f} samples/s, "
                     f"{100 * over:.0f}% above the ceiling's {ceiling_samples_per_s:,.0f} (other load or a cold "
                     "cache during the ceiling run); the ceiling understates the loader")
    if w.has_stages and w.unattributed_s > 0.03 * sum(w.stage_s.values()):
        notes.append(f"{w.unattributed_s:.3f} thread-seconds of stage time did not fit in the pool's "
                     f"{n} threads: some stage ran on another thread too (a driver thread collating, say); "
                     "the busy figure counts the pool's threads only")

    answer = _answer(w, model_ran)
    agree = [_answer(p, model_ran) == answer for p in parts if p.batches > 0 or p.wall_s > 0]
    confidence = sum(agree) / len(agree) if agree else None
    if confidence is not None:
        ev["confidence"] = confidence
        ev["parts"] = len(agree)

    # Rule 0: evidence in proportion to the effect.
    short, needs = _evidence(w, parts, model_ran, buffered_samples, ev)
    if short is not None:
        lead = f"; so far the figures point at {answer}" if answer else ""
        ev["leading"] = answer
        per_batch = w.wall_s / w.batches if w.batches > 0 else None
        if needs is not None:
            need = float(f"{max(needs * per_batch * 1.2 if per_batch else 2 * w.wall_s, 0.01):.2g}")
            tip = (f"measure about {needs} batches: a window of at least {need:g} s (benchmark(..., seconds={need:g}), "
                   "or more epochs) settles it at the spread measured so far")
        else:
            need = float(f"{max(10 * w.wall_s, 1.0):.2g}")
            tip = (f"the figures sit on the line, so a longer window may never settle it; measure at least {need:g} s "
                   f"(benchmark(..., seconds={need:g})) to see whether they move off it, or take both answers as "
                   "limiting about equally")
        return Verdict(None, "not enough evidence: " + short + lead, tip, ev, enough=False, confidence=confidence,
                       notes=tuple(notes), seconds_needed=need)
    answer = ev.pop("decided", answer)
    agree = [_answer(p, model_ran) == answer for p in parts if p.batches > 0 or p.wall_s > 0]
    confidence = sum(agree) / len(agree) if agree else None
    if confidence is not None:
        ev["confidence"] = confidence

    conf = f" (confidence {100 * confidence:.0f}%: {sum(agree)} of {len(agree)} parts agree" \
        + (f", rate \u00b1{100 * spread:.0f}%)" if spread is not None else ")") if confidence is not None else ""

    # Rule 1: model or data.
    if answer == "model":
        margin = ""
        if ceiling_samples_per_s and w.samples_per_s and ceiling_samples_per_s >= w.samples_per_s:
            margin = (f"; the loader alone delivers {ceiling_samples_per_s:,.0f} samples/s, "
                      f"{ceiling_samples_per_s / w.samples_per_s:.1f}x what the model consumes")
        return Verdict(
            "model",
            f"model-bound: the accelerator waited for data {100 * w.wait_fraction:.0f}% of the time in steady "
            "state" + conf,
            "the loader keeps up" + margin + ": speed up the model step (larger batch, mixed precision, "
            "compiled model), or give the loader fewer threads and the CPU to something else",
            ev, confidence=confidence, notes=tuple(notes),
        )

    if answer is None:
        ev["note"] = "the loader exposes no per-stage timings"
        return Verdict(
            None,
            ("data-bound: the accelerator waited for data "
             f"{100 * w.wait_fraction:.0f}% of the time" if model_ran else "data-bound (no model step)") + conf,
            "the loader exposes no per-stage timings; run a loaderlib DataLoader to see which stage limits",
            ev, confidence=confidence, notes=tuple(notes),
        )

    # Rule 2: the stage with the largest share of thread time.
    share = w.stage_share
    stage = next(k for k, v in _STAGE_TO_BOTTLENECK.items() if v == answer)
    kind = answer
    ev["stage"] = stage
    where = f"at {n} thread{'s' if n != 1 else ''} with {100 * busy:.0f}% busy"
    summary = f"{kind}-bound {where} ({100 * share[stage]:.0f}% of thread time in {stage})"
    if model_ran:
        summary += f", accelerator idle {100 * w.wait_fraction:.0f}%"
    summary += conf

    # Rule 4: what to try.
    if kind == "io":
        storage = _storage(extract, n, w)
        if storage is not None:
            head, tip, figures = storage
            ev.update(figures)
            if contended and full:
                # The read-ahead stage's own latencies stand whatever the load; the rate may not.
                tip += (f" (other processes used {other_cores:.1f} cores: the rate, and so the depth it calls for, "
                        "understate a quieter machine)")
            summary = head + f" ({100 * share[stage]:.0f}% of thread time waiting for reads)" + conf
            return Verdict(kind, summary, tip, ev, confidence=confidence, notes=tuple(notes))
    gil = bool(gil_held and gil_held.get(stage))
    off_cpu = cores_used is not None and cores_used < IO_WAIT_CORES * busy_threads
    gil_serialised = (kind == "python" and n >= 2 and cores_used is not None
                      and GIL_CORES[0] <= cores_used <= GIL_CORES[1])
    if kind in ("io", "python") and contended and full:
        # Other processes took the cores: CPU use no longer tells a GIL-bound step from a blocked one.
        tip = (f"the machine is full (other processes used {other_cores:.1f} cores), so CPU use cannot tell whether "
               f"the {stage} step holds the GIL or waits on something: measure on a quieter machine; either way, "
               + _CHEAPER[kind])
    elif gil_serialised:
        ev["gil_held"] = True
        tip = (f"{n} threads ran the Python step but the process used only {cores_used:.1f} cores: the GIL "
               "runs it one thread at a time, so more threads cannot help: " + _CHEAPER["python"]
               + ", or run it in worker processes (num_workers > 0)")
    elif kind in ("io", "python") and off_cpu:
        what = "reads" if kind == "io" else "the Python step (sleeping or blocked, so not holding the GIL)"
        tip = (f"the threads mostly wait on {what}: {cores_used:.1f} cores used by {busy_threads:.1f} busy threads, "
               f"so more threads than cores help here (try num_threads={max(2 * n, cpus)}), or " + _CHEAPER[kind])
    elif gil:
        ev["gil_held"] = True
        tip = ("this Python step holds the GIL, so more threads cannot help: " + _CHEAPER["python"]
               + ", or run it in worker processes (num_workers > 0)")
    elif busy >= SATURATED and n < cpus:
        tip = f"add threads (num_threads={n} -> {cpus}), or " + _CHEAPER[kind]
    elif busy >= SATURATED:
        tip = f"every CPU is busy ({cpus}): " + _CHEAPER[kind]
    else:
        tip = (f"the pool is busy only {100 * busy:.0f}% of the time, so threads wait on something no stage "
               "times (the GIL, the driver, a small prefetch queue): raise prefetch, check Python steps; "
               "the stage to make cheaper is still " + stage + ": " + _CHEAPER[kind])
    return Verdict(kind, summary, tip, ev, confidence=confidence, notes=tuple(notes))


def _storage(extract: Any, threads: int, w: Window) -> tuple[str, str, dict] | None:
    """What an io verdict says about the storage.

    NOTE [ Storage in the verdict ]
    When reads limit the loader, the useful answer names the storage: how long one read takes
    and how many were in flight, since by Little's law those two set the read rate, and what
    the read-ahead stage (NOTE [ Read-ahead ] in ``pyx/include/ll_readahead.h``) did or should do
    about it. The figures are the stage's own (``stats.extract``): latency p50, the depth,
    and the depth the delivered rate calls for by Little's law. Without a read-ahead stage
    (``io_depth=0``, the Python engines) the io advice of rule 4 applies unchanged. Returns
    the summary's head, the tip and the figures, or None when the loader has no read-ahead
    stage or it read nothing.
    """
    if extract is not None and extract.reads:
        lat = extract.latency_p50_ms
        depth = extract.io_depth
        need = math.ceil(HEADROOM * w.samples_per_s * lat / 1e3) + threads if w.samples_per_s > 0 else depth
        head = (f"read-bound: storage latency ~{lat:.3g} ms with {depth} reads in flight"
                + (f"; io_depth {'adapting' if extract.adaptive else 'fixed'} at {depth}"))
        if extract.adaptive:
            tip = (f"the read-ahead depth adapts (now {depth}); if the storage serves more reads at once, a higher "
                   f"depth helps: try io_depth={max(2 * depth, need)}, or " + _CHEAPER["io"])
        else:
            tip = (f"raise io_depth (now {depth}; about {max(need, depth + 1)} in flight cover {lat:.3g} ms reads at "
                   "this rate), or leave it unset so it adapts, or " + _CHEAPER["io"])
        return head, tip, {"read_latency_ms": lat, "io_depth": depth, "reads_in_flight": extract.reads_in_flight}
    return None
