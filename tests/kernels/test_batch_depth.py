"""The default prefetch's batch cap (NOTE [ Batches in memory ] in loaderlib/_engines/depth.py).

The rule is checked on its own with scripted figures (no clock), and on a real native loader:
the slots leased at once (the arena counts them), the output against an explicit prefetch
(the uncapped queue), consumers that keep batches, warm epochs and num_threads=0.
"""

from __future__ import annotations

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._engines.base import Produced, Producer, RunState, Task, _Knobs, _Run
from loaderlib._engines.depth import GROW_SHARE, SMALL_TEAM, WINDOW, BatchDepth, start_ahead
from loaderlib._extract.readahead import ReadAhead
from loaderlib._observe.recorder import StageRecorder
from loaderlib.sampler import EpochOrder

from ._loader_images import make_image_folder

MS = 1_000_000


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("imgs"), num_classes=3, per_class=12)


def _loader(folder, **kw):
    chain = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.Normalize((0.5,) * 3, (0.25,) * 3),
                       T.ToCHW()])
    ds = ll.ImageFolderDataset(folder).transform_first(chain)
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_threads", 1)
    return ll.DataLoader(ds, shuffle=True, seed=7, **kw)


# -- the rule -----------------------------------------------------------------------------

@pytest.mark.parametrize(("threads", "batch", "ahead"), [
    (1, 1, 1), (1, 64, 1), (2, 64, 1), (3, 64, 2), (16, 64, 2), (2, 32, 2), (6, 256, 1), (7, 256, 2)])
def test_start_ahead_is_one_for_a_small_team(threads, batch, ahead):
    # at least SMALL_TEAM images per batch for each thread past the first
    assert start_ahead(threads, batch) == ahead
    assert (ahead == 1) == ((threads - 1) * SMALL_TEAM <= batch)


def _window(d: BatchDepth, held_ms: float, waited_ms: float, every_ms: float, t0: int = 0) -> int:
    """WINDOW + 1 delivered batches, one every ``every_ms``; returns the last delivery time."""
    t = t0
    for _ in range(WINDOW + 1):
        t += int(every_ms * MS)
        d.observe(int(held_ms * MS), int(waited_ms * MS), t)
    return t


def test_one_more_batch_ahead_when_it_would_have_saved_the_consumer_waits():
    d = BatchDepth(batch_size=64, most=2)
    assert d.cap(2) == 2
    # the driver sat 2 ms at the cap before each batch the consumer then waited 5 ms for: a
    # deeper queue saves 2 ms of every 20 ms (10% > GROW_SHARE)
    _window(d, held_ms=2, waited_ms=5, every_ms=20)
    assert d.cap(2) == 3
    assert d.decisions[-1][:2] == (1, 2) and "would have saved 10.0%" in d.decisions[-1][2]
    # never past ``most``
    _window(d, held_ms=2, waited_ms=5, every_ms=20, t0=10**12)
    assert d.cap(2) == 3


@pytest.mark.parametrize(("held_ms", "waited_ms"), [
    (0.1, 20),    # an infinitely fast consumer: waits for every batch, the driver only for the hand-over
    (5, 0),       # a slow consumer: the driver waits at the cap, the consumer never waits
    (0, 5),       # the producer is the bottleneck: nothing to save by starting earlier
])
def test_no_deeper_queue_when_it_would_not_have_saved_anything(held_ms, waited_ms):
    d = BatchDepth(batch_size=64, most=4)
    _window(d, held_ms=held_ms, waited_ms=waited_ms, every_ms=20)
    assert d.cap(2) == 2
    assert d.decisions == []
    assert min(held_ms, waited_ms) / 20 <= GROW_SHARE


def test_a_consumer_that_keeps_batches_raises_the_cap_up_to_most():
    d = BatchDepth(batch_size=64, most=2)
    d.forced()
    assert d.cap(2) == 3 and "keeps batches" in d.decisions[0][2]
    d.forced()
    assert d.cap(2) == 3


def test_wake_signals_only_a_waiting_driver():
    d = BatchDepth(batch_size=8, most=2)
    for _ in range(1000):   # releases while no driver waits leave nothing behind
        d.wake()
    assert d.signal.qsize() == 0
    d.waiting = True
    d.wake()
    d.wake()
    d.wait(0)   # takes the signals and drains the rest
    assert d.signal.qsize() == 0


def test_a_ring_calls_on_release_once_per_freed_slot_and_swallows_its_errors():
    arena = ll.BatchArena(2)
    calls = []
    arena.on_release = lambda: calls.append(1)
    layout = ll.arena.BatchLayout.of([((4,), np.float32)])
    _lease, views = arena.acquire(layout)
    assert arena.num_leased == 1
    del _lease, views
    assert calls == [1] and arena.num_leased == 0

    def boom():
        raise RuntimeError("callback failed")

    arena.on_release = boom
    _lease, views = arena.acquire(layout)
    del _lease, views   # the error is dropped: a lease ends in a dealloc, anywhere
    assert arena.num_leased == 0


# -- on a native loader ---------------------------------------------------------------------

def _epochs(loader, n):
    out = []
    for _ in range(n):
        for x, y in loader:
            out.append((x.copy(), y.copy()))
    return out


@pytest.mark.parametrize(("threads", "batch", "cap"), [(1, 4, 2), (2, 4, 3)])
def test_the_default_keeps_the_cap_and_gives_the_uncapped_output(folder, threads, batch, cap):
    loader = _loader(folder, num_threads=threads, batch_size=batch)
    assert loader._knobs.depth is not None and loader._knobs.depth.cap(threads) == cap
    assert f"at most {cap} batches in memory" in loader.explain()
    got = _epochs(loader, 3)
    # Small batches are quick, so the hand-over may be a share of a batch worth a batch more
    # ahead (the growth rule); every raise is a decision, and the cap held (warm epochs included).
    depth = loader._knobs.depth
    assert depth.ahead == cap - 1 + len(depth.decisions)
    assert loader._arena_ring.peak_leased <= 1 + depth.ahead
    ref = _epochs(_loader(folder, num_threads=threads, batch_size=batch, prefetch=2), 3)
    assert len(got) == len(ref) == 3 * 9
    for (x, y), (rx, ry) in zip(got, ref):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)


def test_output_is_the_same_for_one_and_two_threads_under_the_cap(folder):
    one = _epochs(_loader(folder, num_threads=1), 2)
    two = _epochs(_loader(folder, num_threads=2), 2)
    for (x, y), (rx, ry) in zip(one, two):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)


@pytest.mark.parametrize("num_threads", [0, 1])
def test_a_consumer_that_keeps_every_batch_gets_them_all_intact(folder, num_threads):
    loader = _loader(folder, num_threads=num_threads)
    kept = list(loader)   # holds all 9 batches: the cap must give way, never deadlock
    ref = _epochs(_loader(folder, num_threads=1, prefetch=2), 1)
    assert len(kept) == len(ref) == 9
    for (x, y), (rx, ry) in zip(kept, ref):   # nothing kept was overwritten
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
    assert loader._arena_ring.peak_leased >= 9
    if num_threads:
        assert any("keeps batches" in why for _, _, why in loader._knobs.depth.decisions)


class _CountingProducer(Producer):
    """Batches that lease at submit and finish at once; records what was submitted."""

    lookahead = 2
    leases_at_submit = True

    def __init__(self, state: RunState) -> None:
        super().__init__(state=state, recorder=StageRecorder(enabled=False), on_error="raise")
        self.submitted: list[int] = []

    def submit(self, task: Task) -> Task:
        self.submitted.append(task.number)
        return task

    def finish(self, task: Task) -> Produced:
        return Produced(task.number, task.start + task.indices.size, task.indices.size, task.target)


def test_a_warm_run_finishes_its_first_batch_before_it_is_iterated():
    """NOTE [ Warm slots ]: a warm next epoch whose ring has no further free slot makes the batch
    it started instead of waiting to be iterated for room for a second one. Single-threaded,
    no clock: the room stays closed after the first batch, and the run must not ask to wait."""
    order = EpochOrder(1, np.arange(12, dtype=np.int64), [4, 4, 4], False, np.empty(0, np.int64),
                       np.empty(0, np.int64), {})
    state = RunState(order, seed=0)
    state.live.clear()   # a warm run nobody iterates yet
    prod = _CountingProducer(state)
    run = _Run(state=state, producer=prod, knobs=_Knobs(1, 2), recorder=StageRecorder(enabled=False),
               timeout=None, threaded=False)
    asked: list[int] = []

    def room() -> bool:   # one slot was free: the one the first batch took
        asked.append(len(run.pending))
        return not prod.submitted

    run.room = room

    def wait_room() -> bool:   # waiting is for a run with nothing in production
        if run.pending:
            raise AssertionError("the warm run waited for room with a batch in production")
        return room()

    run._wait_room = wait_room   # type: ignore[method-assign]
    out = run.step()
    assert out is not None and out.batch == 0 and prod.submitted == [0]
    assert asked == [0, 1]   # room before the first batch, and none for a second


def test_the_next_epoch_is_prepared_within_the_cap(folder):
    loader = _loader(folder)
    batches = 0
    for x, _y in loader:   # x, the epoch's last batch, is still held afterwards
        batches += 1
    assert batches == 9
    assert loader._warm.run is not None
    depth = loader._knobs.depth
    assert loader._arena_ring.peak_leased <= 1 + depth.ahead
    assert x.shape == (4, 3, 32, 32)
    assert len(list(loader)) == 9


def test_an_explicit_prefetch_is_a_fixed_queue(folder):
    loader = _loader(folder, prefetch=3)
    assert loader._knobs.depth is None and "batches in memory" not in loader.explain()
    capped = _loader(folder)
    capped.prefetch = 3   # setting it turns the cap off too
    assert capped._knobs.depth is None and "batches in memory" not in capped.explain()
    assert _loader(folder, prefetch=ll.AUTOTUNE)._knobs.depth is None


def test_ram_budget_bounds_how_far_ahead(folder):
    one = 4 * 3 * 32 * 32 * 4 + 4 * 8   # images and labels of one batch
    loader = _loader(folder, ram_budget=3 * one)
    assert loader._knobs.depth.most == 2
    loader = _loader(folder, ram_budget=int(1.5 * one))
    assert loader._knobs.depth.most == 1


def test_a_run_reading_inline_still_probes_its_storage(folder):
    """NOTE [ Reads that are work ]: a run that starts reading inline (the loader's earlier runs
    found reads to be work) still reads one batch in PROBE_EVERY ahead under the batch cap,
    so a storage that turns slow is noticed: its probes reach the IO threads."""
    loader = _loader(folder, profile=True)
    loader._knobs.read_hint.update(inline=True, depth=16)
    for _ in range(2):
        for _batch in loader:
            pass
    ex = loader.stats.extract
    assert ex is not None and ex.inline
    assert ex.reads > 0


@pytest.mark.parametrize("batch_size", [2, 4])
def test_every_probe_of_a_run_reading_inline_is_read_by_the_io_threads(folder, monkeypatch, batch_size):
    """Each position a probe queues is read by the IO threads, epoch after epoch.

    The reverted ff2f0c9 (Producer.catch_up) ran the read-ahead's top-up after the next batch
    was queued; a probe made then queued positions that batch had already attached, which
    the kernel threads read themselves: those reads never reached the IO threads (on a
    16-batch epoch every probe did so, 0 reads per epoch). Counting that some read happened
    misses it; the read counter must equal the positions the probes queued."""
    queued: list[int] = []
    queue = ReadAhead.queue

    def counting_queue(self, positions, idx):
        took = queue(self, positions, idx)
        queued.append(took)
        return took

    monkeypatch.setattr(ReadAhead, "queue", counting_queue)
    loader = _loader(folder, profile=True, batch_size=batch_size)
    loader._knobs.read_hint.update(inline=True, depth=16)
    for _epoch in range(3):
        queued.clear()
        for _batch in loader:
            pass
        ex = loader.stats.extract
        assert ex is not None and ex.inline
        # 36 images in batches of 2 or 4: 18 or 9 batches, at least 2 probes an epoch.
        assert len([t for t in queued if t]) >= 2, queued
        assert ex.reads - ex.inline_reads == sum(queued), (ex.reads, ex.inline_reads, queued)


class _FreeingProducer(_CountingProducer):
    """Records, when production is freed, which batches the queue already holds."""

    def __init__(self, state: RunState, queue: list) -> None:
        super().__init__(state)
        self.queue = queue
        self.freed_with: list | None = None

    def done_producing(self) -> None:
        assert self.freed_with is None, "production freed twice"
        self.freed_with = [p.batch for p in list(self.queue[0]._items) if isinstance(p, Produced)]


@pytest.mark.parametrize(("prefetch", "queued_at_free"), [(4, [0, 1, 2]), (2, [0, 1]), (1, [1])])
def test_the_last_batch_is_handed_on_before_production_is_freed(prefetch, queued_at_free):
    """NOTE [ The last batch first ]: with room in the queue the driver puts the epoch's last
    batch before freeing the producer (a warm next epoch's first batch waits for the slot the
    consumer gives back when it takes that batch); with the queue full it frees first."""
    from loaderlib._engines.base import _drive
    from loaderlib._engines.handoff import _BatchQueue

    order = EpochOrder(0, np.arange(12, dtype=np.int64), [4, 4, 4], False, np.empty(0, np.int64),
                       np.empty(0, np.int64), {})
    state = RunState(order, seed=0)
    knobs = _Knobs(1, prefetch)
    holder: list = []
    prod = _FreeingProducer(state, holder)
    run = _Run(state=state, producer=prod, knobs=knobs, recorder=StageRecorder(enabled=False), timeout=None)
    queue = _BatchQueue(knobs, StageRecorder(enabled=False))
    holder.append(queue)
    taken: list[int] = []
    if prefetch < 3:   # a consumer that takes a batch whenever the queue is full, as a slow model does
        put = queue.put

        def put_taking(item, force=False):
            if queue.full():
                taken.append(queue.get(None, "test").batch)
            return put(item, force)

        queue.put = put_taking   # type: ignore[method-assign]
    _drive(run, queue)   # on this thread: batches 0, 1, 2, then the end
    assert prod.freed_with == queued_at_free
    assert not run.production_left


def _team_threads() -> set[int]:
    """The system ids of this process's kernel team threads (NOTE [ Thread names ])."""
    from tests._threads import threads

    return {tid for tid, name in threads().items() if name.startswith("ll-team")}


def test_every_epoch_runs_on_the_first_epochs_kernel_team(folder):
    """NOTE [ One team across epochs ]: a warm next epoch takes over the kernel team of the
    epoch before, so no kernel thread is started after the first epoch, and the output is
    that of a loader whose epochs each start their own team (warm epochs off)."""
    import gc

    gc.collect()
    before = _team_threads()
    loader = _loader(folder, num_threads=2)
    teams, tids, got = [], [], []
    for _epoch in range(3):
        for i, (x, y) in enumerate(loader):
            got.append((x.copy(), y.copy()))
            if i == 1:
                teams.append(loader._current()._run.producer.plan._team)
                tids.append(_team_threads() - before)
    assert all(t is teams[0] for t in teams) and teams[0].size == 2
    assert tids[0] and all(t == tids[0] for t in tids), tids
    fresh = _loader(folder, num_threads=2)
    fresh._warm_epochs = False   # every epoch on a team of its own
    ref = [(x.copy(), y.copy()) for _ in range(3) for x, y in fresh]
    assert len(got) == len(ref) == 27
    for (x, y), (rx, ry) in zip(got, ref):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
    teams.clear()
    loader.close()
    fresh.close()
    gc.collect()
    assert not (_team_threads() - before)
