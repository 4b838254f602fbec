"""``AUTOTUNE``: threads, prefetch depth and parallel calls tuned online under a RAM budget.

NOTE [ Autotune ]
tf.data's autotuner models each stage's processing time and searches the knobs that
maximise the modelled output rate. Here the loader already measures what matters at the
one place that counts, the consumer, so the tuner is simpler: a hill climb on *delivered*
throughput, one knob at a time (threads first, then prefetch depth). For the current knob
it measures a window at the current value, tries a step up (doubling), keeps it while the
rate improves by more than ``tolerance``, else returns to the best value and tries a step
down the same way; then the knob is settled and the next one starts. The first window after
every change is discarded (the prefetch queue refills, threads start). Knobs only change
speed: every engine's output is a pure function of the seed
(NOTE [ Counter-based sample randomness ]), so tuning never changes which elements or batches
come out. The prefetch
depth (and so the arena's slots, ``prefetch + 2``) is capped by ``ram_budget``. Each change is
recorded as ``(time, knob, old, new, reason)``. The clock is injected, so the decision
logic is tested with synthetic measurements.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["AUTOTUNE", "HillClimb", "Tuner", "attach", "parse_bytes"]

#: Pass as ``num_threads``, ``prefetch`` or ``num_parallel_calls`` to have it tuned online.
AUTOTUNE = -1

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: int | str) -> int:
    """Bytes from an int or a string such as ``"2GB"``, ``"512 MiB"``, ``"1.5g"`` (KB/MB/GB are
    powers of 1000, KiB/MiB/GiB of 1024)."""
    if isinstance(value, bool):
        raise ValueError(f"ram_budget must be bytes (an int) or a string such as '2GB', got {value!r}")  # noqa: TRY004
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"ram_budget must be positive, got {value!r}")
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
            if n > 0:
                return n
    raise ValueError(f"ram_budget must be bytes (an int) or a string such as '2GB' or '512MiB', got {value!r}")


class HillClimb:
    """One integer knob tuned by hill climbing on a measured rate (NOTE [ Autotune ]).

    Phases: the first rate is the start's; then doubling ("up") while each step beats the
    best rate by more than ``tolerance``; if not even the first step up did, halving
    ("down") the same way; then back to the best value, settled.
    """

    def __init__(self, name: str, value: int, lo: int, hi: int, tolerance: float = 0.05) -> None:
        self.name = name
        self.value = max(lo, min(hi, int(value)))
        self.lo = lo
        self.hi = hi
        self.tolerance = tolerance
        self.best: tuple[int, float] | None = None
        self.phase = "start"

    @property
    def settled(self) -> bool:
        return self.phase == "settled"

    def _up(self, v: int) -> int:
        return min(self.hi, v * 2)

    def _down(self, v: int) -> int:
        return max(self.lo, v // 2)

    def _settle(self, why: str) -> tuple[int, str] | None:
        self.phase = "settled"
        best = self.best[0]
        return None if best == self.value else (best, f"{why}: back to {best}, settled")

    def _try_down(self, why: str) -> tuple[int, str] | None:
        nxt = self._down(self.best[0])
        if nxt == self.best[0]:
            return self._settle(why)
        self.phase = "down"
        return nxt, f"{why}; trying {nxt}"

    def step(self, rate: float) -> tuple[int, str] | None:
        """Take the rate measured at ``self.value``; returns ``(new value, reason)`` or None."""
        v = self.value
        if self.phase == "settled":
            return None
        if self.phase == "start":
            self.best = (v, rate)
            nxt = self._up(v)
            if nxt == v:
                return self._try_down(f"{rate:.1f}/s at {v}, the upper limit")
            self.phase = "up"
            return nxt, f"{rate:.1f}/s at {v}; trying {nxt}"
        best_v, best_rate = self.best
        better = rate > best_rate * (1 + self.tolerance)
        why = f"{rate:.1f}/s at {v} vs {best_rate:.1f}/s at {best_v}"
        if better:
            self.best = (v, rate)
            nxt = self._up(v) if self.phase == "up" else self._down(v)
            if nxt == v:
                return self._settle(why)
            return nxt, f"{why}; trying {nxt}"
        if self.phase == "up" and best_v == self._first:
            return self._try_down(why)
        return self._settle(why)

    def start(self) -> None:
        """Begin tuning from the current value."""
        self._first = self.value


class Tuner:
    """Tunes knobs one after the other from measured delivered throughput.

    Parameters
    ----------
    knobs : list of (HillClimb, apply)
        ``apply(new)`` sets the live value.
    clock : callable
        Seconds (monotonic); injected in tests.
    window_s : float
        Length of one measurement.
    min_items : int
        Fewest items a window needs.
    """

    def __init__(self, knobs: list, clock: Callable[[], float] | None = None, window_s: float = 0.5,
                 min_items: int = 4) -> None:
        self.knobs = knobs
        self.clock = clock or time.monotonic
        self.window_s = window_s
        self.min_items = min_items
        self.decisions: list[tuple] = []
        self._k = 0
        self._t0: float | None = None
        self._count = 0
        self._discard = True
        self._t_start: float | None = None
        self._lock = threading.Lock()
        if knobs:
            knobs[0][0].start()

    @property
    def settled(self) -> bool:
        return self._k >= len(self.knobs)

    def observe(self, items: int = 1) -> None:
        """Count ``items`` delivered now; closes a window and steps the current knob when due."""
        if self.settled:
            return
        with self._lock:
            now = self.clock()
            if self._t_start is None:
                self._t_start = now
            if self._t0 is None:
                self._t0, self._count = now, 0
                return
            self._count += items
            dt = now - self._t0
            if dt < self.window_s or self._count < self.min_items:
                return
            rate = self._count / dt
            self._t0, self._count = now, 0
            if self._discard:
                self._discard = False
                return
            self._step(rate, now)

    def _step(self, rate: float, now: float) -> None:
        climb, apply = self.knobs[self._k]
        old = climb.value
        out = climb.step(rate)
        if out is not None:
            new, reason = out
            climb.value = new
            apply(new)
            self.decisions.append((round(now - self._t_start, 3), climb.name, old, new, reason))
            self._discard = True
        if climb.settled:
            self._k += 1
            if self._k < len(self.knobs):
                self.knobs[self._k][0].start()
                self._discard = True


def batch_nbytes(loader: Any) -> int | None:
    """Bytes of one batch of a native loader, known before the epoch (None otherwise)."""
    a = loader._analysis
    if a.engine != "native" or a.native_source is None:
        return None
    b = loader.batch_size
    src = a.native_source
    if src.kind == "arrays":
        return sum(b * arr[0:1].nbytes for arr in src.arrays)
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
           clock: Callable[[], float] | None = None) -> Tuner:
    """Tune a DataLoader's ``num_threads`` and/or ``prefetch`` online (NOTE [ Autotune ]).

    The tuner observes each delivered batch (``LoaderIterator.__next__`` calls
    ``knobs.tuner.observe``) and records its decisions (``loader.stats.autotune``).
    """
    from ._threads import default_num_threads

    knobs = loader._knobs
    cpus = max(1, default_num_threads())
    nbytes = batch_nbytes(loader)
    check_budget(ram_budget, nbytes, f"this loader (batch_size={loader.batch_size})")
    pairs: list = []
    if num_threads:
        knobs.num_threads = cpus
        hi = cpus if loader.engine == "native" else 2 * cpus

        def set_threads(n: int) -> None:
            knobs.num_threads = n

        pairs.append((HillClimb("num_threads", cpus, 1, max(1, hi)), set_threads))
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
    tuner = Tuner(pairs, clock=clock)
    tuner.batch_check = (ram_budget, loader.batch_size) if nbytes is None and ram_budget is not None else None
    knobs.tuner = tuner
    loader._tuner = tuner
    return tuner


def observe_batch(tuner: Tuner, batch: Any) -> None:
    """The hook a loader iterator calls per delivered batch."""
    check = getattr(tuner, "batch_check", None)
    if check is not None:
        tuner.batch_check = None
        from ._pipeline_spec import leaves

        try:
            nbytes = sum(getattr(x, "nbytes", 0) for x in leaves(batch))
        except ValueError:
            nbytes = 0
        check_budget(check[0], nbytes, f"this loader (batch_size={check[1]})")
    tuner.observe(1)


def tune_knob(owner: Any, knob: Any, label: str, kind: str = "num_parallel_calls") -> Tuner:
    """Tune a pipeline node's knob (``num_parallel_calls`` of a map, a prefetch depth)."""
    opts = getattr(owner, "_options", {})
    lo, hi = (1, max(1, knob.limit)) if kind == "num_parallel_calls" else (1, knob.limit)

    def apply(n: int) -> None:
        knob.value = n

    climb = HillClimb(f"{label} {kind}", knob.value, lo, hi)
    tuner = Tuner([(climb, apply)], clock=opts.get("autotune_clock"))
    knob.observe = tuner.observe
    owner.__dict__.setdefault("_tuners", []).append(tuner)
    return tuner


def decisions_of(owner: Any) -> list:
    """Every decision of the tuners attached to a loader or pipeline, oldest first."""
    out: list = []
    t = getattr(owner, "_tuner", None)
    if t is not None:
        out += t.decisions
    for t in getattr(owner, "_tuners", []):
        out += t.decisions
    return out
