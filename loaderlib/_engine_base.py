"""The pieces every engine shares: the epoch plan, the prefetch queue, the driver thread.

NOTE [ Iterator state ]
Everything that belongs to one pass over the data lives in one :class:`_Run` object: the
epoch number and seed, the epoch's batches (a pure function of the sampler's seed and the
epoch, see NOTE [ Sampler order is a pure function ]), how many batches were produced and how
many were delivered to the user, the prefetch queue, the producer and its arena. The
iterator the user holds is a thin handle on it; the driver thread references the run, never
the handle, so dropping the handle (``break`` out of a loop) finalises the run: the driver
stops, its threads are joined and its slots return to the arena. Exact mid-epoch resume
restores ``(epoch, seed, delivered, carry)`` and skips the delivered batches.

NOTE [ Engine stages ]
An engine is a *producer* with three calls: ``submit(task)`` starts work on one batch of
indices and returns a handle, ``finish(handle)`` returns the finished batch (or None when
every sample was skipped), ``close()`` frees what it holds. The driver keeps
``producer.lookahead`` batches submitted, so the Python engines overlap the next batch's
samples with this batch's collation, and puts finished batches on the queue in order.

NOTE [ Batch wall time ]
The wall time a producer reports for a batch (the recorder turns it into pool capacity,
threads x wall, the denominator of the busy fraction) must not overlap the previous
batch's: with several batches in flight, "since this batch was submitted" counts the same
seconds twice and halves the busy fraction. The threads engine times each batch from the
previous batch's end (its sample stream restarts the clock there); the processes engine,
whose workers each hold batches, reports the time since the later of the batch's
submission and the previous batch's end (:func:`batch_wall`).
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import LoaderTimeoutError

_clock = time.perf_counter_ns


def batch_wall(start: int, previous_end: int, end: int) -> int:
    """A batch's wall time without the part that overlaps the previous batch's
    (NOTE [ Batch wall time ])."""
    return end - max(start, previous_end)


@dataclass
class _Task:
    number: int            # position of the batch in the epoch
    indices: np.ndarray    # int64 sample indices
    target: int            # samples the batch should hold (its size before any borrowing)


class _EpochPlan:
    """The epoch's batches and the cursor over them (see NOTE [ Iterator state ])."""

    def __init__(self, batches: list[np.ndarray]) -> None:
        self.batches = [np.asarray(b, dtype=np.int64).reshape(-1) for b in batches]
        self.sizes = [b.size for b in self.batches]
        self.next = 0
        self.lock = threading.Lock()

    def next_task(self) -> _Task | None:
        with self.lock:
            while self.next < len(self.batches):
                k = self.next
                self.next += 1
                if self.batches[k].size:
                    return _Task(k, self.batches[k], self.sizes[k])
            return None

    def borrow(self, count: int) -> np.ndarray:
        """Take up to ``count`` indices from the front of the batches not yet started.

        ``on_error="skip"`` fills a batch with these, so batch sizes hold; the epoch's last
        batch ends up shorter (or is dropped when empty). The native engine starts one batch
        at a time, so these are the very next samples; the processes engine has several
        batches at its workers, so its fill comes from the first batch not yet sent.
        """
        taken = []
        need = count
        with self.lock:
            k = self.next
            while need > 0 and k < len(self.batches):
                b = self.batches[k]
                take = b[:need]
                if take.size:
                    taken.append(take)
                    self.batches[k] = b[need:]
                    need -= take.size
                k += 1
        return np.concatenate(taken) if taken else np.zeros(0, np.int64)


class _Knobs:
    """Live settings shared by a loader and its running iterators."""

    def __init__(self, num_threads: int | None, prefetch: int) -> None:
        self.num_threads = num_threads
        self._prefetch = prefetch
        self._queues: weakref.WeakSet = weakref.WeakSet()

    @property
    def prefetch(self) -> int:
        return self._prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._prefetch = value
        for q in list(self._queues):
            q.wake()


_END = object()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _BatchQueue:
    """A FIFO whose capacity (``knobs.prefetch``) may change while it is in use."""

    def __init__(self, knobs: _Knobs, recorder: Any) -> None:
        self._knobs = knobs
        self._rec = recorder
        self._cond = threading.Condition()
        self._items: collections.deque = collections.deque()
        self._closed = False
        knobs._queues.add(self)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Any, force: bool = False) -> bool:
        """Append ``item``, waiting while the queue is full; False if the queue was closed."""
        t0 = 0
        with self._cond:
            while not force and not self._closed and len(self._items) >= max(1, self._knobs.prefetch):
                if not t0:
                    t0 = _clock()
                self._cond.wait(0.5)
            if self._closed:
                return False
            self._items.append(item)
            depth = len(self._items)
            self._cond.notify_all()
        if self._rec.enabled:
            if t0:
                self._rec.producer_blocked(_clock() - t0)
            self._rec.queue_depth(depth, max(1, self._knobs.prefetch))
        return True

    def get(self, timeout: float | None, what: str) -> Any:
        """The next item; LoaderTimeoutError after ``timeout`` seconds without one."""
        t0 = _clock()
        deadline = None if not timeout else time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if self._closed:
                    return _END
                if deadline is None:
                    self._cond.wait(0.5)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise LoaderTimeoutError(
                            f"no batch within timeout={timeout} s while waiting for {what}; a dataset, "
                            "transform or worker may be stuck (raise DataLoader(timeout=...) if batches "
                            "are just slow)")
                    self._cond.wait(min(left, 0.5))
            item = self._items.popleft()
            depth = len(self._items)
            self._cond.notify_all()
        if self._rec.enabled:
            self._rec.consumer_waited(_clock() - t0)
            self._rec.queue_depth(depth, max(1, self._knobs.prefetch))
        return item


class _Run:
    """One pass over the data (see NOTE [ Iterator state ])."""

    def __init__(self, *, epoch: int, seed: int, plan: _EpochPlan, producer: Any, knobs: _Knobs,
                 recorder: Any, timeout: float | None, total: int) -> None:
        self.epoch = epoch
        self.seed = seed
        self.plan = plan
        self.producer = producer
        self.knobs = knobs
        self.recorder = recorder
        self.timeout = timeout
        self.total = total
        self.delivered = 0
        self.queue = _BatchQueue(knobs, recorder)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.closed = False
        self.joined = False
        self.interrupted = False   # closed by a timeout or Ctrl-C: never wait for user code

    def start(self) -> None:
        self.thread = threading.Thread(target=_drive, args=(self,), name="loaderlib-driver", daemon=True)
        self.thread.start()

    def close(self, wait: bool = True) -> None:
        """Stop the pipeline. ``wait=False`` (after a timeout or Ctrl-C) only signals: a
        Python call that is running cannot be interrupted, so its threads end on their own;
        the iterator's finaliser joins them later."""
        if not self.closed:
            self.closed = True
            self.stop.set()
            self.queue.close()
            self.producer.close(wait=False)
        if wait and not self.joined:
            self.joined = True
            t = self.thread
            if t is not None and t is not threading.current_thread():
                t.join()
            if not self.interrupted:
                self.producer.close(wait=True)


def _drive(run: _Run) -> None:
    """Driver thread body: submit batches, finish them in order, queue them."""
    pending: collections.deque = collections.deque()
    try:
        while not run.stop.is_set():
            while len(pending) < run.producer.lookahead:
                task = run.plan.next_task()
                if task is None:
                    break
                pending.append(run.producer.submit(task))
            if not pending:
                break
            batch = run.producer.finish(pending.popleft())
            if batch is None:
                continue
            if not run.queue.put(batch):
                break
        run.queue.put(_END, force=True)
    except BaseException as e:  # noqa: BLE001 - delivered to the consumer, who raises it
        run.queue.put(_Failure(e), force=True)
    finally:
        for h in pending:
            try:
                run.producer.cancel(h)
            except Exception:  # noqa: BLE001, S110
                pass


class LoaderIterator:
    """Iterator over one epoch of a DataLoader (see NOTE [ Iterator state ])."""

    def __init__(self, run: _Run, owner: Any = None) -> None:
        self._run = run
        # ``for b in DataLoader(...)`` drops the loader at once: the iterator keeps it (and its
        # worker processes) alive. The loader refers back only weakly, so there is no cycle.
        self._owner = owner
        self._finalizer = weakref.finalize(self, _Run.close, run)

    def __iter__(self) -> LoaderIterator:
        return self

    def __len__(self) -> int:
        return max(0, self._run.total - self._run.delivered)

    @property
    def epoch(self) -> int:
        return self._run.epoch

    @property
    def delivered(self) -> int:
        """Batches handed to the user so far in this epoch."""
        return self._run.delivered

    def __next__(self) -> Any:
        run = self._run
        if run.closed:
            raise StopIteration
        try:
            item = run.queue.get(run.timeout, f"batch {run.delivered} of epoch {run.epoch}")
        except BaseException:
            # Timeout or Ctrl-C: stop the pipeline before the exception propagates, without
            # waiting for a Python call that may be the reason for the timeout.
            run.interrupted = True
            run.close(wait=False)
            raise
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            exc = item.exc
            try:
                raise exc
            finally:
                # The traceback holds this frame: drop the locals that would close a cycle
                # (exception -> traceback -> frame -> exception) and keep slots alive.
                exc = item = None
        run.delivered += 1
        return item

    def close(self) -> None:
        """Stop the pipeline: join its threads, stop its work and free its slots. Idempotent."""
        self._finalizer()
