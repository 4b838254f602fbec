"""``get_worker_info()``: which worker (process or pool thread) is running the current code.

NOTE [ Worker info ]
PyTorch users shard iterable datasets and seed their own RNGs from
``torch.utils.data.get_worker_info()``; loaderlib keeps its meaning on every engine. Inside a
worker process the info is set once, before ``worker_init_fn`` runs; inside a pool thread
(threads engine, the native engine's ``worker_init_fn`` call, ``num_threads=0``) it is
thread-local, so several loaders in one process never see each other's info. In the main
thread, outside any worker, it is ``None``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["WorkerInfo", "get_worker_info", "worker_seed"]

_SEED_MASK = (1 << 63) - 1


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker knows about itself (``ll.get_worker_info()`` inside worker code).

    Attributes
    ----------
    id : int
        The worker's number, ``0 <= id < num_workers``.
    num_workers : int
        Workers (processes, or pool threads) of the loader.
    seed : int
        This worker's seed: the loader's seed plus ``id`` (PyTorch's convention), so a
        user's own RNG seeded from it differs per worker and repeats per run.
    dataset : object
        The worker's copy of the dataset (in a process, not the main process's object).
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


_local = threading.local()
_process_info: WorkerInfo | None = None   # set once in a worker process


def worker_seed(seed: int, worker_id: int) -> int:
    """The seed of worker ``worker_id`` of a loader seeded with ``seed``."""
    return (int(seed) + int(worker_id)) & _SEED_MASK


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of the worker running this code, ``None`` in the main thread."""
    info = getattr(_local, "info", None)
    return info if info is not None else _process_info


def set_thread_info(info: WorkerInfo | None) -> None:
    """Mark the calling thread as a worker (``None`` clears it)."""
    _local.info = info


def set_process_info(info: WorkerInfo | None) -> None:
    """Mark this whole process as one worker (worker processes only)."""
    global _process_info
    _process_info = info
