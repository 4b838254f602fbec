"""StageRecorder and Stats: totals, percentiles, busy fraction, series, threading, export."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from loaderlib.profiling import STAGES, StageRecorder, Stats

from loaderlib._observe import stats as stats_mod

from .profiling_sim import FakeClock


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(stats_mod, "_clock", c)  # the one profiling clock
    return c


def _stage_dict(values):
    return dict(zip(STAGES, (int(v) for v in values)))


def test_stages_contract():
    assert STAGES == ("read", "decode", "transform", "python", "collate")


def test_disabled_records_nothing():
    rec = StageRecorder(enabled=False)
    rec.epoch_started(4, 32)
    rec.batch_done(32, {"decode": 10**9}, 10**9, 4)
    rec.consumer_waited(5)
    rec.producer_blocked(5)
    rec.queue_depth(1, 2)
    rec.python_gil("python", True)
    s = rec.snapshot()
    assert isinstance(s, Stats)
    assert not s.enabled
    assert s.samples == 0 and s.batches == 0
    assert sum(s.stage_total_s.values()) == 0
    assert s.consumer_wait_s == 0 and s.gil_held == {}
    assert "disabled" in repr(s)
    # Switching it on later records from then on.
    rec.enabled = True
    rec.batch_done(8, {"read": 8000}, 10_000, 1)
    assert rec.snapshot().samples == 8


def test_totals_means_busy_against_numpy(clock):
    rng = np.random.default_rng(0)
    rec = StageRecorder()
    rec.epoch_started(num_threads=2, batch_size=16)
    all_rows, walls, threads = [], [], []
    for b in range(7):
        n = 16 if b < 6 else 5
        rows = rng.integers(1_000, 200_000, size=(n, len(STAGES)))
        wall = 100_000_000
        th = 2 if b % 2 else 1
        clock.advance(0.1)
        rec.batch_done(n, _stage_dict(rows.sum(0)), wall, th, per_sample_ns=rows)
        all_rows.append(rows)
        walls.append(wall)
        threads.append(th)
    rows = np.concatenate(all_rows)
    s = rec.snapshot()
    assert s.batches == 7 and s.samples == rows.shape[0] == 6 * 16 + 5
    assert s.batch_size == 16 and s.num_threads == threads[-1]
    np.testing.assert_allclose([s.stage_total_s[k] for k in STAGES], rows.sum(0) / 1e9)
    np.testing.assert_allclose([s.stage_mean_ms[k] for k in STAGES], rows.mean(0) / 1e6)
    np.testing.assert_allclose([s.stage_p50_ms[k] for k in STAGES], np.percentile(rows, 50, axis=0) / 1e6)
    np.testing.assert_allclose([s.stage_p99_ms[k] for k in STAGES], np.percentile(rows, 99, axis=0) / 1e6)
    assert s.percentile_source == "per-sample"
    # Capacity: each 0.1 s had the thread count reported before it (2 from epoch_started).
    capacity = sum(0.1e9 * t for t in [2, *threads[:-1]])
    assert s.thread_capacity_s == pytest.approx(capacity / 1e9)
    assert s.busy_fraction == pytest.approx(rows.sum() / capacity)
    assert s.producer_wall_s == pytest.approx(sum(walls) / 1e9)
    assert s.elapsed_s == pytest.approx(0.7)
    assert s.samples_per_s == pytest.approx(rows.shape[0] / 0.7)
    assert s.batches_per_s == pytest.approx(7 / 0.7)
    share = s.stage_share
    np.testing.assert_allclose([share[k] for k in STAGES], rows.sum(0) / rows.sum())
    assert s.dominant_stage == STAGES[int(np.argmax(rows.sum(0)))]


def test_kernel_timings_with_three_columns_fill_the_rest_with_batch_means():
    rec = StageRecorder()
    rec.epoch_started(1, 4)
    timings = np.array([[10, 100, 1000], [20, 200, 2000], [30, 300, 3000], [40, 400, 4000]], dtype=np.int64)
    stage = {"read": 100, "decode": 1000, "transform": 10000, "collate": 400_000}
    rec.batch_done(4, stage, 500_000, 1, per_sample_ns=timings)
    s = rec.snapshot()
    assert s.stage_p50_ms["decode"] == pytest.approx(np.median([100, 200, 300, 400]) / 1e6)
    # collate was only given as a batch total: every sample stands at the batch mean.
    assert s.stage_p50_ms["collate"] == pytest.approx(100_000 / 1e6)
    assert s.stage_p99_ms["collate"] == pytest.approx(100_000 / 1e6)
    assert s.stage_total_s["python"] == 0


def test_percentiles_from_batch_means_without_per_sample_rows():
    rec = StageRecorder()
    rec.epoch_started(1, 10)
    means = [1_000, 3_000, 2_000, 10_000]
    for m in means:
        rec.batch_done(10, {"decode": 10 * m}, 10 * m, 1)
    s = rec.snapshot()
    assert s.percentile_source == "per-batch mean"
    assert s.stage_p50_ms["decode"] == pytest.approx(np.percentile(means, 50) / 1e6)
    assert s.stage_p99_ms["decode"] == pytest.approx(np.percentile(means, 99) / 1e6)
    rec.batch_done(2, {"decode": 2}, 2, 1, per_sample_ns=np.ones((2, 5)))
    assert rec.snapshot().percentile_source == "mixed"


def test_percentile_window_keeps_the_most_recent_rows():
    rec = StageRecorder(sample_window=10)
    rec.epoch_started(1, 3)
    rows = np.arange(1, 26, dtype=np.int64)[:, None] * np.ones((1, 5), dtype=np.int64) * 1000
    for i in range(0, 24, 3):  # batches of 3 wrap the 10-row ring several times
        chunk = rows[i:i + 3]
        rec.batch_done(3, _stage_dict(chunk.sum(0)), 1, 1, per_sample_ns=chunk)
    chunk = rows[24:25]
    rec.batch_done(1, _stage_dict(chunk.sum(0)), 1, 1, per_sample_ns=chunk)
    s = rec.snapshot()
    last = rows[-10:, 0]
    assert s.stage_p50_ms["read"] == pytest.approx(np.percentile(last, 50) / 1e6)
    assert s.stage_p99_ms["read"] == pytest.approx(np.percentile(last, 99) / 1e6)
    # A single batch larger than the window keeps its last rows.
    big = np.arange(40, dtype=np.int64)[:, None] * np.ones((1, 5), dtype=np.int64)
    rec.batch_done(40, _stage_dict(big.sum(0)), 1, 1, per_sample_ns=big)
    assert rec.snapshot().stage_p50_ms["read"] == pytest.approx(np.percentile(big[-10:, 0], 50) / 1e6)
    # Totals still count everything.
    assert rec.snapshot().samples == 25 + 40


def test_consumer_producer_queue_gil(clock):
    rec = StageRecorder()
    rec.epoch_started(2, 8)
    rec.consumer_waited(3_000_000)
    rec.consumer_waited(1_000_000)
    rec.producer_blocked(7_000_000)
    rec.queue_depth(1, 4)
    rec.queue_depth(3, 4)
    rec.queue_depth(2, 4)
    rec.python_gil("python", True)
    rec.python_gil("transform", False)
    clock.advance(0.04)
    rec.batch_done(8, {"decode": 1}, 1, 2)
    s = rec.snapshot()
    # The epoch's first wait is its boundary (the refill), the second a steady-state wait.
    assert s.boundary_wait_s == pytest.approx(0.003) and s.consumer_wait_s == pytest.approx(0.001)
    assert s.consumer_waits == 2
    assert s.consumer_wait_fraction == pytest.approx(0.025)
    assert s.producer_blocked_s == pytest.approx(0.007)
    assert (s.queue_depth, s.queue_capacity) == (2, 4)
    assert s.queue_depth_mean == pytest.approx(2.0)
    assert s.gil_held == {"python": True, "transform": False}
    assert "GIL" in repr(s) and "python" in repr(s)
    # A new epoch clears the figures but keeps what is known about the pipeline's GIL use.
    rec.epoch_started(2, 8)
    s = rec.snapshot()
    assert s.samples == 0 and s.consumer_wait_s == 0 and s.queue_capacity == 0
    assert s.gil_held == {"python": True, "transform": False}
    rec.reset()
    assert rec.snapshot().gil_held == {}


def test_events_are_visible_to_snapshot_before_the_next_batch():
    rec = StageRecorder()
    rec.epoch_started(1, 1)
    rec.consumer_waited(5_000)
    rec.consumer_waited(7_000)
    rec.queue_depth(0, 2)
    s = rec.snapshot()
    assert s.boundary_wait_s == pytest.approx(5e-6) and s.consumer_wait_s == pytest.approx(7e-6)
    assert s.queue_capacity == 2


def test_bad_input_raises():
    rec = StageRecorder()
    with pytest.raises(ValueError, match="unknown stage"):
        rec.batch_done(1, {"decoding": 1}, 1, 1)
    with pytest.raises(ValueError, match="per_sample_ns"):
        rec.batch_done(2, {"read": 1}, 1, 1, per_sample_ns=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="per_sample_ns"):
        rec.batch_done(2, {"read": 1}, 1, 1, per_sample_ns=np.zeros((2, 6)))
    with pytest.raises(ValueError, match="unknown stage"):
        rec.python_gil("model", True)
    with pytest.raises(ValueError, match="sample_window must be a positive integer, got 0"):
        StageRecorder(sample_window=0)
    assert rec.snapshot().samples == 0  # nothing half-recorded


def test_concurrent_writers_lose_nothing():
    rec = StageRecorder()
    rec.epoch_started(8, 4)
    n_threads, n_iter = 8, 2000
    start = threading.Barrier(n_threads + 1)
    stop = threading.Event()
    snaps = []

    def writer(k):
        start.wait()
        for _ in range(n_iter):
            rec.consumer_waited(1)
            rec.producer_blocked(2)
            rec.queue_depth(k, 8)
            rec.batch_done(4, {"read": 1, "decode": 2, "transform": 3, "python": 4, "collate": 5}, 10, 2)

    def reader():
        start.wait()
        while not stop.is_set():
            snaps.append(rec.snapshot())

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(n_threads)]
    r = threading.Thread(target=reader)
    for t in threads:
        t.start()
    r.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    s = rec.snapshot()
    total = n_threads * n_iter
    assert s.batches == total and s.samples == 4 * total
    assert s.consumer_waits == total
    assert s.consumer_wait_s + s.boundary_wait_s == pytest.approx(total * 1e-9)
    assert s.producer_blocked_s == pytest.approx(2 * total * 1e-9)
    assert s.stage_total_s["collate"] == pytest.approx(5 * total * 1e-9)
    # Every nanosecond of stage time is in a bin, done ahead of the epoch, or reported apart.
    placed = sum(sum(s.series[f"stage_s.{k}"]) for k in STAGES)
    assert placed + sum(s.ahead_stage_s.values()) + s.unattributed_s == pytest.approx(15 * total * 1e-9)
    assert s.busy_fraction <= 1.0
    assert s.queue_depth_mean == pytest.approx(np.mean(range(n_threads)))
    # Every snapshot taken while running was internally consistent.
    for snap in snaps:
        assert snap.samples == 4 * snap.batches
        assert snap.stage_total_s["collate"] == pytest.approx(5 * snap.batches * 1e-9)


def test_time_series_bins(clock):
    rec = StageRecorder(series_interval=0.5, series_len=100)
    rec.epoch_started(2, 10)
    clock.advance(0.1)
    rec.batch_done(10, {"decode": 200_000_000}, 100_000_000, 2)     # [0.0, 0.1]
    clock.advance(0.2)  # t = 0.3
    rec.consumer_waited(50_000_000)                                 # the epoch's first wait: boundary
    rec.consumer_waited(50_000_000)                                 # [0.25, 0.3]: steady
    rec.batch_done(10, {"decode": 100_000_000}, 100_000_000, 2)     # [0.2, 0.3]
    clock.advance(0.4)  # t = 0.7
    rec.queue_depth(3, 4)
    rec.batch_done(20, {"read": 50_000_000}, 100_000_000, 1)        # [0.6, 0.7]; 1 thread from now
    clock.advance(0.9)  # t = 1.6: [1.0, 1.5) delivered nothing
    rec.batch_done(5, {"read": 1}, 1, 1)
    clock.advance(0.15)  # t = 1.75: nothing more happened, so the series ends at 1.6
    s = rec.snapshot()
    ser = s.series
    assert s.elapsed_s == pytest.approx(1.6)
    assert ser["t_s"] == pytest.approx((0.5, 1.0, 1.5, 1.6))
    assert ser["dur_s"] == pytest.approx((0.5, 0.5, 0.5, 0.1))
    assert ser["samples"] == (20, 20, 0, 5)
    assert ser["samples_per_s"] == pytest.approx((40.0, 40.0, 0.0, 50.0))
    # Capacity: 2 threads until 0.7 s, then 1.
    assert ser["capacity_s"] == pytest.approx((1.0, 0.2 * 2 + 0.3, 0.5, 0.1))
    assert ser["busy_fraction"][0] == pytest.approx(0.3 / 1.0)
    assert ser["busy_fraction"][1] == pytest.approx(0.05 / 0.7)
    assert ser["boundary_wait_s"] == pytest.approx((0.05, 0.0, 0.0, 0.0))
    assert ser["wait_s"] == pytest.approx((0.05, 0.0, 0.0, 0.0))
    assert ser["consumer_wait_fraction"][0] == pytest.approx(0.1)
    assert ser["queue_depth"][1] == 3 and np.isnan(ser["queue_depth"][0])
    assert ser["threads"] == (2.0, 1.0, 1.0, 1.0)
    assert ser["stage_s.decode"] == pytest.approx((0.3, 0.0, 0.0, 0.0))
    assert ser["stage_s.read"] == pytest.approx((0.0, 0.05, 0.0, 1e-9))
    # Integrating the series gives back the samples produced and the capacity.
    assert float(np.dot(ser["dur_s"], ser["samples_per_s"])) == pytest.approx(s.samples)
    assert sum(ser["capacity_s"]) == pytest.approx(s.thread_capacity_s)


def test_series_is_bounded(clock):
    rec = StageRecorder(series_interval=0.5, series_len=8)
    rec.epoch_started(1, 1)
    for _ in range(50):
        clock.advance(0.5)
        rec.batch_done(1, {"read": 1}, 1, 1)
    clock.advance(1000.0)  # a long stall does not allocate one bin per interval
    rec.batch_done(1, {"read": 1}, 1, 1)
    s = rec.snapshot()
    assert len(s.series["t_s"]) <= 9
    assert s.series["t_s"][-1] == pytest.approx(s.elapsed_s, abs=0.5)


def test_export_and_display(clock):
    rec = StageRecorder()
    rec.epoch_started(2, 4)
    clock.advance(0.2)
    rec.consumer_waited(10)
    rec.batch_done(4, {"read": 4000, "decode": 8000}, 8000, 2)
    rec.queue_depth(0, 2)  # NaN-free; a bin without queue reports gives NaN -> None in JSON
    s = rec.snapshot()
    d = json.loads(s.to_json())
    assert d["samples"] == 4 and d["stage_total_s"]["decode"] == pytest.approx(8e-6)
    assert d["stage_share"]["read"] == pytest.approx(1 / 3)
    assert set(d["series"]) >= {"t_s", "samples_per_s", "stage_s.decode"}
    r = repr(s)
    for name in STAGES:
        assert name in r
    assert "4 samples in 1 batches" in r
    h = s._repr_html_()
    assert h.count("<tr>") == len(STAGES) + 1 and "decode" in h


def test_plot_returns_a_figure(clock):
    rec = StageRecorder()
    rec.epoch_started(1, 2)
    for _ in range(4):
        clock.advance(0.3)
        rec.batch_done(2, {"read": 1000, "decode": 3000}, 4000, 1)
    fig = rec.snapshot().plot()
    from matplotlib.figure import Figure

    assert isinstance(fig, Figure) and len(fig.axes) == 2
    line = fig.axes[1].lines[0]
    # One level per bin, drawn as steps from each bin's start to the last bin's end.
    assert list(line.get_xdata()) == pytest.approx([0.0, *rec.snapshot().series["t_s"]])


def test_core_runs_and_records_without_importing_profiling():
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, loaderlib as ll\n"
        "loader = ll.DataLoader(ll.ArrayDataset(np.zeros((8, 2)), np.arange(8)).transform(lambda a, b: (a, b)),"
        " batch_size=4, profile=True)\n"
        "list(loader)\n"
        "assert isinstance(loader.stats, ll.Stats) and loader.stats.samples == 8\n"
        "print(sorted(m for m in sys.modules if m.startswith('loaderlib.profiling')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
