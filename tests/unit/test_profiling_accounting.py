"""One accounting, on an injected clock: the harness, the verdict and the report on synthetic
stage records (tests/unit/profiling_sim.py), and the invariants every window keeps.

No test here reads a real clock or sleeps: time is a FakeClock that jumps from event to event.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import pytest
from loaderlib.profiling import STAGES, StageRecorder, benchmark
from loaderlib.profiling import harness as harness_mod

import loaderlib
from loaderlib._observe import stats as stats_mod
from loaderlib.stats import Delivery, Window, split_window, window_of

from .profiling_sim import FakeClock, FakeMonitor, SimLoader


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(stats_mod, "_clock", c)
    return c


@pytest.fixture
def monitor(monkeypatch):
    class Monitor(FakeMonitor):
        cores = 1.0
        other_cores = 0.0
        top_others: ClassVar[list] = []

    monkeypatch.setattr(harness_mod, "_ResourceMonitor", Monitor)
    monkeypatch.setattr(loaderlib, "available_cpus", lambda: 2)
    return Monitor


def _consistent(report):
    """The invariants of NOTE [ One accounting ], on the report and on each of its parts."""
    for w in (report.window, *report.parts):
        assert w.problems() == [], w
        assert w.busy_fraction <= 1.0 + 1e-9
        if w.has_stages:
            assert sum(w.stage_share.values()) == pytest.approx(1.0, abs=1e-12)
    assert report.problems == ()
    # The consumer's side adds up: with the injected clock every second of the window is a
    # steady wait, an epoch-boundary wait or model time (the harness's bookkeeping takes none).
    assert report.consumer_wall_fraction == pytest.approx(1.0, abs=1e-9)
    # The parts tile the window.
    assert sum(p.wall_s for p in report.parts) == pytest.approx(report.wall_s, rel=1e-9)
    assert sum(p.samples for p in report.parts) == report.samples


# -- the recorder's bins never hold more than the pool had ------------------------------------
def test_bins_never_exceed_capacity_and_keep_every_nanosecond(clock):
    """Random batches whose stage time exceeds their own wall time (batches in flight side by
    side): every bin stays within threads x its length, and bins + ahead + unattributed
    account for all the stage time recorded."""
    rng = np.random.default_rng(1)
    rec = StageRecorder(series_interval=0.05)
    rec.epoch_started(4, 8)
    total = 0
    for _ in range(300):
        dt = float(rng.uniform(0.001, 0.03))
        clock.advance(dt)
        wall = int(dt * 1e9 * rng.uniform(0.2, 1.0))
        # Up to 1.6x what 4 threads can do in the batch's own wall time, on average below 1x of the elapsed.
        stage = {k: int(v) for k, v in zip(STAGES, rng.dirichlet(np.ones(5)) * 4 * wall * rng.uniform(0.2, 1.6))}
        total += sum(stage.values())
        rec.batch_done(8, stage, wall, 4)
    s = rec.snapshot()
    ser = s.series
    busy = np.array(ser["busy_fraction"])
    assert busy.max() <= 1.0 + 1e-9
    assert busy.max() > 0.99  # the case is real: some bins were filled to the brim
    placed = sum(sum(ser[f"stage_s.{k}"]) for k in STAGES)
    assert placed + sum(s.ahead_stage_s.values()) + s.unattributed_s == pytest.approx(total / 1e9, rel=1e-9)
    assert sum(s.stage_total_s.values()) == pytest.approx(total / 1e9, rel=1e-12)
    assert s.busy_fraction <= 1.0 + 1e-12
    assert sum(ser["capacity_s"]) == pytest.approx(4 * s.elapsed_s, rel=1e-9)


def test_excess_moves_back_to_where_the_pool_had_room(clock):
    rec = StageRecorder(series_interval=0.1)
    rec.epoch_started(1, 1)
    clock.advance(0.1)
    rec.batch_done(1, {"decode": 20_000_000}, 20_000_000, 1)        # bin 0: 20 ms of 100
    clock.advance(0.1)
    rec.batch_done(1, {"decode": 150_000_000}, 50_000_000, 1)       # bin 1: 150 ms in 100
    s = rec.snapshot()
    assert s.series["stage_s.decode"] == pytest.approx((0.07, 0.1))
    assert s.series["busy_fraction"] == pytest.approx((0.7, 1.0))
    assert s.unattributed_s == 0
    # More than the whole epoch had: the rest is reported, never squeezed into a bin.
    clock.advance(0.1)
    rec.batch_done(1, {"decode": 500_000_000}, 100_000_000, 1)
    s = rec.snapshot()
    assert max(s.series["busy_fraction"]) == pytest.approx(1.0)
    assert s.unattributed_s == pytest.approx(0.5 - 0.1 - 0.03)


def test_first_wait_of_an_epoch_is_a_boundary_and_work_done_ahead_is_kept_apart(clock):
    rec = StageRecorder(series_interval=0.5)
    rec.epoch_started(2, 4)
    clock.advance(0.3)
    rec.consumer_waited(300_000_000)       # the refill: the epoch's first batch
    rec.batch_done(4, {"read": 1_000_000}, 100_000_000, 2)
    clock.advance(0.2)
    rec.consumer_waited(50_000_000)
    s = rec.snapshot()
    assert s.boundary_wait_s == pytest.approx(0.3) and s.consumer_wait_s == pytest.approx(0.05)
    assert s.consumer_waits == 2
    assert s.series["boundary_wait_s"] == pytest.approx((0.3,))
    assert s.series["wait_s"] == pytest.approx((0.05,))
    # A warm epoch's records arrive as the epoch starts, their wall time before it.
    rec.epoch_started(2, 4)
    rec.batch_done(4, {"decode": 80_000_000}, 40_000_000, 2)
    s = rec.snapshot()
    assert s.ahead_stage_s["decode"] == pytest.approx(0.08)
    assert s.stage_total_s["decode"] == pytest.approx(0.08)
    assert s.unattributed_s == 0 and s.busy_fraction == 0


def test_snapshot_freezes_when_the_run_ends(clock):
    rec = StageRecorder()
    rec.epoch_started(1, 4)
    for _ in range(10):
        clock.advance(0.1)
        rec.batch_done(4, {"decode": 50_000_000}, 100_000_000, 1)
    before = rec.snapshot()
    clock.advance(30.0)  # nothing happens any more
    after = rec.snapshot()
    assert after.elapsed_s == before.elapsed_s == pytest.approx(1.0)
    assert after.to_json() == before.to_json()  # NaN (no queue reports) compares equal as JSON null
    assert after.samples_per_s == pytest.approx(40.0) and after.busy_fraction == pytest.approx(0.5)


# -- windows cut from bins ----------------------------------------------------------------------
def _epoch(clock, threads=2, batches=10, batch_s=0.1, busy=0.8, wait_first=0.0):
    rec = StageRecorder(series_interval=0.25)
    rec.epoch_started(threads, 4)
    if wait_first:
        clock.advance(wait_first)
        rec.consumer_waited(int(wait_first * 1e9))
    for _ in range(batches):
        clock.advance(batch_s)
        rec.batch_done(4, {"decode": int(busy * threads * batch_s * 1e9)}, int(batch_s * 1e9), threads)
        rec.consumer_waited(0)
    return rec.snapshot()


def test_window_cut_from_bins_is_proportional_and_spans_epochs(clock):
    a = _epoch(clock, busy=0.8)
    b = _epoch(clock, busy=0.4, wait_first=0.2)
    whole = window_of([a, b], a.started_s, b.started_s + b.elapsed_s)
    assert whole.wall_s == pytest.approx(2.2)
    assert whole.samples == pytest.approx(80)
    assert whole.stage_s["decode"] == pytest.approx(0.8 * 2 + 0.4 * 2)  # thread seconds
    assert whole.capacity_s == pytest.approx(2 * 2.2)
    assert whole.busy_fraction == pytest.approx(2.4 / 4.4)
    assert whole.boundary_wait_s == pytest.approx(0.2) and whole.consumer_wait_s == 0
    assert whole.epochs == 1  # b started inside the window
    # Half of one 0.25 s bin: figures in proportion.
    half = window_of([a], a.started_s + 0.125, a.started_s + 0.25)
    assert half.stage_s["decode"] == pytest.approx(0.125 * 0.8 * 2)
    assert half.capacity_s == pytest.approx(0.125 * 2) and half.busy_fraction == pytest.approx(0.8)
    parts = split_window([a, b], a.started_s, b.started_s + b.elapsed_s, 4)
    assert sum(p.samples for p in parts) == pytest.approx(whole.samples)
    assert sum(p.stage_s["decode"] for p in parts) == pytest.approx(whole.stage_s["decode"])
    assert [p.busy_fraction > 0.6 for p in parts] == [True, True, False, False]


def test_deliveries_give_the_consumer_side():
    ds = [Delivery(1.0, 4, 0.5, 0.2, boundary=True), Delivery(1.3, 4, 0.1, 0.2), Delivery(1.6, 0, 0.05, 0.0, True)]
    w = window_of([], 0.9, 1.6, ds)
    assert (w.samples, w.batches, w.epochs) == (8, 2, 1)
    assert w.boundary_wait_s == pytest.approx(0.1 + 0.05)   # only the part of the refill inside
    assert w.consumer_wait_s == pytest.approx(0.1)
    assert w.model_s == pytest.approx(0.4)
    assert w.samples_per_s == pytest.approx(8 / 0.7)


def test_problems_are_found_when_a_window_breaks_an_invariant():
    ok = Window(0.0, 1.0, 10, 1, {k: 0.1 for k in STAGES}, 2.0, 2, 0.1, 0.1, 0.5)
    assert ok.problems() == []
    over = Window(0.0, 1.0, 10, 1, {"decode": 2.5}, 2.0, 2, 0.0, 0.0)
    assert any("busy 125.0% > 100%" in p for p in over.problems())
    assert sum(over.stage_share.values()) == pytest.approx(1.0)
    late = Window(0.0, 1.0, 10, 1, {}, 2.0, 2, 0.6, 0.3, 0.4)
    assert any("consumer time" in p for p in late.problems())
    neg = Window(0.0, 1.0, -1, 1, {"read": -1.0}, 2.0, 2, 0.0, 0.0)
    assert any("negative" in p and "samples" in p and "read" in p for p in neg.problems())


# -- the harness on a simulated loader ----------------------------------------------------------
def test_decode_bound_at_one_thread(clock, monitor):
    monitor.cores = 0.95
    loader = SimLoader(clock, threads=1, batch_s=0.01, busy=0.95, shares={"decode": 0.8, "read": 0.1,
                                                                           "transform": 0.1})
    r = benchmark(loader, seconds=4.0)
    _consistent(r)
    assert r.samples_per_s == pytest.approx(16 / 0.01, rel=1e-3)
    assert r.ceiling_samples_per_s == r.samples_per_s
    assert r.busy_fraction == pytest.approx(0.95, rel=1e-3)
    assert r.stage_s["decode"] / sum(r.stage_s.values()) == pytest.approx(0.8)
    v = r.verdict
    assert v.enough and v.bottleneck == "decode" and v.confidence == 1.0
    assert "num_threads=1 -> 2" in v.suggestion
    assert "decode-bound at 1 thread with 95% busy (80% of thread time in decode)" in v.summary


def test_model_bound_with_epoch_refills_is_not_blamed_on_a_stage(clock, monitor):
    """The loader (1,600/s) outruns the model (800/s), but every epoch of 20 batches starts with
    a 90 ms refill: 18% of the time waiting, all of it at epoch boundaries."""
    loader = SimLoader(clock, n_batches=20, batch_s=0.01, startup_s=0.08, prefetch=4)
    r = benchmark(loader, model_step=loader.model(0.02), seconds=6.0, replay=False)
    _consistent(r)
    assert r.bottleneck == "model", r
    assert r.accelerator_idle_fraction == pytest.approx(0.0, abs=1e-9)
    assert r.boundary_wait_s / r.wall_s == pytest.approx(0.09 / 0.49, rel=0.05)
    assert r.window.epochs >= 10
    assert any("epoch boundaries" in n for n in r.verdict.notes)
    assert r.ceiling_samples_per_s > r.samples_per_s


def test_too_short_a_run_says_so_and_how_long_to_run(clock, monitor):
    # decode leads transform by 2 points of thread time: 5 batches at the spread floor cannot say.
    loader = SimLoader(clock, batch_s=0.02, shares={"decode": 0.49, "transform": 0.47, "read": 0.04})
    r = benchmark(loader, seconds=0.08, warmup_batches=2)
    _consistent(r)
    v = r.verdict
    assert v.bottleneck is None and not v.enough and r.batches == 4
    # Five batches finished in the window (the pool works one ahead of the consumer).
    assert v.summary.startswith("not enough evidence: over 5 batches decode and transform took 49% and 47% of "
                                "thread time")
    assert v.summary.endswith("does not settle which of them limits; so far the figures point at decode")
    # At the floor's spread (2 points) a 2-point lead needs t(n - 1) / sqrt(n) < 1: 9 batches,
    # at this window's 20 ms each, with a 20% margin.
    assert "measure about 9 batches" in v.suggestion
    assert v.seconds_needed == pytest.approx(0.22) and f"seconds={v.seconds_needed:g}" in v.suggestion
    # The same window with decode at 90%: 5 batches settle it.
    loader = SimLoader(clock, batch_s=0.02)
    r = benchmark(loader, seconds=0.08, warmup_batches=2)
    assert r.verdict.enough and r.verdict.bottleneck == "decode"


def _jittered(top, second, spread, seed=0):
    """Per-batch shares: ``top`` and ``second`` stages in the ratio given, each batch's figures
    scaled by a scripted factor in [1 - spread, 1 + spread] (the same every run)."""
    rng = np.random.default_rng(seed)
    table = [(float(rng.uniform(1 - spread, 1 + spread)), float(rng.uniform(1 - spread, 1 + spread)))
             for _ in range(4096)]

    def shares(_epoch, k):
        a, b = table[k % len(table)]
        t, s = top[1] * a, second[1] * b
        return {top[0]: t / (t + s), second[0]: s / (t + s)}
    return shares


def test_a_2x_separation_over_8_batches_gets_an_answer(clock, monitor):
    """NOTE [ Verdict rules ], rule 0: the evidence needed scales with the effect, not a fixed length."""
    # decode 2x transform per batch (each +-30%), a 0.16 s window: 8 batches.
    loader = SimLoader(clock, batch_s=0.02, shares=_jittered(("decode", 2.0), ("transform", 1.0), 0.3))
    r = benchmark(loader, seconds=0.16, warmup_batches=2)
    _consistent(r)
    assert 8 <= r.batches <= 9 and r.verdict.enough and r.bottleneck == "decode", r.verdict
    # A model (100 ms) twice as slow as the loader (50 ms), 8 model steps: model-bound.
    loader = SimLoader(clock, batch_s=0.05, prefetch=2)
    r = benchmark(loader, model_step=loader.model(0.1), seconds=0.8, warmup_batches=2, replay=False)
    _consistent(r)
    assert 8 <= r.batches <= 9 and r.verdict.enough and r.bottleneck == "model", r.verdict
    # A loader (200 ms) twice as slow as the model (100 ms): the stage is named.
    loader = SimLoader(clock, batch_s=0.2, prefetch=2)
    r = benchmark(loader, model_step=loader.model(0.1), seconds=2.0, warmup_batches=4, replay=False)
    _consistent(r)
    assert r.batches >= 8 and r.verdict.enough and r.bottleneck == "decode", r.verdict
    assert r.verdict.evidence["wait_interval"][0] > 0.1


def test_close_stages_over_a_short_run_are_not_enough_evidence(clock, monitor):
    # decode 1.1x transform per batch (each +-30%): 40 batches cannot tell them apart.
    loader = SimLoader(clock, batch_s=0.02, shares=_jittered(("decode", 1.1), ("transform", 1.0), 0.3, seed=4))
    r = benchmark(loader, seconds=0.8, warmup_batches=2)
    _consistent(r)
    v = r.verdict
    assert r.batches == 40 and not v.enough and v.bottleneck is None
    assert v.summary.startswith("not enough evidence: over 41 batches decode and transform took 53% and 47%")
    lo, hi = v.evidence["stage_lead_interval"]
    assert lo < 0 < hi
    assert "measure about" in v.suggestion and v.seconds_needed > 0.8


def test_a_run_whose_parts_disagree_is_not_enough_evidence(clock, monitor):
    """The pipeline alternates every second between faster and slower than the model."""
    def cost(_epoch, _k, t):
        return 0.005 if int(t) % 2 else 0.04

    loader = SimLoader(clock, batch_s=cost, prefetch=2)
    r = benchmark(loader, model_step=loader.model(0.02), seconds=4.0, ceiling=False, replay=False)
    _consistent(r)
    v = r.verdict
    assert not v.enough and v.bottleneck is None
    assert "the accelerator waited" in v.summary and "does not settle whether it is under 10%" in v.summary
    lo, hi = v.evidence["wait_interval"]
    assert lo < 0.10 < hi
    assert v.confidence < 0.75 and v.seconds_needed > 4.0


def test_a_disturbed_ceiling_run_is_reported_with_how_much(clock, monitor):
    # The ceiling run (the first iter) was slowed to half speed; the run with the model was not.
    loader = SimLoader(clock, batch_s=lambda epoch, _k, _t: 0.02 if epoch == 1 else 0.01)
    r = benchmark(loader, model_step=loader.model(0.005), seconds=3.0, replay=False)
    _consistent(r)
    assert r.samples_per_s == pytest.approx(1600, rel=0.01) and r.ceiling_samples_per_s == pytest.approx(800, rel=0.01)
    note = [n for n in r.verdict.notes if "ceiling run was disturbed" in n]
    assert note and "100% above the ceiling's 800" in note[0]


def test_gil_io_and_competing_load_advice(clock, monitor):
    monitor.cores = 1.0
    r = benchmark(SimLoader(clock, shares={"python": 0.9, "read": 0.1}, busy=0.97), seconds=3.0)
    assert r.bottleneck == "python" and "GIL" in r.verdict.suggestion and "1.0 cores" in r.verdict.suggestion
    monitor.cores = 0.1
    r = benchmark(SimLoader(clock, shares={"read": 0.9, "decode": 0.1}, busy=0.97), seconds=3.0)
    assert r.bottleneck == "io" and "more threads than cores" in r.verdict.suggestion
    monitor.cores, monitor.other_cores = 0.9, 1.1
    monitor.top_others = [("pytest", 0.8), ("chromium", 0.3)]
    r = benchmark(SimLoader(clock, busy=0.97), seconds=3.0)
    _consistent(r)
    note = [n for n in r.verdict.notes if n.startswith("competing load")]
    assert r.bottleneck == "decode" and note
    assert "other processes used 1.1 of 2 cores (pytest 0.8, chromium 0.3)" in note[0]
    # A machine with cores to spare: fewer cores than busy threads is not competition.
    monitor.other_cores = 0.1
    r = benchmark(SimLoader(clock, busy=0.97), seconds=3.0)
    assert not any(n.startswith("competing load") for n in r.verdict.notes)


def test_report_exports_and_plot_keep_every_label(clock, monitor, tmp_path):
    import json

    loader = SimLoader(clock, batch_s=0.01)
    r = benchmark(loader, model_step=loader.model(0.005), seconds=2.5, replay=False)
    d = json.loads(r.to_json())
    assert d["window"]["busy_fraction"] == pytest.approx(r.busy_fraction)
    assert d["verdict"]["confidence"] == r.verdict.confidence
    assert len(d["parts"]) == len(r.parts) == 5
    html = r._repr_html_()
    assert "font-family: system-ui" in html and "sans-serif;" in html  # never the browser's serif default
    fig = r.plot()
    fig.savefig(tmp_path / "r.png")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    box = fig.bbox
    for ax in fig.axes:  # each axes with its labels, ticks, title and legend lies inside the figure
        e = ax.get_tightbbox(renderer)
        assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1 and box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, ax
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()][:2] == ["read 5%", "decode 90%"]
    line = fig.axes[1].lines[0]
    assert len(line.get_xdata()) == len(r.parts) + 1 >= 2  # one level per part, never a lone point
    assert math.isclose(line.get_ydata()[0], r.parts[0].samples_per_s)


# -- the Extract line: every verdict shows it (NOTE [ Every read counts ]) ----------------------
def _read_counters(reads: int, nbytes: int, lat_us: float, inline: int) -> dict:
    hist = [0] * 96
    hist[int(4 * np.log2(lat_us))] = reads
    return {"reads": reads, "failures": 0, "bytes": nbytes, "lat_ns": int(reads * lat_us * 1e3), "cpu_ns": 0,
            "queue_ns": 0, "wait_ns": int(0.25e9), "reading": 3, "depth": 24, "hist": hist, "slots_limit": 64,
            "adaptive": True, "inline": False, "inline_reads": inline, "inline_bytes": nbytes * inline // reads}


@pytest.mark.parametrize(("shares", "cores", "model_s", "verdict"), [
    ({"decode": 0.9, "read": 0.05, "transform": 0.05}, 1.9, 0.0, "decode"),
    ({"read": 0.9, "decode": 0.1}, 0.1, 0.0, "io"),
    ({"python": 0.9, "read": 0.1}, 1.0, 0.0, "python"),
    ({"decode": 0.9, "read": 0.05, "transform": 0.05}, 1.9, 0.02, "model"),
])
def test_the_report_shows_the_extract_line_whatever_the_verdict(clock, monitor, shares, cores, model_s, verdict):
    monitor.cores = cores
    loader = SimLoader(clock, shares=shares, busy=0.97, extract=_read_counters(1000, 45_000_000, 16_000.0, 400))
    r = benchmark(loader, model_step=loader.model(model_s) if model_s else 0, seconds=3.0, replay=False)
    assert r.bottleneck == verdict, r.verdict
    line = next(x for x in repr(r).splitlines() if x.strip().startswith("Extract"))
    ex = r.extract
    assert ex is not None and ex.reads == 1000 and ex.inline_reads == 400
    for part in ("io_depth 24 (adaptive)", "3 reads in flight", "1,000 reads, 400 by the decode threads",
                 f"{ex.bytes_per_s / 1e6:,.1f} MB/s", f"latency p50/p95 {ex.latency_p50_ms:.2f}/{ex.latency_p95_ms:.2f}",
                 "waited 0.25 thread-s"):
        assert part in line, (part, line)
    # 16 ms reads: the histogram bin's upper edge, within 19%.
    assert 16.0 <= ex.latency_p50_ms <= 16.0 * 2 ** 0.25


def test_the_extract_line_says_when_no_read_was_counted(clock, monitor):
    r = benchmark(SimLoader(clock), seconds=1.0)
    line = next(x for x in repr(r).splitlines() if x.strip().startswith("Extract"))
    assert "no reads counted" in line
