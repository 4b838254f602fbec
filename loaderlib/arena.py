"""The batch arena: a ring of aligned slots that batches are written into and viewed from.

Owner of ``loaderlib._ext._arena``. An engine plans a batch's layout (a list of parts,
each a shape and dtype: images, labels, ...) and asks the arena for a slot; it gets back
numpy arrays that are C-contiguous, 64-byte aligned views of that slot and writes the
batch straight into them. The slot is reused only after every array viewing it is gone
(see NOTE [ Slot leases ] in ``pyx/_arena.pyx``), so kept batches are never overwritten
and steady state allocates nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._ext import _arena

__all__ = ["ALIGNMENT", "AlignedBuffer", "BatchArena", "BatchLayout", "aligned_empty", "arena_counters",
           "pinned_allocator"]

#: Byte alignment of every slot and every part inside it. 64 bytes is a cache line and
#: AVX-512 width, and what JAX requires to import a host buffer without copying.
ALIGNMENT = 64

AlignedBuffer = _arena.AlignedBuffer


def _align(n: int, a: int = ALIGNMENT) -> int:
    return (n + a - 1) // a * a


def arena_counters() -> dict:
    """Process-wide aligned allocations: ``allocations``, ``bytes_allocated``, ``bytes_live``."""
    n, total, live = _arena.counters()
    return {"allocations": int(n), "bytes_allocated": int(total), "bytes_live": int(live)}


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A new C-contiguous, 64-byte aligned, zero-filled array (owns an AlignedBuffer)."""
    dt = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    buf = AlignedBuffer(nbytes, ALIGNMENT)
    return np.frombuffer(buf, dtype=np.uint8, count=nbytes).view(dt).reshape(shape)


def pinned_allocator(device: Any = None) -> Callable[[int], Any]:
    """A slot allocator whose buffers are page-locked once, when allocated.

    NOTE [ Pinned slots ]
    A batch copies to a GPU asynchronously (DMA, no staging copy) only from page-locked
    memory. Pinning per batch (``tensor.pin_memory()``) costs a copy and a cudaHostAlloc each
    time; here each slot's buffer comes from torch's pinned host allocator once, and the ring
    reuses it for every batch, so pinning costs nothing per batch. The memory is page aligned
    (the layout needs 64 bytes) and mapped for every device (unified addressing); with
    ``device`` ("cuda:1") it is allocated with that device current, so that device's context
    owns it.

    Parameters
    ----------
    device : torch.device, optional
        A CUDA device.

    Returns
    -------
    callable
        ``allocate(nbytes)`` returning a writable uint8 numpy array that keeps its pinned
        tensor alive.
    """
    import contextlib

    import torch

    def allocate(nbytes: int) -> Any:
        where = (torch.cuda.device(device) if device is not None and getattr(device, "index", None) is not None
                 else contextlib.nullcontext())
        with where:
            return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, pin_memory=True).numpy()

    return allocate


@dataclass(frozen=True)
class BatchLayout:
    """Where each part of a batch lives inside a slot."""

    shapes: tuple
    dtypes: tuple
    offsets: tuple
    nbytes: int

    @classmethod
    def of(cls, parts: Sequence[tuple[Sequence[int], Any]]) -> BatchLayout:
        shapes, dtypes, offsets = [], [], []
        off = 0
        for shape, dtype in parts:
            dt = np.dtype(dtype)
            shp = tuple(int(s) for s in shape)
            if any(s < 0 for s in shp):
                raise ValueError(f"negative dimension in {shp}")
            off = _align(off)
            shapes.append(shp)
            dtypes.append(dt)
            offsets.append(off)
            off += int(np.prod(shp, dtype=np.int64)) * dt.itemsize
        return cls(tuple(shapes), tuple(dtypes), tuple(offsets), _align(max(off, 1)))

    def views(self, lease: Any) -> list[np.ndarray]:
        whole = np.frombuffer(lease, dtype=np.uint8)
        out = []
        for shp, dt, off in zip(self.shapes, self.dtypes, self.offsets):
            n = int(np.prod(shp, dtype=np.int64)) * dt.itemsize
            out.append(whole[off:off + n].view(dt).reshape(shp))
        return out


class BatchArena:
    """A ring of reusable, aligned batch slots.

    Parameters
    ----------
    num_slots : int
        Slots allocated up front by :meth:`reserve` (the engine uses ``prefetch + 2``: the
        queue, the batch being produced and the one the user holds). More are added only
        if a user keeps more batches than that alive.
    allocator : callable, optional
        ``allocator(nbytes)`` returning a writable buffer object for a slot
        (default: 64-byte aligned private memory). The processes engine passes a
        shared-memory allocator.

    Notes
    -----
    Not thread-safe by itself beyond what the GIL gives: one engine thread acquires, any
    thread may drop the views (release needs no lock, see NOTE [ Slot leases ]).
    """

    def __init__(self, num_slots: int = 4, allocator: Callable[[int], Any] | None = None) -> None:
        self.num_slots = max(1, int(num_slots))
        self._ring = _arena.SlotRing(allocator or (lambda n: AlignedBuffer(n, ALIGNMENT)))

    def reserve(self, layout: BatchLayout, num_slots: int | None = None) -> None:
        """Allocate the slots for ``layout`` now (before the epoch), not on the first batch."""
        self._ring.reserve(self.num_slots if num_slots is None else int(num_slots), layout.nbytes)

    def acquire(self, layout: BatchLayout) -> tuple[Any, list[np.ndarray]]:
        """Lease a slot for ``layout``: returns ``(lease, arrays)``.

        The arrays are C-contiguous views of the slot, each 64-byte aligned; the slot stays
        leased while the lease or any view (or view of a view) is alive.
        """
        if self._ring.num_slots < self.num_slots:
            # First use: the whole ring at once, sized for this layout (engines that know
            # the layout before the epoch call reserve() themselves).
            self._ring.reserve(self.num_slots, layout.nbytes)
        lease = self._ring.acquire(layout.nbytes)
        return lease, layout.views(lease)

    def acquire_bytes(self, nbytes: int) -> Any:
        """Lease a raw slot of at least ``nbytes`` bytes."""
        return self._ring.acquire(int(nbytes))

    def clear(self) -> None:
        """Free the memory of every slot not currently leased."""
        self._ring.clear()

    @property
    def stats(self) -> dict:
        """``slots``, ``leased``, ``capacity_bytes``, ``allocations``, ``bytes_allocated``, ``acquires``."""
        r = self._ring
        return {
            "slots": r.num_slots,
            "leased": r.num_leased,
            "capacity_bytes": r.capacity_bytes,
            "allocations": r.allocations,
            "bytes_allocated": r.bytes_allocated,
            "acquires": r.acquires,
        }
