"""The threads engine: Python samples on the loader's pool of daemon threads.

``ThreadsProducer`` loads ``dataset[i]`` on the pool and collates into the arena;
``HybridProducer`` runs a chain's native prefix as one kernel pass and its Python tail on the
pool. Both follow NOTE [ Engine stages ] in ``base.py``. ``PythonPool`` and its
``_DaemonThreadPool`` are the loader's one pool of Python threads (NOTE [ Stuck user code ]).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import queue
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _threads
from .._datasets.base import Dataset, at_epoch
from .._extract.readahead import ReadAhead, ReadTally, read_ahead_for
from .._extract.source import native_source_of
from .._observe.recorder import Recorder
from .._worker_info import WorkerInfo, set_thread_info, worker_seed
from ..arena import BatchArena
from .base import Produced, Producer, RunState, Task, _clock, _Knobs, _Stopped, annotate
from .collate import collate_recorded
from .native import NativeProducer


def describe_error(exc: BaseException) -> str:
    """How a skipped sample's error is reported (``loader.errors``)."""
    return f"{type(exc).__name__}: {exc}"



def _source(dataset: Any, i: int) -> str | None:
    """The dataset's name for sample ``i`` (its file or record key), if it has one."""
    src = getattr(dataset, "source", None)
    if callable(src):
        try:
            return src(int(i))
        except Exception:  # noqa: BLE001
            return None
    return None


class _InlineExecutor:
    """An executor that runs each call at once in the submitting thread (``num_threads=0``)."""

    def submit(self, fn: Callable, *args: Any) -> cf.Future:
        f: cf.Future = cf.Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to whoever reads the future
            f.set_exception(e)
        return f

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


class _DaemonThreadPool:
    """A fixed set of daemon threads running submitted calls in order.

    NOTE [ Stuck user code ]
    A ``dataset[i]`` or a Python transform may never return (a hung network mount). The
    standard ``ThreadPoolExecutor`` joins its threads when the interpreter exits, so one
    stuck call would keep a finished training script alive for ever. These threads are
    daemonic: after a timeout the loader stops waiting for them, and they never block exit.
    ``running`` holds each thread's call in progress, so a timeout can name the samples
    left behind (ThreadsProducer.timed_out warns with them).
    """

    def __init__(self, n: int, initializer: Callable[[], None] | None = None) -> None:
        self.running: dict[int, tuple] = {}   # thread ident -> (fn, args) of the call in progress
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._broken: BaseException | None = None
        self._threads = [threading.Thread(target=self._work, args=(initializer,), name=f"loaderlib-python-{k}",
                                          daemon=True) for k in range(n)]
        for t in self._threads:
            t.start()

    def _work(self, initializer: Callable[[], None] | None) -> None:
        _threads.name_native_thread(threading.current_thread().name.replace("loaderlib-", "ll-"))   # NOTE [ Thread names ]
        if initializer is not None:
            try:
                initializer()
            except BaseException as e:  # noqa: BLE001 - reported through every future of the pool
                self._broken = e
        while True:
            item = self._queue.get()
            if item is None:
                return
            f, fn, args = item
            if not f.set_running_or_notify_cancel():
                continue
            if self._broken is not None:
                f.set_exception(RuntimeError(f"worker_init_fn failed: {type(self._broken).__name__}: "
                                             f"{self._broken}"))
                continue
            me = threading.get_ident()
            self.running[me] = (fn, args)
            try:
                f.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to whoever reads the future
                f.set_exception(e)
            finally:
                self.running.pop(me, None)

    def submit(self, fn: Callable, *args: Any) -> cf.Future:
        if self._closed:
            raise RuntimeError("the loader's Python pool is closed")
        f: cf.Future = cf.Future()
        self._queue.put((f, fn, args))
        return f

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self._closed = True
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()


class PythonPool:
    """The loader's one pool of Python threads, shared by its runs (threads engine, Python
    tails after a native prefix).

    Sized from ``knobs.num_threads`` and resized between batches when it changes; with
    ``num_threads=0`` every call runs inline in the calling thread. Each pool thread is a
    worker in the sense of :func:`loaderlib.get_worker_info` and runs ``worker_init_fn``
    once with its id (NOTE [ Worker info ]).
    """

    def __init__(self, knobs: _Knobs, *, worker_init_fn: Callable | None, seed: int, dataset: Any) -> None:
        self.knobs = knobs
        self.worker_init_fn = worker_init_fn
        self.seed = seed
        self.dataset = dataset
        self._pool: _InlineExecutor | _DaemonThreadPool | None = None
        self._size = -1
        self._old: list[_InlineExecutor | _DaemonThreadPool] = []
        self._lock = threading.Lock()
        self.last_end = 0   # when the pool's previous batch finished (NOTE [ Batch wall time ])

    @property
    def size(self) -> int:
        """Threads of the current executor (0: inline)."""
        return max(self._size, 0)

    def executor(self, stop: threading.Event) -> _InlineExecutor | _DaemonThreadPool:
        """The executor for the next calls of a run whose stop event is ``stop``.

        Raises :class:`_Stopped` once ``stop`` is set: a run stopped without waiting (Ctrl-C,
        a timeout) may still be inside a step, and must not start a pool after
        :meth:`close` (NOTE [ No pool after close ]).
        """
        n = self.knobs.num_threads
        n = _threads.default_num_threads() if n is None else int(n)
        with self._lock:
            # NOTE [ No pool after close ]
            # close() runs after the run's stop is set (the iterator's finaliser stops the run,
            # then the loader closes the pool). Checked under the lock close() takes, a stopped
            # run can never create threads after close() has collected the pools: one driver
            # that did so left an idle pool thread alive for ever after Ctrl-C.
            if stop.is_set():
                raise _Stopped("the run stopped before asking for the Python pool")
            if self._pool is None or n != self._size:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)   # its queued samples still run
                    self._old.append(self._pool)
                if n == 0:
                    self._pool = _InlineExecutor()
                    if self.worker_init_fn is not None:
                        self.worker_init_fn(0)   # the calling thread is the one worker
                else:
                    self._pool = self._threaded(n)
                self._size = n
            return self._pool

    def _threaded(self, n: int) -> _DaemonThreadPool:
        counter = itertools.count()
        init, seed, dataset = self.worker_init_fn, self.seed, self.dataset

        def initializer() -> None:
            wid = next(counter)
            set_thread_info(WorkerInfo(wid, n, worker_seed(seed, wid), dataset))
            if init is not None:
                init(wid)

        return _DaemonThreadPool(n, initializer)   # NOTE [ Stuck user code ]

    def running_calls(self) -> list[tuple]:
        """``(fn, args)`` of every call a pool thread is running now."""
        with self._lock:
            pools = [self._pool, *self._old]
        return [c for p in pools for c in list(getattr(p, "running", {}).values())]

    def close(self, wait: bool = True) -> None:
        with self._lock:
            pools = [self._pool, *self._old]
            self._pool, self._old, self._size = None, [], -1
        for p in pools:
            if p is not None:
                p.shutdown(wait=wait, cancel_futures=True)


def result(f: cf.Future, stop: threading.Event) -> Any:
    """``f.result()``, giving up with :class:`_Stopped` once ``stop`` is set."""
    while True:
        try:
            return f.result(timeout=0.1)
        except cf.TimeoutError:
            if stop.is_set():
                raise _Stopped() from None
        except cf.CancelledError:
            raise _Stopped() from None   # only close() cancels samples


def _load(dataset: Any, i: int, timed: bool, ahead: tuple | None = None) -> tuple[Any, int, int]:
    """``dataset[i]`` and, when timed, its (read, python) nanoseconds.

    With ``ahead = (reader, position)`` the sample's bytes come from the read-ahead stage
    (NOTE [ Read-ahead for Python reads ]).

    NOTE [ Read or Python in a Python dataset ]
    A Python dataset is opaque: its ``__getitem__`` may wait on storage or compute. Its
    transform layers (``.transform``/``.transform_first`` functions) are Python work and are
    timed as "python". The innermost ``__getitem__`` is split by this thread's CPU time:
    time spent on the CPU (Python, or native code it calls) is "python", time off the CPU
    (blocked in reads, sleeps, network) is "read". Off-CPU time also includes waiting for
    the GIL, so a GIL-bound dataset over-reports "read"; the verdict cross-checks the cores
    actually used.
    """
    if ahead is not None:
        return _load_ahead(dataset, i, timed, *ahead)
    if not timed:
        return dataset[i], 0, 0
    base, layers = dataset.unwrap() if isinstance(dataset, Dataset) else (dataset, [])
    t0 = _clock()
    c0 = time.thread_time_ns()
    item = base[i]
    cpu = time.thread_time_ns() - c0
    t1 = _clock()
    for layer in layers:
        item = layer.apply(item)
    wall = t1 - t0
    cpu = min(cpu, wall)
    return item, wall - cpu, cpu + (_clock() - t1)


def _load_ahead(dataset: Any, i: int, timed: bool, reader: ReadAhead, position: int,
                tally: ReadTally | None = None) -> tuple[Any, int, int]:
    """``dataset[i]`` built from bytes the read-ahead stage fetched, and its (read, python) ns.

    NOTE [ Read-ahead for Python reads ]
    A dataset of ours (its native source reads files or byte ranges) under a Python transform
    runs on the threads engine, each pool thread reading its sample with ``dataset[i]``: as
    many reads in flight as threads, as in the kernels before the read-ahead stage. Here the
    producer queues the samples' reads on a read-ahead stage (NOTE [ Read-ahead ] in
    include/ll_readahead.h) as it submits them, and the pool thread takes the bytes of its
    sample (waiting without the GIL if they have not arrived), then builds the item with the
    dataset's own ``item_from_bytes`` and applies the transform layers: the same item as
    ``dataset[i]``. A sample whose read was never queued (the slots were full) is read by
    ``dataset[i]`` as before. The wait is the sample's "read" time.
    A sample read here with the dataset's ``read(i)`` is timed and counted in the run's
    ``tally`` (NOTE [ Every read counts ] in ``pyx/include/ll_readahead.h``), its time being
    the sample's "read" time too.
    """
    base, layers = dataset.unwrap() if isinstance(dataset, Dataset) else (dataset, [])
    d = int(reader.src.data_index(np.asarray([i]))[0])
    data, waited = reader.take(int(position), reader.timeout)
    if data is None and callable(getattr(base, "read", None)):
        t0 = _clock()
        data = base.read(d)
        dt = _clock() - t0
        waited += dt
        if tally is not None:
            tally.add(len(data), dt)
    t1 = _clock()
    item = base[d] if data is None else base.item_from_bytes(d, data)
    for layer in layers:
        item = layer.apply(item)
    if not timed:
        return item, 0, 0
    return item, waited, _clock() - t1


class ThreadsProducer(Producer):
    """Samples loaded by ``dataset[i]`` on the loader's Python pool; collation into the arena.

    Good when the Python code releases the GIL (OpenCV, numpy, loaderlib's own decoder and
    transforms called on one image).
    """

    lookahead = 2

    def __init__(self, *, dataset: Any, batchify_fn: Any, arena: BatchArena, pool: PythonPool, recorder: Recorder,
                 on_error: str, state: RunState, io_depth: int | None = 0, batch_size: int = 1,
                 timeout: float | None = None, read_budget: int | None = None, read_hint: dict | None = None) -> None:
        super().__init__(state=state, recorder=recorder, on_error=on_error)
        dataset = at_epoch(dataset, state.epoch, state.seed)   # NOTE [ Datasets that change with the epoch ]
        self.dataset = dataset
        self.reader: ReadAhead | None = None   # NOTE [ Read-ahead for Python reads ] (_load_ahead)
        self.tally = ReadTally()                # reads not read ahead (NOTE [ Every read counts ])
        base = dataset.unwrap()[0] if isinstance(dataset, Dataset) else dataset
        src = native_source_of(base)
        if callable(getattr(base, "item_from_bytes", None)):   # files, ranges, or a store's samples
            self.reader = read_ahead_for(src, state.order.stream, io_depth=io_depth, batch_size=batch_size,
                                         lookahead=self.lookahead, timeout=timeout, budget_bytes=read_budget,
                                         start=state.cursor, hint=read_hint)
        self.batchify_fn = batchify_fn
        self.arena = arena
        self.pool = pool
        self._stream: collections.deque = collections.deque()   # (index, position, future)
        self._futures: set = set()
        self._stream_t0 = 0

    # NOTE [ Sample stream ]: submitted samples form one ordered stream across batches, and
    # each batch takes the next ``target`` samples that load successfully. Without failures
    # that is exactly the task's indices; with on_error="skip" a batch is filled from the
    # next samples in order (already running ones first), so batch sizes hold and only the
    # epoch's last batch comes out shorter (NOTE [ The epoch is one stream ]).

    def _submit_indices(self, indices: np.ndarray, start: int) -> None:
        ex = self.pool.executor(self.state.stop)
        timed = self.rec.enabled
        reader = self.reader
        if reader is not None:
            reader.top_up()
        for j, i in enumerate(indices.tolist()):
            ahead = (reader, start + j, self.tally) if reader is not None else None
            self._stream.append((i, start + j, ex.submit(_load, self.dataset, i, timed, ahead)))

    def submit(self, task: Task) -> Task:
        if not self._stream_t0:
            self._stream_t0 = _clock()
        self._submit_indices(task.indices, task.start)
        return task

    def cancel(self, handle: Any) -> None:
        while self._stream:
            self._stream.popleft()[2].cancel()

    def finish(self, task: Task) -> Produced | None:
        # Not before the pool's previous batch ended, whichever run made it (NOTE [ Batch wall time ]).
        t0 = max(self._stream_t0 or _clock(), self.pool.last_end)
        nthreads = max(1, self.pool.size)
        samples: list = []
        python_ns = read_ns = 0
        end = task.start
        while len(samples) < task.target:
            if not self._stream:
                # on_error="skip" only: fill from the next batch, or from the stream's tail
                # that ends no batch (last_batch="discard").
                more = self.state.next_task()
                idx, start = (more.indices, more.start) if more is not None else self.state.take(
                    task.target - len(samples))
                if not idx.size:
                    break
                self._submit_indices(idx, start)
            i, pos, f = self._stream.popleft()
            end = pos + 1
            try:
                item, dt_read, dt = result(f, self.state.stop)
            except _Stopped:
                raise
            except Exception as e:  # noqa: BLE001
                if self.on_error == "raise":
                    self.cancel(None)
                    raise annotate(e, i, _source(self.dataset, i), "threads")
                self.skipped(i, _source(self.dataset, i), describe_error(e))
                continue
            samples.append(item)
            read_ns += dt_read
            python_ns += dt
        self._stream_t0 = _clock() if self._stream else 0
        if self.reader is not None:
            self.reader.adapt(nthreads)
            self.reader.top_up()
            if self.rec.enabled:
                self.rec.extract(self.tally.merged(self.reader.counters()))
        batch = collate_recorded(self.batchify_fn, samples, self.arena, self.rec,
                                 {"read": read_ns, "python": python_ns}, t0, nthreads)
        self.pool.last_end = max(self.pool.last_end, _clock())
        return None if batch is None else Produced(batch, end, len(samples), task.target)

    def timed_out(self) -> str | None:
        # NOTE [ Stuck user code ]: a call that never returns cannot be interrupted; name it.
        stuck = sorted(args[1] for fn, args in self.pool.running_calls() if fn is _load)
        if not stuck:
            return None
        named = ", ".join(f"{i}" + (f" ({src!r})" if (src := _source(self.dataset, i)) else "") for i in stuck[:10])
        msg = (f"dataset[i] is still running for sample{'s' if len(stuck) > 1 else ''} {named}{' and more' if len(stuck) > 10 else ''}; it is "
               "left on a daemon thread, which cannot be interrupted and does not keep the interpreter from exiting")
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        return msg

    def close(self, wait: bool = True) -> None:
        self.cancel(None)
        if self.reader is not None:
            self.reader.close(wait=wait)   # NOTE [ Closing the read-ahead ] in pyx/include/ll_readahead.h


def python_tail(item: Any, suffix: Any, position: int, others: list, seed: int, epoch: int, index: int) -> Any:
    """A native sample through the chain's Python tail: ``suffix`` (a transforms.Compose, or None)
    on its image with the sample's keyed randomness, then the whole-sample ``.transform(fn)``
    layers, innermost first. Shared by the threads engine and worker processes."""
    if suffix is not None:
        img = suffix(item[0] if isinstance(item, tuple) else item, seed=seed, epoch=epoch, index=index,
                     position=position)
        item = (img, *item[1:]) if isinstance(item, tuple) else img
    for fn in others:
        item = fn(*item) if isinstance(item, tuple) else fn(item)
    return item


class HybridProducer(Producer):
    """Native samples, Python after them: the threads engine when only the tail is Python.

    Each batch's samples are read, decoded and transformed by the fused native prefix of the
    chain in one kernel pass (into an arena slot); the Python suffix of the chain (and any
    ``.transform(fn)`` on whole samples) then runs per sample on the loader's Python pool, and
    the batch is collated with the batchify function. Loaderlib transforms in the suffix get
    the same keyed randomness they would have in a fused chain.
    """

    lookahead = 1

    def __init__(self, *, native: NativeProducer, suffix: Any, suffix_position: int, others: list,
                 batchify_fn: Any, arena: BatchArena, pool: PythonPool, recorder: Recorder, on_error: str,
                  state: RunState) -> None:
        super().__init__(state=state, recorder=recorder, on_error=on_error)
        self.native = native
        self.suffix = suffix                    # a transforms.Compose of the Python tail, or None
        self.suffix_position = suffix_position  # transform position of its first step
        self.others = others                    # whole-sample functions, innermost first
        self.batchify_fn = batchify_fn
        self.arena = arena
        self.pool = pool
        self.reader = native.reader   # the native prefix's read-ahead stage

    def _tail(self, item: Any, index: int) -> tuple[Any, int]:
        t0 = _clock()
        item = python_tail(item, self.suffix, self.suffix_position, self.others, self.state.seed,
                           self.state.epoch, index)
        return item, _clock() - t0

    def finish(self, task: Task) -> Produced | None:
        t0 = _clock()
        samples: list = []
        python_ns = 0
        stage = {"read": 0, "decode": 0, "transform": 0}
        todo, need, end = task.indices, task.target, task.start + task.indices.size
        nthreads = 1
        src = self.native.src
        while need > 0 and todo.size:
            res = self.native.produce(todo, need, end)
            if res is None:
                break
            arrays, sel, st, _rows, nthreads, _wall, end = res
            for k in stage:
                stage[k] += st.get(k, 0)
            ex = self.pool.executor(self.state.stop)
            items = [(arrays[0][j], int(arrays[1][j])) if len(arrays) > 1 else arrays[0][j] for j in range(len(sel))]
            futs = [ex.submit(self._tail, it, int(i)) for it, i in zip(items, sel.tolist())]
            for i, f in zip(sel.tolist(), futs):
                try:
                    item, dt = result(f, self.state.stop)
                except _Stopped:
                    raise
                except Exception as e:  # noqa: BLE001 - user code: reported or skipped per on_error
                    if self.on_error == "raise":
                        for g in futs:
                            g.cancel()
                        raise annotate(e, i, src.source(i), "threads")
                    self.skipped(i, src.source(i), describe_error(e))
                    continue
                samples.append(item)
                python_ns += dt
            need = task.target - len(samples)
            if need > 0 and self.on_error == "skip":
                todo, start = self.state.take(need)
                end = start + todo.size
            else:
                todo = todo[:0]
        batch = collate_recorded(self.batchify_fn, samples, self.arena, self.rec, {**stage, "python": python_ns},
                                 t0, max(nthreads, self.pool.size))
        return None if batch is None else Produced(batch, end, len(samples), task.target)

    def continue_from(self, before: Producer) -> None:
        if isinstance(before, HybridProducer):   # NOTE [ One team across epochs ] in native.py
            self.native.continue_from(before.native)

    def close(self, wait: bool = True) -> None:
        self.native.close(wait=wait)

