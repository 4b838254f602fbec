"""``AUTOTUNE``: threads, prefetch depth and parallel calls tuned online under a RAM budget.

NOTE [ Autotune ]
tf.data's autotuner models each stage's processing time and searches the knobs that
maximise the modelled output rate. Here the loader already measures what matters at the
one place that counts, the consumer, so the tuner is simpler: a hill climb on *delivered*
throughput, one knob at a time (threads first, then prefetch depth).

Measuring. The rate is the deliveries of a *window* over the time between them: at least
``window_s`` (0.25 s) and ``min_items`` deliveries. A *stream* is one epoch's run (a pipeline
segment, a pass of a Python step): the time between two streams (the end of an epoch, the idle
time after a dropped iterator, a model's evaluation) is never measured, and the first
deliveries of a stream that starts after such a pause are *warm-up*, discarded: what its queue
held when it started (``prefetch + 2`` batches for a loader), made while nobody was measuring.
A window in progress pauses at a stream's end and goes on after the next one's warm-up, so
epochs shorter than a window still count. A stream that starts without a pause (within twice
the measured time between deliveries: a loader's warm next epoch, a consumer that asks at
once) continues the measurement as if nothing happened: its producer never stopped, so its
first deliveries come at the steady rate. After every change of a knob the warm-up is those deliveries and at least
``window_s`` more (the queue holds batches made with the old setting; threads start). A setting
is judged on the *median* of ``windows`` (3) windows, so one disturbed window (a GC pause,
another process) cannot decide; when those disagree by more than ``spread`` (25% of their
median) up to ``max_windows`` (5) are taken and the median of all is used.

Deciding. For the current knob the start value is measured, then a step up (doubling) is
tried and kept while the median rate improves on the best by more than ``tolerance`` (5%);
if not even the first step up did, the tuner goes back below the start, halving the same way;
then the knob settles on the best value seen. Going below the start costs throughput while it
is measured, so a knob may refuse it on evidence: a native loader's thread count goes below
the cores only when the process used less than ``BUSY`` (85%) of a CPU per thread while the
start was measured (the cores were shared with another process or the model's threads, and
fewer threads may contend less); kernel threads that kept their cores busy cannot be faster
with fewer, and on 2 cores the trial alone cost ``storage.py``'s warm local AUTOTUNE column
a window at half speed. The next knob starts from the rate of that best
setting (measured with every knob as it is now), so it needs no measurement of its own start.
Every step is recorded as ``(time, knob, old, new, reason)``, the last one of each knob too
("kept N, settled" when the value does not change), and the reason holds the evidence: the
medians compared and the windows behind them.

Bound. At most ``max_trials`` (4) settings per knob, its start included, each costing one
warm-up and 3 to 5 windows, about 1.5 s of deliveries at most: a knob settles after at most
6 s of delivered data, two knobs within 10.5 s (the second starts from the first's best rate),
plus the warm-up deliveries of each stream start. The RN50 train pipeline on 2 shared cores
(``benchmarks/pipeline.py`` (c), epochs of 1024 images) measures threads 2 and 1, then prefetch
4 and 1, and settled 5.5 s after the loader was made, in its 5th epoch (7.0 s and 8.3 s in
other runs; 10.6 s under a load average of 3.7, where windows disagree and take 5).

Knobs only change speed: every engine's output is a pure function of the seed
(NOTE [ Counter-based sample randomness ]), so tuning never changes which elements or batches
come out. The prefetch depth (and so the arena's slots, ``prefetch + 2``) is capped by
``ram_budget``. Decision times are seconds since the owner's origin: a DataLoader's creation,
or a Pipeline's (every tuner of a pipeline, its engine stages' included, shares that origin),
on the profiling clock (``loaderlib.stats.clock_ns``) unless a clock is injected; the decision
logic is tested with synthetic measurements on an injected clock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ._extract.source import SourceKind
from ._observe import stats
from ._threads import default_num_threads
from ._tree import tree_leaves

__all__ = ["AUTOTUNE", "HillClimb", "Tuner", "attach"]

#: Pass as ``num_threads``, ``prefetch`` or ``num_parallel_calls`` to have it tuned online.
AUTOTUNE = -1

#: Share of their time the kernel threads waited for bytes above which AUTOTUNE may give a
#: native loader more threads than cores.
READ_WAITING = 0.05

def profiling_seconds() -> float:
    """The profiling clock in seconds (``loaderlib.stats.clock_ns``; looked up at each call so a
    test's clock reaches the tuner too)."""
    return stats.clock_ns() / 1e9


class HillClimb:
    """One integer knob tuned by hill climbing on a measured rate (NOTE [ Autotune ]).

    Phases: the start's rate first; then doubling ("up") while each step beats the best rate
    by more than ``tolerance``; if not even the first step up did, halving ("down") the same
    way; then the best value, settled. At most ``max_trials`` settings are measured, the start
    included. :meth:`step` moves :attr:`value` and says why, on every call.
    """

    def __init__(self, name: str, value: int, lo: int, hi: int, tolerance: float = 0.05,
                 max_trials: int = 4, bound: Callable[[], int] | None = None,
                 below: Callable[[int, float | None], str | None] | None = None) -> None:
        self.name = name
        self.bound = bound   # the upper bound now, when it follows the run (else ``hi``)
        # below(value, cpu_per_s): why going below the start cannot help (None: try it);
        # cpu_per_s is the process's CPU seconds per second while the start was measured.
        self.below = below
        self.cpu_per_s: float | None = None   # set by the Tuner before each step
        self.value = max(lo, min(hi, int(value)))
        self.lo = lo
        self.hi = hi
        self.tolerance = tolerance
        self.max_trials = max_trials
        self.trials = 0
        self.best: tuple[int, float] | None = None
        self.phase = "start"
        self._first = self.value
        self._start_cpu: float | None = None

    @property
    def settled(self) -> bool:
        return self.phase == "settled"

    def _up(self, v: int) -> int:
        return min(self.hi if self.bound is None else max(self.lo, min(self.hi, self.bound())), v * 2)

    def _down(self, v: int) -> int:
        return max(self.lo, v // 2)

    def step(self, rate: float, evidence: str = "") -> tuple[int, str]:
        """Take the rate measured at :attr:`value` (``evidence``: how it was measured); returns
        ``(next value, reason)``, the same value when the knob stays (then it is settled)."""
        if self.phase == "settled":
            raise RuntimeError(f"{self.name} is settled at {self.value}")
        v = self.value
        self.trials += 1
        at = f"{rate:.1f}/s at {v}{evidence}"
        if self.phase == "start":
            self.best = (v, rate)
            self._first = v
            self._start_cpu = self.cpu_per_s
            if self._up(v) != v:
                return self._try(self._up(v), "up", at)
            return self._go_below(f"{at}, the upper limit")
        best_v, best_rate = self.best
        vs = f"{at} vs {best_rate:.1f}/s at {best_v}"
        if rate > best_rate * (1 + self.tolerance):
            self.best = (v, rate)
            return self._try(self._up(v) if self.phase == "up" else self._down(v), self.phase, f"{vs}: better")
        if self.phase == "up" and best_v == self._first:
            return self._go_below(f"{vs}: no better, back to {best_v}")
        return self._settle(f"{vs}: no better")

    def _go_below(self, why: str) -> tuple[int, str]:
        """Try below the start, unless the evidence says it cannot be faster (NOTE [ Autotune ])."""
        first = self._first
        no = self.below(first, self._start_cpu) if self.below is not None and self._down(first) != first else None
        if no is not None:
            return self._settle(f"{why}; {no}")
        if why.endswith(f"back to {first}"):
            why += " and below"
        if self.below is not None and self._start_cpu is not None:
            why += f" (the process used {self._start_cpu:.2f} CPUs with {first}: the cores are shared)"
        return self._try(self._down(first), "down", why)

    def _try(self, nxt: int, phase: str, why: str) -> tuple[int, str]:
        if nxt == self.best[0]:
            return self._settle(f"{why}; {self.best[0]} is the {'upper' if phase == 'up' else 'lower'} limit")
        if self.trials >= self.max_trials:
            return self._settle(f"{why}; {self.max_trials} settings tried (the bound)")
        self.phase = phase
        self.value = nxt
        return nxt, f"{why}; trying {nxt}"

    def _settle(self, why: str) -> tuple[int, str]:
        self.phase = "settled"
        best = self.best[0]
        verdict = f"back to {best}" if best != self.value else f"kept {best}"
        self.value = best
        return best, f"{why}: {verdict}, settled"


_NO_STREAM = object()

#: A native loader's kernel threads count as having the cores to themselves when the process
#: used at least this share of one CPU per thread while they were measured (NOTE [ Autotune ]).
BUSY = 0.85


class Tuner:
    """Tunes knobs one after the other from measured delivered throughput (NOTE [ Autotune ]).

    Parameters
    ----------
    knobs : list of (HillClimb, apply)
        ``apply(new)`` sets the live value.
    clock : callable, optional
        Seconds (monotonic); the profiling clock by default. Injected in tests.
    origin : float, optional
        The clock reading decision times count from (default: now).
    window_s : float
        Shortest measurement window (time between deliveries of one stream).
    min_items : int
        Fewest deliveries a window needs.
    windows : int
        Steady windows per setting; the setting's rate is their median.
    max_windows : int
        Most windows per setting, taken while the first ``windows`` disagree by more than
        ``spread`` (a fraction of their median).
    warmup_items : int or callable
        Deliveries discarded at every stream start and after every change (what the queue
        held, made before); a callable is asked each time (a loader's ``prefetch + 2``).
        After a change, at least ``window_s`` of deliveries are discarded too.
    cpu_clock : callable, optional
        The process's CPU seconds (``time.process_time`` by default; injected in tests): the
        CPU used per second while a setting is measured is handed to the knob (``cpu_per_s``),
        the evidence its ``below`` rule reads.
    """

    def __init__(self, knobs: list, clock: Callable[[], float] | None = None, origin: float | None = None,
                 window_s: float = 0.25, min_items: int = 4, windows: int = 3, max_windows: int = 5,
                 spread: float = 0.25, warmup_items: int | Callable[[], int] = 4,
                 cpu_clock: Callable[[], float] | None = None) -> None:
        self.knobs = knobs
        self.clock = clock or profiling_seconds
        self.cpu_clock = cpu_clock or time.process_time
        self._cpu_mark: tuple[float, float] | None = None   # (CPU, clock) when the setting's measurement began
        self.origin = self.clock() if origin is None else origin
        self.window_s = window_s
        self.min_items = min_items
        self.windows = windows
        self.max_windows = max(windows, max_windows)
        self.spread = spread
        self.warmup_items = warmup_items
        self.decisions: list[tuple] = []
        self._k = 0
        self._stream: Any = _NO_STREAM
        self._last = 0.0               # the previous delivery of the stream
        self._skip_items = 0           # warm-up left: deliveries ...
        self._skip_s = 0.0             # ... and seconds
        self._w_items = 0              # the window in progress: deliveries and their time
        self._w_s = 0.0
        self._typical: float | None = None   # the last window's time between deliveries
        self._rates: list[float] = []  # the current setting's windows
        self._lock = threading.Lock()

    @property
    def settled(self) -> bool:
        return self._k >= len(self.knobs)

    def _warmup(self) -> int:
        w = self.warmup_items
        return int(w() if callable(w) else w)

    def observe(self, items: int = 1, stream: Any = None) -> None:
        """Count ``items`` delivered now by ``stream`` (an epoch's run, a pass of a step: any
        value that changes when a new one starts); closes a window and steps the current knob
        when due (NOTE [ Autotune ])."""
        if self.settled:
            return
        with self._lock:
            now = self.clock()
            if stream != self._stream:
                self._stream = stream
                typical = self._w_s / self._w_items if self._w_items else self._typical
                if typical is None or now - self._last > 2 * typical:
                    # A pause before this stream: the time since the last one is no delivery
                    # time, and its first deliveries are what its queue held. The window in
                    # progress only pauses (NOTE [ Autotune ]).
                    self._last, self._skip_items = now, self._warmup()
                    self._cpu_mark = None
                    return
            dt, self._last = now - self._last, now
            if self._skip_items > 0 or self._skip_s > 0:
                self._skip_items -= items
                self._skip_s -= dt
                self._cpu_mark = None
                return
            if self._cpu_mark is None:
                self._cpu_mark = (self.cpu_clock(), now)
            self._w_items += items
            self._w_s += dt
            if self._w_s < self.window_s or self._w_items < self.min_items:
                return
            self._rates.append(self._w_items / self._w_s)
            self._typical = self._w_s / self._w_items
            self._w_items, self._w_s = 0, 0.0
            rates = self._rates
            if len(rates) < self.windows:
                return
            rates_sorted = sorted(rates)
            k = len(rates_sorted) // 2
            med = rates_sorted[k] if len(rates_sorted) % 2 else (rates_sorted[k - 1] + rates_sorted[k]) / 2
            if len(rates) < self.max_windows and max(rates) - min(rates) > self.spread * med:
                return
            windows = ", ".join(f"{r:.1f}" for r in rates)
            self._step(med, now, f" (median of {len(rates)} windows: {windows})")

    def _step(self, rate: float, now: float, evidence: str) -> None:
        self._rates = []
        climb, apply = self.knobs[self._k]
        old = climb.value
        if self._cpu_mark is not None and now > self._cpu_mark[1]:
            climb.cpu_per_s = (self.cpu_clock() - self._cpu_mark[0]) / (now - self._cpu_mark[1])
        new, reason = climb.step(rate, evidence)
        self.decisions.append((round(now - self.origin, 3), climb.name, old, new, reason))
        if new != old:
            apply(new)
            self._skip_items, self._skip_s = self._warmup(), self.window_s
            self._cpu_mark = None
        if climb.settled:
            self._k += 1
            if self._k < len(self.knobs):
                # The best setting's rate is the next knob's start (every knob is as it was then).
                self._step(climb.best[1], now, f" (the {climb.name} measurement)")


def batch_nbytes(loader: Any) -> int | None:
    """Bytes of one batch of a native loader, known before the epoch (None otherwise)."""
    a = loader._analysis
    if a.engine != "native" or a.native_source is None:
        return None
    b = loader.batch_size
    src = a.native_source
    if src.kind is SourceKind.ARRAYS:
        return sum(b * arr[0:1].nbytes for arr in src.arrays)
    if src.kind is SourceKind.TOKENS:
        return sum(math.prod(shape) * dt.itemsize for shape, dt in src.dataset.token_parts(b))
    plan = a.plan
    if plan is None or plan.sample_shape is None:
        return None
    n = b * plan.dtype.itemsize
    for d in plan.sample_shape:
        n *= d
    if src.labels is not None:
        n += b * src.labels[0:1].nbytes
    return n


def check_budget(budget: int | None, nbytes: int | None, what: str) -> None:
    if budget is not None and nbytes is not None and budget < nbytes:
        raise ValueError(f"ram_budget={budget} bytes cannot hold one batch of {what} ({nbytes} bytes): raise "
                         "ram_budget or lower the batch size")


def attach(loader: Any, *, num_threads: bool, prefetch: bool, ram_budget: int | None = None,
           clock: Callable[[], float] | None = None, origin: float | None = None) -> Tuner:
    """Tune a DataLoader's ``num_threads`` and/or ``prefetch`` online (NOTE [ Autotune ]).

    The tuner observes each delivered batch (``LoaderIterator.__next__`` calls
    :func:`observe_batch`, each epoch's run a stream of its own) and records its decisions
    (``loader.stats.autotune``), timed from ``origin`` (default: now, the loader's creation).
    """
    knobs = loader._knobs
    cpus = max(1, default_num_threads())
    nbytes = batch_nbytes(loader)
    check_budget(ram_budget, nbytes, f"this loader (batch_size={loader.batch_size})")
    pairs: list = []
    if num_threads:
        knobs.num_threads = cpus
        hi = cpus if loader.engine == "native" else 2 * cpus
        bound = None
        src = loader._analysis.native_source
        if loader.engine == "native" and src is not None and src.kind in (SourceKind.FILES, SourceKind.SHARDS):
            # The kernels compute, so more threads than cores help a native loader only while
            # its threads wait for bytes the read-ahead stage has not delivered: then (and only
            # then) the climb may go past the cores, and keeps what delivered throughput rewards.
            hi = 2 * cpus

            def bound() -> int:
                return 2 * cpus if loader._read_waiting() > READ_WAITING else cpus

        below = None
        if loader.engine == "native":
            def below(n: int, cpu_per_s: float | None) -> str | None:
                # Fewer kernel threads can only be faster when they do not have the cores to
                # themselves (another process, the model's own threads): NOTE [ Autotune ].
                if cpu_per_s is None or cpu_per_s < BUSY * n:
                    return None
                return (f"the process used {cpu_per_s:.2f} CPUs with {n} threads ({100 * cpu_per_s / n:.0f}%): "
                        f"the cores are theirs, fewer threads cannot be faster")

        def set_threads(n: int) -> None:
            knobs.num_threads = n

        pairs.append((HillClimb("num_threads", cpus, 1, max(1, hi), bound=bound, below=below), set_threads))
    if prefetch:
        hi = 16
        if ram_budget is not None and nbytes:
            hi = max(1, min(hi, ram_budget // nbytes - 2))
        start = min(hi, max(1, knobs.prefetch))

        def set_prefetch(n: int) -> None:
            knobs.prefetch = n
            ring = loader._arena_ring
            if ring is not None:
                loader._arena()   # slots follow the depth

        knobs.prefetch = start
        pairs.append((HillClimb("prefetch", start, 1, hi), set_prefetch))
    # What the queue holds (and the batch in flight) was made before a change or a stream start.
    tuner = Tuner(pairs, clock=clock, origin=origin, warmup_items=lambda: knobs.prefetch + 2)
    tuner.batch_check = (ram_budget, loader.batch_size) if nbytes is None and ram_budget is not None else None
    knobs.tuner = tuner
    loader._tuner = tuner
    return tuner


def observe_batch(tuner: Tuner, batch: Any, stream: int) -> None:
    """The hook a loader iterator calls per delivered batch (``stream``: its run's serial)."""
    check = getattr(tuner, "batch_check", None)
    if check is not None:
        tuner.batch_check = None
        try:
            nbytes = sum(getattr(x, "nbytes", 0) for x in tree_leaves(batch))
        except ValueError:
            nbytes = 0
        check_budget(check[0], nbytes, f"this loader (batch_size={check[1]})")
    tuner.observe(1, stream)


def tune_knob(knob: Any, label: str, kind: str = "num_parallel_calls", *, clock: Callable[[], float] | None = None,
              origin: float | None = None) -> Tuner:
    """Tune a pipeline node's knob (``num_parallel_calls`` of a map, a prefetch depth) on
    ``clock``, its decisions timed from ``origin`` (the pipeline's; the caller keeps the tuner
    in its ``_tuners`` list, which :func:`decisions_of` reads)."""
    lo, hi = (1, max(1, knob.limit)) if kind == "num_parallel_calls" else (1, knob.limit)

    def apply(n: int) -> None:
        knob.value = n

    climb = HillClimb(f"{label} {kind}", knob.value, lo, hi)
    # A map keeps 2 * value calls in flight, a prefetch step value elements ready: made before.
    tuner = Tuner([(climb, apply)], clock=clock, origin=origin, warmup_items=lambda: 2 * knob.value + 1)
    knob.observe = tuner.observe
    return tuner


def decisions_of(*owners: Any) -> list:
    """Every decision of the tuners attached to loaders or pipelines, oldest first (their
    times must share one origin, as a pipeline's tuners do)."""
    out: list = []
    for owner in owners:
        t = getattr(owner, "_tuner", None)
        if t is not None:
            out += t.decisions
        for t in getattr(owner, "_tuners", []):
            out += t.decisions
    return sorted(out, key=lambda d: d[0])
