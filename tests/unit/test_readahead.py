"""The read-ahead stage (NOTE [ Read-ahead ] in pyx/include/ll_readahead.h): reads issued
ahead by native IO threads must change nothing in the output, the resume, or the errors."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from loaderlib._ext import _chain
from loaderlib._extract.readahead import MAX_DEPTH, MIN_DEPTH, START_DEPTH, ReadAhead, choose_depth
from loaderlib._extract.source import NativeSource, SourceKind
from loaderlib.errors import DecodeError
from loaderlib.sampler import RandomSampler
from tests import _threads
from tests._synth import encode_jpeg, photo_like

CHAIN = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip()])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("ra_folder")
    for c in range(3):
        os.makedirs(root / f"c{c}")
        for i in range(23):
            data = encode_jpeg(photo_like(90 + 3 * i, 70 + 5 * c, seed=10 * i + c), quality=85)
            (root / f"c{c}" / f"{i:03d}.jpg").write_bytes(data)
    return str(root)


@pytest.fixture(scope="module")
def shards(folder, tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("ra_records")
    ds = ll.ImageFolderDataset(folder)
    half = len(ds) // 2
    items = ds.items
    a, _ = ll.write_records(str(out / "a"), [p for p, _ in items[:half]], [y for _, y in items[:half]])
    b, _ = ll.write_records(str(out / "b"), [p for p, _ in items[half:]], [y for _, y in items[half:]])
    return [a, b]


def _epoch(ds, **kw) -> tuple[np.ndarray, np.ndarray]:
    loader = ll.DataLoader(ds, batch_size=8, shuffle=True, seed=5, **kw)
    xs, ys = [], []
    for x, y in loader:
        xs.append(np.array(x))
        ys.append(np.array(y))
    loader.close()
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("kind", ["files", "records"])
def test_output_is_the_same_at_any_depth_and_thread_count(folder, shards, kind):
    base = ll.ImageFolderDataset(folder) if kind == "files" else ll.RecordFileDataset(shards)
    ds = base.transform_first(CHAIN)
    ref_x, ref_y = _epoch(ds, num_threads=1, io_depth=0)
    assert ref_x.shape == (len(base), 40, 40, 3)
    for threads in (1, 2):
        for depth in (None, 1, 3, 64):
            x, y = _epoch(ds, num_threads=threads, io_depth=depth)
            assert np.array_equal(x, ref_x), (threads, depth)
            assert np.array_equal(y, ref_y), (threads, depth)


def test_matches_the_step_by_step_transform(folder):
    """Independent reference: dataset[i] (read and decoded from Python) then the chain called
    with the same key, against the loader's read-ahead output."""
    base = ll.ImageFolderDataset(folder)
    loader = ll.DataLoader(base.transform_first(T.Compose([T.Resize((32, 48))])), batch_size=16, io_depth=4,
                           seed=1)
    x = np.concatenate([np.array(b[0]) for b in loader])
    for i in (0, 17, len(base) - 1):
        img, _ = base[i]
        want = T.Resize((32, 48))(img, seed=loader.seed, epoch=0, index=i)
        assert np.array_equal(x[i], want)


def test_stats_and_explain_show_the_stage(folder):
    loader = ll.DataLoader(ll.ImageFolderDataset(folder).transform_first(CHAIN), batch_size=8, io_depth=5,
                           profile=True)
    assert "read-ahead" in loader.explain() and "io_depth=5" in loader.explain()
    for _ in loader:
        pass
    ex = loader.stats.extract
    assert ex is not None and ex.io_depth == 5 and not ex.adaptive
    assert ex.reads == 69 and ex.failures == 0
    sizes = sum(os.path.getsize(p) for p, _ in ll.ImageFolderDataset(folder).items)
    assert ex.bytes == sizes
    assert 0 < ex.latency_p50_ms <= ex.latency_p95_ms
    off = ll.DataLoader(ll.ImageFolderDataset(folder).transform_first(CHAIN), batch_size=8, io_depth=0,
                        profile=True)
    assert "off (io_depth=0)" in off.explain()
    for _ in off:
        pass
    # No read-ahead: the decode threads' own reads are counted all the same (NOTE [ Every read counts ]).
    ex = off.stats.extract
    assert ex is not None and ex.io_depth == 0 and (ex.reads, ex.bytes) == (69, sizes)
    assert ex.inline_reads == 69 and "no read-ahead" in ex.line()


def test_resume_is_exact_with_read_ahead(shards):
    ds = ll.RecordFileDataset(shards).transform_first(CHAIN)
    full = ll.DataLoader(ds, batch_size=8, shuffle=True, seed=9, io_depth=7)
    want = [np.array(x) for x, _ in full]
    first = ll.DataLoader(ds, batch_size=8, shuffle=True, seed=9, io_depth=7)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = it.state_dict()
    del it
    again = ll.DataLoader(ds, batch_size=8, shuffle=True, seed=9, io_depth=None)
    again.load_state_dict(state)
    rest = [np.array(x) for x, _ in again]
    assert len(rest) == len(want) - 3
    for a, b in zip(rest, want[3:]):
        assert np.array_equal(a, b)


def test_a_missing_file_names_the_path_and_errno(folder, tmp_path):
    paths = [p for p, _ in ll.ImageFolderDataset(folder).items][:20]
    gone = str(tmp_path / "gone.jpg")
    paths[13] = gone
    ds = ll.ImageListDataset(paths).transform_first(CHAIN)
    with pytest.raises(DecodeError, match=r"item 13 .*gone\.jpg.*cannot open: No such file or directory \(errno 2\)"):
        for _ in ll.DataLoader(ds, batch_size=4, io_depth=8):
            pass
    # on_error="skip" drops it, with the same samples as reads inside the decode threads.
    with pytest.warns(ll.errors.SkipWarning, match="1 sample skipped"):
        got = [np.array(b) for b in ll.DataLoader(ds, batch_size=4, io_depth=8, on_error="skip", seed=3)]
    with pytest.warns(ll.errors.SkipWarning, match="1 sample skipped"):
        ref = [np.array(b) for b in ll.DataLoader(ds, batch_size=4, io_depth=0, on_error="skip", seed=3)]
    assert sum(len(b) for b in got) == 19
    for a, b in zip(got, ref):
        assert np.array_equal(a, b)


def test_skip_fills_take_samples_a_queued_batch_holds(folder, tmp_path):
    """on_error="skip": a batch with failures is filled from the next samples, which the batch
    queued behind it already holds (and whose bytes may have arrived); every slot is consumed
    once and the batches equal those of reads inside the decode threads."""
    paths = [p for p, _ in ll.ImageFolderDataset(folder).items]
    for k in (1, 2, 6, 9, 10, 17, 30, 31, 32, 50):
        paths[k] = str(tmp_path / f"missing{k}.jpg")
    ds = ll.ImageListDataset(paths).transform_first(CHAIN)
    runs = {}
    for depth in (0, 2, 64):
        for threads in (1, 2):
            with pytest.warns(ll.errors.SkipWarning, match="10 samples skipped"):
                runs[depth, threads] = np.concatenate(
                    [np.array(b) for b in ll.DataLoader(ds, batch_size=4, io_depth=depth, num_threads=threads,
                                                        on_error="skip", seed=2)])
    ref = runs[0, 1]
    assert ref.shape[0] == len(paths) - 10
    for key, got in runs.items():
        assert np.array_equal(got, ref), key


def test_a_file_that_changes_size_is_refused(tmp_path):
    """/proc files say 0 bytes and hold more: the reader sees the size change and fails the item
    (NOTE [ Files that change while read ]), in the kernels and in Python alike."""
    ds = ll.ImageListDataset(["/proc/self/status"]).transform_first(CHAIN)
    for depth in (0, 4):
        with pytest.raises(DecodeError, match="changed size while being read: fstat gave 0 bytes, the read found more"):
            for _ in ll.DataLoader(ds, batch_size=1, io_depth=depth):
                pass
    with pytest.raises(OSError, match="changed size while being read"):
        ll.ImageListDataset(["/proc/self/status"]).read(0)


def test_io_depth_is_validated():
    with pytest.raises(ValueError, match="io_depth must be a non-negative integer"):
        ll.DataLoader(np.zeros((4, 2)), batch_size=2, io_depth=-3)
    with pytest.raises(ValueError, match="io_depth must be a non-negative integer"):
        ll.DataLoader(np.zeros((4, 2)), batch_size=2, io_depth=True)
    ll.DataLoader(np.zeros((4, 2)), batch_size=2, io_depth=ll.AUTOTUNE)   # accepted: adapts


def test_pipeline_with_options_io_depth(folder):
    pipe = ll.Pipeline.from_folder(folder).map(CHAIN).batch(8)
    ref = np.concatenate([np.array(x) for x, _ in pipe.with_options(seed=2, io_depth=0)])
    got = np.concatenate([np.array(x) for x, _ in pipe.with_options(seed=2, io_depth=3)])
    assert np.array_equal(got, ref)
    with pytest.raises(ValueError, match="io_depth"):
        pipe.with_options(io_depth=-2)


# --------------------------------------------------------------------------- the native half


def test_reader_slots_are_bounded_and_reused(folder):
    """Queuing stops at the slot limit; a batch attached to the queued positions frees them."""
    paths = [p for p, _ in ll.ImageFolderDataset(folder).items]
    src = NativeSource(SourceKind.FILES, stage="", paths=paths)
    stream = np.arange(len(paths), dtype=np.int64)
    ra = ReadAhead(src, stream, io_depth=2, batch_size=4, lookahead=1, timeout=None)
    assert ra.limit == 4 + 2 * 2
    assert ra.top_up() == ra.limit   # the ring is full after that many
    assert ra.top_up() == 0
    plan = compile_chain(T.Compose([T.Resize((16, 16))]))
    out = np.zeros((4, 16, 16, 3), np.uint8)
    st = src.run(plan, stream[:4], out, seed=0, epoch=0, num_threads=2, timings=None,
                 positions=np.arange(4, dtype=np.int64), reader=ra)
    assert st.ok.all()
    assert ra.top_up() == 4          # the batch's slots came back
    c = ra.counters()
    assert c["taken"] == 4 and c["queued"] == ra.limit + 4
    ra.close()


def test_reader_gives_up_on_positions_never_queued(folder):
    """Items whose positions were not queued are read in the pass (a full ring)."""
    paths = [p for p, _ in ll.ImageFolderDataset(folder).items][:6]
    src = NativeSource(SourceKind.FILES, stage="", paths=paths)
    ra = ReadAhead(src, np.arange(6, dtype=np.int64), io_depth=1, batch_size=1, lookahead=1, timeout=None)
    plan = compile_chain(T.Compose([T.Resize((16, 16))]))
    out = np.zeros((6, 16, 16, 3), np.uint8)
    ref = np.zeros_like(out)
    plan.run_files_into(paths, ref, np.arange(6), seed=0, epoch=0, num_threads=1)
    ra.top_up()    # queues 3 (limit 1 + 2 x 1)
    st = src.run(plan, np.arange(6, dtype=np.int64), out, seed=0, epoch=0, num_threads=2, timings=None,
                 positions=np.arange(6, dtype=np.int64), reader=ra)
    assert st.ok.all()
    assert np.array_equal(out, ref)
    assert ra.counters()["taken"] == 6
    ra.close()


def test_choose_depth_follows_littles_law():
    # 2 threads took 1000 samples in 1 s without waiting: 1000/s; 16 ms reads -> 24 + 2 in flight.
    depth, why = choose_depth(current=16, threads=2, latency_s=0.016, taken=1000, wait_s=0.0, wall_s=1.0)
    assert depth == 26 and "Little's law" in why
    # The threads waited half their time: the rate they could reach is twice what they did.
    depth, _ = choose_depth(current=16, threads=2, latency_s=0.016, taken=1000, wait_s=1.0, wall_s=1.0)
    assert depth == 50
    # Fast reads (20 us): the law asks for 3, the depth stays at its floor.
    depth, _ = choose_depth(current=40, threads=2, latency_s=20e-6, taken=2000, wait_s=0.0, wall_s=1.0)
    assert depth == 28   # lowered by halves towards the floor: (40 + 16) // 2
    depth, _ = choose_depth(current=16, threads=2, latency_s=20e-6, taken=2000, wait_s=0.0, wall_s=1.0)
    assert depth == MIN_DEPTH
    # Waiting although the law says the depth suffices: raised by a quarter anyway.
    depth, _ = choose_depth(current=40, threads=2, latency_s=0.001, taken=100, wait_s=0.5, wall_s=1.0)
    assert depth == 50
    assert choose_depth(current=4, threads=2, latency_s=0.01, taken=0, wait_s=0.0, wall_s=1.0) is None
    big, _ = choose_depth(current=16, threads=64, latency_s=1.0, taken=10 ** 6, wait_s=0.0, wall_s=1.0)
    assert big == MAX_DEPTH


def test_no_io_threads_left_after_abandoned_iterators(folder):
    ds = ll.ImageFolderDataset(folder).transform_first(CHAIN)
    loader = ll.DataLoader(ds, batch_size=4, io_depth=12)
    gc.collect()
    before = threading.active_count()
    tasks_before = len(os.listdir("/proc/self/task"))
    io_before = {int(t) for t in os.listdir("/proc/self/task")}   # an earlier test's, if any
    for _ in range(30):
        it = iter(loader)
        next(it)
        del it
    loader.close()
    # Joined, not left to exit on their own (NOTE [ Closing the read-ahead ]): nothing to wait for.
    native = [name for tid, name in _threads.threads().items() if tid not in io_before]
    assert [n for n in native if n.startswith(("ll-io", "ll-team"))] == []
    assert threading.active_count() <= before
    gc.collect()
    assert len(os.listdir("/proc/self/task")) <= tasks_before


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_reader_touches_only_the_slots_it_uses(folder):
    """NOTE [ Read slots are touched lazily ]: a reader sized for the deepest read-ahead (2,112
    slots, as a loader with batches of 32 makes) writes none of them when it opens, and then
    only as many as it has had reads queued at once; 60 such readers open at once cost well
    under the 0.66 MB each that writing every slot did (their IO threads' stacks included)."""
    paths = [os.fsencode(p) for p, _ in ll.ImageFolderDataset(folder).items]
    cap = 64 + 2 * MAX_DEPTH
    r = _chain.Reader(cap, 2)
    assert r.counters()["slots_touched"] == 0 and r.buffer_bytes() == 0
    assert r.queue_files(np.arange(5, dtype=np.int64), paths[:5]) == 5
    assert r.counters()["slots_touched"] == 5
    for pos in range(5):
        data, _ = r.take(pos, 30.0)
        with open(paths[pos], "rb") as f:
            assert data == f.read()
    # Freed slots are reused before an untouched one is taken.
    assert r.queue_files(np.arange(5, 8, dtype=np.int64), paths[5:8]) == 3
    assert r.counters()["slots_touched"] == 5
    assert r.join(30.0) == 0
    gc.collect()
    before = _resident_bytes()
    readers = [_chain.Reader(cap, 1) for _ in range(60)]
    grown = _resident_bytes() - before
    assert all(x.counters()["slots_touched"] == 0 for x in readers)
    assert grown < 60 * 0.66e6 / 4, f"{grown / 60 / 1e3:.0f} KB per reader"
    for x in readers:
        assert x.join(30.0) == 0


def test_reader_refuses_bad_ranges():
    r = _chain.Reader(4, 1)
    with pytest.raises(ValueError, match="out of range"):
        r.queue_ranges(np.zeros(1, np.int64), np.zeros(1, np.int32), np.zeros(1, np.int64),
                       np.full(1, -1, np.int64))
    with pytest.raises(TypeError, match="paths must be bytes"):
        r.queue_files(np.zeros(1, np.int64), ["x"])
    r.stop()


def _halve(img):
    return (np.asarray(img) // 2).astype(np.uint8)


def test_threads_and_processes_engines_read_ahead_too(folder):
    """A native prefix then a Python step: the threads engine (hybrid) and the worker
    processes (NOTE [ Read-ahead in workers ]) read ahead, with the same output."""
    ds = ll.ImageFolderDataset(folder).transform_first(T.Compose([T.Resize((20, 20)), _halve]))
    ref, _ = _epoch(ds, num_threads=1, io_depth=0)
    got, _ = _epoch(ds, num_threads=2, io_depth=5)
    assert np.array_equal(got, ref)
    loader = ll.DataLoader(ds, batch_size=8, shuffle=True, seed=5, num_workers=2, io_depth=3)
    assert loader.engine == "processes"
    procs = np.concatenate([np.array(x) for x, _ in loader])
    loader.close()
    assert np.array_equal(procs, ref)


def _crop_rows(img):
    return np.ascontiguousarray(np.asarray(img)[:16, :16])


@pytest.mark.parametrize("kind", ["files", "records"])
def test_python_datasets_of_ours_read_ahead_on_the_threads_engine(folder, shards, kind):
    """A Python step first: the threads engine, whose pool threads take their samples' bytes
    from the read-ahead stage (NOTE [ Read-ahead for Python reads ]); the items are
    dataset[i]'s, in the sampler's order (the reference)."""
    base = ll.ImageFolderDataset(folder) if kind == "files" else ll.RecordFileDataset(shards)
    ds = base.transform_first(_crop_rows)
    loader = ll.DataLoader(ds, batch_size=8, shuffle=True, seed=4, num_threads=2, io_depth=6, profile=True)
    assert loader.engine == "threads"
    got = np.concatenate([np.array(x) for x, _ in loader])
    assert loader.stats.extract is not None and loader.stats.extract.reads == len(base)
    order = RandomSampler(len(base), seed=4).order(0)
    want = np.stack([ds[int(i)][0] for i in order])
    assert np.array_equal(got, want)


def test_autotune_climbs_past_the_cores_only_while_threads_wait_for_bytes():
    """AUTOTUNE's thread climb on a native loader that reads storage: bounded by the cores
    unless the read-ahead stage reports the kernel threads waiting for bytes."""
    from loaderlib._autotune import HillClimb

    waiting = {"share": 0.0}
    climb = HillClimb("num_threads", 2, 1, 4, bound=lambda: 4 if waiting["share"] > 0.05 else 2)
    first, _ = climb.step(100.0)
    assert first == 1   # no room above the cores: the climb tries fewer threads
    waiting["share"] = 0.3
    climb = HillClimb("num_threads", 2, 1, 4, bound=lambda: 4 if waiting["share"] > 0.05 else 2)
    first, _ = climb.step(100.0)
    assert first == 4


def test_a_read_that_never_completes_is_bounded_by_timeout(folder):
    """Storage that stops answering (latencyfs charging 5 s per file): the first batch's reads
    fail after half the loader's ``timeout`` with the reason (before the consumer's own wait
    runs out), instead of hanging; the IO threads left in their reads do not keep the loader,
    and the mount unmounts once they return."""
    from benchmarks._latencyfs import mount

    with mount(folder, latency_ms=5000, jitter=0.0, where="open") as mp:
        ds = ll.ImageFolderDataset(mp.path).transform_first(CHAIN)
        loader = ll.DataLoader(ds, batch_size=4, io_depth=4, timeout=0.6)
        with pytest.raises(DecodeError, match=r"read failed: the read did not complete within 0\.3 s"):
            next(iter(loader))
        loader.close()


@pytest.mark.parametrize("sleeps", [True, False], ids=["reads-that-slept", "cpu-share"])
def test_reads_that_are_cpu_work_go_back_to_the_decode_threads(folder, sleeps):
    """NOTE [ Reads that are work ]: scripted native counters (an injected clock, no timing).
    Reads that are work (none slept; where sleeping is not counted, mostly CPU) switch the
    stage to inline reads with one batch in PROBE_EVERY still read ahead; reads that wait
    switch it back; the choice carries over to the next run through the hint."""
    from loaderlib._extract import readahead as ra_mod

    paths = [p for p, _ in ll.ImageFolderDataset(folder).items]
    src = NativeSource(SourceKind.FILES, stage="", paths=paths)
    t = {"ns": 0}
    hint: dict = {}
    ra = ReadAhead(src, np.arange(len(paths), dtype=np.int64), io_depth=None, batch_size=4, lookahead=1,
                   timeout=None, hint=hint, clock=lambda: t["ns"])
    base = ra.native.counters()
    script = dict(base)

    def counters():
        return dict(script)

    script["blocked"] = 0 if sleeps else -1
    ra._counters = counters
    ra._last = counters()
    # 40 reads of 20 us wall, 18 us of it CPU, over 10 ms; none slept.
    t["ns"] += 10_000_000
    script.update(reads=40, lat_ns=40 * 20_000, cpu_ns=40 * 18_000, taken=40, wait_ns=0, bytes=40 * 50_000)
    ra.adapt(2)
    assert ra.inline and hint["inline"] and "CPU (page cache)" in ra.decisions[-1][3]
    queued = [ra.top_up() for _ in range(ra_mod.PROBE_EVERY)]
    assert queued[:-1] == [0] * (ra_mod.PROBE_EVERY - 1) and queued[-1] > 0
    # Reading inline: the probes' reads alone are held, read by INLINE_DEPTH IO threads.
    assert ra.limit == max(ra_mod.MIN_READS, ra_mod.INLINE_DEPTH) and ra.native.counters()["depth"] == ra_mod.INLINE_DEPTH
    # Reads that wait (a cold cache): back to reading ahead once SLOW_PROBES probes in a row say so
    # (one read's wall time may be a wait for a core); Little's law wants 7, the depth stays at
    # its floor of 16.
    for k in range(ra_mod.SLOW_PROBES):
        assert ra.inline
        t["ns"] += 50_000_000
        script.update(reads=script["reads"] + 40, lat_ns=script["lat_ns"] + 40 * 4_000_000,
                      cpu_ns=script["cpu_ns"] + 40 * 30_000, taken=script["taken"] + 40,
                      blocked=script["blocked"] + 40 if sleeps else -1)
        ra.adapt(2)
    assert not ra.inline and not hint["inline"]
    assert ra.limit == 4 * 1 + 2 * ra.depth and ra.native.counters()["depth"] == ra.depth
    assert any("reading ahead again" in d[3] for d in ra.decisions)
    assert ra.depth == MIN_DEPTH
    ra.close()
    # The next run starts where this one left off.
    hint["inline"] = True
    again = ReadAhead(src, np.arange(len(paths), dtype=np.int64), io_depth=None, batch_size=4, lookahead=1,
                      timeout=None, hint=hint)
    assert again.inline
    again.close()
    fixed = ReadAhead(src, np.arange(len(paths), dtype=np.int64), io_depth=3, batch_size=4, lookahead=1,
                      timeout=None, hint=hint)
    assert not fixed.inline   # a fixed io_depth always reads ahead
    fixed.close()


def _scripted(folder, hint: dict, blocked: int = 0):
    """A ReadAhead over ``folder`` whose native counters are a script (``script``, a dict the
    test updates) read on an injected clock (``t["ns"]``): no timing. ``blocked=-1``: the
    platform cannot count the reads that slept."""
    paths = [p for p, _ in ll.ImageFolderDataset(folder).items]
    src = NativeSource(SourceKind.FILES, stage="", paths=paths)
    t = {"ns": 0}
    ra = ReadAhead(src, np.arange(len(paths), dtype=np.int64), io_depth=None, batch_size=4, lookahead=1,
                   timeout=None, hint=hint, clock=lambda: t["ns"])
    script = dict(ra.native.counters())
    script["blocked"] = blocked
    ra._counters = lambda: dict(script)
    ra._last = dict(script)
    return ra, script, t, src, paths


def test_a_first_reader_holds_one_measurement_until_it_has_measured(folder):
    """NOTE [ Read-ahead memory ]: with no hint from an earlier run, the reader holds only
    ``depth`` reads (one measurement's worth) until its first measurement; then the batches'
    share too. A run with a hint starts measured. Scripted counters, injected clock."""
    hint: dict = {}
    ra, script, t, src, paths = _scripted(folder, hint)
    assert ra.unmeasured and ra.limit == ra.depth == START_DEPTH
    # Reads that wait (4 ms each, 1% CPU, all slept): measured, and the batches' share is held
    # from now on.
    t["ns"] += 50_000_000
    script.update(reads=40, lat_ns=40 * 4_000_000, cpu_ns=40 * 40_000, taken=40, wait_ns=0, bytes=40 * 50_000,
                  blocked=40)
    ra.adapt(2)
    assert not ra.unmeasured and not ra.inline
    assert ra.limit == 4 + 2 * ra.depth
    ra.close()
    measured = ReadAhead(src, np.arange(len(paths), dtype=np.int64), io_depth=None, batch_size=4, lookahead=1,
                         timeout=None, hint=hint)
    assert not measured.unmeasured and measured.limit == 4 + 2 * measured.depth
    measured.close()


@pytest.mark.parametrize("sleeps", [True, False], ids=["reads-that-slept", "cpu-share"])
def test_one_slow_probe_between_fast_ones_keeps_reading_inline(folder, sleeps):
    """NOTE [ Reads that are work ]: a probe whose reads looked like waiting (a read may sleep on
    a lock, its wall time includes waiting for a core) counts only when the next probe agrees."""
    from loaderlib._extract import readahead as ra_mod

    ra, script, t, _src, _paths = _scripted(folder, {"inline": True, "depth": 16}, 0 if sleeps else -1)

    def probe(cpu_share: float) -> None:   # a slow probe: 6% CPU, 15 of its 16 reads slept
        t["ns"] += 10_000_000
        script.update(reads=script["reads"] + 16, lat_ns=script["lat_ns"] + 16 * 100_000,
                      cpu_ns=script["cpu_ns"] + int(16 * 100_000 * cpu_share), taken=script["taken"] + 16,
                      blocked=script["blocked"] + (15 if cpu_share < 0.5 else 0) if sleeps else -1)
        ra.adapt(2)

    for share in (0.06, 0.9, 0.06, 0.9, 0.06):
        probe(share)
        assert ra.inline
    probe(0.06)   # the second slow probe in a row
    assert not ra.inline and ra_mod.SLOW_PROBES == 2
    ra.close()


def test_reads_that_never_slept_are_work_on_a_busy_machine(folder):
    """NOTE [ Reads that are work ]: page-cache reads on cores the decode threads keep busy take
    far longer than their CPU time (20% CPU here), yet none slept: they are work, read inline."""
    ra, script, t, _src, _paths = _scripted(folder, {})
    t["ns"] += 10_000_000
    script.update(reads=40, lat_ns=40 * 100_000, cpu_ns=40 * 20_000, taken=40, bytes=40 * 50_000, blocked=3)
    ra.adapt(2)
    assert ra.inline and "8% of reads waited for storage, 20% CPU" in ra.decisions[-1][3]
    ra.close()
