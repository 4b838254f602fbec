"""The live dashboard, driven headlessly: it builds, follows a running loader, its knobs act."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
from loaderlib.profiling import Dashboard, build_demo_dataset
from loaderlib.profiling.baselines import PythonThreadLoader

import loaderlib as ll
from loaderlib import transforms as T

ipywidgets = pytest.importorskip("ipywidgets")


def _slow_read(item):
    time.sleep(0.002)
    return np.zeros((8, 8, 3), np.uint8)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(build_demo_dataset(tmp_path_factory.mktemp("dash"), n_images=64, n_classes=2, progress=False))


def _cells(html_table):
    heads = re.findall(r"<th[^>]*>(.*?)</th>", html_table)
    vals = re.findall(r"<td[^>]*>(.*?)</td>", html_table)
    return dict(zip(heads, vals))


def test_builds_and_shows_what_loader_stats_says():
    loader = PythonThreadLoader([(i, 0) for i in range(4000)], [("read", _slow_read)], batch_size=16,
                                num_threads=2, record=False)
    dash = Dashboard(loader, interval=0.2, autostart=False)
    try:
        assert loader.recorder.enabled  # the dashboard switches recording on
        assert isinstance(dash.widget, ipywidgets.VBox)
        assert dash.image.value[:8] == b"\x89PNG\r\n\x1a\n"
        assert "waiting for batches" in dash.verdict.value
        dash.run_in_background(model_step=0.0, seconds=30)
        deadline = time.monotonic() + 20
        while loader.stats.batches < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        updates = dash.updates
        deadline = time.monotonic() + 10  # redraws pace themselves on a busy machine
        while dash.updates == updates and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dash.updates > updates  # the update thread keeps refreshing
        dash.stop()
        snap = dash.update()
        cells = _cells(dash.figures.value)
        assert cells["samples"] == f"{snap.samples:,}"
        assert cells["samples/s (epoch)"] == f"{snap.samples_per_s:,.1f}"
        assert cells["threads"] == str(snap.num_threads) == "2"
        assert cells["queue"] == f"{snap.queue_depth}/{snap.queue_capacity}"
        assert dash.last_stats is snap
        # Slow reads on an unsaturated CPU: the banner names I/O, with the numbers.
        assert dash.last_verdict.bottleneck == "io"
        assert "<b>io</b>" in dash.verdict.value and "try:" in dash.verdict.value
    finally:
        dash.close()
        loader.close()


def test_knobs_change_the_running_loader(root):
    chain = T.Compose([T.RandomResizedCrop(32), T.ToCHW()])
    loader = ll.DataLoader(ll.ImageFolderDataset(root).transform_first(chain), batch_size=4, num_threads=1,
                           prefetch=2)
    dash = Dashboard(loader, interval=0.2)
    try:
        dash.run_in_background(model_step=0.01, seconds=30)
        deadline = time.monotonic() + 20
        while loader.stats.batches < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        dash.threads.value = 2
        dash.prefetch.value = 5
        assert loader.num_threads == 2 and loader.prefetch == 5
        # The running epoch picks the new thread count up from its next batches.
        deadline = time.monotonic() + 20
        while loader.stats.num_threads != 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert loader.stats.num_threads == 2
        deadline = time.monotonic() + 20
        while loader.stats.queue_capacity != 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert loader.stats.queue_capacity == 5
        # And a change made elsewhere shows up on the knob.
        loader.num_threads = 1
        dash.update()
        assert dash.threads.value == 1
    finally:
        dash.close()
        loader.close()


def test_stops_when_the_loader_is_closed_and_leaves_no_threads(root):
    before = set(threading.enumerate())
    chain = T.Compose([T.RandomResizedCrop(32), T.ToCHW()])
    loader = ll.DataLoader(ll.ImageFolderDataset(root).transform_first(chain), batch_size=4, num_threads=2)
    dash = Dashboard(loader, interval=0.1)
    consumer = dash.run_in_background(model_step=0.005, seconds=30)
    time.sleep(0.4)
    assert dash.running and consumer.is_alive()
    loader.close()
    consumer.join(timeout=20)
    deadline = time.monotonic() + 5
    while dash.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not dash.running
    n = dash.updates
    time.sleep(0.4)
    assert dash.updates == n  # no more updates after the loader closed
    assert "stopped" in dash.title.value
    dash.close()
    time.sleep(0.1)
    assert {t for t in threading.enumerate() if t.is_alive()} <= before


def test_needs_a_recorder():
    with pytest.raises(TypeError, match="recorder"):
        Dashboard([1, 2, 3])


def test_loader_dashboard_method_and_closed_flag(root):
    loader = ll.DataLoader(ll.ImageFolderDataset(root).transform_first(T.Compose([T.CenterCrop(16)])), batch_size=4)
    dash = loader.dashboard(autostart=False)
    try:
        assert isinstance(dash, Dashboard) and dash.loader is loader
        assert loader.recorder.enabled
        assert loader.closed is False
    finally:
        dash.close()
        loader.close()
    assert loader.closed is True
    with pytest.raises(RuntimeError):
        iter(loader)
