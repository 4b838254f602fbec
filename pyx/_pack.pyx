# cython: freethreading_compatible = False
"""Pack kernels: resize to a cap and re-encode, or store raw pixels (owner: loaderlib/_pack.py).

``pack_into`` runs one ``prange`` over a batch of images on the OpenMP pool, as the decode
kernels do; per item the guarded C helper ``ll_pack_item`` (include/ll_pack.h, NOTE
[ Packing at a capped resolution ]) returns a status code and never raises.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, uint8_t, uintptr_t
from libc.stdlib cimport calloc, free

cimport cython
from cython.parallel cimport prange, threadid

from _common cimport *
from worker cimport ll_buf, ll_buf_free
from loaderlib._ext._jpeg cimport Inputs


cdef extern from "ll_record.h":
    const int LL_RAW_HEADER
    const int LL_ORIG_MAX

cdef extern from "ll_pack.h":
    const int LL_PACK_KEEP, LL_PACK_JPEG, LL_PACK_RAW

    ctypedef struct ll_pack_worker:
        pass

    ctypedef struct ll_pack_opts:
        int max_side, quality, reencode, strict
        long long raw_below, max_pixels

    ctypedef struct ll_pack_out:
        int kind, orig_w, orig_h, w, h, c

    int ll_pack_worker_init(ll_pack_worker* p) noexcept nogil
    void ll_pack_worker_free(ll_pack_worker* p) noexcept nogil
    int ll_pack_item(ll_pack_worker* pw, const ll_pack_opts* o, const uint8_t* buf, size_t size,
                     const uint8_t* pixels, int ph, int pwid, int pc, int orig_w, int orig_h, ll_buf* out,
                     size_t* out_len, ll_pack_out* r, char* msg) noexcept nogil
    void ll_pack_size(int w, int h, int max_side, int* tw, int* th) noexcept nogil

cdef extern from "ll_worker.h":
    const int LL_CACHE_LINE

cdef extern from "<stdlib.h>":
    int posix_memalign(void** p, size_t align, size_t size) noexcept nogil

cdef extern from "<string.h>":
    void* memset(void* p, int c, size_t n) noexcept nogil


KEEP, JPEG, RAW = LL_PACK_KEEP, LL_PACK_JPEG, LL_PACK_RAW
#: Bytes of a raw record's header (NOTE [ Packed records ] in include/ll_record.h).
RAW_HEADER = LL_RAW_HEADER
#: Columns of pack_into's ``info`` table.
INFO_FIELDS = ("kind", "orig_w", "orig_h", "w", "h", "c")


def stored_size(int w, int h, int max_side):
    """The stored ``(width, height)`` of a ``w`` x ``h`` image under ``max_side`` (ll_pack_size)."""
    cdef int tw = 0, th = 0
    ll_pack_size(w, h, max_side, &tw, &th)
    return tw, th


cdef class PackWorkers:
    """One decoder, scratch and encoder per OpenMP thread id (NOTE [ One per-thread pool ]
    in include/ll_worker.h, with an encoder beside each entry). NOT thread-safe: one
    ``prange`` team at a time."""
    cdef ll_pack_worker* w
    cdef readonly int size

    def __cinit__(self, int size):
        self.w = NULL
        self.size = 0
        if size < 1:
            raise ValueError("PackWorkers size must be >= 1")
        cdef void* p = NULL
        if posix_memalign(&p, LL_CACHE_LINE, <size_t>size * sizeof(ll_pack_worker)) != 0:
            raise MemoryError()
        memset(p, 0, <size_t>size * sizeof(ll_pack_worker))
        self.w = <ll_pack_worker*>p
        cdef int i
        for i in range(size):
            self.size = i + 1
            if ll_pack_worker_init(&self.w[i]) != LL_OK:
                raise MemoryError("could not create a libjpeg decompressor or compressor")

    def __dealloc__(self):
        cdef int i
        if self.w != NULL:
            for i in range(self.size):
                ll_pack_worker_free(&self.w[i])
            free(self.w)
            self.w = NULL


@cython.boundscheck(False)
@cython.wraparound(False)
def pack_into(list items, const int32_t[:, ::1] pixels not None, int max_side, int quality, long long raw_below,
              bint reencode, long long max_pixels, int strict, int32_t[::1] status not None,
              uint8_t[:, ::1] msgs not None, int32_t[:, ::1] info not None, int num_threads,
              PackWorkers pool not None):
    """Pack every item in parallel; returns a list with each item's packed bytes (None for a
    kept or failed item).

    ``items[i]``: JPEG bytes, or (``pixels[i, 0] > 0``) a C-contiguous HWC uint8 image of
    ``pixels[i]`` = (height, width, channels, original width, original height; 0 for the
    image's own size). Per item: status[i] is LL_OK, LL_WARNED (reason in msgs[i]) or an
    error code with the reason in msgs[i]; info[i] holds INFO_FIELDS. The output does not
    depend on ``num_threads``. Thread-safe only with a pool no other caller is using.
    """
    cdef Py_ssize_t n = len(items)
    if pixels.shape[0] != n or pixels.shape[1] != 5 or status.shape[0] != n or msgs.shape[0] != n \
            or msgs.shape[1] < LL_MSG_LEN or info.shape[0] != n or info.shape[1] != 6:
        raise ValueError("pack_into: inconsistent table sizes")
    if num_threads < 1 or num_threads > pool.size:
        raise ValueError("pack_into: pool smaller than num_threads")
    if quality < 1 or quality > 100:
        raise ValueError(f"pack_into: quality must be 1 to 100, got {quality}")
    cdef Py_ssize_t i
    cdef ll_pack_opts o
    o.max_side = max_side
    o.quality = quality
    o.reencode = reencode
    o.strict = strict
    o.raw_below = raw_below
    o.max_pixels = max_pixels
    cdef ll_buf* outs = <ll_buf*>calloc(max(n, 1), sizeof(ll_buf))
    cdef size_t* lens = <size_t*>calloc(max(n, 1), sizeof(size_t))
    cdef ll_pack_out* rs = <ll_pack_out*>calloc(max(n, 1), sizeof(ll_pack_out))
    if outs == NULL or lens == NULL or rs == NULL:
        free(outs)
        free(lens)
        free(rs)
        raise MemoryError()
    cdef Inputs inp = None
    result = [None] * n
    try:
        inp = Inputs(items)
        for i in range(n):
            if pixels[i, 0] > 0 and (pixels[i, 1] < 1 or (pixels[i, 2] != 1 and pixels[i, 2] != 3) or
                                     <long long>pixels[i, 0] * pixels[i, 1] * pixels[i, 2] != <long long>inp.sizes[i]):
                raise ValueError(f"pack_into: item {i} is not a {pixels[i, 0]}x{pixels[i, 1]}x{pixels[i, 2]} image")
        # NOTE [ Dynamic schedule ] (_jpeg.pyx): images differ in size by 10x or more.
        for i in prange(n, nogil=True, schedule="dynamic", num_threads=num_threads):
            status[i] = ll_pack_item(
                &pool.w[threadid()], &o, inp.ptrs[i], inp.sizes[i],
                inp.ptrs[i] if pixels[i, 0] > 0 else NULL, pixels[i, 0], pixels[i, 1], pixels[i, 2],
                pixels[i, 3], pixels[i, 4], &outs[i], &lens[i], &rs[i], <char*>&msgs[i, 0])
        for i in range(n):
            info[i, 0] = rs[i].kind
            info[i, 1] = rs[i].orig_w
            info[i, 2] = rs[i].orig_h
            info[i, 3] = rs[i].w
            info[i, 4] = rs[i].h
            info[i, 5] = rs[i].c
            if status[i] >= 0 and lens[i] > 0:
                result[i] = PyBytes_FromStringAndSize(<char*>outs[i].p, <Py_ssize_t>lens[i])
    finally:
        if inp is not None:
            inp.release()
        for i in range(n):
            ll_buf_free(&outs[i])
        free(outs)
        free(lens)
        free(rs)
    return result
