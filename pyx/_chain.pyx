# cython: freethreading_compatible = False
"""The fused per-sample executor (owner: loaderlib/_chain.py).

``start_into`` queues a batch on a :class:`Team` of persistent kernel threads (NOTE [ One
queue across batches ] in include/ll_pool.h): per item a free thread reads the bytes (from a
buffer, a file, or a record of an open file), then ``ll_chain_run`` (include/ll_chain.h)
decodes the region the chain needs at the chosen DCT scale and resamples it straight
into the item's output slot. Per-item failures become status codes and messages; this
module never raises for them.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.stdio cimport snprintf
from libc.string cimport memcpy

import os

import numpy as np

cimport cython
cimport numpy as cnp

from _common cimport *
from pool cimport *
from augment cimport LL_AUG_MAX, ll_aug
from fused cimport *
from loaderlib._ext._jpeg cimport Inputs, Workers

cnp.import_array()

OP_RRC = LL_OP_RRC
OP_RESIZE = LL_OP_RESIZE
OP_CENTER_CROP = LL_OP_CENTER_CROP
OP_HFLIP = LL_OP_HFLIP
MAX_OPS = LL_MAX_OPS
MAX_FILE_BYTES = LL_MAX_FILE_BYTES   # NOTE [ One sample's file size limit ]


def simd_level():
    """The SIMD level the chain kernels run at: ``"avx2"``, ``"sse2"`` or ``"scalar"``
    (NOTE [ SIMD switch ] in ll_resize.h; ``LOADERLIB_SIMD`` caps it)."""
    return ll_simd_name().decode()
DTYPE_UINT8 = LL_DTYPE_UINT8
DTYPE_FLOAT32 = LL_DTYPE_FLOAT32
DTYPE_UINT16 = LL_DTYPE_UINT16

# Where start_into's items come from.
cdef enum:
    SRC_BUFFERS = 0
    SRC_FILES = 1
    SRC_RECORDS = 2
    SRC_PIXELS = 3

SOURCE_BUFFERS = SRC_BUFFERS
SOURCE_FILES = SRC_FILES
SOURCE_RECORDS = SRC_RECORDS
SOURCE_PIXELS = SRC_PIXELS


cdef class CompiledChain:
    """An ``ll_plan``: the geometric ops, the point-wise lookup table and the layout.

    Immutable after construction; safe to share between threads.
    """
    cdef ll_plan* plan
    cdef readonly int out_h, out_w, channels, dtype, chw

    def __cinit__(self, list ops, int mode, int channels, bint dct_scaling, int strict, long long max_pixels,
                  int dtype, bint chw, object lut, int out_h, int out_w, list augs=None, list erases=None,
                  bint fast=False):
        """``ops``: tuples (kind, pos, h, w, interp, antialias, s0, s1, r0, r1, p);
        ``lut``: None or a (channels, 256) float32 (dtype float32), uint16 (dtype uint16: float16 or
        bfloat16 bits) or uint8 array;
        ``augs`` / ``erases``: augmentation ops (kind, pos, ints, doubles) run after the
        geometry / on the finished output (NOTE [ Augmentations in the chain ]);
        ``fast``: decode with NOTE [ Fast decode ] (include/ll_jpeg.h)."""
        if len(ops) > LL_MAX_OPS:
            raise ValueError(f"at most {LL_MAX_OPS} geometric transforms can be fused, got {len(ops)}")
        if channels < 1 or channels > 4:
            raise ValueError(f"1 to 4 channels supported, got {channels}")
        if out_h < 1 or out_w < 1:
            raise ValueError("the fused chain needs a fixed output size")
        self.plan = <ll_plan*>calloc(1, sizeof(ll_plan))
        if self.plan == NULL:
            raise MemoryError()
        cdef ll_plan* p = self.plan
        cdef int k
        for k, op in enumerate(ops):
            p.ops[k].kind, p.ops[k].pos, p.ops[k].h, p.ops[k].w = op[0], op[1], op[2], op[3]
            p.ops[k].interp, p.ops[k].antialias = op[4], op[5]
            p.ops[k].s0, p.ops[k].s1, p.ops[k].r0, p.ops[k].r1, p.ops[k].p = op[6], op[7], op[8], op[9], op[10]
        p.nops = len(ops)
        p.mode = mode
        p.channels = channels
        p.dct_scaling = dct_scaling
        p.strict = strict
        p.fast = fast
        p.max_pixels = max_pixels
        p.dtype = dtype
        p.chw = chw
        p.out_h = out_h
        p.out_w = out_w
        if dtype != LL_DTYPE_FLOAT32 and dtype != LL_DTYPE_UINT8 and dtype != LL_DTYPE_UINT16:
            raise ValueError(f"unknown output dtype code {dtype}")
        if dtype != LL_DTYPE_UINT8 and lut is None:
            raise ValueError("float32 and 16-bit output need a lookup table")
        cdef const uint8_t[::1] raw
        if lut is not None:
            want = (np.float32 if dtype == LL_DTYPE_FLOAT32 else np.uint16 if dtype == LL_DTYPE_UINT16
                    else np.uint8)
            if not isinstance(lut, np.ndarray) or lut.dtype != want or lut.shape != (channels, 256):
                raise ValueError(f"lookup table must be a ({channels}, 256) {np.dtype(want).name} array")
            raw = np.ascontiguousarray(lut).reshape(-1).view(np.uint8)
            memcpy(<void*>p.lutf if dtype == LL_DTYPE_FLOAT32 else <void*>p.lut16 if dtype == LL_DTYPE_UINT16
                   else <void*>p.lut8, &raw[0], raw.shape[0])
            p.use_lut = dtype == LL_DTYPE_UINT8
        self.out_h, self.out_w, self.channels, self.dtype, self.chw = out_h, out_w, channels, dtype, chw
        _fill_augs(p.aug.ops, &p.aug.n, augs or [])
        _fill_augs(p.aug.erase, &p.aug.nerase, erases or [])
        ll_plan_prepare(p)   # NOTE [ Emitting float planes in AVX-512 ]

    def __dealloc__(self):
        free(self.plan)
        self.plan = NULL


cdef _fill_augs(ll_aug* dst, int* count, list ops):
    """Copy (kind, pos, ints, doubles) tuples into ``dst``."""
    if len(ops) > LL_AUG_MAX:
        raise ValueError(f"at most {LL_AUG_MAX} augmentations can be fused, got {len(ops)}")
    cdef int k, i
    for k, (kind, pos, ints, dbls) in enumerate(ops):
        if len(ints) > 8 or len(dbls) > 16:
            raise ValueError(f"augmentation {k}: too many parameters")
        dst[k].kind, dst[k].pos = kind, pos
        for i in range(8):
            dst[k].ia[i] = ints[i] if i < len(ints) else 0
        for i in range(16):
            dst[k].da[i] = dbls[i] if i < len(dbls) else 0.0
    count[0] = len(ops)


cdef int _run_item(const ll_plan* plan, ll_worker* wk, int kind, const uint8_t* buf, size_t size,
                   const char* path, int fd, long long offset, uint64_t seed, uint64_t epoch, uint64_t index,
                   void* out, char* msg, int64_t* times, int64_t* read_bytes=NULL,
                   int64_t* read_ns=NULL) noexcept nogil:
    """One item: read (files, records), then decode and transform into ``out``; or, for
    SRC_PIXELS, transform the decoded HWC image ``buf`` of ``offset >> 32`` rows and
    ``offset & 0xffffffff`` columns. ``times`` (or NULL): read, decode, transform nanoseconds.
    ``read_bytes`` and ``read_ns`` (or NULL): the bytes this item read and the read's time
    (0 when it read nothing: pixels, buffers), whether or not ``times`` is kept."""
    cdef int64_t t0 = 0, dt = 0
    cdef int st = LL_OK
    cdef size_t n = size
    cdef long long ph, pw
    msg[0] = 0
    if kind == SRC_PIXELS:
        ph = offset >> 32
        pw = offset & <long long>4294967295
        if times != NULL:
            times[0] = 0
            times[1] = 0
        if ph < 1 or pw < 1 or <unsigned long long>size != <unsigned long long>(ph * pw * plan.channels):
            snprintf(msg, LL_MSG_LEN, "a decoded image of %lld bytes is not %lldx%lldx%d", <long long>size, ph, pw,
                     plan.channels)
            return LL_ERR_SHAPE
        return ll_chain_run_pixels(plan, wk, buf, <int>ph, <int>pw, seed, epoch, index, out, msg,
                                   &times[2] if times != NULL else NULL)
    cdef bint reads = kind == SRC_FILES or kind == SRC_RECORDS
    if reads:
        t0 = ll_now_ns()
    if kind == SRC_FILES:
        st = ll_read_file(path, &wk.file, &n, msg)
        buf = wk.file.p
    elif kind == SRC_RECORDS:
        if ll_buf_reserve(&wk.file, size if size > 0 else 1) != 0:
            st = LL_ERR_NOMEM
        else:
            st = ll_pread_all(fd, wk.file.p, size, offset, msg)
            buf = wk.file.p
    if reads:
        dt = ll_now_ns() - t0
        if read_ns != NULL:
            read_ns[0] = dt
        if read_bytes != NULL:
            read_bytes[0] = <int64_t>n if st == LL_OK else 0
    if times != NULL:
        times[0] = dt
        times[1] = 0
        times[2] = 0
    if st != LL_OK:
        return st
    if times != NULL:
        return ll_chain_run(plan, wk, buf, n, seed, epoch, index, out, msg, &times[1], &times[2])
    return ll_chain_run(plan, wk, buf, n, seed, epoch, index, out, msg, NULL, NULL)


def name_thread(bytes name not None):
    """Give the calling thread the native name ``name`` (at most 15 bytes are kept), as
    ``top -H``, py-spy and gdb show it (NOTE [ Thread names ] in include/ll_pool.h)."""
    ll_name_thread(<const char*>name, -1)


cdef class Team:
    """``size`` persistent kernel threads and their per-thread pool (NOTE [ One queue across
    batches ] in include/ll_pool.h; NOTE [ One per-thread pool ]). Batches submitted with
    :func:`start_into` queue here and run in order; any thread may submit. The threads stop
    and are joined when the team is freed, which cannot happen while a batch it runs is alive
    (each :class:`Pending` holds its team)."""
    cdef ll_pool* pool
    cdef readonly Workers workers
    cdef readonly int size

    def __cinit__(self, int size):
        self.pool = NULL
        if size < 1:
            raise ValueError("a Team needs at least one thread")
        self.workers = Workers(size)
        with nogil:
            self.pool = ll_pool_new(size)
        if self.pool == NULL:
            raise RuntimeError(f"could not start {size} kernel threads")
        self.size = size

    @property
    def usable(self):
        """False in a child process after fork(): the threads stayed in the parent."""
        return bool(ll_pool_usable(self.pool))

    @property
    def idle_ns(self):
        """Nanoseconds the threads have waited with nothing to run since the team started,
        summed over the threads. A loader-bound run's idle share,
        ``idle_ns / (wall_ns * size)``, is what the batch cap costs it (NOTE [ Staged items ])."""
        if not ll_pool_usable(self.pool):
            return 0
        cdef int64_t n
        with nogil:
            n = ll_pool_idle_ns(self.pool)
        return int(n)

    def __dealloc__(self):
        # Runs before ``workers`` is released: the threads are gone before their entries.
        if self.pool != NULL:
            with nogil:
                ll_pool_free(self.pool)
            self.pool = NULL


cdef extern from "ll_readahead.h":
    ctypedef struct ll_rreq:
        int status
        char* msg
        ll_buf data
        ll_buf path
        size_t n
    ctypedef struct ll_rwait:
        int64_t n
        int64_t nready
        int64_t* order
        int64_t* slot
    ctypedef struct ll_reader:
        ll_rreq* slots
        int64_t cap
        int depth
        int nthreads
        int reading
        int64_t reads, failures, bytes, lat_ns, cpu_ns, queue_ns, queued, taken, wait_ns
        int64_t blocked
        int64_t limit
        int64_t fresh
        uint32_t hist[96]
    ctypedef struct ll_inline_reads:
        int64_t reads, bytes, ns
        uint32_t hist[96]
    void ll_inline_count(ll_inline_reads* c, int64_t nbytes, int64_t ns) noexcept nogil
    const int LL_LAT_BINS
    const int LL_READER_MAX_THREADS
    ll_reader* ll_reader_new(int64_t cap, int depth) noexcept nogil
    int ll_reader_usable(const ll_reader* r) noexcept nogil
    int ll_reader_set_depth(ll_reader* r, int depth) noexcept nogil
    void ll_reader_set_limit(ll_reader* r, int64_t limit) noexcept nogil
    void ll_reader_trim(ll_reader* r) noexcept nogil
    int64_t ll_reader_queue(ll_reader* r, const int64_t* pos, int64_t n, const char* const* paths,
                            const int32_t* fds, const int64_t* offs, const int64_t* sizes) noexcept nogil
    void ll_reader_attach(ll_reader* r, ll_rwait* w, const int64_t* pos, int64_t n) noexcept nogil
    void ll_reader_detach(ll_reader* r, ll_rwait* w) noexcept nogil
    int64_t ll_rwait_next(ll_reader* r, ll_rwait* w, int64_t k, int64_t timeout_ns, int64_t* waited) noexcept nogil
    void ll_reader_release(ll_reader* r, int64_t slot) noexcept nogil
    int64_t ll_reader_take(ll_reader* r, int64_t pos, int64_t timeout_ns, int64_t* waited) noexcept nogil
    void ll_reader_stop(ll_reader* r) noexcept nogil
    int ll_reader_join(ll_reader* r, int64_t timeout_ns) noexcept nogil
    void ll_reader_close(ll_reader* r) noexcept nogil
    int64_t ll_reader_buffer_bytes(ll_reader* r) noexcept nogil


LAT_BINS = LL_LAT_BINS
MAX_IO_THREADS = LL_READER_MAX_THREADS


cdef class Reader:
    """The read-ahead stage's native half (NOTE [ Read-ahead ] in include/ll_readahead.h): a
    ring of ``cap`` read slots keyed by stream position and up to ``depth`` IO threads.

    Positions are queued in increasing order with :meth:`queue_files` or
    :meth:`queue_ranges`; batches started with ``start_into(..., reader=self,
    positions=...)`` take their bytes from it. Freed (its threads told to stop) when the last
    batch holding it and its owner are gone; :meth:`stop` stops it earlier.
    """
    cdef ll_reader* r
    cdef readonly int64_t cap

    def __cinit__(self, int64_t cap, int depth):
        self.r = NULL
        if cap < 1:
            raise ValueError("a Reader needs at least one slot")
        with nogil:
            self.r = ll_reader_new(cap, depth)
        if self.r == NULL:
            raise MemoryError(f"could not allocate {cap} read slots")
        self.cap = cap

    def __dealloc__(self):
        if self.r != NULL:
            with nogil:
                ll_reader_close(self.r)
            self.r = NULL

    @property
    def usable(self):
        """False in a child process after fork(): the IO threads stayed in the parent."""
        return bool(ll_reader_usable(self.r))

    def set_depth(self, int depth):
        """Reads in flight from now on (1 to MAX_IO_THREADS); returns the IO threads running."""
        cdef int n
        with nogil:
            n = ll_reader_set_depth(self.r, depth)
        return n

    def set_limit(self, int64_t limit):
        """Use at most ``limit`` read slots (1 to cap): the read-ahead's memory bound."""
        with nogil:
            ll_reader_set_limit(self.r, limit)

    def trim(self):
        """Free the buffers of the read slots not in use (their memory goes back)."""
        with nogil:
            ll_reader_trim(self.r)

    def stop(self):
        """Drop queued reads and let the IO threads exit; batches still waiting give up."""
        with nogil:
            ll_reader_stop(self.r)

    def join(self, double timeout=0.0):
        """:meth:`stop`, then wait (without the GIL) for every IO thread to finish its read
        and exit, at most ``timeout`` seconds (0: no limit), and join them (NOTE [ Closing
        the read-ahead ] in include/ll_readahead.h). Returns how many were still in a read
        when the time ran out (they are detached)."""
        cdef int64_t tns = <int64_t>(timeout * 1e9) if timeout > 0 else 0
        cdef int left
        with nogil:
            left = ll_reader_join(self.r, tns)
        return left

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def queue_files(self, const int64_t[::1] positions not None, list paths not None):
        """Queue whole-file reads of ``paths`` (bytes) at ``positions``; returns how many
        positions were taken (the ring may be full)."""
        cdef Py_ssize_t n = positions.shape[0]
        if len(paths) != n:
            raise ValueError(f"{len(paths)} paths for {n} positions")
        if n == 0:
            return 0
        cdef const char** ptrs = <const char**>calloc(n, sizeof(char*))
        if ptrs == NULL:
            raise MemoryError()
        cdef Py_ssize_t i
        cdef int64_t k
        try:
            for i in range(n):
                p = paths[i]
                if not isinstance(p, bytes):
                    raise TypeError(f"path {i}: paths must be bytes (os.fsencode)")
                ptrs[i] = <const char*>(<bytes>p)
            with nogil:
                k = ll_reader_queue(self.r, &positions[0], n, ptrs, NULL, NULL, NULL)
        finally:
            free(ptrs)
        return k

    def queue_ranges(self, const int64_t[::1] positions not None, const int32_t[::1] fds not None,
                     const int64_t[::1] offsets not None, const int64_t[::1] sizes not None):
        """Queue ``sizes[i]`` bytes at ``offsets[i]`` of descriptor ``fds[i]`` at
        ``positions``; returns how many positions were taken."""
        cdef Py_ssize_t n = positions.shape[0]
        if fds.shape[0] != n or offsets.shape[0] != n or sizes.shape[0] != n:
            raise ValueError("queue_ranges: inconsistent table sizes")
        if n == 0:
            return 0
        cdef Py_ssize_t i
        for i in range(n):
            if sizes[i] < 0 or offsets[i] < 0 or sizes[i] > LL_MAX_FILE_BYTES:
                raise ValueError(f"record {i}: offset {offsets[i]} / size {sizes[i]} out of range")
        cdef int64_t k
        with nogil:
            k = ll_reader_queue(self.r, &positions[0], n, NULL, &fds[0], &offsets[0], &sizes[0])
        return k

    def take(self, int64_t position, double timeout=0.0):
        """The bytes read for stream ``position`` (a copy; the slot is freed), waiting for the
        read without the GIL, at most ``timeout`` seconds (0: no limit). Returns ``(data,
        waited_ns)``: ``data`` is None when the position was never queued (read it yourself);
        a failed read raises OSError with its reason; a timeout raises TimeoutError."""
        cdef int64_t waited = 0, s
        cdef int64_t tns = <int64_t>(timeout * 1e9) if timeout > 0 else 0
        with nogil:
            s = ll_reader_take(self.r, position, tns, &waited)
        if s == -1:
            return None, waited
        if s == -2:
            raise TimeoutError(f"the read did not complete within {timeout:g} s")
        cdef ll_rreq* q = &self.r.slots[s]
        try:
            if q.status != LL_OK:
                raise OSError((<bytes>q.msg).decode("utf-8", "replace"))
            data = (<char*>q.data.p)[:q.n] if q.n > 0 else b""
        finally:
            with nogil:
                ll_reader_release(self.r, s)
        return data, waited

    def buffer_bytes(self):
        """Bytes the read slots' buffers hold (they grow to the largest sample each slot held)."""
        cdef int64_t total
        with nogil:
            total = ll_reader_buffer_bytes(self.r)
        return int(total)

    def counters(self):
        """A snapshot: reads done, failures, bytes, summed latency / CPU / queue nanoseconds,
        reads during which an IO thread slept (``blocked``; -1 where not measurable), reads
        queued so far, items the kernel threads took and their summed wait for bytes,
        reads in progress, depth, slot limit, IO threads, the slots ever used
        (``slots_touched``: the rest were never written, NOTE [ Read slots are touched lazily ]
        in include/ll_readahead.h), and the latency histogram
        (LAT_BINS counts; bin b covers [2^(b/4), 2^((b+1)/4)) microseconds)."""
        cdef ll_reader* r = self.r
        # The counters are written under the reader's mutex; a torn read of one 64-bit
        # counter cannot happen on the platforms built for, and a snapshot need not be atomic.
        hist = [int(r.hist[b]) for b in range(LL_LAT_BINS)]
        return {"reads": int(r.reads), "failures": int(r.failures), "bytes": int(r.bytes), "lat_ns": int(r.lat_ns),
                "cpu_ns": int(r.cpu_ns), "blocked": int(r.blocked), "queue_ns": int(r.queue_ns),
                "queued": int(r.queued),
                "taken": int(r.taken), "wait_ns": int(r.wait_ns), "limit": int(r.limit),
                "reading": int(r.reading), "depth": int(r.depth), "threads": int(r.nthreads),
                "slots_touched": int(r.fresh), "hist": hist}


cdef struct RunCtx:
    const ll_plan* plan
    ll_worker* workers
    int kind
    uintptr_t* ptrs
    size_t* sizes
    const int32_t* fds
    int fd
    const int64_t* offsets
    const int64_t* indices
    uint64_t seed, epoch
    char* base
    Py_ssize_t item_bytes
    int32_t* status
    uint8_t* msgs
    Py_ssize_t msg_stride
    int64_t* times
    ll_reader* reader        # NULL: every item reads in the pass
    ll_rwait wait
    int64_t timeout_ns       # the longest wait for bytes (0: no limit)
    double timeout_s
    ll_inline_reads inl      # reads the kernel threads did themselves (NOTE [ Every read counts ])


cdef int64_t _job_run(RunCtx* c, int64_t k, int tid, char* dst) noexcept nogil:
    # Claim k of the batch into its output slot, or into ``dst`` (NOTE [ Staged items ] in
    # include/ll_pool.h); returns the item's index in the batch.
    cdef int kind = c.kind
    cdef int64_t i = k
    cdef int64_t waited = 0, s = -1, nbytes = 0, read_ns = 0
    cdef int64_t* times
    cdef char* msg
    cdef ll_rreq* q
    if c.reader != NULL:
        # NOTE [ Read-ahead ]: claim k runs the k-th item whose bytes arrived.
        i = ll_rwait_next(c.reader, &c.wait, k, c.timeout_ns, &waited)
        s = c.wait.slot[i]
    if dst == NULL:
        dst = c.base + i * c.item_bytes
    times = c.times + 3 * i if c.times != NULL else NULL
    msg = <char*>(c.msgs + i * c.msg_stride)
    if s == -2:
        snprintf(msg, LL_MSG_LEN, "read failed: the read did not complete within %.6g s", c.timeout_s)
        c.status[i] = LL_ERR_READ
        if times != NULL:
            times[0] = waited
            times[1] = 0
            times[2] = 0
        return i
    if s >= 0:
        q = &c.reader.slots[s]
        msg[0] = 0
        if q.status != LL_OK:
            snprintf(msg, LL_MSG_LEN, "%s", q.msg)
            c.status[i] = q.status
            if times != NULL:
                times[1] = 0
                times[2] = 0
        elif times != NULL:
            c.status[i] = ll_chain_run(c.plan, &c.workers[tid], q.data.p, q.n, c.seed, c.epoch, <uint64_t>c.indices[i],
                                       dst, msg, &times[1], &times[2])
        else:
            c.status[i] = ll_chain_run(c.plan, &c.workers[tid], q.data.p, q.n, c.seed, c.epoch, <uint64_t>c.indices[i],
                                       dst, msg, NULL, NULL)
        if times != NULL:
            times[0] = waited
        ll_reader_release(c.reader, s)
        return i
    c.status[i] = _run_item(
        c.plan, &c.workers[tid], kind,
        <const uint8_t*>c.ptrs[i] if kind == SRC_BUFFERS or kind == SRC_PIXELS else NULL, c.sizes[i],
        <const char*>c.ptrs[i] if kind == SRC_FILES else NULL, c.fds[i] if c.fds != NULL else c.fd,
        c.offsets[i] if kind == SRC_RECORDS or kind == SRC_PIXELS else 0, c.seed, c.epoch, <uint64_t>c.indices[i],
        dst, msg, times, &nbytes, &read_ns)
    if kind == SRC_FILES or kind == SRC_RECORDS:
        ll_inline_count(&c.inl, nbytes, read_ns)
    if times != NULL:
        times[0] += waited
    return i


# NOTE [ Staged items ]: LOADERLIB_STAGING=off turns staging off (to compare).
cdef bint _STAGING = os.environ.get("LOADERLIB_STAGING", "on").lower() not in ("off", "0")


cdef void _job_item(void* ctx, int64_t k, int tid) noexcept nogil:
    _job_run(<RunCtx*>ctx, k, tid, NULL)


cdef int _job_stage(void* ctx, int64_t k, int tid, int slot) noexcept nogil:
    # NOTE [ Staged items ]: claim k runs into the thread's scratch ``slot``; 0 when there is
    # no memory for it (the claim then runs at the gate's opening).
    cdef RunCtx* c = <RunCtx*>ctx
    cdef ll_worker* w = &c.workers[tid]
    if ll_buf_reserve(&w.stage[slot], <size_t>c.item_bytes) != 0:
        return 0
    w.stage_item[slot] = _job_run(c, k, tid, <char*>w.stage[slot].p)
    return 1


cdef void _job_flush(void* ctx, int tid, int slot) noexcept nogil:
    # The gate opened: the staged item goes into its place in the batch.
    cdef RunCtx* c = <RunCtx*>ctx
    cdef ll_worker* w = &c.workers[tid]
    memcpy(c.base + w.stage_item[slot] * c.item_bytes, w.stage[slot].p, <size_t>c.item_bytes)


cdef class Pending:
    """One batch queued on a :class:`Team` by :func:`start_into`. ``wait()`` blocks (without
    the GIL) until every item has been written or has its status; dropping the object waits
    too, so the memory the kernels write is never freed under them."""
    cdef ll_job job
    cdef RunCtx ctx
    cdef Team team
    cdef Reader reader
    cdef Inputs inp
    cdef list items
    cdef object refs
    cdef uintptr_t* ptrs
    cdef size_t* sizes
    cdef bint submitted, finished
    cdef readonly long long opened_ns   # when the gate opened (CLOCK_MONOTONIC ns; 0: never gated or not yet)
    cdef const int64_t[::1] offsets_mv
    cdef const int64_t[::1] indices_mv
    cdef const int32_t[::1] fds_mv
    cdef int64_t[:, ::1] timings_mv
    cdef int32_t[::1] status_mv
    cdef uint8_t[:, ::1] msgs_mv

    def __cinit__(self):
        self.ptrs = NULL
        self.sizes = NULL
        self.ctx.reader = NULL
        self.ctx.wait.order = NULL
        self.ctx.wait.slot = NULL
        self.submitted = False
        self.finished = False

    def done(self):
        """Whether the batch has finished (does not block)."""
        return not self.submitted or self.finished or bool(ll_pool_done(self.team.pool, &self.job))

    def staged(self):
        """Items the team ran into its own scratch while the gate was closed (NOTE [ Staged
        items ] in include/ll_pool.h); they are written into the output when it opens."""
        return int(ll_pool_staged(self.team.pool, &self.job)) if self.submitted else 0

    def gated(self):
        """Whether the batch waits behind its closed gate (``start_into(..., gated=True)``)."""
        return self.submitted and not self.finished and bool(ll_pool_gated(self.team.pool, &self.job))

    def wait_open(self, double timeout):
        """Wait (without the GIL) until the gate opens or ``timeout`` seconds pass; returns
        whether it is still closed."""
        cdef int64_t ns = <int64_t>(timeout * 1e9)
        cdef int g
        if not self.submitted or self.finished:
            return False
        with nogil:
            g = ll_pool_wait_open(self.team.pool, &self.job, ns)
        return bool(g)

    def open(self):
        """Open the batch's gate: the team's threads may start its items (a no-op when open)."""
        if self.submitted and not self.finished:
            _open_gate(<void*>self)

    def withdraw(self):
        """Take the batch back while its gate is still closed: no item runs, what it attached
        to the read-ahead is given up, and it counts as finished. False (nothing changed) when
        the gate was already open: then it runs and ``wait()`` waits for it as usual."""
        if not self.submitted or self.finished:
            return False
        cdef int taken
        with nogil:   # it waits for a thread running a staged item to let go (NOTE [ Staged items ])
            taken = ll_pool_withdraw(self.team.pool, &self.job)
        if not taken:
            return False
        if self.ctx.reader != NULL:
            with nogil:
                ll_reader_detach(self.ctx.reader, &self.ctx.wait)
        self.finished = True
        self._release()
        return True

    def gate_hook(self):
        """``(function, argument)`` addresses for :meth:`SlotRing.set_gate
        <loaderlib._ext._arena.SlotRing.set_gate>`: calling the function on the argument, with
        the GIL held, opens this batch's gate (the caller keeps this object alive until then)."""
        return <uintptr_t>&_open_gate, <uintptr_t><void*>self

    def wait(self):
        """Block until the batch has finished; then its inputs are released."""
        if self.submitted and not self.finished:
            if not ll_pool_usable(self.team.pool):
                raise RuntimeError("this batch was started in another process (the process forked while it ran)")
            with nogil:
                ll_pool_wait(self.team.pool, &self.job)
            self.finished = True
        self._release()

    cdef void _release(self):
        if self.inp is not None:
            self.inp.release()
            self.inp = None
        free(self.ptrs)
        free(self.sizes)
        free(self.ctx.wait.order)
        free(self.ctx.wait.slot)
        self.ptrs = NULL
        self.sizes = NULL
        self.ctx.wait.order = NULL
        self.ctx.wait.slot = NULL
        self.ctx.reader = NULL
        self.reader = None
        self.items = None
        self.refs = None

    def inline_reads(self):
        """The reads the kernel threads did themselves in this batch (samples not read ahead),
        once it has finished: ``(reads, bytes, nanoseconds, histogram)``, the histogram in the
        reader's bins (NOTE [ Every read counts ] in include/ll_readahead.h)."""
        cdef ll_inline_reads* c = &self.ctx.inl
        return int(c.reads), int(c.bytes), int(c.ns), [int(c.hist[b]) for b in range(LL_LAT_BINS)]

    def __dealloc__(self):
        cdef int taken
        if self.submitted and not self.finished and self.team is not None and ll_pool_usable(self.team.pool):
            with nogil:   # waits for a thread running a staged item (NOTE [ Staged items ])
                taken = ll_pool_withdraw(self.team.pool, &self.job)
            if taken:
                # Never opened (NOTE [ Batches in memory ]): nothing written, nothing to wait for.
                if self.ctx.reader != NULL:
                    with nogil:
                        ll_reader_detach(self.ctx.reader, &self.ctx.wait)
            else:
                with nogil:
                    ll_pool_wait(self.team.pool, &self.job)
        self.finished = True
        self._release()


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _open_gate(void* pending) noexcept:
    # The gate opener a slot's release calls (SlotRing.set_gate): the GIL is held, and the
    # Pending is alive (the ring holds it until the gate is opened or cleared).
    cdef Pending p = <Pending>pending
    if p.submitted and not p.finished and p.team is not None:
        if p.opened_ns == 0:
            p.opened_ns = ll_now_ns()
        ll_pool_open(p.team.pool, &p.job)


def start_into(CompiledChain chain not None, Team team not None, int kind, list items, int fd,
               const int64_t[::1] offsets, cnp.ndarray out not None, const int64_t[::1] indices not None,
               uint64_t seed, uint64_t epoch, int num_threads, int64_t[:, ::1] timings,
               int32_t[::1] status not None, uint8_t[:, ::1] msgs not None, const int32_t[::1] fds=None,
               Reader reader=None, const int64_t[::1] positions=None, double timeout=0.0, bint gated=False):
    """Queue the fused chain for every item of a batch on ``team``, into ``out[i]``; returns
    a :class:`Pending` whose ``wait()`` returns once every item is done.

    ``kind``: SOURCE_BUFFERS: ``items`` are bytes-like buffers; SOURCE_FILES: ``items``
    are file paths (bytes), read inside the pass; SOURCE_RECORDS: records of the open file
    ``fd`` (or of ``fds[i]`` when given: records of several shard files in one pass):
    ``offsets[i]`` and ``items[i]`` (the size, an int); SOURCE_PIXELS: decoded HWC images,
    ``offsets[i]`` = rows << 32 | columns. With ``reader`` and ``positions`` (the items'
    stream positions; SOURCE_FILES and SOURCE_RECORDS), items whose reads ``reader`` queued
    take their bytes from it, in the order they arrive, waiting at most ``timeout`` seconds
    (0: no limit) for one (NOTE [ Read-ahead ]). At most ``num_threads`` of the team's threads work
    on the batch (NOTE [ One queue across batches ]). Per item: status[i] is LL_OK, LL_WARNED
    or an error code with the reason in msgs[i]. ``out``, ``status``, ``msgs`` and
    ``timings`` belong to the kernels until ``wait()`` returns. ``gated``: queued behind a
    closed gate, no item starts before :meth:`Pending.open` (or the hook of
    :meth:`Pending.gate_hook`); its reads go out at once (NOTE [ Batches in memory ]).
    """
    cdef Py_ssize_t n = len(items)
    if indices.shape[0] != n or status.shape[0] != n or msgs.shape[0] != n or msgs.shape[1] < LL_MSG_LEN:
        raise ValueError("start_into: inconsistent table sizes")
    if timings is not None and (timings.shape[0] != n or timings.shape[1] != 3):
        raise ValueError("start_into: timings must be (N, 3)")
    if num_threads < 1 or num_threads > team.size:
        raise ValueError("start_into: team smaller than num_threads")
    if not team.usable:
        raise RuntimeError("start_into: the team's threads belong to another process (this one forked)")
    if kind != SRC_BUFFERS and kind != SRC_FILES and kind != SRC_RECORDS and kind != SRC_PIXELS:
        raise ValueError(f"start_into: unknown source kind {kind}")
    if (kind == SRC_RECORDS or kind == SRC_PIXELS) and (offsets is None or offsets.shape[0] != n):
        raise ValueError("start_into: offsets must have one entry per record (per image: rows << 32 | columns)")
    if out.shape[0] != n or not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out):
        raise ValueError("start_into: out must be a writeable C-contiguous (N, ...) array")
    cdef Py_ssize_t item_bytes = out.nbytes // n if n > 0 else 0
    cdef Py_ssize_t expect = <Py_ssize_t>chain.out_h * chain.out_w * chain.channels * (
        4 if chain.dtype == LL_DTYPE_FLOAT32 else 2 if chain.dtype == LL_DTYPE_UINT16 else 1)
    if n > 0 and item_bytes != expect:
        raise ValueError(f"start_into: each output slot has {item_bytes} bytes, the chain writes {expect}")
    if fds is not None and fds.shape[0] != n:
        raise ValueError(f"start_into: {fds.shape[0]} descriptors for {n} items")
    if reader is not None:
        if kind != SRC_FILES and kind != SRC_RECORDS:
            raise ValueError("start_into: read-ahead applies to files and records only")
        if positions is None or positions.shape[0] != n:
            raise ValueError("start_into: a reader needs one stream position per item")
        if not reader.usable:
            raise RuntimeError("start_into: the reader's threads belong to another process (this one forked)")
    cdef Pending pend = Pending()
    pend.team = team
    pend.items = items
    pend.refs = (chain, out)
    pend.offsets_mv = offsets
    pend.indices_mv = indices
    pend.fds_mv = fds
    pend.timings_mv = timings
    pend.status_mv = status
    pend.msgs_mv = msgs
    pend.ptrs = <uintptr_t*>calloc(max(n, 1), sizeof(uintptr_t))
    pend.sizes = <size_t*>calloc(max(n, 1), sizeof(size_t))
    if pend.ptrs == NULL or pend.sizes == NULL:
        raise MemoryError()
    cdef Py_ssize_t i
    cdef long long sz
    if kind == SRC_BUFFERS or kind == SRC_PIXELS:
        pend.inp = Inputs(items)
        for i in range(n):
            pend.ptrs[i] = <uintptr_t>pend.inp.ptrs[i]
            pend.sizes[i] = pend.inp.sizes[i]
    else:
        for i in range(n):
            it = items[i]
            if kind == SRC_FILES:
                if not isinstance(it, bytes):
                    raise TypeError(f"item {i}: paths must be bytes (os.fsencode)")
                pend.ptrs[i] = <uintptr_t><const char*>(<bytes>it)
            else:
                sz = it
                if sz < 0 or offsets[i] < 0:
                    raise ValueError(f"record {i}: negative offset or size")
                pend.sizes[i] = <size_t>sz
    if n == 0:
        pend._release()
        return pend
    cdef RunCtx* c = &pend.ctx
    c.plan = chain.plan
    c.workers = team.workers.w
    c.kind = kind
    c.ptrs = pend.ptrs
    c.sizes = pend.sizes
    c.fds = &fds[0] if fds is not None else NULL
    c.fd = fd
    c.offsets = &offsets[0] if offsets is not None and offsets.shape[0] > 0 else NULL
    c.indices = &indices[0]
    c.seed = seed
    c.epoch = epoch
    c.base = <char*>cnp.PyArray_DATA(out)
    c.item_bytes = item_bytes
    c.status = &status[0]
    c.msgs = &msgs[0, 0]
    c.msg_stride = msgs.strides[0]
    c.times = &timings[0, 0] if timings is not None else NULL
    if reader is not None:
        c.wait.order = <int64_t*>calloc(n, sizeof(int64_t))
        c.wait.slot = <int64_t*>calloc(n, sizeof(int64_t))
        if c.wait.order == NULL or c.wait.slot == NULL:
            pend._release()
            raise MemoryError()
        pend.reader = reader
        c.reader = reader.r
        c.timeout_s = timeout
        c.timeout_ns = <int64_t>(timeout * 1e9) if timeout > 0 else 0
        with nogil:
            ll_reader_attach(c.reader, &c.wait, &positions[0], n)
    pend.job.fn = _job_item
    pend.job.ctx = c
    pend.job.n = n
    pend.job.limit = num_threads
    # NOTE [ Staged items ]: while the gate is closed, up to an eighth of the batch (four items
    # a thread) may be run ahead into the team's scratch.
    pend.job.stage = NULL
    if gated and _STAGING:
        pend.job.stage = _job_stage
    pend.job.flush = _job_flush
    pend.job.stage_max = max(1, n // 8)
    pend.opened_ns = 0
    pend.submitted = True
    cdef int closed = 1 if gated else 0
    with nogil:
        ll_pool_submit_gated(team.pool, &pend.job, closed)
    return pend
