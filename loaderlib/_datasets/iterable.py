"""Iterable datasets: consumed lazily, one batch at a time, sharded across ranks.

NOTE [ Iterable shards ]
An iterable (a generator, a ``torch.utils.data.IterableDataset``, any object with
``__iter__`` but no ``__getitem__``/``__len__``) is never materialised: each batch pulls its
items from the iterator when it is made, so an infinite stream yields its first batch at
once. Across ranks every rank reads the stream and keeps one item of every *round* of
``world_size`` consecutive items (rank ``r`` keeps the ``r``-th), so the ranks' items are
disjoint and their union is the stream. A final partial round is handled like
``DistributedSampler``'s remainder: ``last_batch="discard"`` (``drop_last=True``) drops it on
every rank; otherwise it is padded by wrapping around to the first items of the stream. So
every rank gets the same number of items, hence the same number of batches, and a collective
never waits for a rank that ran out.

Resume needs an iterable that can say where it is: one with ``state_dict()`` and
``load_state_dict(state)`` (torchdata's Stateful protocol). Its state is taken after each
batch is made and stored with the batch; the loader's state holds the snapshot of the last
batch delivered, and loading it calls ``load_state_dict`` before the next ``iter()``. Other
iterables raise :class:`~loaderlib.StateError` from ``state_dict()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._engines.base import Produced, Producer, RunState, Task, _clock
from ..errors import StateError

__all__ = ["IterableProducer", "IterableRunState", "RankStride", "default_rank", "is_iterable_dataset",
           "is_stateful"]


def is_iterable_dataset(obj: Any) -> bool:
    """Whether ``obj`` is consumed by iteration (not by index)."""
    if any(c.__name__ == "IterableDataset" and c.__module__.startswith("torch") for c in type(obj).__mro__):
        return True
    return hasattr(obj, "__iter__") and not (hasattr(obj, "__len__") and hasattr(obj, "__getitem__"))


def is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def default_rank() -> tuple[int, int]:
    """``(rank, world_size)``: from an initialised ``torch.distributed``, else the ``RANK`` and
    ``WORLD_SIZE`` variables torchrun sets, else ``(0, 1)``."""
    try:
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001, S110 - torch half-initialised: fall back to the environment
        pass
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(f"RANK and WORLD_SIZE must be integers, got {os.environ.get('RANK')!r} and "
                         f"{os.environ.get('WORLD_SIZE')!r}") from None


class RankStride:
    """Rank ``rank``'s share of an iterator (NOTE [ Iterable shards ])."""

    def __init__(self, it: Iterator, rank: int, world_size: int, pad: bool) -> None:
        self.it = it
        self.rank = rank
        self.world = world_size
        self.pad = pad

    def __iter__(self) -> Iterator:
        if self.world == 1:
            yield from self.it
            return
        first: list = []     # the stream's first items: what a partial last round wraps to
        while True:
            round_ = []
            for item in self.it:
                round_.append(item)
                if len(first) < self.world:
                    first.append(item)
                if len(round_) == self.world:
                    break
            if len(round_) == self.world:
                yield round_[self.rank]
                continue
            if round_ and self.pad:
                padded = (round_ + first * self.world)[:self.world]
                yield padded[self.rank]
            return


class _IterOrder:
    """The part of an epoch order an iterable run has: whether short batches are dropped."""

    def __init__(self, epoch: int, drop_short: bool) -> None:
        self.epoch = epoch
        self.drop_short = drop_short
        self.key: dict = {}
        self.carry_in = np.zeros(0, np.int64)
        self.carry_out = np.zeros(0, np.int64)
        self.targets: list = []
        self.stream = np.zeros(0, np.int64)


class IterableRunState(RunState):
    """The run state of an iterable epoch: batches are cut from items as they arrive.

    ``position`` counts this rank's items consumed by delivered batches; ``snapshots`` maps
    a batch's end position to the iterable's state after it (stateful iterables only).
    """

    def __init__(self, epoch: int, seed: int, batch_size: int, drop_short: bool, *,
                 length: int | None = None) -> None:
        super().__init__(_IterOrder(epoch, drop_short), seed)
        self.batch_size = batch_size
        self.length = length
        self.ended = False
        self.snapshots: dict[int, Any] = {}
        self.source_state: Any = None   # the iterable's state after the last delivered batch
        self.produced = 0               # batches made so far

    @property
    def total(self) -> int:
        if self.length is None:
            raise TypeError("an iterable dataset without __len__ has no number of batches")
        n = self.length
        return n // self.batch_size if self.order.drop_short else -(-n // self.batch_size)

    @property
    def exhausted(self) -> bool:
        return self.ended

    def next_task(self) -> Task | None:
        with self.lock:
            if self.ended:
                return None
            k = self.next_batch
            self.next_batch += 1
            return Task(k, np.zeros(0, np.int64), self.batch_size, self.cursor)

    def take(self, count: int) -> tuple[np.ndarray, int]:
        return np.zeros(0, np.int64), self.cursor

    def delivered_batch(self, end: int) -> None:
        with self.lock:
            self.delivered += 1
            self.position = end
            if end in self.snapshots:
                self.source_state = self.snapshots.pop(end)
                for k in [k for k in self.snapshots if k < end]:
                    del self.snapshots[k]

    def state_dict(self) -> dict:
        with self.lock:
            return {"epoch": int(self.epoch), "delivered": int(self.delivered), "position": int(self.position),
                    "carry": [], "order_key": {}, "finished": bool(self.ended and self.delivered >= self.produced),
                    "source_state": self.source_state}


class IterableProducer(Producer):
    """Batches pulled from an iterator on the producing thread, collated into the arena."""

    lookahead = 1

    def __init__(self, *, dataset: Any, rank: int, world_size: int, pad: bool, batchify_fn: Any, arena: Any,
                 state: IterableRunState, recorder: Any, on_error: str) -> None:
        super().__init__(state=state, recorder=recorder, on_error=on_error)
        self.dataset = dataset
        self.rank = rank
        self.world = world_size
        self.pad = pad
        self.batchify_fn = batchify_fn
        self.arena = arena
        self._it: Iterator | None = None
        self._stateful = is_stateful(dataset)

    def finish(self, task: Task) -> Produced | None:
        from .._engines.collate import collate_recorded

        st = self.state
        if self._it is None:
            self._it = iter(RankStride(iter(self.dataset), self.rank, self.world, self.pad))
        t0 = _clock()
        samples: list = []
        for item in self._it:
            samples.append(item)
            if len(samples) == task.target:
                break
        read_ns = _clock() - t0
        if len(samples) < task.target:
            st.ended = True
        if not samples:
            return None
        end = task.start + len(samples)
        with st.lock:
            st.cursor = end
            st.produced += 1
            if self._stateful:
                st.snapshots[end] = self.dataset.state_dict()
        batch = collate_recorded(self.batchify_fn, samples, self.arena, self.rec, {"read": read_ns}, t0, 1)
        return Produced(batch, end, len(samples), task.target)

    def close(self, wait: bool = True) -> None:
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if wait and close is not None:
            try:
                close()   # a generator's finally blocks run now, on this thread
            except Exception:  # noqa: BLE001, S110
                pass


def resume_source(dataset: Any, state: dict) -> None:
    """Put a stateful iterable where ``state`` says, before the next ``iter()``."""
    snap = state.get("source_state")
    if snap is None:
        return
    if not is_stateful(dataset):
        raise StateError(f"the state holds an iterable's position, but {type(dataset).__name__} has no "
                         "load_state_dict()")
    dataset.load_state_dict(snap)


def cannot_resume(dataset: Any, num_workers: int = 0) -> StateError:
    if num_workers > 0:
        return StateError(f"cannot save the position of {type(dataset).__name__} read by {num_workers} worker "
                          "processes (each holds its own iterator); resume needs num_workers=0 and a stateful "
                          "iterable")
    return StateError(f"cannot save the position of {type(dataset).__name__}: an iterable dataset can resume only "
                      "if it has state_dict() and load_state_dict() (torchdata's Stateful protocol); "
                      "give it those, or use a map-style dataset (with __len__ and __getitem__)")
