"""DataLoader arguments, engine choice, and the Python (threads) engine on small arrays."""

import _thread
import gc
import threading
import time

import numpy as np
import pytest

import loaderlib as ll
from loaderlib import DataLoader
from loaderlib.batchify import Pad, Stack, Tuple
from loaderlib.datasets import ArrayDataset, SimpleDataset


def _xy(n=50):
    x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    y = np.arange(n, dtype=np.int64) * 10
    return x, y


def _wait_threads(before, timeout=30.0):
    """Threads started since ``before`` (a set of threads) that are still alive after up to
    ``timeout`` seconds of waiting for them to end (a bound, not a timing assertion)."""
    end = time.monotonic() + timeout
    while True:
        new = [t for t in threading.enumerate() if t not in before]
        if not new or time.monotonic() >= end:
            return new
        time.sleep(0.01)


@pytest.mark.parametrize("python_step", [False, True])
def test_batches_equal_array_slices(python_step):
    x, y = _xy()
    ds = ArrayDataset(x, y)
    if python_step:
        ds = ds.transform(lambda a, b: (a, b))
    loader = DataLoader(ds, batch_size=16, num_threads=2)
    assert loader.engine == ("threads" if python_step else "native")
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    for k, (a, b) in enumerate(batches):
        np.testing.assert_array_equal(a, x[16 * k:16 * (k + 1)])
        np.testing.assert_array_equal(b, y[16 * k:16 * (k + 1)])
        assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous


def test_last_batch_modes_and_len():
    x, y = _xy(10)
    ds = ArrayDataset(x, y)
    assert len(DataLoader(ds, batch_size=4)) == 3
    assert [len(b[1]) for b in DataLoader(ds, batch_size=4)] == [4, 4, 2]
    assert [len(b[1]) for b in DataLoader(ds, batch_size=4, last_batch="discard")] == [4, 4]
    assert [len(b[1]) for b in DataLoader(ds, batch_size=4, drop_last=True)] == [4, 4]
    loader = DataLoader(ds, batch_size=4, last_batch="rollover")
    e0 = [(b[1] // 10).tolist() for b in loader]
    e1 = [(b[1] // 10).tolist() for b in loader]
    assert e0 == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert e1 == [[8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]   # 2 carried + 10
    assert len(loader) == 2    # nothing carried now
    e2 = [(b[1] // 10).tolist() for b in loader]
    assert e2 == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(loader) == 3    # (2 carried + 10) // 4


def test_shuffle_every_sample_once_and_differs_by_epoch():
    x, y = _xy(100)
    for ds in (ArrayDataset(x, y), ArrayDataset(x, y).transform(lambda a, b: (a, b))):
        loader = DataLoader(ds, batch_size=7, shuffle=True, seed=11)
        epochs = [np.concatenate([b[1] for b in loader]) // 10 for _ in range(2)]
        for e in epochs:
            assert sorted(e.tolist()) == list(range(100))
        assert epochs[0].tolist() != epochs[1].tolist()
        # the same seed gives the same orders
        again = DataLoader(ds, batch_size=7, shuffle=True, seed=11)
        assert (np.concatenate([b[1] for b in again]) // 10).tolist() == epochs[0].tolist()


def test_conflicting_arguments():
    ds = ArrayDataset(*_xy(10))
    bs = ll.BatchSampler(ll.SequentialSampler(10), 3)
    with pytest.raises(ValueError, match="drop_last=True conflicts with last_batch='keep'"):
        DataLoader(ds, batch_size=2, drop_last=True, last_batch="keep")
    with pytest.raises(ValueError, match="batchify_fn and collate_fn"):
        DataLoader(ds, batch_size=2, batchify_fn=Stack(), collate_fn=Pad())
    with pytest.raises(ValueError, match="batch_size, shuffle"):
        DataLoader(ds, batch_size=2, shuffle=True, batch_sampler=bs)
    with pytest.raises(ValueError, match="shuffle=True conflicts with sampler"):
        DataLoader(ds, batch_size=2, shuffle=True, sampler=ll.SequentialSampler(10))
    with pytest.raises(ValueError, match="batch_size is required"):
        DataLoader(ds)
    with pytest.raises(ValueError, match="on_error"):
        DataLoader(ds, batch_size=2, on_error="ignore")
    with pytest.raises(ValueError, match="last_batch"):
        DataLoader(ds, batch_size=2, last_batch="drop")
    # aliases that agree are fine
    assert len(DataLoader(ds, batch_size=3, drop_last=True, last_batch="discard")) == 3
    assert len(DataLoader(ds, batch_sampler=bs)) == 4


def test_collate_fn_alias_and_plain_sequences():
    data = [(np.full(3, i), i) for i in range(9)]
    loader = DataLoader(data, batch_size=4, collate_fn=lambda s: [t[1] for t in s])
    assert loader.engine == "threads"
    assert list(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]

    class Seq:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return i * i

    assert [b.tolist() for b in DataLoader(Seq(), batch_size=2)] == [[0, 1], [4, 9], [16]]
    assert [b.tolist() for b in DataLoader(iter(range(3)), batch_size=2)] == [[0, 1], [2]]


def test_pad_and_tuple_batchify_threads():
    data = SimpleDataset([(np.arange(n), n) for n in (1, 3, 2, 5)])
    loader = DataLoader(data, batch_size=2, batchify_fn=Tuple(Pad(val=-1), Stack()))
    (a0, _l0), (a1, l1) = list(loader)
    np.testing.assert_array_equal(a0, [[0, -1, -1], [0, 1, 2]])
    np.testing.assert_array_equal(a1, [[0, 1, -1, -1, -1], [0, 1, 2, 3, 4]])
    assert l1.tolist() == [2, 5]


def test_stack_num_shards_native():
    x, y = _xy(12)
    loader = DataLoader(ArrayDataset(x, y), batch_size=6, batchify_fn=Tuple(Stack(num_shards=2), Stack()))
    assert loader.engine == "native"
    shards, _labels = next(iter(loader))
    assert len(shards) == 2 and [len(s) for s in shards] == [3, 3]
    np.testing.assert_array_equal(np.concatenate(shards), x[:6])
    assert all(np.shares_memory(s, shards.batch) for s in shards)


def test_explain_names_python_stage():
    ds = ArrayDataset(*_xy(4)).transform(lambda a, b: (a, b))
    text = DataLoader(ds, batch_size=2).explain()
    assert "engine: threads" in text and "python" in text
    text = DataLoader(ArrayDataset(*_xy(4)), batch_size=2).explain()
    assert text.startswith("engine: native")


def test_python_error_propagates_with_type_and_index():
    def bad(a, b):
        if b == 130:
            raise KeyError("no such thing")
        return a, b

    loader = DataLoader(ArrayDataset(*_xy(30)).transform(bad), batch_size=4, timeout=20)
    with pytest.raises(KeyError, match="no such thing") as info:
        for _ in loader:
            pass
    assert info.value.sample_index == 13
    assert "sample 13" in "".join(getattr(info.value, "__notes__", []))


def test_on_error_skip_fills_batches():
    def bad(a, b):
        if b in (30, 70):
            raise ValueError("broken sample")
        return a, b

    loader = DataLoader(ArrayDataset(*_xy(20)).transform(bad), batch_size=4, on_error="skip")
    labels = [b[1] // 10 for b in loader]
    assert [len(lab) for lab in labels] == [4, 4, 4, 4, 2]
    flat = np.concatenate(labels).tolist()
    assert flat == [i for i in range(20) if i not in (3, 7)]
    assert [(e.index, e.reason) for e in loader.errors] == [(3, "ValueError: broken sample"),
                                                           (7, "ValueError: broken sample")]


def test_timeout_bounds_the_wait():
    release = threading.Event()

    def stuck(a, b):
        release.wait(120)   # a sample that would block far longer than the timeout
        return a, b

    before = set(threading.enumerate())
    loader = DataLoader(ArrayDataset(*_xy(4)).transform(stuck), batch_size=2, timeout=0.3, num_threads=1)
    t0 = time.monotonic()
    with pytest.raises(ll.LoaderTimeoutError, match="timeout=0.3"):
        next(iter(loader))
    waited = time.monotonic() - t0
    release.set()
    assert waited < 60   # not a timing check: without the timeout this would wait for 120 s
    gc.collect()
    assert _wait_threads(before, 10) == []


def test_stopped_run_cannot_restart_the_python_pool():
    # The race behind a pool thread that outlived Ctrl-C: the interrupted run's driver, not
    # joined, asked for the executor after the loader had closed the pool and so started a
    # new one that nobody closed (NOTE [ No pool after close ]).
    from loaderlib._engines.threads import PythonPool, _Stopped
    from loaderlib.loader import _Knobs

    before = set(threading.enumerate())
    pool = PythonPool(_Knobs(2, 2), worker_init_fn=None, seed=0, dataset=None)
    running, stopped = threading.Event(), threading.Event()
    assert pool.executor(running).submit(lambda: 7).result() == 7
    stopped.set()
    pool.close()
    with pytest.raises(_Stopped, match="run stopped"):
        pool.executor(stopped)
    assert _wait_threads(before) == []
    assert pool.executor(running).submit(lambda: 8).result() == 8   # a later run may start it again
    pool.close()
    assert _wait_threads(before) == []


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test: ``_thread.interrupt_main`` does nothing while
    SIGINT is ignored, which is how a process started in the background by a
    non-interactive shell (a CI step's ``cmd &``) inherits it; Python then keeps it ignored."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.mark.usefixtures("python_sigint")
def test_a_ctrl_c_that_lands_in_a_batch_release_is_not_lost():
    """Dropping a batch ends its slot lease, whose release wakes the driver from Python (the
    arena's ``on_release``), inside a dealloc, where an exception cannot propagate. A Ctrl-C
    that arrives during that call must reach the user's loop all the same (NOTE [ Ctrl-C inside
    a slot's release ] in pyx/_arena.pyx): here it arrives at the start of the call."""
    loader = DataLoader(ArrayDataset(*_xy(40)), batch_size=2, num_threads=1)
    it = iter(loader)
    batch = next(it)
    later = next(it)   # the iterator lets go of the batch before: this frame holds it alone
    ring = loader._arena_ring
    wake = ring.on_release
    assert wake is not None   # the release runs Python code
    calls = []

    def wake_during_ctrl_c():
        calls.append(1)
        if len(calls) == 1:
            _thread.interrupt_main()   # one press, handled right here, inside the release
        wake()

    ring.on_release = wake_during_ctrl_c
    try:
        with pytest.raises(KeyboardInterrupt, match=r"^$"):
            del batch   # its lease ends here, on this thread
            for _ in range(1000):   # a loop's backward jump handles a pending interrupt
                pass
    finally:
        ring.on_release = wake
    assert calls == [1]   # the press landed in the release
    del later
    it.close()
    loader.close()


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_stops_cleanly():
    # Where the interrupt lands (the loader's wait, or between two batches) varies from run to
    # run; either way no thread may outlive the dropped iterator.
    def slow(a, b):
        time.sleep(0.2)
        return a, b

    before = set(threading.enumerate())
    loader = DataLoader(ArrayDataset(*_xy(40)).transform(slow), batch_size=2, num_threads=1, timeout=30)
    it = iter(loader)
    next(it)   # the pipeline is running: the interrupt cannot land inside iter() itself
    # A press that lands in a slot's release is raised again (NOTE [ Ctrl-C inside a slot's
    # release ]); one that lands in another finaliser is printed and dropped by Python, as a
    # user's first Ctrl-C can be: press again until one lands.
    stopped = threading.Event()

    def press():
        while not stopped.wait(0.3):
            _thread.interrupt_main()

    presser = threading.Thread(target=press)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt, match=r"^$"):
            for _ in it:
                pass
    finally:
        stopped.set()
        presser.join()
    try:   # a press between the catch and stopped.set() is still pending: take it here
        for _ in range(1000):
            pass
    except KeyboardInterrupt:
        pass
    # Wherever the interrupt landed (in the loader's wait or between two batches), dropping
    # the iterator stops its driver and the loader's Python threads.
    del it
    gc.collect()
    assert _wait_threads(before) == []


@pytest.mark.parametrize("python_step", [False, True])
def test_abandoned_iterators_leave_no_threads(python_step):
    before = set(threading.enumerate())
    ds = ArrayDataset(*_xy(200))
    if python_step:
        ds = ds.transform(lambda a, b: (a, b))
    loader = DataLoader(ds, batch_size=4, num_threads=2, prefetch=3)
    for _ in range(5):
        for _batch in loader:
            break
    it = iter(loader)
    next(it)
    del it, _batch
    gc.collect()
    assert _wait_threads(before) == []


def test_kept_batches_never_overwritten():
    x, y = _xy(64)
    ds = ArrayDataset(x, y).transform(lambda a, b: (a + 0, b))
    for loader in (DataLoader(ArrayDataset(x, y), batch_size=4, prefetch=2),
                   DataLoader(ds, batch_size=4, prefetch=2)):
        kept = [b for b in loader]
        for k, (a, b) in enumerate(kept):
            np.testing.assert_array_equal(a, x[4 * k:4 * k + 4])
            np.testing.assert_array_equal(b, y[4 * k:4 * k + 4])


def test_two_loaders_in_lockstep():
    x, y = _xy(40)
    l1 = DataLoader(ArrayDataset(x, y), batch_size=5)
    l2 = DataLoader(ArrayDataset(x * 2, y + 1).transform(lambda a, b: (a, b)), batch_size=5)
    for k, ((a1, b1), (a2, b2)) in enumerate(zip(l1, l2)):
        np.testing.assert_array_equal(a1, x[5 * k:5 * k + 5])
        np.testing.assert_array_equal(a2, 2 * x[5 * k:5 * k + 5])
        np.testing.assert_array_equal(b2, y[5 * k:5 * k + 5] + 1)
    assert k == 7


def test_settings_change_while_iterating():
    x, y = _xy(60)
    loader = DataLoader(ArrayDataset(x, y).transform(lambda a, b: (a, b)), batch_size=3, num_threads=1, prefetch=1)
    out = []
    for k, (a, b) in enumerate(loader):
        if k == 2:
            loader.num_threads = 2
            loader.prefetch = 4
        out.append(b)
    assert loader.num_threads == 2 and loader.prefetch == 4
    np.testing.assert_array_equal(np.concatenate(out), y)
    with pytest.raises(ValueError):
        loader.prefetch = 0


def test_sharded_sampler_bound_by_loader():
    x, y = _xy(10)
    counts = []
    for k in range(3):
        loader = DataLoader(ArrayDataset(x, y), batch_size=2, sampler=ll.ShardedSampler(3, k))
        counts.append(len(list(loader)))
    assert counts == [2, 2, 2]


def test_stats_recorded_when_profiling():
    loader = DataLoader(ArrayDataset(*_xy(20)).transform(lambda a, b: (a, b)), batch_size=5, profile=True)
    list(loader)
    assert loader.stats.samples == 20
    assert loader.stats.batches == 4


def test_threads_engine_steady_state_allocates_no_arena_memory():
    from loaderlib.arena import arena_counters

    x, y = _xy(64)
    loader = DataLoader(ArrayDataset(x, y).transform(lambda a, b: (a, b)), batch_size=8, prefetch=2)

    def batches():
        while True:
            yield from loader

    stream = batches()
    for _ in range(16):
        next(stream)
    before = arena_counters()
    for _ in range(200):
        _a, b = next(stream)
    np.testing.assert_array_equal(b, y[(200 + 16 - 1) % 8 * 8:][:8])
    after = arena_counters()
    # Process-wide counters: other tests' loaders may free memory meanwhile, never allocate.
    assert (after["allocations"], after["bytes_allocated"]) == (before["allocations"], before["bytes_allocated"])
