"""The batch arena: a ring of aligned slots that batches are written into and viewed from.

Owner of ``loaderlib._ext._arena``. An engine plans a batch's layout (a list of parts,
each a shape and dtype: images, labels, ...) and asks the arena for a slot; it gets back
numpy arrays that are C-contiguous, 64-byte aligned views of that slot and writes the
batch straight into them. The slot is reused only after every array viewing it is gone
(see NOTE [ Slot leases ] in ``pyx/_arena.pyx``), so kept batches are never overwritten
and steady state allocates nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._ext import _arena
from .errors import LoaderError

_log = logging.getLogger(__name__)

__all__ = ["ALIGNMENT", "AlignedBuffer", "BatchArena", "BatchLayout", "HostRegistrar", "aligned_empty",
           "arena_counters", "pinned_allocator"]

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
    import torch

    def allocate(nbytes: int) -> Any:
        with _device_current(device):
            return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, pin_memory=True).numpy()

    return allocate


def _device_current(device: Any) -> Any:
    """A context with the CUDA ``device`` current (a no-op for None or a device without index)."""
    if device is not None and getattr(device, "index", None) is not None:
        import torch

        return torch.cuda.device(device)
    return contextlib.nullcontext()


#: ``cudaHostRegisterPortable``: the memory counts as pinned in every CUDA context.
_CUDA_HOST_REGISTER_PORTABLE = 1


@dataclass(frozen=True)
class HostRegistrar:
    """Page-locks memory allocated elsewhere for CUDA, once per buffer: the processes engine's
    shared-memory slots (NOTE [ Registering shared-memory slots ]).

    NOTE [ Registering shared-memory slots ]
    The processes engine's slots are shared-memory mappings that worker processes write into,
    so torch's pinned allocator (NOTE [ Pinned slots ]) cannot make them. Instead the
    loader's process page-locks each mapping once, when the slot is made, with
    ``cudaHostRegister(address, size, cudaHostRegisterPortable)``, and unregisters it when
    the slot goes, before the mapping is closed: memory unmapped while still registered
    would leave the driver holding the pages, and a new mapping at the same address could
    not be registered. The pages are shared, so what the workers write lands in the locked
    pages themselves; the workers never touch CUDA. The calls go through
    ``torch.cuda.cudart()``, the CUDA runtime torch itself loaded: ``pin_memory`` needs torch
    with CUDA anyway, so there is no second runtime to find (and possibly of another version),
    and torch's own checkpoint stager registers shared-memory tensors the same way. The
    loader's process may initialise CUDA safely because workers are fresh interpreters,
    never forks (NOTE [ Worker processes ]). With ``device`` ("cuda:1") the calls run with that
    device current, as :func:`pinned_allocator` allocates.

    Parameters
    ----------
    device : torch.device, optional
        A CUDA device.
    """

    device: Any = None

    def register(self, address: int, nbytes: int) -> None:
        """Page-lock ``nbytes`` at ``address``.

        Raises
        ------
        LoaderError
            CUDA refused (the message gives its error code and what to do).
        """
        import torch

        with _device_current(self.device):
            cudart = torch.cuda.cudart()
            code = int(cudart.cudaHostRegister(int(address), int(nbytes), _CUDA_HOST_REGISTER_PORTABLE))
        if code != 0:
            raise LoaderError(f"pin_memory=True: cudaHostRegister of a {nbytes}-byte shared-memory slot failed with "
                              f"CUDA error {code}{_cuda_error_name(cudart, code)}; pass pin_memory=False, or "
                              "num_workers=0 (the in-process engines pin with torch's allocator)")

    def unregister(self, address: int) -> None:
        """Undo :meth:`register` for ``address``. Never raises: it runs when a slot is freed,
        possibly at interpreter exit, when the CUDA runtime may be gone already."""
        try:
            import torch

            with _device_current(self.device):
                cudart = torch.cuda.cudart()
                code = int(cudart.cudaHostUnregister(int(address)))
        except Exception as e:  # noqa: BLE001 - CUDA or torch already torn down
            _log.debug("cudaHostUnregister(%#x) not called: %s", address, e)
            return
        if code != 0:
            _log.warning("cudaHostUnregister(%#x) failed with CUDA error %d%s", address, code,
                         _cuda_error_name(cudart, code))


def _cuda_error_name(cudart: Any, code: int) -> str:
    try:
        return f" ({cudart.cudaGetErrorString(cudart.cudaError(code))})"
    except Exception:  # noqa: BLE001 - only a nicer message
        return ""


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
        # One ndarray constructor a part over the lease's buffer: per batch, on the driver's
        # path (np.prod, a slice, view and reshape a part cost 4-5x as many instructions).
        return [np.ndarray(shp, dt, lease, off) for shp, dt, off in zip(self.shapes, self.dtypes, self.offsets)]


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
        self.peak_leased = 0   # most slots leased at once so far (NOTE [ Warm slots ])

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
        self.peak_leased = max(self.peak_leased, self._ring.num_leased)
        return lease, layout.views(lease)

    def acquire_after(self, lease: Any, layout: BatchLayout) -> tuple[Any, list[np.ndarray]] | None:
        """Lease the slot of ``lease`` (still held) a second time, for the batch that will
        overwrite it once ``lease`` and its views are gone (NOTE [ Successor leases ] in
        pyx/_arena.pyx): ``(successor, arrays)``, or None when that slot cannot take one (it
        is free, too small for ``layout``, or a successor waits already). Nothing may write the
        arrays before the gate set with :meth:`set_gate` opens."""
        ring = self._ring
        slot = lease.slot
        if not ring.can_follow(slot) or lease.nbytes < layout.nbytes:
            return None
        succ = ring.acquire_after(slot)
        return succ, layout.views(succ)

    def can_follow(self, lease: Any) -> bool:
        """Whether :meth:`acquire_after` may lease ``lease``'s slot now."""
        return bool(self._ring.can_follow(lease.slot))

    def set_gate(self, lease: Any, pending: Any) -> None:
        """Open ``pending``'s gate (a queued ``_chain.Pending``) when the holder of ``lease``'s
        slot goes, in C; at once if it went already."""
        fn, arg = pending.gate_hook()
        self._ring.set_gate(lease.slot, fn, arg, pending)

    def clear_gate(self, lease: Any) -> None:
        """Forget the gate set on ``lease``'s slot (its batch was taken back)."""
        self._ring.clear_gate(lease.slot)

    @property
    def on_release(self) -> Callable[[], None] | None:
        """Called with no argument each time a slot is freed (a lease's last view went); it
        must never block (it may run in any thread's dealloc, even at exit)."""
        return self._ring.on_release

    @on_release.setter
    def on_release(self, fn: Callable[[], None] | None) -> None:
        self._ring.on_release = fn

    @property
    def num_leased(self) -> int:
        """Slots leased now (batches in production, queued or held by the user)."""
        return int(self._ring.num_leased)

    def has_room(self) -> bool:
        """Whether a slot that has been written before is free now: fewer slots are leased than
        the most ever leased at once (slots are taken lowest index first, so those are the
        ones in memory). Before any batch, one slot counts as room."""
        return self._ring.num_leased < max(self.peak_leased, 1)

    def acquire_bytes(self, nbytes: int) -> Any:
        """Lease a raw slot of at least ``nbytes`` bytes."""
        return self._ring.acquire(int(nbytes))

    def clear(self) -> None:
        """Free the memory of every slot not currently leased."""
        self._ring.clear()

    def close(self) -> None:
        """Free every slot's memory: the free ones' now, each leased one's when its lease goes."""
        self._ring.close()

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
