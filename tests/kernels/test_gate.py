"""The batch cap's gate (NOTE [ Batches in memory ] in loaderlib/_engines/depth.py, NOTE
[ Successor leases ] in pyx/_arena.pyx): a batch queued behind a closed gate runs none of its
items until the gate opens, can be taken back unrun, and is opened in C by the release of the
slot it follows; the native loader queues the next batch that way, aimed at the slot the user
still holds, and gives the uncapped output. Events and counters, no clocks."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import loaderlib as ll
from benchmarks._synth import encode_jpeg
from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from loaderlib.arena import BatchArena, BatchLayout
from tests.conftest import make_photo

from ._loader_images import make_image_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    sizes = [(500, 375), (375, 500), (333, 251), (97, 61)]
    return [encode_jpeg(make_photo(w, h, seed=k), 90, "420") for k, (w, h) in enumerate(sizes)] * 3


def _plan():
    return compile_chain(T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD),
                                    T.ToCHW()]))


def _reference(plan, jpegs, epoch=0):
    out = np.empty((len(jpegs), *plan.sample_shape), plan.dtype)
    for i, b in enumerate(jpegs):   # one item per call, one thread
        assert plan.run_buffers_into([b], out[i:i + 1], [i], seed=5, epoch=epoch, num_threads=1).ok.all()
    return out


@pytest.mark.parametrize("threads", [1, 3])
def test_a_gated_batch_runs_nothing_until_opened_and_lets_later_batches_pass(jpegs, threads):
    plan = _plan()
    ref0, ref1 = _reference(plan, jpegs, 0), _reference(plan, jpegs, 1)
    idx = np.arange(len(jpegs))
    gated_out = np.full((len(jpegs), *plan.sample_shape), 7, plan.dtype)
    gated = plan.run_buffers_into(jpegs, gated_out, idx, seed=5, epoch=0, num_threads=threads, wait=False,
                                  gated=True)
    free_out = np.full_like(gated_out, 7)
    st = plan.run_buffers_into(jpegs, free_out, idx, seed=5, epoch=1, num_threads=threads)   # queued behind it
    assert st.ok.all()
    np.testing.assert_array_equal(free_out, ref1)   # the team went past the closed gate
    assert gated.gated() and not gated.done()
    assert (gated_out == 7).all()                     # none of its items ran
    gated.open()
    assert not gated.gated()
    assert gated.result().ok.all()
    np.testing.assert_array_equal(gated_out, ref0)


def test_a_gated_batch_taken_back_runs_nothing_and_an_open_one_is_not_taken(jpegs):
    plan = _plan()
    idx = np.arange(len(jpegs))
    out = np.full((len(jpegs), *plan.sample_shape), 7, plan.dtype)
    p = plan.run_buffers_into(jpegs, out, idx, seed=5, epoch=0, num_threads=2, wait=False, gated=True)
    assert p.withdraw()
    assert p.done() and not p.gated()
    p.wait()   # returns at once: nothing is queued any more
    assert (out == 7).all()
    q = plan.run_buffers_into(jpegs, out, idx, seed=5, epoch=0, num_threads=2, wait=False, gated=True)
    q.open()
    assert not q.withdraw()   # open: it runs, and is waited for as any batch
    assert q.result().ok.all()
    np.testing.assert_array_equal(out, _reference(plan, jpegs))


def _wait_staged(p, want: int) -> int:
    """Wait until ``want`` items of the gated batch ``p`` are staged (NOTE [ Staged items ] in
    include/ll_pool.h): an idle team stages at once; the bound only turns a bug into a failure."""
    for _ in range(2000):
        if p.handle.staged() >= want:
            break
        p.wait_open(0.005)   # gives the team's threads the CPU; the gate stays closed
    return p.handle.staged()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_an_idle_team_stages_up_to_an_eighth_of_a_batch_without_touching_the_held_output(jpegs, threads):
    plan = _plan()
    many = jpegs * 3   # 36 items: at most 4 (an eighth) staged
    ref = _reference(plan, many)
    idx = np.arange(len(many))
    out = np.full((len(many), *plan.sample_shape), 7, plan.dtype)
    p = plan.run_buffers_into(many, out, idx, seed=5, epoch=0, num_threads=threads, wait=False, gated=True)
    want = len(many) // 8   # up to four a thread
    assert _wait_staged(p, want) == want
    assert p.gated() and (out == 7).all()          # run ahead, but not into the slot the user holds
    # A batch queued now runs although every thread holds a staged item.
    other = np.full_like(out, 7)
    assert plan.run_buffers_into(many, other, idx, seed=5, epoch=0, num_threads=threads).ok.all()
    np.testing.assert_array_equal(other, ref)
    assert p.gated() and (out == 7).all() and p.handle.staged() == want
    p.open()
    assert p.result().ok.all()
    np.testing.assert_array_equal(out, ref)        # the staged items copied into place, the rest run


def test_a_gated_batch_taken_back_after_staging_writes_nothing_and_reruns_whole(jpegs):
    plan = _plan()
    idx = np.arange(len(jpegs))
    out = np.full((len(jpegs), *plan.sample_shape), 7, plan.dtype)
    p = plan.run_buffers_into(jpegs, out, idx, seed=5, epoch=0, num_threads=2, wait=False, gated=True)
    assert _wait_staged(p, 1) >= 1
    assert p.withdraw()                            # the staged items are dropped
    assert p.done() and (out == 7).all()
    q = plan.run_buffers_into(jpegs, out, idx, seed=5, epoch=0, num_threads=2, wait=False, gated=True)
    q.open()
    assert q.result().ok.all()
    np.testing.assert_array_equal(out, _reference(plan, jpegs))


def test_staged_items_that_fail_report_their_error_after_the_gate_opens(jpegs):
    plan = _plan()
    bad = [b"not a jpeg at all", jpegs[0][:200], *jpegs[2:], *jpegs]   # 24: up to 3 may be staged
    idx = np.arange(len(bad))
    ref = np.full((len(bad), *plan.sample_shape), 7, plan.dtype)
    want = plan.run_buffers_into(bad, ref, idx, seed=5, epoch=0, num_threads=1)
    out = np.full_like(ref, 7)
    p = plan.run_buffers_into(bad, out, idx, seed=5, epoch=0, num_threads=2, wait=False, gated=True)
    assert _wait_staged(p, 3) == 3                  # items 0-2: the two that fail among them
    p.open()
    got = p.result()
    np.testing.assert_array_equal(got.status, want.status)
    assert sorted(got.errors) == sorted(want.errors) == [0, 1]
    np.testing.assert_array_equal(out[2:], ref[2:])


def test_a_dropped_gated_batch_never_blocks(jpegs):
    plan = _plan()
    out = np.zeros((len(jpegs), *plan.sample_shape), plan.dtype)
    p = plan.run_buffers_into(jpegs, out, np.arange(len(jpegs)), seed=5, epoch=0, num_threads=2, wait=False,
                              gated=True)
    del p   # its gate never opened: dropping it takes it back instead of waiting for ever
    gc.collect()
    plan.close()   # the team stops: nothing of it is queued
    assert (out == 0).all()


def test_the_holders_release_opens_the_successors_gate_and_the_slot_stays_leased(jpegs):
    plan = _plan()
    arena = BatchArena(num_slots=2)
    layout = BatchLayout.of([((len(jpegs), *plan.sample_shape), plan.dtype)])
    held, (held_view,) = arena.acquire(layout)
    held_view[...] = 3
    succ, (view,) = arena.acquire_after(held, layout)
    assert succ.slot == held.slot and arena.num_leased == 1
    assert arena.acquire_after(held, layout) is None   # one successor per slot
    p = plan.run_buffers_into(jpegs, view, np.arange(len(jpegs)), seed=5, epoch=0, num_threads=2, wait=False,
                              gated=True)
    arena.set_gate(succ, p.handle)
    assert p.gated() and (held_view == 3).all()   # the holder's batch is intact while it holds it
    released = threading.Event()
    arena.on_release = released.set
    del held, held_view   # the holder lets go: the gate opens in the lease's dealloc
    assert released.is_set() and not p.gated()
    assert arena.num_leased == 1   # the successor keeps the slot
    assert p.result().ok.all()
    np.testing.assert_array_equal(view, _reference(plan, jpegs))
    del succ, view, p
    gc.collect()
    assert arena.num_leased == 0


def test_a_gate_set_after_the_holder_went_opens_at_once(jpegs):
    plan = _plan()
    arena = BatchArena(num_slots=1)
    layout = BatchLayout.of([((len(jpegs), *plan.sample_shape), plan.dtype)])
    held, _views = arena.acquire(layout)
    succ, (view,) = arena.acquire_after(held, layout)
    del held, _views   # gone before the batch is queued
    p = plan.run_buffers_into(jpegs, view, np.arange(len(jpegs)), seed=5, epoch=0, num_threads=1, wait=False,
                              gated=True)
    arena.set_gate(succ, p.handle)
    assert not p.gated()
    assert p.result().ok.all()


# -- on a native loader ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("gate"), num_classes=3, per_class=12)


def _loader(folder, **kw):
    chain = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.Normalize((0.5,) * 3, (0.25,) * 3),
                       T.ToCHW()])
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_threads", 2)
    return ll.DataLoader(ll.ImageFolderDataset(folder).transform_first(chain), shuffle=True, seed=7, **kw)


def _lease(batch: np.ndarray):
    base = batch
    while not hasattr(base, "slot"):
        base = base.obj if isinstance(base, memoryview) else base.base
    return base


def test_the_next_batch_is_queued_behind_the_slot_the_user_holds(folder):
    """At the cap (the user's batch and one in production), the batch after next is queued on
    the kernel team before the user gives its batch back, into that batch's slot: the slot the
    user holds gets a successor, and no third slot is leased."""
    loader = _loader(folder, num_threads=1)
    assert loader._knobs.depth.cap(1) == 2
    it = iter(loader)
    x, _y = next(it)
    mine = [_lease(x)]
    ring = loader._arena_ring
    found = threading.Event()

    def gated_on_mine() -> bool:
        return not ring.can_follow(mine[0])   # a successor lease waits on the user's slot

    for _ in range(600):   # the driver queues it while we hold x (a bound on polls, not a timing)
        if gated_on_mine():
            found.set()
            break
        it._run.state.stop.wait(0.05)
    assert found.is_set(), "no batch was queued behind the gate of the slot the user holds"
    assert ring.num_leased == 2
    first = (x.copy(), _y.copy())
    mine.clear()
    del x, _y   # the user gives its batch back: the gate opens
    got = [first, *[(b.copy(), c.copy()) for b, c in it]]
    ref = [(b.copy(), c.copy()) for b, c in _loader(folder, num_threads=2, prefetch=2)]
    assert len(got) == len(ref) == 9
    for (a, b), (ra, rb) in zip(got, ref):
        np.testing.assert_array_equal(a, ra)
        np.testing.assert_array_equal(b, rb)
    assert not loader._knobs.depth.decisions   # the gate held the cap: no slot was forced
    assert ring.peak_leased == 2


def test_breaking_out_with_a_batch_behind_a_gate_leaves_nothing_queued(folder):
    loader = _loader(folder)
    for i, (x, _y) in enumerate(loader):
        if i == 2:
            break
    loader.close()
    del x, _y
    gc.collect()
    assert loader._arena_ring.num_leased == 0


def _poll(cond, polls: int = 600) -> bool:
    """Whether ``cond()`` came true within ``polls`` checks (a bound on polls, not a timing)."""
    ev = threading.Event()
    for _ in range(polls):
        if cond():
            return True
        ev.wait(0.05)
    return False


def test_the_next_epochs_first_batch_is_queued_behind_the_users_slot_before_the_epoch_ends(folder):
    """NOTE [ Warm slots ]: while the user still holds the epoch's second-to-last batch, the warm
    next epoch's first batch is queued behind that batch's slot (the epoch's last batch runs in
    the other one), so it starts when the user gives the slot back, as a batch mid-epoch does."""
    loader = _loader(folder, num_threads=1)
    it = iter(loader)
    got = []
    for k in range(8):   # batches 0..7 of 9; batch 7 is still held after the loop
        x, y = next(it)
        got.append((x.copy(), y.copy()))
    ring = loader._arena_ring   # made by the first next() (NOTE [ Lazy iter ])
    held = [_lease(x)]
    assert _poll(lambda: loader._warm.run is not None and not ring.can_follow(held[0])), \
        "the next epoch's first batch was not queued behind the slot the user holds"
    warm = loader._warm.run
    assert not warm.state.live.is_set()   # queued before the user asked for the next epoch
    assert ring.num_leased == 2           # in the user's slot: no third one
    held.clear()
    del x, y
    got += [(b.copy(), c.copy()) for b, c in it]
    got += [(b.copy(), c.copy()) for b, c in loader]   # the warm epoch
    ref = _loader(folder, num_threads=2, prefetch=2)
    want = [(b.copy(), c.copy()) for _ in range(2) for b, c in ref]
    assert len(got) == len(want) == 18
    for (a, b), (ra, rb) in zip(got, want):
        np.testing.assert_array_equal(a, ra)
        np.testing.assert_array_equal(b, rb)
    assert ring.peak_leased == 2 and not loader._knobs.depth.decisions


def test_the_next_epoch_starts_reading_once_this_epochs_reads_are_queued(folder):
    """NOTE [ Warm epochs ]: with a read-ahead that has queued the epoch's last reads (a fixed
    io_depth reaches the end of the stream batches before the last one is planned), the next
    epoch's run, and so its reads, start then, not only once every batch is planned."""
    loader = _loader(folder, num_threads=1, io_depth=8)
    it = iter(loader)
    early = None
    for k, (_x, _y) in enumerate(it):
        if early is None and loader._warm.run is not None:
            early = (k, it._run.state.exhausted)
    assert early is not None
    k, exhausted = early
    assert not exhausted, f"the next epoch started only at batch {k}, once every batch was planned"
    assert len(list(loader)) == 9


def test_a_consumer_keeping_batches_with_reads_ahead_gets_them_intact(folder):
    """A gated batch taken back (the consumer waits for it while holding the slot it follows)
    gives up the reads it had attached; queued again into a slot of its own, it reads those
    samples itself, and every kept batch is the uncapped loader's."""
    loader = _loader(folder, num_threads=1, io_depth=8)
    kept = list(loader)
    ref = [(b.copy(), c.copy()) for b, c in _loader(folder, num_threads=2, prefetch=2)]
    assert len(kept) == len(ref) == 9
    for (a, b), (ra, rb) in zip(kept, ref):
        np.testing.assert_array_equal(a, ra)
        np.testing.assert_array_equal(b, rb)
    assert any("keeps batches" in why for _, _, why in loader._knobs.depth.decisions)


def test_no_batch_is_gated_while_the_read_ahead_reads_ahead(folder, monkeypatch):
    """NOTE [ Batches in memory ]: a batch queued early attaches positions whose reads were not
    queued yet, which the kernel threads then read themselves; so while the read-ahead reads
    ahead (a fixed io_depth always does) no batch waits behind a gate, and the output is the
    uncapped loader's. A warm next epoch's first batches may still follow the slots of the
    epoch before (NOTE [ Warm slots ]; whether they do depends on timing): their reads were
    queued when the epoch before had issued its last ones, so only gates of a run's own slots
    count here."""
    from loaderlib._engines.native import NativeProducer

    gated: list[int] = []
    submit_after = NativeProducer.submit_after

    def counting(self, task, lease):
        if any(ref() is lease for ref in self._handed):   # a slot of this run's own batches
            gated.append(task.number)
        return submit_after(self, task, lease)

    monkeypatch.setattr(NativeProducer, "submit_after", counting)
    got = [(x.copy(), y.copy()) for _ in range(2) for x, y in _loader(folder, num_threads=1, io_depth=4)]
    assert gated == []
    ref = [(x.copy(), y.copy()) for _ in range(2) for x, y in _loader(folder, num_threads=1, prefetch=2)]
    assert len(got) == len(ref) > 0
    for (x, y), (rx, ry) in zip(got, ref):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
    gated.clear()
    for _ in range(2):
        for _b in _loader(folder, num_threads=1):   # warm local files are read inline: gated
            pass
    assert gated
