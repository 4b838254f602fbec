# cython: freethreading_compatible = False
"""Batch arena memory (owner: loaderlib/arena.py).

Aligned slot buffers and the bookkeeping that decides when a slot may be reused.

NOTE [ Slot leases ]
A batch handed to the user is made of numpy views of one slot. Every view's base chain ends
at one ``SlotLease`` object (numpy keeps a reference to the buffer exporter), and so does
every derived view, torch tensor (``torch.from_numpy``) or DLPack capsule. The lease's
``__dealloc__`` runs exactly when the last of them is gone, and only then is the slot marked
free. So a user who keeps a batch never sees it overwritten, and no explicit "release"
call exists that a user could forget. All state changes happen with the GIL held and without
any Python call in between (no GIL switch point), so acquire and release need no lock.

NOTE [ Successor leases ]
A slot the user still holds can be lent a second time, to the batch that will overwrite it
(``acquire_after``): the successor lease counts as the same leased slot, and its batch is
queued on the kernel team behind a closed gate (``start_into(..., gated=True)``). When the
holder's lease ends, ``_release`` hands the slot to the successor and calls the gate's C
function there, in the lease's dealloc, so the kernel threads start the batch without any
Python thread in between (NOTE [ Batches in memory ] in loaderlib/_engines/depth.py). A
successor taken back before its gate opened clears the gate first (``clear_gate``), then
drops its lease; a holder that goes before the gate is set leaves ``opened`` so that
``set_gate`` opens it at once.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
cimport cython
from libc.stdint cimport uint8_t, uintptr_t
from libc.stdlib cimport free
from libc.string cimport memset
import numpy as np
import os

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void** memptr, size_t alignment, size_t size)

cdef extern from "<sys/mman.h>" nogil:
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void* addr, size_t length)
    int madvise(void* addr, size_t length, int advice)
    void* MAP_FAILED
    int PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS

cdef extern from "Python.h":
    void PyErr_SetInterrupt()

cdef extern from "ll_common.h":
    void ll_release_free_memory() nogil

cdef extern from *:
    """
    #include <sys/mman.h>
    #ifdef MADV_HUGEPAGE
    #define LL_MADV_HUGEPAGE MADV_HUGEPAGE
    #else
    #define LL_MADV_HUGEPAGE (-1)
    #endif
    #ifdef MADV_NOHUGEPAGE
    #define LL_MADV_NOHUGEPAGE MADV_NOHUGEPAGE
    #else
    #define LL_MADV_NOHUGEPAGE (-1)
    #endif
    """
    const int LL_MADV_HUGEPAGE
    const int LL_MADV_NOHUGEPAGE

# NOTE [ Large slots come from mmap ]: anonymous mappings are page aligned and zero by
# definition, with pages faulted in by the first write, in parallel, by the kernel threads
# that fill the batch. Zeroing a 38 MB slot up front instead cost ~30 ms per slot before
# the first batch. Small buffers come from posix_memalign and are zeroed explicitly.
#
# NOTE [ Slots in small pages ]
# Slots of 4 MB and more are kept out of transparent huge pages (MADV_NOHUGEPAGE), whatever
# the system's THP policy. Huge pages would save faults (~20 instead of ~9,400 for a 38 MB
# float batch) and TLB misses, but:
#   - the TLB saving is within the noise: the kernels write a slot once per batch,
#     sequentially (benchmarks/slot_pages.py, steady state: 1.213 against 1.201 CPU-ms per
#     image, medians of 6 rounds);
#   - a huge page has to be found first. With THP's usual defrag=madvise, a fault in an
#     madvised range compacts memory until a free 2 MB block exists, and on a virtual
#     machine that block is often memory the host has not backed yet (free memory is handed
#     back to the host): on the benchmark machine the first write of fresh memory cost
#     3.3 ms per MB in huge pages against 0.85 ms in small pages (a C loop over fresh
#     mappings). The second slot is first written inside benchmarks/loader.py's measured
#     window, which ran at 1,604 images/s in small pages against 1,524 in huge pages
#     (benchmarks/slot_pages.py, 1.05x; system CPU 0.055 against 0.086 ms per image).
# LOADERLIB_HUGE_PAGES=1 (read once, at import) offers slots to huge pages instead; then only
# the whole 2 MB ranges inside a slot are advised: slots mapped side by side merge into one
# mapping, and a huge page across the boundary of two would make writing one slot's last
# bytes resident 2 MB that are mostly the next slot's (1.2 MB more per float slot, measured
# by a profiling script reading /proc/self/smaps on the RN50 bench).
cdef size_t _MMAP_MIN = 1 << 20
cdef size_t _HUGE = 2 << 20
cdef bint _HUGE_PAGES = os.environ.get("LOADERLIB_HUGE_PAGES", "") not in ("", "0")

# Process-wide counters of AlignedBuffer allocations (arena steady-state checks use them).
cdef long long _n_alloc = 0
cdef long long _bytes_alloc = 0
cdef long long _bytes_live = 0


def counters():
    """``(allocations, bytes_allocated, bytes_live)`` of every AlignedBuffer in this process."""
    return (_n_alloc, _bytes_alloc, _bytes_live)


def release_free_memory():
    """Give the allocator's free pages back to the system (glibc's ``malloc_trim``; a no-op
    elsewhere). A run's kernel team frees its per-thread scratch when its last batch is made,
    into its threads' malloc arenas, where it would stay resident beside the next run's
    (NOTE [ Warm slots ] in loaderlib/_engines/base.py)."""
    with nogil:
        ll_release_free_memory()


cdef inline void _export_bytes(Py_buffer* buffer, object owner, void* ptr, Py_ssize_t nbytes,
                               Py_ssize_t* shape, Py_ssize_t* strides):
    """Fill ``buffer`` as a writable 1-D byte view of ``nbytes`` at ``ptr`` owned by ``owner``."""
    shape[0] = nbytes
    strides[0] = 1
    buffer.buf = ptr
    buffer.len = nbytes
    buffer.readonly = 0
    buffer.itemsize = 1
    buffer.format = "B"
    buffer.ndim = 1
    buffer.shape = shape
    buffer.strides = strides
    buffer.suboffsets = NULL
    buffer.internal = NULL
    buffer.obj = owner


cdef class AlignedBuffer:
    """``nbytes`` of zeroed memory whose address is a multiple of ``alignment``.

    Exposes the writable buffer protocol (1-D, unsigned bytes). Freed when the object and
    every export of it are gone.
    """
    cdef void* ptr
    cdef bint mapped
    cdef size_t mapped_size
    cdef readonly Py_ssize_t nbytes
    cdef readonly Py_ssize_t alignment
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, Py_ssize_t nbytes, Py_ssize_t alignment=64):
        global _n_alloc, _bytes_alloc, _bytes_live
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if alignment < <Py_ssize_t>sizeof(void*) or (alignment & (alignment - 1)) != 0:
            raise ValueError("alignment must be a power of two >= sizeof(void*)")
        self.ptr = NULL
        self.mapped = False
        # posix_memalign(0) may return NULL; keep at least one line so the address is real.
        cdef size_t size = <size_t>(nbytes if nbytes > 0 else alignment)
        cdef size_t lo, hi
        cdef void* p
        if size >= _MMAP_MIN and alignment <= 4096:
            # See NOTE [ Large slots come from mmap ].
            p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
            if p == MAP_FAILED:
                raise MemoryError(f"cannot map {nbytes} bytes")
            # NOTE [ Slots in small pages ]; advice only: a failure changes nothing
            if size >= (4 << 20):
                if _HUGE_PAGES and LL_MADV_HUGEPAGE >= 0:
                    lo = (<size_t>p + _HUGE - 1) & ~(_HUGE - 1)
                    hi = (<size_t>p + size) & ~(_HUGE - 1)
                    if hi > lo:
                        madvise(<void*>lo, hi - lo, LL_MADV_HUGEPAGE)
                elif not _HUGE_PAGES and LL_MADV_NOHUGEPAGE >= 0:
                    madvise(p, size, LL_MADV_NOHUGEPAGE)
            self.ptr = p
            self.mapped = True
            self.mapped_size = size
        else:
            if posix_memalign(&self.ptr, <size_t>alignment, size) != 0 or self.ptr == NULL:
                self.ptr = NULL
                raise MemoryError(f"cannot allocate {nbytes} aligned bytes")
            memset(self.ptr, 0, size)
        self.nbytes = nbytes
        self.alignment = alignment
        _n_alloc += 1
        _bytes_alloc += nbytes
        _bytes_live += nbytes

    def __dealloc__(self):
        global _bytes_live
        if self.ptr != NULL:
            if self.mapped:
                munmap(self.ptr, self.mapped_size)
            else:
                free(self.ptr)
            self.ptr = NULL
            _bytes_live -= self.nbytes

    @property
    def address(self):
        return <size_t>self.ptr

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        _export_bytes(buffer, self, self.ptr, self.nbytes, self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass


cdef enum:
    SLOT_FREE = 0
    SLOT_LEASED = 1

ctypedef void (*gate_fn)(void*) noexcept


cdef class SlotRing:
    """A growable ring of slot buffers; a slot is lent out as one :class:`SlotLease`.

    ``allocator(nbytes)`` makes a slot's buffer (a writable buffer-protocol object such as
    an AlignedBuffer, or an object whose ``buf`` attribute is one, e.g. a shared-memory block). Slots are created once and reused;
    a slot whose buffer is too small for a request is reallocated with geometric growth,
    and a new slot is added only when every slot is leased. See NOTE [ Slot leases ].
    """
    cdef list buffers
    cdef list states
    cdef object allocator
    cdef readonly long long allocations     # buffers this ring has made
    cdef readonly long long bytes_allocated  # their total size
    cdef readonly long long acquires
    cdef readonly bint closed   # close(): every slot's buffer goes as soon as it is free
    cdef public object on_release   # called with no argument after a slot is freed (or None)
    # NOTE [ Successor leases ]: per slot, the leases alive on it (2 while a successor waits
    # for the holder's release), the successor's gate (function, argument, the object that
    # keeps the argument alive) and whether the holder went before a gate was set.
    cdef list holders
    cdef list gates
    cdef list opened

    def __cinit__(self, allocator):
        self.buffers = []
        self.states = []
        self.allocator = allocator
        self.allocations = 0
        self.bytes_allocated = 0
        self.acquires = 0
        self.closed = False
        self.on_release = None
        self.holders = []
        self.gates = []
        self.opened = []

    cdef object _alloc(self, Py_ssize_t nbytes):
        buf = self.allocator(nbytes)
        self.allocations += 1
        self.bytes_allocated += nbytes
        return buf

    def reserve(self, Py_ssize_t num_slots, Py_ssize_t nbytes):
        """Make sure at least ``num_slots`` slots of ``nbytes`` exist (allocated up front)."""
        cdef Py_ssize_t i
        for i in range(len(self.buffers)):
            if self.states[i] == SLOT_FREE and _nbytes(self.buffers[i]) < max(nbytes, 0):
                self._refill(i, nbytes)
        while len(self.buffers) < num_slots:
            i = self._claim_new()
            self._refill(i, nbytes)
            self.states[i] = SLOT_FREE
            self.holders[i] = 0

    cdef Py_ssize_t _claim_new(self):
        # A new slot, leased before its buffer exists (NOTE [ Atomic leases ]).
        self.buffers.append(None)
        self.states.append(SLOT_LEASED)
        self.holders.append(1)
        self.gates.append(None)
        self.opened.append(False)
        return len(self.buffers) - 1

    cdef void _refill(self, Py_ssize_t i, Py_ssize_t nbytes) except *:
        # Give slot ``i`` a new buffer. The allocator is Python code: the slot is marked
        # leased for the duration, so no other thread can take it half-made.
        cdef int before = self.states[i]
        self.states[i] = SLOT_LEASED
        self.buffers[i] = None
        try:
            self.buffers[i] = self._alloc(nbytes)
        except BaseException:
            self.states[i] = before
            raise
        self.states[i] = before

    def acquire(self, Py_ssize_t nbytes):
        """Lease a free slot of at least ``nbytes`` (allocating only if none fits).

        NOTE [ Atomic leases ]
        Choosing a free slot and marking it leased happen with no Python call in between (no
        GIL switch point), so two threads acquiring at once never get the same slot. Only
        then may the slot get a new buffer from the allocator, which is Python code; if that
        fails, the slot is returned.
        """
        cdef Py_ssize_t i, best = -1, small = -1, n = len(self.buffers)
        cdef Py_ssize_t size, grow
        for i in range(n):
            if self.states[i] != SLOT_FREE:
                continue
            size = _nbytes(self.buffers[i])
            if size >= nbytes and size >= 0:
                best = i
                break
            if small < 0:
                small = i
        if best >= 0:
            self.states[best] = SLOT_LEASED
            self.holders[best] = 1
        elif small >= 0:
            self.states[small] = SLOT_LEASED
            self.holders[small] = 1
            best = small
            # NOTE [ Arena growth ]: variable shapes (Pad) plan for the largest batch seen so
            # far; growing by at least 1.5x keeps reallocations logarithmic in the growth.
            size = max(_nbytes(self.buffers[small]), 0)
            try:
                self._refill(small, max(nbytes, size + size // 2))
            except BaseException:
                self.states[small] = SLOT_FREE
                self.holders[small] = 0
                raise
        else:
            grow = max([_nbytes(b) for b in self.buffers] + [nbytes])
            best = self._claim_new()
            try:
                self._refill(best, grow)
            except BaseException:
                self.states[best] = SLOT_FREE
                self.holders[best] = 0
                raise
        self.acquires += 1
        try:
            return SlotLease(self, best, self.buffers[best])
        except BaseException:
            self.states[best] = SLOT_FREE
            self.holders[best] = 0
            raise

    def can_follow(self, Py_ssize_t slot):
        """Whether :meth:`acquire_after` may lease ``slot`` next: it is leased by one holder,
        with no successor waiting."""
        return 0 <= slot < len(self.states) and self.states[slot] != SLOT_FREE and self.holders[slot] == 1

    def acquire_after(self, Py_ssize_t slot):
        """A second lease on the leased ``slot``, for the batch that will overwrite it once its
        holder is gone (NOTE [ Successor leases ]). Its memory is the holder's: nothing may
        write it before the gate set with :meth:`set_gate` opens."""
        if not self.can_follow(slot):
            raise ValueError(f"slot {slot} cannot take a successor (free, or one already waits)")
        self.holders[slot] = 2
        self.gates[slot] = None
        self.opened[slot] = False
        self.acquires += 1
        try:
            return SlotLease(self, slot, self.buffers[slot])
        except BaseException:
            self.holders[slot] = 1
            raise

    def set_gate(self, Py_ssize_t slot, uintptr_t fn, uintptr_t arg, object keep):
        """Call ``fn(arg)`` (a C function, with the GIL held) when the holder of ``slot`` goes,
        or now if it went already; ``keep`` is held until then."""
        if self.opened[slot]:
            self.opened[slot] = False
            (<gate_fn>fn)(<void*>arg)
            return
        self.gates[slot] = (fn, arg, keep)

    def clear_gate(self, Py_ssize_t slot):
        """Forget the gate of ``slot`` (its batch was taken back), without calling it."""
        if 0 <= slot < len(self.gates):
            self.gates[slot] = None
            self.opened[slot] = False

    cdef void _release(self, Py_ssize_t slot):
        # states is None when the collector cleared this ring in the same cycle as the lease
        # (NOTE [ A lease's buffer survives garbage collection ]): nothing is left to free.
        cdef uintptr_t fn, arg
        if self.states is not None and 0 <= slot < len(self.states):
            if self.holders is not None and self.holders[slot] > 1:
                # NOTE [ Successor leases ]: the holder went, the successor keeps the slot and
                # its gate opens now, in C, with no Python call on the way.
                self.holders[slot] = 1
                gate = self.gates[slot]
                self.gates[slot] = None
                if gate is None:
                    self.opened[slot] = True
                else:
                    fn, arg = gate[0], gate[1]
                    (<gate_fn>fn)(<void*>arg)
                    gate = None
            else:
                if self.holders is not None:
                    self.holders[slot] = 0
                self.states[slot] = SLOT_FREE
                if self.closed:
                    self.buffers[slot] = None
            cb = self.on_release
            if cb is not None:
                # A lease may end anywhere (a dealloc on any thread, at exit): the callback must
                # never block (NOTE [ Batches in memory ] in loaderlib/_engines/depth.py).
                try:
                    cb()
                except KeyboardInterrupt:
                    # NOTE [ Ctrl-C inside a slot's release ]
                    # The callback is Python code, and a Ctrl-C pending when it starts is
                    # handled there, in a dealloc, where no exception can propagate. The
                    # lease usually ends as the user's loop rebinds its batch variable, so
                    # that is where a press can land: swallowed here, that Ctrl-C did nothing
                    # (tests/unit/test_loader_api.py makes it land there). It is raised
                    # again: the interrupt is set pending once more and the user's code meets
                    # it at its next check.
                    PyErr_SetInterrupt()
                except BaseException:
                    pass

    def buffer(self, Py_ssize_t slot):
        """The buffer object of ``slot`` (for engines that address slots by name)."""
        return self.buffers[slot]

    @property
    def num_slots(self):
        return len(self.buffers)

    @property
    def num_leased(self):
        return sum(1 for s in self.states if s != SLOT_FREE)

    @property
    def capacity_bytes(self):
        return sum(max(_nbytes(b), 0) for b in self.buffers)

    def clear(self):
        """Drop the buffers of free slots; leased ones stay with the ring for reuse (NOTE
        [ Successor leases ]: a slot with a successor waiting is leased)."""
        cdef Py_ssize_t i
        for i in range(len(self.buffers)):
            if self.states[i] == SLOT_FREE:
                self.buffers[i] = None

    def close(self):
        """Drop the buffers of free slots now and each leased one's as soon as its lease goes
        (the ring is not used again: a kept batch frees its memory when dropped, even while
        the ring itself lingers)."""
        self.closed = True
        self.clear()


cdef Py_ssize_t _nbytes(object buf):
    if buf is None:
        return -1
    if isinstance(buf, AlignedBuffer):
        return (<AlignedBuffer>buf).nbytes
    return memoryview(_exporter(buf)).nbytes


cdef object _exporter(object source):
    # Slot buffers are buffer-protocol objects, or objects whose ``buf`` attribute is one
    # (a shared-memory block, which Python < 3.12 classes cannot export directly).
    # NOTE [ A lease's buffer survives garbage collection ]: the lease holds its export on a
    # numpy array over the buffer, never on a memoryview or mmap directly. When a lease dies
    # in a reference cycle (an exception's traceback holding the frame that held it), the
    # collector clears every object of the cycle; clearing a memoryview that still has an
    # export drops its managed buffer, and the lease's PyBuffer_Release then reads freed
    # memory (a crash). numpy arrays are not tracked by the collector, so the array, and the
    # buffer it keeps, live until the lease releases them.
    obj = source if isinstance(source, AlignedBuffer) or not hasattr(source, "buf") else source.buf
    return obj if isinstance(obj, AlignedBuffer) else np.frombuffer(obj, np.uint8)


@cython.no_gc_clear
cdef class SlotLease:
    """One lent slot: exposes the slot's memory (writable bytes) and frees it on release.

    Created only by :meth:`SlotRing.acquire` and :meth:`SlotRing.acquire_after`. See NOTE
    [ Slot leases ] and NOTE [ Successor leases ].
    """
    cdef SlotRing ring
    cdef readonly Py_ssize_t slot
    cdef readonly object source   # the slot's buffer object (kept alive by the lease)
    cdef object __weakref__       # the engine follows the leases of batches it handed out
    cdef Py_buffer view
    cdef bint has_view
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, SlotRing ring, Py_ssize_t slot, object source):
        self.has_view = False
        PyObject_GetBuffer(_exporter(source), &self.view, PyBUF_SIMPLE | PyBUF_WRITABLE)
        self.has_view = True
        self.ring = ring
        self.slot = slot
        self.source = source

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False
        if self.ring is not None:
            self.ring._release(self.slot)

    @property
    def nbytes(self):
        return self.view.len

    @property
    def address(self):
        return <size_t>self.view.buf

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        _export_bytes(buffer, self, self.view.buf, self.view.len, self.shape, self.strides)

    def __releasebuffer__(self, Py_buffer* buffer):
        pass
