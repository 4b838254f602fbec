"""The messages between the loader and its worker processes, one type each, shared by both sides.

Every message is a small ``NamedTuple`` pickled onto the worker's socket (NOTE [ Worker
processes ] in ``processes.py``): the receiver dispatches on its type and reads its fields by
name. NOTE [ Message types ] says why NamedTuple. A batch travels as a ``Done`` whose
``structure`` is the batchify function's output with every array that lies in the task's
shared-memory slot replaced by an :class:`ArrayRef` (``ShardsRef`` for a ``Shards``).

NOTE [ Message types ]
A message is pickled and unpickled once per batch on each side, so its type must cost next
to nothing there. A NamedTuple pickles as a reference to its class plus the tuple of its
fields, unpickles with one call of the class, and is immutable: a few bytes more than the
tagged tuple it replaces (the class's name instead of the tag string) and a microsecond or
two per message, against the milliseconds of a batch. A frozen slotted dataclass goes
through ``__getstate__``/``__setstate__`` and costs several times that on the same message.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

# ----------------------------------------------------------------------- loader -> worker


class Init(NamedTuple):
    """The first message: where to import from, who the worker is and what it runs."""

    paths: list[str]      # sys.path entries to add (the loader's working directory first)
    worker_id: int
    payload: bytes        # cloudpickle of (dataset, batchify_fn, worker_init_fn, on_error, prefix)
    num_workers: int
    seed: int             # the loader's seed (the worker's own is derived from it)


class IterStart(NamedTuple):
    """A new epoch of an iterable dataset: open this worker's share (NOTE [ Iterable shards ])."""

    rank: int
    world_size: int
    pad: bool


class Work(NamedTuple):
    """Load one batch into a shared-memory slot."""

    task_id: int
    indices: np.ndarray | int   # sample indices, or for an iterable the number of items to take
    shm_name: str               # the slot's block in /dev/shm
    shm_size: int               # the slot's size in bytes
    seed: int                   # the run's (seed, epoch): the key of the native prefix's randomness
    epoch: int


class Cancel(NamedTuple):
    """Skip task ``task_id`` if it has not started (its result is not wanted)."""

    task_id: int


class Stop(NamedTuple):
    """Exit."""


# ----------------------------------------------------------------------- worker -> loader


class Ready(NamedTuple):
    """The dataset and functions loaded and ``worker_init_fn`` ran."""

    pid: int


class InitError(NamedTuple):
    """Loading the payload or ``worker_init_fn`` failed; the worker exits."""

    text: str
    traceback: str
    payload: bytes | None   # the pickled exception, when it pickles


class Cancelled(NamedTuple):
    """Task ``task_id`` was skipped after a :class:`Cancel`."""

    task_id: int


class Failed(NamedTuple):
    """Task ``task_id`` raised (a sample with ``on_error="raise"``, or the whole task)."""

    task_id: int
    sample: int | None      # the failing sample's index, None when the whole task failed
    source: str | None      # its file or record key
    text: str
    traceback: str
    payload: bytes | None   # the pickled exception, when it pickles


class Done(NamedTuple):
    """Task ``task_id``'s batch, in its slot."""

    task_id: int
    structure: Any          # the batch with ArrayRef leaves; None when no sample loaded
    failures: list          # (index, source, reason) of the samples skipped (on_error="skip")
    needed: int             # slot bytes the batch needed (more than the slot: the loader grows them)
    python_ns: int          # time loading the samples
    collate_ns: int         # time collating them


ToWorker = Init | IterStart | Work | Cancel | Stop
FromWorker = Ready | InitError | Cancelled | Failed | Done


# ----------------------------------------------------------------------- batches in slots


class ArrayRef:
    """An array placed in the slot: offset, shape, dtype."""

    __slots__ = ("dtype", "offset", "shape")

    def __init__(self, offset: int, shape: tuple, dtype: str) -> None:
        self.offset, self.shape, self.dtype = offset, shape, dtype

    def __reduce__(self) -> tuple:
        return (ArrayRef, (self.offset, self.shape, self.dtype))


class ShardsRef:
    """A ``Shards`` batch whose array is an :class:`ArrayRef`."""

    __slots__ = ("batch", "num_shards")

    def __init__(self, batch: ArrayRef, num_shards: int) -> None:
        self.batch, self.num_shards = batch, num_shards

    def __reduce__(self) -> tuple:
        return (ShardsRef, (self.batch, self.num_shards))


def slot_array(x: Any) -> bool:
    """Whether a batch leaf travels in the shared-memory slot (other leaves are pickled)."""
    return isinstance(x, np.ndarray) and x.dtype != object and x.dtype.fields is None
