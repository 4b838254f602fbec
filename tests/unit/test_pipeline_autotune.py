"""AUTOTUNE: the tuner's decisions from synthetic measurements on an injected clock, and
that tuning never changes the output."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

import loaderlib as ll
import loaderlib._observe.stats as stats_mod
from loaderlib import transforms as T
from loaderlib._autotune import HillClimb, Tuner
from loaderlib._checks import parse_bytes

from .profiling_sim import FakeClock


class SteppingClock:
    """Advances a fixed step on every reading (so every window closes after a few batches)."""

    def __init__(self, step: float) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@pytest.fixture
def clock(monkeypatch):
    """The profiling clock, frozen until a test moves it (the tuner's default clock too)."""
    c = FakeClock()
    monkeypatch.setattr(stats_mod, "_clock", c)
    return c


def seconds(clock: FakeClock):
    return lambda: clock.t / 1e9


def test_parse_bytes():
    assert parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(" 1.5 g ") == 1_500_000_000
    assert parse_bytes(4096) == 4096 and parse_bytes(np.int64(7)) == 7
    for bad in ("two GB", "0GB", -5, 0, True, "12XB", 1.5, None):
        with pytest.raises(ValueError, match="ram_budget must be a positive number of bytes"):
            parse_bytes(bad, "ram_budget")


def simulate(tuner: Tuner, clock: FakeClock, value_of, rate_of, items: int, stream=None, until_settled=False):
    """Deliver ``items`` items, each taking 1/rate(current knob value) seconds."""
    for _ in range(items):
        if until_settled and tuner.settled:
            return
        clock.advance(1.0 / rate_of(value_of()))
        tuner.observe(1, stream)


def climb(h: HillClimb, rate: dict) -> list:
    """Step ``h`` on ``rate[value]`` until it settles; the values it moved to."""
    values = []
    while not h.settled:
        values.append(h.step(rate[h.value])[0])
    return values


def test_hill_climb_up_then_back():
    h = HillClimb("num_threads", 2, 1, 16)
    assert climb(h, {1: 50, 2: 100, 4: 190, 8: 195, 16: 100}) == [4, 8, 4]   # doubling while it pays, then back
    assert h.settled and h.value == 4 and h.trials == 3
    with pytest.raises(RuntimeError, match="num_threads is settled at 4"):
        h.step(1.0)


def test_hill_climb_tries_lower_when_more_is_worse():
    h = HillClimb("num_threads", 4, 1, 16)
    assert climb(h, {1: 400, 2: 300, 4: 200, 8: 150}) == [8, 2, 1, 1]
    assert h.value == 1 and h.settled
    # at the upper limit it goes straight to trying lower, and settles where it started
    top = HillClimb("prefetch", 4, 1, 4)
    assert top.step(10.0) == (2, "10.0/s at 4, the upper limit; trying 2")
    assert top.step(10.0) == (4, "10.0/s at 2 vs 10.0/s at 4: no better: back to 4, settled")


def test_hill_climb_bounds_the_settings_it_tries():
    # every doubling pays a little more than the tolerance: the bound stops the climb
    h = HillClimb("prefetch", 1, 1, 64, max_trials=4)
    assert climb(h, {v: 100 * 1.06 ** k for k, v in enumerate((1, 2, 4, 8, 16, 32, 64))}) == [2, 4, 8, 8]
    assert h.trials == 4 and h.value == 8


def test_tuner_decisions_with_injected_clock(clock):
    knobs = {"num_threads": 1, "prefetch": 2}

    def setter(name):
        def apply(v):
            knobs[name] = v
        return apply

    tuner = Tuner([(HillClimb("num_threads", 1, 1, 8), setter("num_threads")),
                   (HillClimb("prefetch", 2, 1, 8), setter("prefetch"))], clock=seconds(clock), window_s=1.0,
                  min_items=4)
    # throughput grows with threads up to 4; prefetch does not matter
    simulate(tuner, clock, lambda: knobs["num_threads"], lambda n: 10.0 * min(n, 4), 2000)
    assert tuner.settled and knobs == {"num_threads": 4, "prefetch": 2}
    names = [(d[1], d[2], d[3]) for d in tuner.decisions]
    assert names == [("num_threads", 1, 2), ("num_threads", 2, 4), ("num_threads", 4, 8), ("num_threads", 8, 4),
                     ("prefetch", 2, 4), ("prefetch", 4, 1), ("prefetch", 1, 2)]
    times = [d[0] for d in tuner.decisions]
    assert times == sorted(times) and all(isinstance(d[4], str) and "/s" in d[4] for d in tuner.decisions)
    # a setting is one discarded window and three measured ones; the prefetch knob starts from
    # the rate of the threads' best setting, at the moment the threads settle
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[3] == 0 and all(g >= 4.0 - 1e-9 for k, g in enumerate(gaps) if k != 3)
    assert "(the num_threads measurement)" in tuner.decisions[4][4]


def test_tuner_ignores_short_windows(clock):
    tuner = Tuner([(HillClimb("num_threads", 2, 1, 8), lambda v: None)], clock=seconds(clock), window_s=1.0,
                  min_items=50)
    simulate(tuner, clock, lambda: 2, lambda n: 10.0, 100)   # 10 items per window: below min_items
    assert tuner.decisions == []


def _windows(reason: str) -> list:
    """The window rates a decision's reason quotes as evidence."""
    return [float(x) for m in re.findall(r"windows: ([0-9., ]+)\)", reason) for x in m.split(", ")]


def test_warm_up_windows_are_discarded_at_stream_starts_and_after_changes(clock):
    """Each epoch starts after an idle gap (the previous iterator was dropped, or the model
    evaluated) with a burst (the queue was filled meanwhile); after each change the first items
    come at the old setting's rate. None of it may reach a comparison."""
    knobs = {"v": 2}
    changed = {"at": None}

    def apply(v):
        knobs["v"] = v
        changed["at"] = clock.t

    steady = {1: 60.0, 2: 100.0, 4: 103.0}
    # the queue holds 15 items at each epoch start (a loader says prefetch + 2)
    tuner = Tuner([(HillClimb("num_threads", 2, 1, 4), apply)], clock=seconds(clock), warmup_items=15)
    for epoch in range(40):
        clock.advance(30.0)                        # idle between epochs
        for k in range(90):
            if tuner.settled:
                break
            rate = steady[knobs["v"]]
            if k < 15:
                rate *= 8                          # a full queue drains first
            elif changed["at"] is not None and clock.t - changed["at"] < 0.2e9:
                rate = 20.0                        # threads still starting after a change
            clock.advance(1.0 / rate)
            tuner.observe(1, epoch)
    assert tuner.settled and knobs["v"] == 2
    assert [(d[2], d[3]) for d in tuner.decisions] == [(2, 4), (4, 1), (1, 2)]
    measured = [w for d in tuner.decisions for w in _windows(d[4])]
    assert len(measured) >= 9 and all(55 <= w <= 110 for w in measured), measured


def test_epochs_shorter_than_a_window_still_settle(clock):
    """Epochs of 12 deliveries (0.1 s at most, less than a window) with 5 s between them: a
    window goes on across epochs, without the gaps and each epoch's warm-up."""
    knobs = {"v": 2}

    def apply(v):
        knobs["v"] = v

    rates = {1: 50.0, 2: 100.0, 4: 180.0}
    tuner = Tuner([(HillClimb("num_threads", 2, 1, 4), apply)], clock=seconds(clock))
    for epoch in range(400):
        if tuner.settled:
            break
        clock.advance(5.0)
        for _ in range(12):
            clock.advance(1.0 / rates[knobs["v"]])
            tuner.observe(1, epoch)
    assert tuner.settled and knobs["v"] == 4
    assert [(d[2], d[3]) for d in tuner.decisions] == [(2, 4), (4, 4)]
    assert tuner.decisions[-1][4].endswith("4 is the upper limit: kept 4, settled")
    quoted = [float(r) for d in tuner.decisions for r in re.findall(r"([0-9.]+)/s", d[4])]
    assert sorted(set(quoted)) == [100.0, 180.0], tuner.decisions
    assert epoch < 60     # 2 settings of (warm-up + 3 windows), 8 of 12 deliveries measured an epoch


def test_epochs_that_follow_without_a_pause_are_measured_as_one_stream():
    """A warm next epoch (or any stream that starts at once) loses nothing: the tuner decides
    exactly as if one stream ran, where epochs after a pause each lose their warm-up."""
    def run(epoch_len, pause):
        fc = FakeClock()
        knobs = {"v": 1}

        def apply(v):
            knobs["v"] = v

        tuner = Tuner([(HillClimb("num_threads", 1, 1, 8), apply)], clock=seconds(fc))
        for k in range(100_000):
            if tuner.settled:
                break
            if k % epoch_len == 0 and k:
                fc.advance(pause)
            fc.advance(1.0 / (40.0 * min(knobs["v"], 4)))
            tuner.observe(1, k // epoch_len)
        return tuner.decisions

    one = run(10**9, 0.0)
    assert [(d[2], d[3]) for d in one] == [(1, 2), (2, 4), (4, 8), (8, 4)]
    assert run(12, 0.0) == one
    paused = run(12, 1.0)
    assert [(d[2], d[3]) for d in paused] == [(1, 2), (2, 4), (4, 8), (8, 4)]
    assert paused[-1][0] > one[-1][0] + 1.0     # the pauses and each epoch's warm-up cost time
    quoted = {float(r) for d in paused for r in re.findall(r"([0-9.]+)/s", d[4])}
    assert quoted == {40.0, 80.0, 160.0}, paused  # but never enter a rate


def test_an_outlier_window_is_ignored(clock):
    """A GC pause in one window at 4 threads must not make 4 look worse than 2."""
    knobs = {"v": 2}
    changed = {"at": clock.t}

    def apply(v):
        knobs["v"] = v
        changed["at"] = clock.t

    rates = {1: 50.0, 2: 100.0, 4: 190.0, 8: 195.0}
    tuner = Tuner([(HillClimb("num_threads", 2, 1, 8), apply)], clock=seconds(clock))
    paused = False
    for _ in range(5000):
        if tuner.settled:
            break
        clock.advance(1.0 / rates[knobs["v"]])
        if knobs["v"] == 4 and clock.t - changed["at"] >= 0.6e9 and not paused:   # past the warm-up at 4
            clock.advance(1.5)
            paused = True
        tuner.observe(1)
    assert paused and tuner.settled and knobs["v"] == 4
    assert [(d[2], d[3]) for d in tuner.decisions] == [(2, 4), (4, 8), (8, 4)]
    at4 = tuner.decisions[1][4]
    assert min(_windows(at4)) < 60 and "better" in at4   # the disturbed window is in the evidence, outvoted


def test_noisy_rates_around_a_plateau_settle_within_the_bound(clock):
    """Throughput grows to 4 threads and is flat after, every 0.1 s disturbed by up to 10%:
    the tuner settles on the plateau after at most 4 settings (the bound in NOTE [ Autotune ]),
    in bounded time, whatever the noise (20 noise sequences)."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        knobs = {"v": 1}

        def apply(v, knobs=knobs):
            knobs["v"] = v

        tuner = Tuner([(HillClimb("num_threads", 1, 1, 64), apply)], clock=seconds(clock))
        noise = {"until": 0, "f": 1.0}
        start = clock.t
        tried = {1}
        for _ in range(100_000):
            if tuner.settled:
                break
            if clock.t >= noise["until"]:
                noise["until"], noise["f"] = clock.t + 0.1e9, rng.uniform(0.9, 1.1)
            clock.advance(1.0 / (100.0 * min(knobs["v"], 4) * noise["f"]))
            tuner.observe(1)
            tried.add(knobs["v"])
        assert tuner.settled and len(tried) <= 4, (seed, tried)
        assert knobs["v"] >= 4, seed                                   # on the plateau
        # at most 4 settings of (1 warm-up + 5) windows, each a little over window_s
        assert (clock.t - start) / 1e9 <= 4 * (1 + 5) * (tuner.window_s + 0.01), seed
        assert tuner.decisions[-1][4].endswith("settled")


def test_every_step_is_recorded_with_its_evidence(clock):
    """A losing step up says it goes back, with both rates; a knob that ends where it is
    (at its limit, or with nothing to try) records "kept N, settled" too."""
    knobs = {"num_threads": 2, "prefetch": 1, "depth": 1}

    def setter(name):
        def apply(v):
            knobs[name] = v
        return apply

    tuner = Tuner([(HillClimb("num_threads", 2, 1, 8), setter("num_threads")),
                   (HillClimb("prefetch", 1, 1, 1), setter("prefetch")),    # a RAM budget of one slot
                   (HillClimb("depth", 1, 1, 2), setter("depth"))], clock=seconds(clock))
    rates = {1: 80.0, 2: 100.0, 4: 101.0, 8: 101.0}
    simulate(tuner, clock, lambda: knobs["num_threads"], lambda n: rates[n] * (1.2 if knobs["depth"] == 2 else 1),
             20_000, until_settled=True)
    assert tuner.settled
    rows = [(d[1], d[2], d[3]) for d in tuner.decisions]
    assert rows == [("num_threads", 2, 4), ("num_threads", 4, 1), ("num_threads", 1, 2),
                    ("prefetch", 1, 1), ("depth", 1, 2), ("depth", 2, 2)]
    why = [d[4] for d in tuner.decisions]
    assert re.search(r"101\.0/s at 4 \(median of 3 windows: .*\) vs 100\.0/s at 2: no better, back to 2 and "
                     r"below; trying 1$", why[1]), why[1]
    assert re.search(r"80\.0/s at 1 .* vs 100\.0/s at 2: no better: back to 2, settled$", why[2]), why[2]
    assert why[3].endswith("1 is the lower limit: kept 1, settled") and "100.0/s at 1" in why[3]
    assert re.search(r"120\.0/s at 2 .* vs 100\.0/s at 1: better; 2 is the upper limit: kept 2, settled$",
                     why[5]), why[5]
    assert {d[1] for d in tuner.decisions if d[4].endswith("settled")} == {"num_threads", "prefetch", "depth"}


def _images(tmp_path, n=12):
    import cv2

    rng = np.random.default_rng(3)
    paths = []
    for i in range(n):
        p = tmp_path / f"{i}.jpg"
        cv2.imwrite(str(p), rng.integers(0, 256, (24 + i, 30, 3), dtype=np.uint8))
        paths.append(str(p))
    return paths


def test_dataloader_autotune_same_output(tmp_path):
    paths = _images(tmp_path)
    ds = ll.ImageListDataset(paths, np.arange(len(paths))).transform_first(
        T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToCHW()]))
    fixed = ll.DataLoader(ds, batch_size=2, shuffle=True, seed=4, num_threads=1, prefetch=2)
    tuned = ll.DataLoader(ds, batch_size=2, shuffle=True, seed=4, num_threads=ll.AUTOTUNE, prefetch=ll.AUTOTUNE)
    tuner = tuned._tuner
    tuner.clock, tuner.origin = SteppingClock(0.2), 0.0     # windows close every two batches; equal rates
    tuner.window_s, tuner.min_items, tuner.windows, tuner.max_windows = 0.3, 1, 1, 1   # one window a setting
    for _ in range(4):
        a = [(x.copy(), y.copy()) for x, y in fixed]
        b = [(x.copy(), y.copy()) for x, y in tuned]
        assert all(np.array_equal(x, u) and np.array_equal(y, v) for (x, y), (u, v) in zip(a, b))
        assert len(a) == len(b) == 6
    decisions = tuned.stats.autotune
    assert decisions and all(len(d) == 5 for d in decisions)
    assert any(d[2] != d[3] for d in decisions)          # the knobs moved while the epochs ran
    assert {d[1] for d in decisions} <= {"num_threads", "prefetch"}
    last = {d[1]: d[3] for d in decisions}
    assert tuned.num_threads == last.get("num_threads", tuned.num_threads)
    assert tuned.prefetch == last.get("prefetch", tuned.prefetch)


def test_ram_budget_too_small_for_one_batch(tmp_path):
    paths = _images(tmp_path, 4)
    ds = ll.ImageListDataset(paths, np.arange(4)).transform_first(T.Compose([T.Resize((16, 16)), T.ToCHW()]))
    with pytest.raises(ValueError, match=r"ram_budget=1000 bytes cannot hold one batch .* \(1552 bytes\)"):
        ll.DataLoader(ds, batch_size=2, prefetch=ll.AUTOTUNE, ram_budget=1000)
    ok = ll.DataLoader(ds, batch_size=2, prefetch=ll.AUTOTUNE, ram_budget="5KB")
    # one batch: 2 x 3x16x16 uint8 + 2 int64 labels = 1552 bytes; 5000 // 1552 - 2 slots: prefetch at most 1
    assert ok._tuner.knobs[0][0].hi == 1
    pipe = ll.Pipeline.from_arrays(np.zeros((8, 100), np.float32)).batch(4).with_options(
        prefetch=ll.AUTOTUNE, ram_budget=1000)
    with pytest.raises(ValueError, match="cannot hold one batch"):
        list(pipe)


def test_pipeline_autotune_same_output():
    def square(x):
        return x * x

    ref = [int(x) ** 2 for x in range(50)]
    clock = SteppingClock(0.3)
    pipe = (ll.Pipeline.from_iterable(lambda: iter(range(50))).map(square, num_parallel_calls=ll.AUTOTUNE)
            .prefetch(ll.AUTOTUNE).with_options(autotune_clock=clock))
    for _ in range(3):
        assert [int(v) for v in pipe] == ref
    head = ll.Pipeline.from_arrays(np.arange(50)).map(square).batch(5).with_options(
        num_threads=ll.AUTOTUNE, prefetch=ll.AUTOTUNE, seed=1)
    assert [int(v) for b in head for v in b] == ref
    stats = pipe.stats
    assert all(len(d) == 5 for d in stats["autotune"])


def test_loader_tuner_restarts_at_every_epoch_and_after_a_dropped_iterator(clock, monkeypatch):
    """Batches come at 100/s whatever the knobs; every epoch is dropped after 61 batches and
    followed by 20 s without deliveries. The gaps and the epoch starts never reach a window."""
    import loaderlib._threads

    monkeypatch.setattr(loaderlib._threads, "default_num_threads", lambda: 2)
    x = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    loader = ll.DataLoader(ll.ArrayDataset(x), batch_size=10, num_threads=ll.AUTOTUNE, prefetch=ll.AUTOTUNE, seed=0)
    loader._tuner.clock = seconds(clock)      # its default (the profiling clock), stated
    for _ in range(40):
        if loader._tuner.settled:
            break
        it = iter(loader)
        for k, _batch in enumerate(it):
            clock.advance(0.01)
            if k == 60:
                break
        del it
        clock.advance(20.0)
    assert loader._tuner.settled
    decisions = loader.stats.autotune
    assert [(k, old, new) for _, k, old, new, _ in decisions] == [
        ("num_threads", 2, 1), ("num_threads", 1, 2), ("prefetch", 2, 4), ("prefetch", 4, 1), ("prefetch", 1, 2)]
    quoted = [float(r) for d in decisions for r in re.findall(r"([0-9.]+)/s", d[4])]   # the rates compared
    measured = [w for d in decisions for w in _windows(d[4])]
    assert all(90 <= r <= 110 for r in quoted + measured), decisions
    assert len(measured) >= 12
    assert (loader.num_threads, loader.prefetch) == (2, 2)
    loader.close()


def test_decision_times_count_from_the_pipeline_origin(clock):
    """The engine stage's tuner and a Python step's tuner report times from one origin: when
    the pipeline was made, on the profiling clock."""
    def plus(x):
        return x + 1

    def twice(x):
        return x * 2

    pipe = (ll.Pipeline.from_arrays(np.arange(400)).map(plus).batch(4).unbatch()
            .map(twice, num_parallel_calls=ll.AUTOTUNE)
            .with_options(seed=0, num_threads=ll.AUTOTUNE, autotune_clock=seconds(clock)))
    made = clock.t
    clock.advance(100.0)
    out = []
    for v in pipe:
        clock.advance(0.01)
        out.append(int(v))
    assert out == [2 * (x + 1) for x in range(400)]
    decisions = pipe.stats["autotune"]
    knobs = {d[1] for d in decisions}
    assert len(knobs) == 2 and "num_threads" in knobs, knobs
    assert any(k.startswith("step 4 .map(") and k.endswith("num_parallel_calls") for k in knobs), knobs
    elapsed = (clock.t - made) / 1e9
    assert all(100.0 < d[0] <= elapsed for d in decisions), decisions
    assert [d[0] for d in decisions] == sorted(d[0] for d in decisions)
    engine = pipe._engines[next(iter(pipe._engines))].loader
    assert all(d in decisions for d in engine.stats.autotune)    # the engine's own list, same times
    pipe.close()


def _busy_rule(n, cpu_per_s):
    """A native loader's rule: below the start only when the threads did not have their cores."""
    from loaderlib._autotune import BUSY

    return None if cpu_per_s is None or cpu_per_s < BUSY * n else f"{cpu_per_s:.2f} CPUs: the cores are theirs"


def test_hill_climb_goes_below_the_start_only_on_evidence():
    # at the upper limit with busy threads: settled at once, no trial at half the threads
    busy = HillClimb("num_threads", 2, 1, 2, below=_busy_rule)
    busy.cpu_per_s = 1.96
    assert busy.step(100.0) == (2, "100.0/s at 2, the upper limit; 1.96 CPUs: the cores are theirs: kept 2, settled")
    # the cores were shared (60% of a CPU per thread): the trial below goes ahead
    shared = HillClimb("num_threads", 2, 1, 2, below=_busy_rule)
    shared.cpu_per_s = 1.2
    assert shared.step(100.0) == (1, "100.0/s at 2, the upper limit (the process used 1.20 CPUs with 2: the cores "
                                     "are shared); trying 1")
    # a step up that did not pay goes back, and not below, when the start kept its cores busy
    up = HillClimb("num_threads", 2, 1, 4, below=_busy_rule)
    up.cpu_per_s = 1.9
    assert up.step(100.0)[0] == 4
    up.cpu_per_s = 1.0   # what the trial above measured does not matter: the start's evidence does
    value, why = up.step(101.0)
    assert value == 2 and up.settled and why.endswith("the cores are theirs: back to 2, settled")


def test_tuner_hands_the_knob_the_cpu_used_while_measuring(clock):
    cpu = {"s": 0.0}
    knobs = {"num_threads": 2}

    def apply(v):
        knobs["num_threads"] = v

    def rate_of(n):
        cpu["s"] += 1.0 / 50.0 * 1.9   # 1.9 CPUs busy for every delivery's time
        return 50.0

    h = HillClimb("num_threads", 2, 1, 2, below=_busy_rule)
    tuner = Tuner([(h, apply)], clock=seconds(clock), window_s=1.0, min_items=4, cpu_clock=lambda: cpu["s"])
    simulate(tuner, clock, lambda: knobs["num_threads"], rate_of, 400, until_settled=True)
    assert tuner.settled and knobs["num_threads"] == 2
    assert len(tuner.decisions) == 1 and "1.90 CPUs" in tuner.decisions[0][4]
