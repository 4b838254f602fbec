"""The benchmark harness, the Report, and the Python thread-pool baseline loader."""

from __future__ import annotations

import json
import threading
import time

import cv2
import numpy as np
import pytest
from loaderlib.profiling import STAGES, Report, benchmark
from loaderlib.profiling.baselines import (
    PythonThreadLoader,
    ResNetTrainTransform,
    decode_opencv,
    python_thread_loader,
    read_file,
)
from loaderlib.profiling.harness import _batch_len, _throughput_series, replay_consumer

from tests._synth import base_photo


def _arr(item):
    return np.full((4, 4, 3), item[0] % 251, np.uint8)


def _loader(n=64, batch_size=8, threads=2, steps=None, **kw):
    steps = steps or [("read", _arr)]
    return PythonThreadLoader([(i, i % 5) for i in range(n)], steps, batch_size=batch_size,
                              num_threads=threads, **kw)


class PlainIterable:
    """A loader with no recorder (like a PyTorch DataLoader): batches only."""

    def __init__(self, n_batches=12, bs=4, delay=0.0):
        self.n_batches, self.bs, self.delay = n_batches, bs, delay

    def __len__(self):
        return self.n_batches

    def __iter__(self):
        for i in range(self.n_batches):
            time.sleep(self.delay)
            yield np.full((self.bs, 2), i), np.arange(self.bs)


# -- the baseline loader -------------------------------------------------------------------------
def test_thread_loader_output_matches_a_serial_reference():
    items = [(i, i % 5) for i in range(37)]
    ref = np.stack([_arr(it) for it in items])
    for threads in (1, 2, 3):
        loader = PythonThreadLoader(items, [("read", _arr)], batch_size=8, num_threads=threads)
        batches = list(loader)
        assert [b[0].shape[0] for b in batches] == [8, 8, 8, 8, 5] and len(loader) == 5
        np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), ref)
        np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), [i % 5 for i in range(37)])
        loader.close()
    # Shuffled order is a function of (seed, epoch), whatever the thread count.
    a = PythonThreadLoader(items, [("read", _arr)], batch_size=8, num_threads=1, shuffle=True, seed=3)
    b = PythonThreadLoader(items, [("read", _arr)], batch_size=8, num_threads=3, shuffle=True, seed=3)
    ea, eb = np.concatenate([x[0] for x in a]), np.concatenate([x[0] for x in b])
    np.testing.assert_array_equal(ea, eb)
    assert sorted(ea[:, 0, 0, 0].tolist()) == sorted(ref[:, 0, 0, 0].tolist())
    assert not np.array_equal(ea, ref)
    assert not np.array_equal(np.concatenate([x[0] for x in a]), ea)  # epoch 2 differs


def test_thread_loader_records_every_stage_it_runs():
    def slow(x):
        time.sleep(0.002)
        return x

    loader = _loader(n=32, threads=2, steps=[("read", _arr), ("python", slow)])
    list(loader)
    s = loader.stats
    assert s.samples == 32 and s.batches == 4 and s.num_threads == 2 and s.batch_size == 8
    assert s.stage_total_s["python"] >= 32 * 0.002
    assert s.stage_total_s["decode"] == 0 and s.stage_total_s["collate"] > 0
    assert s.consumer_waits == 5  # four batches and the end of the epoch
    assert s.queue_capacity == 2
    assert s.percentile_source == "per-sample"
    loader.close()


def test_thread_loader_knobs_apply_while_running_and_close_stops_threads():
    before = set(threading.enumerate())
    loader = _loader(n=400, batch_size=4, threads=1, prefetch=1)
    it = iter(loader)
    next(it)
    loader.num_threads = 3
    loader.prefetch = 5
    for _ in range(20):
        next(it)
    time.sleep(0.2)  # let the driver fill the larger queue
    assert it.q.maxsize == 5 and it.q.qsize() >= 2
    assert loader.stats.num_threads == 3
    loader.close()
    time.sleep(0.05)
    assert set(threading.enumerate()) <= before
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_thread_loader_raises_step_errors_in_the_consumer():
    def bad(item):
        if item[0] == 11:
            raise OSError("cannot read sample 11")
        return _arr(item)

    loader = _loader(n=20, batch_size=4, steps=[("read", bad)])
    with pytest.raises(OSError, match="sample 11"):
        list(loader)
    with pytest.raises(ValueError, match="stage"):
        _loader(steps=[("collate", _arr)])


def test_resnet_transform_and_python_thread_loader_on_files(tmp_path):
    img = base_photo()
    paths = []
    for i, q in enumerate((60, 90)):
        p = tmp_path / f"{i}.jpg"
        cv2.imwrite(str(p), img, [cv2.IMWRITE_JPEG_QUALITY, q])
        paths.append((str(p), i))
    decoded = decode_opencv(read_file(paths[0]))
    np.testing.assert_array_equal(decoded, cv2.cvtColor(cv2.imread(paths[0][0]), cv2.COLOR_BGR2RGB))
    t = ResNetTrainTransform(64, seed=1)
    out = t(decoded, index=5)
    assert out.shape == (3, 64, 64) and out.dtype == np.float32
    np.testing.assert_array_equal(out, t(decoded, index=5))  # keyed by sample index
    # Normalisation against numpy: (x/255 - mean)/std undone gives values in [0, 255].
    raw = out.transpose(1, 2, 0) * (np.array([0.229, 0.224, 0.225]) * 255) + np.array([0.485, 0.456, 0.406]) * 255
    assert raw.min() > -0.01 and raw.max() < 255.01
    loader = python_thread_loader(paths * 4, batch_size=4, num_threads=2, size=64, shuffle=False)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 64, 64) and labels.tolist() == [0, 1, 0, 1]
    np.testing.assert_array_equal(images[0], ResNetTrainTransform(64, seed=0)(decoded, index=0))
    loader.close()


# -- the harness --------------------------------------------------------------------------------
def test_report_fields_and_exports():
    loader = _loader(n=96, batch_size=8)
    r = benchmark(loader, epochs=2, warmup_batches=3)
    assert isinstance(r, Report)
    assert r.batches == 2 * 12 - 3 and r.samples == r.batches * 8
    assert r.samples_per_s == pytest.approx(r.samples / r.wall_s)
    assert r.batches_per_s == pytest.approx(r.batches / r.wall_s)
    assert r.ceiling_samples_per_s == r.samples_per_s  # model_step=0 is the ceiling
    assert r.accelerator_idle_fraction is None and r.consumer_alone_samples_per_s is None
    assert r.first_batch_s > 0 and r.peak_rss_bytes > 10 * 2**20 and r.cpu_cores_used >= 0
    assert set(r.stage_s) == set(STAGES) and r.stage_s["read"] > 0
    assert r.engine == "python-threads" and r.num_threads == 2 and r.batch_size == 8
    assert r.bottleneck in ("io", "collate", "python", "transform", "decode")
    d = json.loads(r.to_json())
    assert d["bottleneck"] == r.bottleneck and d["samples"] == r.samples
    assert d["verdict"]["summary"] == r.verdict.summary and d["stats"]["samples"] == loader.stats.samples
    text = repr(r)
    assert "bottleneck" in text and "samples/s" in text and "read" in text
    assert "<table>" in r._repr_html_()
    fig = r.plot()
    assert len(fig.axes) == 2
    # The recorder is back to how it was, and the loader's threads are gone.
    assert loader.recorder.enabled
    loader.close()


def test_recorder_switched_on_for_the_run_and_restored():
    loader = _loader(n=48, record=False)
    r = benchmark(loader, epochs=1, warmup_batches=1)
    assert r.stage_s["read"] > 0
    assert not loader.recorder.enabled
    loader.close()


def test_seconds_mode_spans_epochs_and_stops_mid_epoch():
    before = set(threading.enumerate())

    def slow(item):
        time.sleep(0.001)
        return _arr(item)

    loader = _loader(n=40, batch_size=4, threads=2, steps=[("read", slow)])
    t = time.perf_counter()
    r = benchmark(loader, seconds=0.6, warmup_batches=2)
    took = time.perf_counter() - t
    assert r.wall_s >= 0.6 and took < 10
    assert r.batches > 10  # more than one epoch of 10 batches
    series = r.series
    durations = np.diff((0.0, *series["t_s"]))
    assert float(np.dot(durations, series["samples_per_s"])) == pytest.approx(r.samples, rel=1e-6)
    loader.close()
    time.sleep(0.05)
    assert set(threading.enumerate()) <= before


def test_model_step_callable_replay_and_idle_fraction():
    seen = []

    def model(batch):
        seen.append(batch[0].shape[0])
        time.sleep(0.01)

    loader = _loader(n=64, batch_size=8)
    r = benchmark(loader, model_step=model, epochs=1, warmup_batches=2)
    assert r.model_step == "callable model"
    # The ceiling run does not call the model; the model run sees each of the 8 batches once,
    # then the replay ("infinitely fast data") calls it on cached copies for about a second.
    assert seen[:8] == [8] * 8 and len(seen) >= 8 + 3
    assert r.model_s >= 0.01 * r.batches
    assert 0 <= r.accelerator_idle_fraction < 1
    assert r.consumer_alone_samples_per_s == pytest.approx(8 / 0.01, rel=0.5)
    assert r.headspace == pytest.approx(r.ceiling_samples_per_s / r.consumer_alone_samples_per_s)
    assert r.bottleneck == "model"
    loader.close()


def test_loader_without_recorder():
    r = benchmark(PlainIterable(n_batches=12, delay=0.005), model_step=0.0, epochs=1, warmup_batches=2)
    assert r.stage_s is None and r.busy_fraction is None and r.bottleneck is None
    assert r.batches == 10 and r.samples == 40 and r.engine is None
    assert "no per-stage timings" in r.verdict.suggestion
    r = benchmark(PlainIterable(n_batches=12, delay=0.0), model_step=0.02, epochs=1, warmup_batches=2,
                  ceiling=False)
    assert r.bottleneck == "model" and r.ceiling_samples_per_s is None
    assert r.accelerator_idle_fraction < 0.1


def test_argument_checks_and_warmup_cap():
    with pytest.raises(ValueError, match="model_step"):
        benchmark(PlainIterable(), model_step=-1)
    with pytest.raises(ValueError, match="seconds"):
        benchmark(PlainIterable(), seconds=0)
    with pytest.raises(ValueError, match="epochs"):
        benchmark(PlainIterable(), epochs=0)
    # Epoch mode caps warmup at a quarter of the batches, so a small loader is still measured.
    r = benchmark(PlainIterable(n_batches=8), warmup_batches=50, epochs=1)
    assert r.batches == 8 - 2


def test_replay_consumer_and_helpers():
    calls = []
    rate = replay_consumer([np.zeros((5, 2)), np.zeros((3, 2))], lambda b: calls.append(len(b)), seconds=0.0,
                           min_steps=4)
    assert calls == [5, 3, 5, 3] and rate > 0
    assert replay_consumer([np.zeros(2)], 0.0) == float("inf")
    assert _batch_len((np.zeros((7, 3)), np.zeros(7))) == 7
    assert _batch_len({"x": np.zeros((2, 1))}) == 2
    assert _batch_len([[1, 2, 3], [4, 5, 6]]) == 3
    s = _throughput_series([(0.2, 10), (0.4, 20), (0.9, 30), (1.3, 50)])
    assert s["t_s"] == pytest.approx((0.5, 1.0, 1.3))
    assert s["samples_per_s"] == pytest.approx((40.0, 20.0, 20 / 0.3))
    # A last bin shorter than half an interval is folded into the one before.
    s = _throughput_series([(0.2, 10), (0.4, 20), (0.9, 30), (1.1, 50)])
    assert s["t_s"] == pytest.approx((0.5, 1.1))
    assert s["samples_per_s"] == pytest.approx((40.0, 30 / 0.6))


def test_import_loaderlib_needs_no_jupyter_or_matplotlib():
    import subprocess
    import sys

    code = ("import sys, loaderlib, loaderlib.profiling; from loaderlib.profiling import benchmark, Report; "
            "bad = [m for m in ('ipywidgets', 'matplotlib', 'IPython', 'tqdm') if m in sys.modules]; "
            "assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert res.returncode == 0, res.stderr
