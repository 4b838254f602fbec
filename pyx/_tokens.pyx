# cython: freethreading_compatible = False
"""Token kernels: training rows from a token corpus (owner: loaderlib/_datasets/tokens/dataset.py).

``rows_into`` runs one ``prange`` over the rows of a batch; per row the C helper ``ll_tok_row``
(include/ll_tokens.h, NOTE [ A token row ]) copies the row's spans of the corpus and writes ``input_ids``, ``labels`` and ``position_ids`` with the row's
segment starts, and returns a status code, never raising. ``cu_seqlens_into`` turns the rows'
segment starts into the batch's ``cu_seqlens``; ``best_fit`` places document pieces into rows.
"""

from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.errno cimport errno
from libc.stdlib cimport free, malloc
from libc.string cimport strerror
from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_ND, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from posix.mman cimport MADV_RANDOM, MAP_FAILED, MAP_SHARED, PROT_READ, madvise, mmap, munmap
from posix.types cimport off_t
from posix.unistd cimport _SC_PAGESIZE, sysconf

cimport cython
from cython.parallel cimport prange, threadid

from pool cimport *


cdef extern from "ll_tokens.h":
    const int LL_TOK_U8, LL_TOK_U16, LL_TOK_I16, LL_TOK_U32, LL_TOK_I32, LL_TOK_I64
    const int LL_TOK_OUT_U16, LL_TOK_OUT_I32, LL_TOK_OUT_I64
    const int LL_TOK_OK, LL_TOK_RANGE, LL_TOK_SPAN, LL_TOK_NOMEM

    ctypedef struct ll_tok_file:
        const void* data
        int64_t ntok
        int dtype
        const int64_t* bounds
        int64_t nbounds
        int64_t bdiv
        int bshift
        int eos_split

    ctypedef struct ll_tok_spec:
        const ll_tok_file* files
        int64_t nfiles
        const int64_t* file_start
        int64_t eos
        int64_t limit
        int64_t pad_id
        int64_t ignore
        int mask_doc_starts
        int64_t S
        int ids_type
        int idx_type

    ctypedef struct ll_tok_fail:
        int status
        int64_t where

    int ll_tok_row(const ll_tok_spec* sp, const int64_t* seg_g, const int64_t* seg_n, int64_t nseg, int detect,
                   int32_t* starts, int64_t* nseg_out, void* ids, void* lab, void* pos,
                   ll_tok_fail* fail) noexcept nogil
    int64_t ll_tok_cu_seqlens(const int32_t* starts, int64_t stride, const int64_t* counts, int64_t n, int64_t S,
                              int32_t* cu, int64_t* max_len) noexcept nogil
    ctypedef struct ll_tok_job:
        ll_tok_spec sp
        const int64_t* seg_g
        const int64_t* seg_n
        const int64_t* row_ptr
        const int64_t* out_rows
        int detect
        char* ids
        char* lab
        char* pos
        int64_t ids_stride
        int64_t idx_stride
        int32_t* starts
        int64_t starts_stride
        int64_t* counts
        int32_t* status
        int64_t* where
        int64_t* item_ns
    void ll_tok_job_item(void* ctx, int64_t i, int tid) noexcept nogil
    int ll_tok_log2(int64_t d) noexcept nogil
    int64_t ll_tok_will_need(const ll_tok_spec* sp, const int64_t* seg_g, const int64_t* seg_n,
                             int64_t nseg) noexcept nogil
    int64_t ll_tok_best_fit(const int64_t* lens, int64_t n, int64_t cap, int64_t* row_of,
                            int64_t* order) noexcept nogil


#: Source token types (the ``dtype`` of a file in ``Corpus``), by numpy dtype name.
SOURCE_TYPES = {"uint8": LL_TOK_U8, "uint16": LL_TOK_U16, "int16": LL_TOK_I16, "uint32": LL_TOK_U32,
                "int32": LL_TOK_I32, "int64": LL_TOK_I64}
#: Output types of ``input_ids`` (all three) and of labels and positions (int32, int64).
OUTPUT_TYPES = {"uint16": LL_TOK_OUT_U16, "int32": LL_TOK_OUT_I32, "int64": LL_TOK_OUT_I64}
OK, RANGE, SPAN, NOMEM = LL_TOK_OK, LL_TOK_RANGE, LL_TOK_SPAN, LL_TOK_NOMEM


cdef class Corpus:
    """The files of a token corpus as the kernels read them: per file its tokens (a 1-D array,
    usually a read-only mapping), their type code and its document starts (or None).

    Keeps every array it points into alive for as long as it lives. Read-only once made, so
    any number of threads may read it at once.
    """

    cdef ll_tok_file* files
    cdef int64_t nfiles
    cdef int64_t[::1] starts
    cdef list keep

    def __cinit__(self, list tokens, list sizes, list types, list bounds, list divisors, list eos_split):
        cdef Py_ssize_t i, n = len(tokens)
        self.files = <ll_tok_file*>malloc(max(n, 1) * sizeof(ll_tok_file))
        if self.files == NULL:
            raise MemoryError()
        self.nfiles = n
        self.keep = []
        import numpy as np
        st = np.zeros(n + 1, np.int64)
        for i in range(n):
            b = bounds[i]
            self.files[i].data = NULL
            self.files[i].ntok = sizes[i]
            self.files[i].dtype = types[i]
            self.files[i].bdiv = divisors[i]
            self.files[i].bshift = ll_tok_log2(divisors[i])
            self.files[i].eos_split = 1 if eos_split[i] else 0
            if tokens[i] is not None:
                self.set_tokens(i, tokens[i])
            if b is None or b.size == 0:
                self.files[i].bounds = NULL
                self.files[i].nbounds = 0
            else:
                self.keep.append(b)
                self.files[i].bounds = <const int64_t*><uintptr_t>b.__array_interface__["data"][0]
                self.files[i].nbounds = b.size
            st[i + 1] = st[i] + sizes[i]
        self.starts = st

    def set_tokens(self, Py_ssize_t i, a):
        """Point file ``i`` at its tokens, once they are local (a C-contiguous 1-D array of
        the file's size and type). Files without them read as an error, never as memory."""
        if not 0 <= i < self.nfiles:
            raise IndexError(f"file {i} out of range")
        if a.ndim != 1 or a.size != self.files[i].ntok or not a.flags.c_contiguous:
            raise ValueError(f"file {i}: {a.size} tokens, expected {self.files[i].ntok} in one C-contiguous run")
        if SOURCE_TYPES.get(a.dtype.name) != self.files[i].dtype:
            raise ValueError(f"file {i}: tokens of {a.dtype}, not the type it was opened with")
        self.keep.append(a)
        self.files[i].data = <const void*><uintptr_t>a.__array_interface__["data"][0] if a.size else NULL

    def __dealloc__(self):
        free(self.files)

    @property
    def file_start(self):
        """The global token offset of each file, and the total last (int64, ``nfiles + 1``)."""
        return self.starts.base


cdef int _check_rows(str fn, const int64_t[::1] seg_g, const int64_t[::1] seg_n, const int64_t[::1] row_ptr,
                     const int64_t[::1] out_rows, int64_t seq_len, const int32_t[:, ::1] starts,
                     const int32_t[::1] status, const int64_t[::1] where, Py_ssize_t room) except -1:
    """What :func:`rows_into` and :func:`start_rows_into` (``fn``, for messages) check of their
    rows before a kernel reads them: ``room`` output rows exist."""
    cdef Py_ssize_t n = out_rows.shape[0], i
    if row_ptr.shape[0] != n + 1 or status.shape[0] < n or where.shape[0] < n:
        raise ValueError(f"{fn}: row_ptr, status and where must cover every row")
    if starts.shape[1] < seq_len + 2:
        raise ValueError(f"{fn}: starts needs seq_len + 2 columns")
    if n == 0:
        return 0
    if row_ptr[0] < 0 or row_ptr[n] > seg_g.shape[0] or seg_n.shape[0] != seg_g.shape[0]:
        raise ValueError(f"{fn}: row_ptr points outside the spans")
    for i in range(n):
        if row_ptr[i + 1] < row_ptr[i]:
            raise ValueError(f"{fn}: row_ptr must not decrease")
        if out_rows[i] < 0 or out_rows[i] >= room:
            raise ValueError(f"{fn}: output row {out_rows[i]} out of range")
    return 0


cdef void _spec(ll_tok_spec* sp, Corpus corpus, int64_t seq_len, int64_t eos, int64_t limit, int64_t pad_id,
                int64_t ignore, bint mask_doc_starts, int ids_type, int idx_type) noexcept:
    sp.files = corpus.files
    sp.nfiles = corpus.nfiles
    sp.file_start = &corpus.starts[0]
    sp.eos = eos
    sp.limit = limit
    sp.pad_id = pad_id
    sp.ignore = ignore
    sp.mask_doc_starts = 1 if mask_doc_starts else 0
    sp.S = seq_len
    sp.ids_type = ids_type
    sp.idx_type = idx_type


@cython.boundscheck(False)
@cython.wraparound(False)
def rows_into(Corpus corpus, const int64_t[::1] seg_g not None, const int64_t[::1] seg_n not None,
              const int64_t[::1] row_ptr not None, const int64_t[::1] out_rows not None, bint detect,
              int64_t seq_len, int64_t eos, int64_t limit, int64_t pad_id, int64_t ignore, bint mask_doc_starts,
              int ids_type, int idx_type, uintptr_t ids, uintptr_t labels, uintptr_t positions,
              Py_ssize_t ids_stride, Py_ssize_t idx_stride, int32_t[:, ::1] starts not None,
              int64_t[::1] counts not None, int32_t[::1] status not None, int64_t[::1] where not None,
              int num_threads):
    """Fill output rows ``out_rows[i]`` from the spans ``row_ptr[i]:row_ptr[i + 1]`` of
    ``seg_g``/``seg_n`` (global token start, length; NOTE [ A token row ]).

    ``ids``/``labels``/``positions``: addresses of C-contiguous 2-D outputs of ``seq_len``
    columns, rows ``ids_stride`` / ``idx_stride`` bytes apart (the owner checks them).
    ``starts[r]`` (``seq_len + 2`` int32) and ``counts[r]`` receive output row r's segment
    starts; ``status[i]``/``where[i]`` row i's status code and the global token at fault.
    Thread-safe for distinct output rows; one ``prange`` over the rows.
    """
    cdef ll_tok_spec sp
    cdef Py_ssize_t n = out_rows.shape[0], i
    cdef int64_t r, a, b
    cdef int t, nt = num_threads if num_threads > 0 else 1
    cdef ll_tok_fail* fails
    _check_rows("rows_into", seg_g, seg_n, row_ptr, out_rows, seq_len, starts, status, where,
                min(starts.shape[0], counts.shape[0]))
    if n == 0:
        return
    _spec(&sp, corpus, seq_len, eos, limit, pad_id, ignore, mask_doc_starts, ids_type, idx_type)
    fails = <ll_tok_fail*>malloc(nt * sizeof(ll_tok_fail))
    if fails == NULL:
        raise MemoryError()
    try:
        # NOTE [ Dynamic schedule ] (pyx/_chain.pyx): rows of pieces cost what their spans cost.
        for i in prange(n, nogil=True, num_threads=nt, schedule="dynamic"):
            t = threadid()
            r = out_rows[i]
            a = row_ptr[i]
            b = row_ptr[i + 1]
            status[i] = ll_tok_row(&sp, &seg_g[a], &seg_n[a], b - a, detect, &starts[r, 0], &counts[r], <void*>(ids + r * ids_stride),
                                   <void*>(labels + r * idx_stride), <void*>(positions + r * idx_stride), fails + t)
            where[i] = fails[t].where
    finally:
        free(fails)


def will_need(Corpus corpus, const int64_t[::1] seg_g not None, const int64_t[::1] seg_n not None):
    """Advise the pages of the spans ``seg_g``/``seg_n`` as needed soon (MADV_WILLNEED): the
    kernel reads them in the background. Returns the bytes advised. Thread-safe."""
    cdef ll_tok_spec sp
    cdef int64_t out
    if seg_g.shape[0] != seg_n.shape[0]:
        raise ValueError("will_need: seg_g and seg_n differ in length")
    if seg_g.shape[0] == 0:
        return 0
    sp.files = corpus.files
    sp.nfiles = corpus.nfiles
    sp.file_start = &corpus.starts[0]
    with nogil:
        out = ll_tok_will_need(&sp, &seg_g[0], &seg_n[0], seg_g.shape[0])
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def cu_seqlens_into(const int32_t[:, ::1] starts not None, const int64_t[::1] counts not None, Py_ssize_t n,
                    int64_t seq_len, int32_t[::1] cu not None):
    """``cu_seqlens`` of the first ``n`` rows into ``cu``; returns ``(entries, max_seqlen)``.
    ``cu`` needs ``sum(counts[:n]) + 1`` entries (at most ``n * seq_len + 1``)."""
    cdef int64_t total = 0, longest = 0, m
    cdef Py_ssize_t r
    if n > starts.shape[0] or n > counts.shape[0]:
        raise ValueError("cu_seqlens_into: more rows than starts")
    for r in range(n):
        if counts[r] < 1 or counts[r] > starts.shape[1]:
            raise ValueError(f"cu_seqlens_into: row {r} has {counts[r]} segments")
        total += counts[r]
    if cu.shape[0] < total + 1:
        raise ValueError("cu_seqlens_into: cu is too short")
    with nogil:
        m = ll_tok_cu_seqlens(&starts[0, 0], starts.shape[1], &counts[0], n, seq_len, &cu[0], &longest)
    return m, longest


def best_fit(const int64_t[::1] lens not None, int64_t cap):
    """Best-fit decreasing placement of pieces of ``lens`` (each 1..cap) into rows of ``cap``
    tokens (NOTE [ Packing in blocks ]): ``(row_of, order, rows)``, the row of each piece, the
    order they were placed in, and the number of rows."""
    import numpy as np
    cdef Py_ssize_t n = lens.shape[0]
    row_of = np.empty(n, np.int64)
    order = np.empty(n, np.int64)
    cdef int64_t[::1] ro = row_of
    cdef int64_t[::1] od = order
    cdef int64_t rows
    if cap < 1:
        raise ValueError("best_fit: cap must be at least 1")
    if n == 0:
        return row_of, order, 0
    with nogil:
        rows = ll_tok_best_fit(&lens[0], n, cap, &ro[0], &od[0])
    if rows < 0:
        raise MemoryError("best_fit: out of memory")
    return row_of, order, int(rows)


cdef class TokenTeam:
    """``size`` persistent kernel threads (a team of include/ll_pool.h, NOTE [ One queue across
    batches ]) that token batches queue on with :func:`start_rows_into` and run in order. The
    threads are joined when the team is freed, which cannot happen while a batch it runs is
    alive (each :class:`PendingRows` holds its team)."""

    cdef ll_pool* pool
    cdef readonly int size

    def __cinit__(self, int size):
        self.pool = NULL
        if size < 1:
            raise ValueError("a TokenTeam needs at least one thread")
        with nogil:
            self.pool = ll_pool_new(size)
        if self.pool == NULL:
            raise RuntimeError(f"could not start {size} kernel threads")
        self.size = size

    @property
    def usable(self):
        """False in a child process after fork(): the threads stayed in the parent."""
        return bool(ll_pool_usable(self.pool))

    def __dealloc__(self):
        if self.pool != NULL:
            with nogil:
                ll_pool_free(self.pool)
            self.pool = NULL


cdef class PendingRows:
    """A batch of token rows queued on a :class:`TokenTeam`: :meth:`wait` blocks until every row
    is written. Holds the team, the corpus and every array the job points into until then; a
    batch dropped unwaited is waited for before its memory goes."""

    cdef TokenTeam team
    cdef ll_tok_job ctx
    cdef ll_job job
    cdef list keep
    cdef bint queued

    def wait(self):
        """Block until the rows are written (at once when they are)."""
        if self.queued:
            with nogil:
                ll_pool_wait(self.team.pool, &self.job)
            self.queued = False

    def __dealloc__(self):
        if self.queued and self.team is not None and self.team.pool != NULL:
            with nogil:
                ll_pool_wait(self.team.pool, &self.job)


cdef char* _address(a) except NULL:
    """The first byte of ``a``, a writable C-contiguous array the caller keeps alive (read
    through the buffer protocol: ``__array_interface__`` builds a dict a call)."""
    cdef Py_buffer view
    PyObject_GetBuffer(a, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
    cdef char* p = <char*>view.buf
    PyBuffer_Release(&view)
    if p == NULL:
        raise ValueError("start_rows_into: an output array without memory")
    return p


def start_rows_into(TokenTeam team not None, Corpus corpus not None, const int64_t[::1] seg_g not None,
                    const int64_t[::1] seg_n not None, const int64_t[::1] row_ptr not None,
                    const int64_t[::1] out_rows not None, bint detect, int64_t seq_len, int64_t eos, int64_t limit,
                    int64_t pad_id, int64_t ignore, bint mask_doc_starts, int ids_type, int idx_type,
                    ids, labels, positions, int32_t[:, ::1] starts not None, int64_t[::1] counts not None,
                    int32_t[::1] status not None, int64_t[::1] where not None, int num_threads,
                    int64_t[::1] item_ns=None):
    """:func:`rows_into` queued on ``team`` instead of run here: returns a :class:`PendingRows`
    (``ids``, ``labels``, ``positions``: the 2-D output arrays, C-contiguous, checked by the
    owner). Status codes land in ``status``/``where``, and with ``item_ns`` each row's
    nanoseconds on its thread, once it is waited for."""
    cdef Py_ssize_t n = out_rows.shape[0]
    _check_rows("start_rows_into", seg_g, seg_n, row_ptr, out_rows, seq_len, starts, status, where,
                min(starts.shape[0], counts.shape[0], ids.shape[0], labels.shape[0], positions.shape[0]))
    if not team.usable:
        raise RuntimeError("start_rows_into: the team belongs to another process")
    cdef PendingRows p = PendingRows.__new__(PendingRows)
    p.team = team
    p.queued = False
    p.keep = [corpus, seg_g, seg_n, row_ptr, out_rows, ids, labels, positions, starts, counts, status, where, item_ns]
    if item_ns is not None and item_ns.shape[0] < n:
        raise ValueError("start_rows_into: item_ns must cover every row")
    if n == 0:
        return p
    _spec(&p.ctx.sp, corpus, seq_len, eos, limit, pad_id, ignore, mask_doc_starts, ids_type, idx_type)
    p.ctx.seg_g = &seg_g[0] if seg_g.shape[0] else NULL
    p.ctx.seg_n = &seg_n[0] if seg_n.shape[0] else NULL
    p.ctx.row_ptr = &row_ptr[0]
    p.ctx.out_rows = &out_rows[0]
    p.ctx.detect = 1 if detect else 0
    p.ctx.ids = _address(ids)
    p.ctx.lab = _address(labels)
    p.ctx.pos = _address(positions)
    p.ctx.ids_stride = ids.strides[0]
    p.ctx.idx_stride = labels.strides[0]
    p.ctx.starts = &starts[0, 0]
    p.ctx.starts_stride = starts.shape[1]
    p.ctx.counts = &counts[0]
    p.ctx.status = &status[0]
    p.ctx.where = &where[0]
    p.ctx.item_ns = &item_ns[0] if item_ns is not None else NULL
    p.job.fn = ll_tok_job_item
    p.job.ctx = &p.ctx
    p.job.n = n
    p.job.limit = num_threads if num_threads > 0 else 1
    p.job.stage = NULL
    p.job.flush = NULL
    p.job.stage_max = 0
    with nogil:
        ll_pool_submit(team.pool, &p.job)
    p.queued = True
    return p


cdef char* _FORMAT_B = "B"


cdef class FileMap:
    """``length`` bytes of an open file from byte ``offset``, mapped read-only, exporting them
    through the buffer protocol (``numpy.frombuffer`` makes an array of them that keeps this
    mapping alive).

    NOTE [ One mapping, no descriptor ]
    ``numpy.memmap`` (through ``mmap.mmap``) keeps a duplicate of the file's descriptor open for
    as long as the mapping lives: one descriptor per token file, and per index array, so a
    corpus of a few hundred Megatron files ran past the common limit of 1,024 open files
    (``ulimit -n``) with "Too many open files". A mapping does not need its descriptor once
    made, so this class maps with ``mmap(2)`` and the caller closes the descriptor at once:
    a corpus of any number of files holds none open. Unmapped when the last buffer over it is
    released and this object is collected.
    """

    cdef char* base
    cdef size_t maplen
    cdef size_t skip
    cdef readonly Py_ssize_t length
    cdef int exports

    def __cinit__(self, int fd, int64_t offset, int64_t length, bint random=False):
        cdef int64_t page = sysconf(_SC_PAGESIZE)
        cdef int64_t lo
        self.base = NULL
        if offset < 0 or length <= 0:
            raise ValueError(f"FileMap: offset {offset} and length {length} (a positive length from a "
                             "non-negative offset)")
        lo = offset - offset % page
        self.skip = <size_t>(offset - lo)
        self.maplen = <size_t>(length + (offset - lo))
        cdef void* p = mmap(NULL, self.maplen, PROT_READ, MAP_SHARED, fd, <off_t>lo)
        if p == MAP_FAILED:
            raise OSError(errno, f"mmap of {length} bytes at {offset}: {strerror(errno).decode()}")
        self.base = <char*>p
        self.length = length
        if random:
            madvise(p, self.maplen, MADV_RANDOM)   # NOTE [ Token files are read at random ]

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a FileMap is read-only")
        buffer.buf = self.base + self.skip
        buffer.obj = self
        buffer.len = self.length
        buffer.readonly = 1
        buffer.itemsize = 1
        buffer.format = _FORMAT_B if flags & PyBUF_FORMAT else NULL
        buffer.ndim = 1
        buffer.shape = &self.length if flags & PyBUF_ND else NULL
        buffer.strides = NULL
        buffer.suboffsets = NULL
        buffer.internal = NULL
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buffer):
        self.exports -= 1

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, self.maplen)
            self.base = NULL
