"""Ray Data: loaderlib's native decode-and-transform kernels inside ``map_batches``, and a
loader per trainer fed by ``Dataset.streaming_split``.

NOTE [ Ray Data batches ]
``Dataset.map_batches(fn, batch_format="numpy")`` calls ``fn`` with a dict of column name to
numpy array; a binary column (``ray.data.read_binary_files``' ``bytes``) is an object array
of ``bytes``. :func:`map_batches_fn` hands those buffers, uncopied, to the fused native chain
(one parallel pass per batch: decode only the region the chain needs, resample, normalise,
write into one output array) and returns the other columns untouched, the bytes column
replaced by the image column. Randomness is keyed as in the loader, by ``(seed, epoch, row
index)``: with ``index_column`` naming a column of row indices, a random chain gives exactly
what :class:`loaderlib.DataLoader` gives for those samples; without one, each call draws a
fresh key. Ray decides the parallelism across tasks; inside a task the kernels use the CPUs
Ray assigned to it (``num_cpus`` of ``map_batches``), so tasks never oversubscribe a node.

NOTE [ Output slots in Ray workers ]
A float32 batch of 64 224x224 images is 38 MB. A fresh ``np.empty`` per call maps new pages
that the OS zeroes on first touch: on a 2-CPU local cluster ``perf`` put 13% of a map task's
CPU in ``clear_page``, about as much as the fused chain's resampling. So the output array is a
view of a slot of one :class:`loaderlib.BatchArena` per worker process (NOTE [ Slot leases ]
in ``pyx/_arena.pyx``): Ray copies the returned block into its object store and drops it, the
lease goes, and the next call, in this task or a later one in the same process, writes into
the same, already-mapped pages. A slot is reused only once nothing views it, so a block
Ray still holds (or a fused next step keeps) is never overwritten: the ring grows instead.
The slots stay mapped for the worker process's life, as many as batches were alive at once
(two in steady state); ``reuse_output=False`` gives a fresh array per call instead.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import transforms as T
from .._chain import compile_chain
from .._checks import check_int
from ..arena import BatchArena, BatchLayout
from ..errors import LoaderError

__all__ = ["MapBatches", "RayShardLoader", "map_batches_fn", "streaming_loaders"]


def _assigned_cpus() -> int:
    """CPUs Ray assigned to the calling task or actor (1 outside Ray)."""
    try:
        import ray

        if not ray.is_initialized():
            return 1
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    except Exception:  # noqa: BLE001 - no Ray context (a plain call): one thread
        return 1
    return max(1, int(-(-cpus // 1)))


#: The output slots of every MapBatches call in this process (NOTE [ Output slots in Ray
#: workers ]); made on first use, so importing this module allocates nothing.
_output_arena: BatchArena | None = None


def _output(shape: tuple, dtype: Any, reuse: bool) -> np.ndarray:
    """An array to write a batch into: a view of a reusable slot, or a fresh array."""
    global _output_arena
    if not reuse:
        return np.empty(shape, dtype)
    if _output_arena is None:
        _output_arena = BatchArena(2)
    _lease, (out,) = _output_arena.acquire(BatchLayout.of([(shape, dtype)]))
    return out


class MapBatches:
    """The callable :func:`map_batches_fn` returns (picklable; compiles its chain once per process).

    Parameters are those of :func:`map_batches_fn`.
    """

    def __init__(self, transform: Any, bytes_column: str = "bytes", image_column: str = "image", *,
                 index_column: str | None = None, seed: int = 0, epoch: int = 0,
                 num_threads: int | None = None, reuse_output: bool = True) -> None:
        if transform is not None and not isinstance(transform, T.Transform):
            transform = T.Compose(list(transform)) if isinstance(transform, (list, tuple)) else transform
        chain = transform if transform is not None else T.Compose([])
        plan = compile_chain(chain)
        if plan is None or plan.sample_shape is None:
            raise ValueError(f"map_batches_fn needs a chain of loaderlib transforms with a fixed output size that "
                             f"runs natively (e.g. Resize + CenterCrop + Normalize), got {transform!r}; run Python "
                             "steps in a second map_batches")
        check_int(num_threads, "num_threads", minimum=1, allow_none=True)
        self.transform = chain
        self.bytes_column = bytes_column
        self.image_column = image_column
        self.index_column = index_column
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.num_threads = num_threads
        self.reuse_output = bool(reuse_output)
        self._local: Any = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._local = None

    def _plan(self) -> Any:
        # NativePlan runs one batch at a time; a threaded actor gets one plan per thread.
        if self._local is None:
            self._local = threading.local()
        plan = getattr(self._local, "plan", None)
        if plan is None:
            plan = self._local.plan = compile_chain(self.transform)
        return plan

    def __call__(self, batch: dict) -> dict:
        if not isinstance(batch, dict) or self.bytes_column not in batch:
            cols = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise LoaderError(f"map_batches_fn: the batch has no {self.bytes_column!r} column (columns: {cols}); "
                              "pass bytes_column=..., and batch_format='numpy' to map_batches")
        raw = batch[self.bytes_column]
        n = len(raw)
        if self.index_column is not None:
            if self.index_column not in batch:
                raise LoaderError(f"map_batches_fn: index_column {self.index_column!r} is not in the batch "
                                  f"(columns: {sorted(batch)})")
            indices = np.asarray(batch[self.index_column], dtype=np.int64).reshape(-1)
            seed = self.seed
        else:
            indices = np.arange(n, dtype=np.int64)
            seed = random.getrandbits(63)   # no row identity: a fresh key per call
        bufs = [b if isinstance(b, (bytes, bytearray, memoryview, np.ndarray)) else bytes(b) for b in raw]
        for i, b in enumerate(bufs):
            if len(b) == 0:
                raise LoaderError(f"map_batches_fn: row {int(indices[i])} of column {self.bytes_column!r} is empty")
        plan = self._plan()
        out = _output((n, *plan.sample_shape), plan.dtype, self.reuse_output)
        threads = self.num_threads or _assigned_cpus()
        status = plan.run_buffers_into(bufs, out, indices, seed=seed, epoch=self.epoch, num_threads=threads,
                                       sources=[f"{self.bytes_column}[{int(k)}]" for k in indices])
        if status.errors:
            raise next(iter(status.errors.values()))
        result = {k: v for k, v in batch.items() if k != self.bytes_column}
        result[self.image_column] = out
        return result


def map_batches_fn(transform: Any, bytes_column: str = "bytes", image_column: str = "image", *,
                   index_column: str | None = None, seed: int = 0, epoch: int = 0,
                   num_threads: int | None = None, reuse_output: bool = True) -> MapBatches:
    """A function for ``ray.data.Dataset.map_batches(fn, batch_format="numpy")`` that decodes
    and transforms ``bytes_column`` with loaderlib's native kernels.

    Parameters
    ----------
    transform : loaderlib.transforms.Compose or list of transforms
        A chain that runs natively with a fixed output size (``Decode`` first is optional).
    bytes_column : str
        Column of encoded images (``read_binary_files`` names it "bytes").
    image_column : str
        Column the batch of images is written to; the bytes column is dropped, every other
        column is kept as it is.
    index_column : str, optional
        Column of row indices keying each row's randomness (NOTE [ Ray Data batches ]).
    seed, epoch : int
        The random key, as ``DataLoader(seed=...)`` and its epoch.
    num_threads : int, optional
        Kernel threads per call (default: the CPUs Ray assigned to the task).
    reuse_output : bool
        Write each batch into a reusable slot of this process (default; NOTE [ Output slots
        in Ray workers ]) rather than a fresh array, which the OS must zero page by page.

    Returns
    -------
    MapBatches
        A picklable callable ``batch dict -> batch dict``.

    Raises
    ------
    ValueError
        The chain does not run natively or has no fixed output size.
    loaderlib.DecodeError
        (When called) an image cannot be decoded; the message names the row.
    """
    return MapBatches(transform, bytes_column, image_column, index_column=index_column, seed=seed, epoch=epoch,
                      num_threads=num_threads, reuse_output=reuse_output)


class RayShardLoader:
    """Batches of one trainer's share of a Ray dataset (one ``streaming_split`` iterator).

    Parameters
    ----------
    iterator : ray.data.DataIterator
        One element of ``Dataset.streaming_split(n, equal=True)``.
    batch_size : int
    columns : sequence of str
        Columns yielded, in this order, as a tuple (default ``("image", "label")``).
    drop_last : bool
        Drop a final short batch (default False).
    output : {"numpy", "torch"}
        numpy arrays, or torch tensors sharing their memory (``torch.from_numpy``).
    prefetch : int
        Batches Ray prepares ahead (``iter_batches(prefetch_batches=...)``).

    Notes
    -----
    Every trainer must iterate its loader at the same time (Ray's streaming split feeds all
    of them from one pipeline): run each in its own process, actor or thread. An actor or
    task that consumes a split should reserve ``num_cpus=0``, or on a small cluster it can
    hold the CPU the pipeline needs.
    """

    def __init__(self, iterator: Any, batch_size: int, columns: tuple = ("image", "label"), *,
                 drop_last: bool = False, output: str = "numpy", prefetch: int = 2) -> None:
        check_int(batch_size, "batch_size", minimum=1)
        if output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
        self.iterator = iterator
        self.batch_size = batch_size
        self.columns = tuple(columns)
        self.drop_last = bool(drop_last)
        self.output = output
        self.prefetch = int(prefetch)

    def __iter__(self) -> Iterator[tuple]:
        for batch in self.iterator.iter_batches(batch_size=self.batch_size, batch_format="numpy",
                                                drop_last=self.drop_last, prefetch_batches=self.prefetch):
            missing = [c for c in self.columns if c not in batch]
            if missing:
                raise LoaderError(f"RayShardLoader: columns {missing} are not in the dataset (it has {sorted(batch)})")
            arrays = tuple(batch[c] for c in self.columns)
            if self.output == "torch":
                import torch

                arrays = tuple(torch.from_numpy(np.ascontiguousarray(a)) if a.dtype != object else a for a in arrays)
            yield arrays


def streaming_loaders(dataset: Any, num_trainers: int, batch_size: int, **kwargs: Any) -> list[RayShardLoader]:
    """One :class:`RayShardLoader` per trainer over ``dataset.streaming_split(num_trainers, equal=True)``.

    ``equal=True`` gives every trainer the same number of rows (a trainer that ran out first
    would block a collective). Keyword arguments go to :class:`RayShardLoader`.
    """
    check_int(num_trainers, "num_trainers", minimum=1)
    return [RayShardLoader(it, batch_size, **kwargs) for it in dataset.streaming_split(num_trainers, equal=True)]
