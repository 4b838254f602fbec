"""The bottleneck verdict: its rules on given numbers, and on loaders with injected bottlenecks.

The injected scenarios run a real loader (the Python thread-pool loader, whose every step
can be any callable) with real sleeps and real decoding, measured by the real harness.
"""

from __future__ import annotations

import time

import cv2
import numpy as np
import pytest
from loaderlib.profiling import benchmark, diagnose
from loaderlib.profiling.baselines import PythonThreadLoader, decode_opencv
from loaderlib.profiling.verdict import BOTTLENECKS, MODEL_BOUND_WAIT

from loaderlib._threads import available_cpus
from tests._synth import base_photo

STAGE_S = {"read": 0.1, "decode": 2.0, "transform": 0.5, "python": 0.0, "collate": 0.1}


def _diag(**kw):
    args = {"stage_s": STAGE_S, "busy_fraction": 0.97, "threads": 1, "cpus": 4, "model_ran": False,
                "consumer_wait_fraction": 0.9, "cores_used": 0.97, "gil_held": None}
    args.update(kw)
    return diagnose(**args)


# -- the rules on given numbers ---------------------------------------------------------------
def test_largest_thread_time_share_names_the_stage():
    v = _diag()
    assert v.bottleneck == "decode"
    assert v.evidence["stage"] == "decode"
    assert v.evidence["stage_share"]["decode"] == pytest.approx(2.0 / 2.7)
    assert "decode-bound at 1 thread with 97% busy" in v.summary
    assert "num_threads=1 -> 4" in v.suggestion and "crop-region" in v.suggestion
    for stage, kind in [("read", "io"), ("transform", "transform"), ("python", "python"), ("collate", "collate")]:
        s = dict(STAGE_S)
        s[stage] = 10.0
        assert _diag(stage_s=s).bottleneck == kind


def test_saturated_on_every_cpu_asks_for_a_cheaper_stage():
    v = _diag(threads=4, cpus=4, busy_fraction=0.95, cores_used=3.8)
    assert "add threads" not in v.suggestion and "every CPU is busy" in v.suggestion


def test_unsaturated_pool_says_threads_wait():
    v = _diag(threads=4, busy_fraction=0.4, cores_used=1.6)
    assert v.bottleneck == "decode" and "busy only 40%" in v.suggestion


def test_model_bound_only_when_a_model_ran_and_the_consumer_rarely_waited():
    v = _diag(model_ran=True, consumer_wait_fraction=MODEL_BOUND_WAIT / 2,
              ceiling_samples_per_s=900.0, samples_per_s=300.0)
    assert v.bottleneck == "model"
    assert v.evidence["accelerator_idle_fraction"] == MODEL_BOUND_WAIT / 2
    assert "3.0x" in v.suggestion
    assert _diag(model_ran=True, consumer_wait_fraction=0.3).bottleneck == "decode"
    # model_step=0: the consumer never waits on itself; a tiny wait still means the loader limits.
    assert _diag(model_ran=False, consumer_wait_fraction=0.01).bottleneck == "decode"


def test_gil_and_io_wait_advice():
    s = dict(STAGE_S, python=10.0)
    v = _diag(stage_s=s, gil_held={"python": True}, threads=2, cores_used=1.9)
    assert v.bottleneck == "python" and "holds the GIL" in v.suggestion
    # Flagged, but the threads were off-CPU (sleeping, blocked): they do not hold the GIL then.
    v = _diag(stage_s=s, gil_held={"python": True}, threads=2, cores_used=0.1)
    assert v.bottleneck == "python" and "mostly wait on the Python step" in v.suggestion
    v = _diag(stage_s=s, threads=4, busy_fraction=0.95, cores_used=1.0)
    assert "GIL" in v.suggestion and "1.0 cores" in v.suggestion
    s = dict(STAGE_S, read=10.0)
    v = _diag(stage_s=s, threads=2, busy_fraction=0.95, cores_used=0.1)
    assert v.bottleneck == "io" and "more threads than cores" in v.suggestion
    v = _diag(stage_s=s, threads=2, busy_fraction=0.95, cores_used=1.9)
    assert v.bottleneck == "io" and "more threads than cores" not in v.suggestion


def test_no_stage_timings():
    v = _diag(stage_s=None, model_ran=True, consumer_wait_fraction=0.5)
    assert v.bottleneck is None and "no per-stage timings" in v.suggestion
    assert set(BOTTLENECKS) == {"io", "decode", "transform", "python", "collate", "model"}


# -- injected bottlenecks, measured ---------------------------------------------------------------
@pytest.fixture(scope="module")
def jpeg_bytes():
    img = base_photo()
    big = cv2.resize(img, (2048, 1600), interpolation=cv2.INTER_CUBIC)  # a heavy decode (~3.3 MP)
    ok, buf = cv2.imencode(".jpg", big, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    return buf.tobytes()


def _small(_item):
    return np.zeros((16, 16, 3), np.uint8)


def _resize(img):
    return cv2.resize(img, (32, 32), interpolation=cv2.INTER_AREA)


def _check_adds_up(report, threads):
    # Pipeline-bound: every thread second of the window is attributed to some stage.
    assert report.stage_wall_fraction == pytest.approx(1.0, abs=0.10), report
    # Consumer side: time blocked in next() plus model time is the window's wall time.
    assert report.consumer_wall_fraction == pytest.approx(1.0, abs=0.10), report
    assert report.num_threads == threads


def test_slow_reads_are_io():
    def sleepy_read(item):
        time.sleep(0.008)
        return _small(item)

    loader = PythonThreadLoader([(i, 0) for i in range(160)], [("read", sleepy_read), ("transform", _resize)],
                                batch_size=16, num_threads=2)
    try:
        r = benchmark(loader, epochs=1, warmup_batches=3)
    finally:
        loader.close()
    assert r.bottleneck == "io", r
    assert r.verdict.evidence["stage_share"]["read"] > 0.9
    assert r.stage_mean_ms["read"] == pytest.approx(8.0, rel=0.5)
    _check_adds_up(r, 2)


def test_slow_python_transform_is_python():
    def slow_python_step(img):
        time.sleep(0.006)
        return img

    loader = PythonThreadLoader([(i, 0) for i in range(120)],
                                [("read", _small), ("transform", _resize), ("python", slow_python_step)],
                                batch_size=8, num_threads=1)
    try:
        r = benchmark(loader, epochs=1, warmup_batches=3)
    finally:
        loader.close()
    assert r.bottleneck == "python", r
    _check_adds_up(r, 1)


def test_one_thread_on_heavy_decode_is_decode(jpeg_bytes):
    loader = PythonThreadLoader([(i, 0) for i in range(40)],
                                [("read", lambda item: jpeg_bytes), ("decode", decode_opencv),
                                 ("transform", _resize)],
                                batch_size=4, num_threads=1)
    try:
        r = benchmark(loader, epochs=1, warmup_batches=2)
    finally:
        loader.close()
    assert r.bottleneck == "decode", r
    assert r.busy_fraction > 0.8
    assert "at 1 thread" in r.verdict.summary
    if available_cpus() > 1:
        assert "add threads" in r.verdict.suggestion
    _check_adds_up(r, 1)


def test_slow_model_step_is_model():
    loader = PythonThreadLoader([(i, 0) for i in range(160)], [("read", _small), ("transform", _resize)],
                                batch_size=16, num_threads=2)
    try:
        r = benchmark(loader, model_step=0.05, epochs=1, warmup_batches=2)
    finally:
        loader.close()
    assert r.bottleneck == "model", r
    assert r.accelerator_idle_fraction < MODEL_BOUND_WAIT
    assert r.model_s == pytest.approx(0.05 * r.batches, rel=0.2)
    assert r.ceiling_samples_per_s > r.samples_per_s
    assert r.consumer_wall_fraction == pytest.approx(1.0, abs=0.10)


def test_cpu_contention_is_called_out_for_native_stages():
    v = _diag(threads=2, cpus=2, busy_fraction=0.9, cores_used=0.6)
    assert v.bottleneck == "decode" and "other processes compete" in v.suggestion
    v = _diag(threads=2, cpus=2, busy_fraction=0.9, cores_used=1.8)
    assert "other processes" not in v.suggestion and "every CPU is busy" in v.suggestion
