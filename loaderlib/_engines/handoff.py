"""What passes from a run's driver to its consumer: the prefetch queue, its end and failure
markers, and the recorder front of a warm run (split from ``base.py``, which drives runs)."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from .._observe.recorder import Recorder
from ..errors import LoaderTimeoutError

_clock = time.perf_counter_ns


class HeldRecorder:
    """A recorder front that holds a warm run's records until the run is handed to the user.

    A warm next epoch (NOTE [ Warm epochs ] in ``loader.py``) produces batches while the
    current epoch is still being consumed; its records belong to the next epoch's stats, so
    they are kept here and replayed into the loader's recorder by :meth:`release`, right
    after that epoch is started.
    """

    def __init__(self, recorder: Recorder) -> None:
        self._rec = recorder
        self._held: list = []
        self._live = False
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._rec.enabled

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._rec, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                if not self._live:
                    self._held.append((name, args, kwargs))
                    return None
            return target(*args, **kwargs)

        return call

    def release(self) -> None:
        with self._lock:
            held, self._held, self._live = self._held, [], True
            for name, args, kwargs in held:
                getattr(self._rec, name)(*args, **kwargs)


_END = object()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _BatchQueue:
    """A FIFO whose capacity (``knobs.prefetch``) may change while it is in use."""

    def __init__(self, knobs: Any, recorder: Recorder) -> None:
        self._knobs = knobs
        self._rec = recorder
        self._cond = threading.Condition()
        self._items: collections.deque = collections.deque()
        self._closed = False
        self.waiting = False    # the consumer waits in get() on an empty queue
        self.last_wait_ns = 0   # how long the last get() waited
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

    def full(self) -> bool:
        """A :meth:`put` now would wait for the consumer."""
        return len(self._items) >= max(1, self._knobs.prefetch)

    def put(self, item: object, force: bool = False) -> bool:
        """Append ``item`` (a :class:`Produced`, a ``_Failure`` or ``_END``), waiting while the
        queue is full; False if the queue was closed."""
        t0 = 0
        with self._cond:
            while not force and not self._closed and len(self._items) >= max(1, self._knobs.prefetch):
                if not t0:
                    t0 = _clock()
                self._cond.wait(0.5)
            if self._closed:
                return False
            self._items.append(item)
            self.waiting = False
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
                if not self.waiting:
                    self.waiting = True
                    d = getattr(self._knobs, "depth", None)
                    if d is not None:
                        d.wake()   # a driver waiting at the batch cap decides again (NOTE [ Batches in memory ])
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
            self.waiting = False
            item = self._items.popleft()
            depth = len(self._items)
            self._cond.notify_all()
        self.last_wait_ns = _clock() - t0
        if self._rec.enabled:
            self._rec.consumer_waited(self.last_wait_ns)
            self._rec.queue_depth(depth, max(1, self._knobs.prefetch))
        return item
