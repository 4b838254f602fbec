"""The live dashboard: its accounting driven by an injected clock, its knobs and threads on a real loader."""

from __future__ import annotations

import dataclasses
import re
import threading
import time

import pytest
from loaderlib.profiling import Dashboard, build_demo_dataset
from loaderlib.profiling import dashboard as dashboard_mod

import loaderlib
import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._observe import stats as stats_mod

from .profiling_sim import FakeClock, SimLoader

ipywidgets = pytest.importorskip("ipywidgets")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(build_demo_dataset(tmp_path_factory.mktemp("dash"), n_images=64, n_classes=2, progress=False))


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(stats_mod, "_clock", c)
    monkeypatch.setattr(loaderlib, "available_cpus", lambda: 2)

    class NoCpu:
        def sample(self):
            pass

        def cores(self, start, end):
            return None

    monkeypatch.setattr(dashboard_mod, "_CpuMeter", NoCpu)
    return c


def _cells(strip):
    """The figures strip's cells: label -> value."""
    return dict(re.findall(r"<div class='loaderlib-kpi'[^>]*><div[^>]*>(.*?)</div><div>(.*?)</div></div>", strip))


def _consume(loader, it, n, model_s, dash, every=0.5):
    """Take ``n`` batches with a model step of ``model_s``, updating the dashboard every ``every``
    simulated seconds; return the verdicts it showed. A new epoch starts when one ends."""
    step = loader.model(model_s)
    shown = []
    last = loader.clock.t
    for _ in range(n):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        step(batch)
        if loader.clock.t - last >= every * 1e9:
            last = loader.clock.t
            dash.update()
            shown.append(dash.last_verdict)
    return it, shown


def _no_text_outside(fig):
    """Every axes with what it draws (labels, tick labels, title, legend) lies inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    box = fig.bbox
    for ax in fig.axes:
        e = ax.get_tightbbox(renderer)
        assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1 and box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, \
            (ax.get_title(), ax.get_ylabel(), e, box)


def test_figures_verdict_and_plots_read_one_window(clock):
    # A loader (1,600 samples/s) faster than the model (800/s), with a 90 ms refill at the start
    # of each epoch of 20 batches: model-bound, the refills shown apart.
    loader = SimLoader(clock, n_batches=20, batch_s=0.01, startup_s=0.08, prefetch=4)
    dash = Dashboard(loader, interval=0.5, autostart=False)
    try:
        assert loader.recorder.enabled  # the dashboard switches recording on
        assert isinstance(dash.widget, ipywidgets.VBox)
        assert dash.plots.value.startswith("<svg") and 'width="100%"' in dash.plots.value
        assert "waiting for batches" in dash.verdict.value
        _, shown = _consume(loader, iter(loader), 300, 0.02, dash)
        # Early updates lack evidence and say so (the dashboard has no per-batch waits: its
        # half-second parts stand for them, and one part has no spread); after that every verdict names
        # the model, at epoch starts too: the refill is never blamed on a stage.
        kinds = [v.bottleneck if v.enough else "not enough" for v in shown]
        assert kinds[0] == "not enough" and set(kinds[5:]) == {"model"}, kinds
        w = dash.last_window
        cells = _cells(dash.figures.value)
        # The widget's figures, the verdict's evidence and the window are the same numbers.
        assert cells["pool busy"] == f"{100 * w.busy_fraction:.0f}%"
        assert dash.last_verdict.evidence["busy_fraction"] == w.busy_fraction
        assert cells["consumer waits"] == f"{100 * w.wait_fraction:.0f}%" == "0%"
        assert cells["epoch starts"] == f"{100 * w.boundary_fraction:.0f}%" != "0%"
        assert cells["samples/s (last 4 s)"] == f"{w.samples_per_s:,.1f}"
        assert w.samples_per_s == pytest.approx(320 / 0.49, rel=0.05)  # 20 batches of 16 per 20 x 20 ms + refill
        assert w.problems() == [] and w.busy_fraction <= 1.0
        assert cells["samples"] == f"{dash.last_stats.samples:,}"
        assert cells["threads"] == "2" and cells["queue"] == f"{dash.last_stats.queue_depth}/4"
        assert "<b>model</b>" in dash.verdict.value and "font-family: system-ui" in dash.verdict.value
        assert "<small>" not in dash.verdict.value  # the advice is at body size
        _no_text_outside(dash._fig)
        legend = [t.get_text() for t in dash._art["ax2"].get_legend().get_texts()]
        assert legend[0].startswith("read ") and legend[1].startswith("decode ") and legend[1].endswith("%")
        # The run ends: nothing is recorded any more, and the figures stay what they were.
        dash.update()
        frozen = (dash.figures.value, dash.verdict.value, dash.last_window)
        clock.advance(30.0)
        dash.update()
        assert (dash.figures.value, dash.verdict.value, dash.last_window) == frozen
        assert "no batch for 30 s" in dash.title.value
        n = len(dash.history)
        dash.update()
        assert len(dash.history) == n  # no history point for time in which nothing happened
    finally:
        dash.close()


def test_a_slow_loader_is_named_with_its_stage(clock):
    loader = SimLoader(clock, batch_s=0.04, shares={"read": 0.9, "collate": 0.1}, prefetch=2)
    dash = Dashboard(loader, autostart=False)
    try:
        _, shown = _consume(loader, iter(loader), 150, 0.02, dash)
        assert [v.bottleneck for v in shown if v.enough][-5:] == ["io"] * 5
        assert dash.last_window.wait_fraction == pytest.approx(0.5, rel=0.02)
        assert "<b>io</b>" in dash.verdict.value and "try: " in dash.verdict.value
    finally:
        dash.close()


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


@pytest.mark.timing
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
    assert "<i>closed</i>" in dash.title.value
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
    with pytest.raises(RuntimeError, match="this DataLoader is closed"):
        iter(loader)


def _decision_rows(html_table):
    """The autotune table's rows as ``(t, knob, change, why)`` text (HTML entities undone)."""
    import html as html_mod

    rows = re.findall(r"<tr>(<td.*?)</tr>", html_table)
    return [tuple(html_mod.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)) for r in rows]


def _expected_rows(decisions):
    return [(f"{t:.1f}", knob, f"{old} \u2192 {new}", reason) for t, knob, old, new, reason in decisions]


class _TunedSim(SimLoader):
    """A simulated loader whose thread count a real tuner moves, on the fake clock: a batch takes
    40 ms of pool time spread over at most 4 useful threads."""

    def __init__(self, clock, **kw):
        super().__init__(clock, threads=1, batch_s=lambda *_: 0.04 / min(self.num_threads, 4), **kw)
        from loaderlib._autotune import HillClimb, Tuner

        def apply(n):
            self.num_threads = n

        self.tuner = Tuner([(HillClimb("num_threads", 1, 1, 8), apply)], clock=lambda: clock.t / 1e9)

    @property
    def stats(self):
        import dataclasses

        return dataclasses.replace(self.recorder.snapshot(), autotune=tuple(self.tuner.decisions))


def test_autotune_decisions_are_listed_live_and_stay_when_the_run_ends(clock):
    loader = _TunedSim(clock, n_batches=2000, prefetch=4)
    dash = Dashboard(loader, interval=0.5, autostart=False, max_threads=8)
    try:
        assert dash.autotune.value == ""  # nothing tuned yet: no list
        assert dash.autotune in dash.widget.children
        step = loader.model(0.002)
        it = iter(loader)
        seen = []
        last = clock.t
        for _ in range(600):
            step(next(it))
            loader.tuner.observe(1)
            if clock.t - last >= 0.5e9:
                last = clock.t
                dash.update()
                seen.append(len(_decision_rows(dash.autotune.value)))
        decisions = loader.tuner.decisions
        # The model of the tuner (NOTE [ Autotune ]): doubling while the rate improves, one step
        # past the best (8 threads are no faster than 4), then back to the best and settled.
        assert [(k, old, new) for _, k, old, new, _ in decisions] == [
            ("num_threads", 1, 2), ("num_threads", 2, 4), ("num_threads", 4, 8), ("num_threads", 8, 4)]
        assert decisions[-1][4].endswith("back to 4, settled")
        # Listed as they were taken (the list grew over the updates), each one as recorded.
        assert seen[0] == 0 and seen[-1] == 4 and sorted(seen) == seen and len(set(seen)) == 5, seen
        assert _decision_rows(dash.autotune.value) == _expected_rows(decisions)
        assert "4 decisions (" in dash.autotune.value and "font-family: system-ui" in dash.autotune.value
        assert dash.threads.value == 4  # the knob follows the tuner
        # The run ends: the list stays as it was.
        frozen = dash.autotune.value
        clock.advance(30.0)
        dash.update()
        assert dash.autotune.value == frozen
    finally:
        dash.close()


def test_autotune_list_keeps_the_newest_and_escapes_reasons(clock):
    decisions = tuple((0.5 * i, "prefetch", i, i + 1, f"rate <{i}> & more") for i in range(15))

    class Tuned(SimLoader):
        @property
        def stats(self):
            import dataclasses

            return dataclasses.replace(self.recorder.snapshot(), autotune=decisions)

    loader = Tuned(clock)
    dash = Dashboard(loader, autostart=False)
    try:
        value = dash.autotune.value
        n = dashboard_mod.AUTOTUNE_ROWS
        assert f"15 decisions, the last {n} shown" in value
        assert _decision_rows(value) == _expected_rows(decisions[-n:])
        assert "<3>" not in value and "&lt;3&gt; &amp; more" in value
    finally:
        dash.close()


def test_a_pipeline_is_watched_with_all_its_tuners_decisions(root, monkeypatch):
    import itertools

    monkeypatch.setattr(loaderlib._threads, "default_num_threads", lambda: 2)
    ticks = itertools.count()
    pipe = (ll.Pipeline.from_folder(root).map(T.Compose([T.CenterCrop(16), T.ToCHW()])).batch(4)
            .with_options(seed=0, num_threads=ll.AUTOTUNE, autotune_clock=lambda: 0.25 * next(ticks)))
    dash = pipe.dashboard(autostart=False)
    try:
        head = pipe.head_loader
        assert dash.loader.pipeline is pipe and dash.loader.recorder is head.recorder and head.recorder.enabled
        assert dash.autotune.value == ""
        for _ in range(8):   # an iteration is 16 batches, a few windows: tuning takes several
            for _ in pipe:
                pass
            if head._tuner.settled:
                break
        dash.update()
        decisions = pipe.stats["autotune"]
        # A constant measured rate (the injected clock ticks 0.25 s per batch): 2 threads are the
        # upper limit, 1 is tried and is no faster, so back to 2.
        assert [(k, old, new) for _, k, old, new, _ in decisions] == [("num_threads", 2, 1), ("num_threads", 1, 2)]
        assert _decision_rows(dash.autotune.value) == _expected_rows(decisions)
        assert "Pipeline (engine native)" in dash.title.value
        # The engine stage's counts, recorded from the start (64 images an iteration; the next
        # iteration's first batches may be under way already, NOTE [ Warm iterations ]).
        assert dash.last_stats.samples >= 64 and dash.last_stats.batches == dash.last_stats.samples // 4
        dash.threads.value = 1
        assert head.num_threads == 1
    finally:
        dash.close()
        pipe.close()


def test_a_pipeline_without_an_engine_stage_is_refused():
    pipe = ll.Pipeline.from_iterable(range(4)).map(lambda x: x + 1)
    with pytest.raises(TypeError, match="runs none"):
        Dashboard(pipe)


def test_the_read_ahead_stage_is_shown(root):
    """A loader with read-ahead: the figures name reads in flight, read latency and bytes/s,
    from the loader's own ExtractStats."""
    loader = ll.DataLoader(ll.ImageFolderDataset(root).transform_first(T.Compose([T.Resize((24, 24))])),
                           batch_size=8, io_depth=6, profile=True)
    dash = Dashboard(loader, autostart=False)
    for _ in loader:
        pass
    dash.update()
    ex = loader.stats.extract
    cells = _cells(dash.figures.value)
    assert cells["reads in flight"] == f"{ex.reads_in_flight}/6"
    assert cells["read latency p50/p95"] == f"{ex.latency_p50_ms:.2f}/{ex.latency_p95_ms:.2f} ms"
    assert cells["read MB/s"] == f"{ex.bytes_per_s / 1e6:,.1f}"
    dash.close()
    loader.close()


def test_the_panel_counts_the_decode_threads_reads_too(root):
    """Warm files, adaptive depth: the decode threads read most samples themselves; the panel's
    read MB/s covers every byte of the epoch's files (NOTE [ Every read counts ])."""
    import os

    ds = ll.ImageFolderDataset(root)
    total = sum(os.path.getsize(p) for p, _ in ds.items)
    loader = ll.DataLoader(ds.transform_first(T.Compose([T.Resize((24, 24))])), batch_size=8, io_depth=0,
                           profile=True)
    dash = Dashboard(loader, autostart=False)
    for _ in loader:
        pass
    dash.update()
    ex = loader.stats.extract
    cells = _cells(dash.figures.value)
    assert ex.bytes == total and ex.inline_reads == len(ds)
    assert cells["reads"] == f"{len(ds):,} ({len(ds):,} by decode threads)"
    assert cells["read MB/s"] == f"{total / loader.stats.elapsed_s / 1e6:,.1f}"
    dash.close()
    loader.close()


def test_the_figures_strip_wraps_into_rows(clock):
    """15 and more figures in one table row overflowed a 1,280 px page: the strip wraps its cells."""
    from loaderlib.profiling.dashboard import CELL_PX

    from loaderlib.stats import ExtractStats

    loader = SimLoader(clock, n_batches=20, batch_s=0.01)
    dash = Dashboard(loader, interval=0.5, autostart=False)
    try:
        _consume(loader, iter(loader), 40, 0.02, dash)
        stats = dataclasses.replace(dash.last_stats, extract=ExtractStats(
            io_depth=16, adaptive=True, reads_in_flight=3, reads=100, failures=0, bytes=10**6, bytes_per_s=2e6,
            latency_mean_ms=1.2, latency_p50_ms=1.0, latency_p95_ms=2.0, read_cpu_s=0.1, read_wait_s=0.2, queued_wait_ms=0.1,
            slots_limit=32, inline=False), memory={"arena": 2**24})
        strip = dash._figures_html(stats, dash.last_window, cores=1.5, others=0.3)
        cells = _cells(strip)
        assert len(cells) == 16 and "<table" not in strip
        assert "flex-wrap:wrap" in strip and "max-width: 980px" in strip
        assert strip.count(f"width:{CELL_PX}px") == 16
        # Rows of at most 980 // CELL_PX cells: the strip is never wider than the dashboard's box.
        assert (980 // CELL_PX) * CELL_PX <= 980 and 16 > 980 // CELL_PX
    finally:
        dash.close()


def test_the_mime_bundle_carries_a_static_view_of_the_last_frame(clock):
    """NOTE [ Dashboard static view ]: beside the widget view, the last frame as PNG and as HTML."""
    import base64

    loader = SimLoader(clock, n_batches=20, batch_s=0.01)
    dash = Dashboard(loader, interval=0.5, autostart=False)
    try:
        _consume(loader, iter(loader), 60, 0.02, dash)
        data = dash._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in data
        assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == dash.widget.model_id
        png = base64.b64decode(data["image/png"])
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert (width, height) == (960, int(3.3 * 96))   # the 10 x 3.3 inch figure at 96 dpi
        page = data["text/html"]
        assert "loaderlib-dashboard-static" in page and data["image/png"] in page
        assert dash.verdict.value in page and dash.figures.value in page and "waiting for batches" not in page
    finally:
        dash.close()


def test_a_displayed_dashboard_refreshes_its_static_view_on_update(clock, monkeypatch):
    import IPython.display

    shown, updated = [], []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw, display_id: shown.append((obj, display_id)))
    monkeypatch.setattr(IPython.display, "update_display", lambda obj, raw, display_id: updated.append((obj, display_id)))
    loader = SimLoader(clock, n_batches=20, batch_s=0.01)
    dash = Dashboard(loader, interval=0.5, autostart=False)
    try:
        dash._ipython_display_()
        assert len(shown) == 1 and "waiting for batches" in shown[0][0]["text/html"]
        _consume(loader, iter(loader), 60, 0.02, dash)
        assert updated and all(d == shown[0][1] for _, d in updated)
        last = updated[-1][0]["text/html"]
        assert dash.verdict.value in last and "waiting for batches" not in last
    finally:
        dash.close()
