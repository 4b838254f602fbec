"""AUTOTUNE: the tuner's decisions from synthetic measurements on an injected clock, and
that tuning never changes the output."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._autotune import HillClimb, Tuner, parse_bytes


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class SteppingClock:
    """Advances a fixed step on every reading (so every window closes after a few batches)."""

    def __init__(self, step: float) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_parse_bytes():
    assert parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(" 1.5 g ") == 1_500_000_000
    assert parse_bytes(4096) == 4096
    for bad in ("two GB", "0GB", -5, 0, True, "12XB"):
        with pytest.raises(ValueError, match="ram_budget must be"):
            parse_bytes(bad)


def simulate(tuner: Tuner, clock: FakeClock, value_of, rate_of, items: int) -> None:
    """Deliver ``items`` items, each taking 1/rate(current knob value) seconds."""
    for _ in range(items):
        clock.t += 1.0 / rate_of(value_of())
        tuner.observe(1)


def test_hill_climb_up_then_back():
    h = HillClimb("num_threads", 2, 1, 16)
    h.start()
    rate = {1: 50, 2: 100, 4: 190, 8: 195, 16: 100}
    seen = []
    for _ in range(10):
        out = h.step(rate[h.value])
        seen.append(out)
        if out is None:
            break
        h.value = out[0]
    assert [s[0] for s in seen if s] == [4, 8, 4]        # doubling while it pays, then back
    assert h.settled and h.value == 4
    assert "back to 4, settled" in seen[2][1]


def test_hill_climb_tries_lower_when_more_is_worse():
    h = HillClimb("num_threads", 4, 1, 16)
    h.start()
    rate = {1: 400, 2: 300, 4: 200, 8: 150}
    values = []
    while True:
        out = h.step(rate[h.value])
        if out is None:
            break
        h.value = out[0]
        values.append(out[0])
    assert values == [8, 2, 1] and h.value == 1 and h.settled
    # at the upper limit it goes straight to trying lower, and settles where it started
    top = HillClimb("prefetch", 4, 1, 4)
    top.start()
    assert top.step(10.0)[0] == 2
    top.value = 2
    assert top.step(10.0) == (4, "10.0/s at 2 vs 10.0/s at 4: back to 4, settled")


def test_tuner_decisions_with_injected_clock():
    clock = FakeClock()
    knobs = {"num_threads": 1, "prefetch": 2}

    def setter(name):
        def apply(v):
            knobs[name] = v
        return apply

    tuner = Tuner([(HillClimb("num_threads", 1, 1, 8), setter("num_threads")),
                   (HillClimb("prefetch", 2, 1, 8), setter("prefetch"))], clock=clock, window_s=1.0, min_items=4)
    # throughput grows with threads up to 4; prefetch does not matter
    simulate(tuner, clock, lambda: knobs["num_threads"], lambda n: 10.0 * min(n, 4), 2000)
    assert tuner.settled and knobs == {"num_threads": 4, "prefetch": 2}
    names = [(d[1], d[2], d[3]) for d in tuner.decisions]
    assert names == [("num_threads", 1, 2), ("num_threads", 2, 4), ("num_threads", 4, 8), ("num_threads", 8, 4),
                     ("prefetch", 2, 4), ("prefetch", 4, 1), ("prefetch", 1, 2)]
    times = [d[0] for d in tuner.decisions]
    assert times == sorted(times) and all(isinstance(d[4], str) and "/s" in d[4] for d in tuner.decisions)
    # every change is followed by one discarded window: decisions are at least 2 windows apart
    assert all(b - a >= 2.0 - 1e-9 for a, b in itertools.pairwise(times))


def test_tuner_ignores_short_windows():
    clock = FakeClock()
    tuner = Tuner([(HillClimb("num_threads", 2, 1, 8), lambda v: None)], clock=clock, window_s=1.0, min_items=50)
    simulate(tuner, clock, lambda: 2, lambda n: 10.0, 100)   # 10 items per window: below min_items
    assert tuner.decisions == []


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
    tuned._tuner.clock = SteppingClock(0.2)     # windows close every few batches; equal rates
    tuned._tuner.window_s = 0.5
    tuned._tuner.min_items = 1
    for _ in range(4):
        a = [(x.copy(), y.copy()) for x, y in fixed]
        b = [(x.copy(), y.copy()) for x, y in tuned]
        assert all(np.array_equal(x, u) and np.array_equal(y, v) for (x, y), (u, v) in zip(a, b))
        assert len(a) == len(b) == 6
    decisions = tuned.stats.autotune
    assert decisions and all(len(d) == 5 for d in decisions)
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
