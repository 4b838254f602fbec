# cython: freethreading_compatible = False
"""JPEG decode kernels (owner: loaderlib/decoding.py).

Two tiers, as everywhere in loaderlib: ``*_into`` entries that take caller-owned outputs
and an explicit ``num_threads`` and run one ``prange``; per-item work in the guarded C
helpers of ``include/ll_jpeg.h``, which return a status code and never raise.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdint cimport int32_t, int64_t, uint8_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

import enum

cimport cython
cimport numpy as cnp
from cython.parallel cimport prange, threadid

from _common cimport *
from jpeglib cimport *
from worker cimport ll_worker, ll_workers_alloc, ll_worker_init, ll_worker_free, LL_CACHE_LINE
from omp cimport LL_HAVE_OPENMP, omp_get_max_threads

cnp.import_array()

# Columns of the info table filled by read_headers_into.
INFO_FIELDS = ("width", "height", "components", "color_space", "subsampling", "progressive",
               "arithmetic", "precision", "out_h", "out_w", "out_c")
cdef enum:
    N_INFO = 11


class _StatusCode(enum.IntEnum):
    """A kernel's per-item status code, with its name and fallback message."""

    def __new__(cls, code, message):
        member = int.__new__(cls, code)
        member._value_ = code
        member.message = message
        return member


# NOTE [ Status codes ] (include/ll_common.h): the one Python table of the codes, built
# from the header's list (their only definition); every Python owner reads it from here.
Status = _StatusCode(
    "Status",
    [(ll_status_table[k].name.decode(), (ll_status_table[k].code, ll_status_table[k].message.decode()))
     for k in range(LL_STATUS_COUNT)],
    module=__name__,
    qualname="Status",
)

#: Length of a per-item message row (the ``msgs`` tables of every kernel).
MSG_LEN = LL_MSG_LEN
#: Output channel order by name (``mode`` of the kernels).
MODES = {"RGB": LL_MODE_RGB, "BGR": LL_MODE_BGR, "GRAY": LL_MODE_GRAY}
#: The kernels' ``strict`` level for Python's ``strict`` argument
#: (NOTE [ Truncated JPEG is an error ] in include/ll_jpeg.h).
STRICT_LEVELS = {None: LL_STRICT_TRUNCATED, True: LL_STRICT_ALL, False: LL_STRICT_NONE}

JPEG_COLOR_SPACES = {JCS_GRAYSCALE: "GRAY", JCS_RGB: "RGB", JCS_YCbCr: "YCbCr",
                     JCS_CMYK: "CMYK", JCS_YCCK: "YCCK"}


def build_facts():
    """What this extension was compiled with (reported by loaderlib.build_info())."""
    v = LIBJPEG_TURBO_VERSION_NUMBER
    return {
        "openmp": bool(LL_HAVE_OPENMP),
        "omp_max_threads": omp_get_max_threads(),
        "libjpeg_turbo_version": f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}" if v else None,
        "libjpeg_api_version": JPEG_LIB_VERSION,
        "simd": bool(LL_JPEG_SIMD),
    }


def huffman_decoder():
    """Which Huffman decoder this module's JPEG decodes use (NOTE [ Our Huffman decoder ] in
    include/ll_huff.h), with its counts: ``(enabled, installed, bailed)``; ``installed``
    counts the images given to loaderlib's decoder, ``bailed`` those it handed back to
    libjpeg's."""
    cdef unsigned long long installed, bailed
    ll_huff_counts(&installed, &bailed)
    return bool(ll_huff_enabled()), int(installed), int(bailed)


def set_huffman_decoder(enabled):
    """Use loaderlib's Huffman decoder (True) or libjpeg's (False) in this module's decodes;
    None: as ``LOADERLIB_HUFFMAN`` says. Tests compare the two with it."""
    ll_huff_set(-1 if enabled is None else (1 if enabled else 0))


cdef class Workers:
    """The per-thread pool of every kernel: one decoder and scratch buffers per OpenMP
    thread id (NOTE [ One per-thread pool ] in include/ll_worker.h).

    Created before a parallel region and reused across calls; NOT thread-safe: one caller
    (one ``prange`` team) at a time. Declared in loaderlib/_ext/_jpeg.pxd, so that
    ``_chain.run_into`` takes it typed.
    """

    def __cinit__(self, int size):
        self.w = NULL
        self.size = 0
        if size < 1:
            raise ValueError("Workers size must be >= 1")
        self.w = ll_workers_alloc(size)   # NOTE [ Per-thread entries own their cache lines ]
        if self.w == NULL:
            raise MemoryError()
        cdef int i
        for i in range(size):
            if ll_worker_init(&self.w[i]) != LL_OK:
                self.size = i + 1
                raise MemoryError("could not create a libjpeg decompressor")
        self.size = size

    @property
    def layout(self):
        """``(address of the entry array, bytes per entry, cache-line size)``: the entries own
        their cache lines (NOTE [ Per-thread entries own their cache lines ])."""
        return <uintptr_t>self.w, <Py_ssize_t>sizeof(ll_worker), <Py_ssize_t>LL_CACHE_LINE

    def __dealloc__(self):
        cdef int i
        if self.w != NULL:
            for i in range(self.size):
                ll_worker_free(&self.w[i])
            free(self.w)
            self.w = NULL


cdef class Inputs:
    """Borrowed pointers into a list of buffer-protocol objects (no copy).

    Holds the buffers until released, so the memory stays valid while kernels run
    without the GIL. Declared in loaderlib/_ext/_jpeg.pxd (``_chain.run_into`` uses it).
    """

    def __cinit__(self, list bufs):
        self.n = len(bufs)
        self.acquired = 0
        self.views = <Py_buffer*>calloc(max(self.n, 1), sizeof(Py_buffer))
        self.ptrs = <const uint8_t**>calloc(max(self.n, 1), sizeof(uint8_t*))
        self.sizes = <size_t*>calloc(max(self.n, 1), sizeof(size_t))
        if self.views == NULL or self.ptrs == NULL or self.sizes == NULL:
            raise MemoryError()
        cdef Py_ssize_t i
        for i in range(self.n):
            try:
                PyObject_GetBuffer(bufs[i], &self.views[i], PyBUF_SIMPLE)
            except (TypeError, BufferError) as e:
                raise TypeError(
                    f"item {i}: expected a contiguous bytes-like object (bytes, bytearray, memoryview, "
                    f"mmap, numpy uint8 array), got {type(bufs[i]).__name__}: {e}") from None
            self.acquired = i + 1
            self.ptrs[i] = <const uint8_t*>self.views[i].buf
            self.sizes[i] = <size_t>self.views[i].len

    def release(self):
        cdef Py_ssize_t i
        for i in range(self.acquired):
            PyBuffer_Release(&self.views[i])
        self.acquired = 0

    def __dealloc__(self):
        self.release()
        free(self.views)
        free(self.ptrs)
        free(self.sizes)


cdef int _plan_one(ll_jpeg_dec* d, const uint8_t* buf, size_t size, int mode, int denom,
                   const int32_t* crop, long long max_pixels, int64_t* row, char* msg) noexcept nogil:
    cdef ll_jpeg_info ji
    cdef int x0 = 0, y0 = 0, oh = 0, ow = 0, oc = 0
    memset(&ji, 0, sizeof(ji))
    cdef int st = ll_jpeg_plan_item(d, buf, size, mode, denom, crop[0], crop[1], crop[2], crop[3],
                                    max_pixels, &ji, &x0, &y0, &oh, &ow, &oc, msg)
    row[0] = ji.width
    row[1] = ji.height
    row[2] = ji.components
    row[3] = ji.color_space
    row[4] = ji.subsampling
    row[5] = ji.progressive
    row[6] = ji.arithmetic
    row[7] = ji.precision
    row[8] = oh
    row[9] = ow
    row[10] = oc
    return st


@cython.boundscheck(False)
@cython.wraparound(False)
def read_headers_into(list bufs, int mode, int denom, const int32_t[:, ::1] crops not None,
                      long long max_pixels, int64_t[:, ::1] info not None,
                      int32_t[::1] status not None, uint8_t[:, ::1] msgs not None,
                      int num_threads, Workers pool not None):
    """Parse every item's JPEG header and plan its output shape, in parallel.

    Per item: status[i] is LL_OK and info[i] holds INFO_FIELDS, or an error code with the
    reason in msgs[i]. Thread-safe only with a pool no other caller is using.
    """
    cdef Py_ssize_t n = len(bufs)
    if crops.shape[0] != n or crops.shape[1] != 4 or info.shape[0] != n or info.shape[1] != N_INFO \
            or status.shape[0] != n or msgs.shape[0] != n or msgs.shape[1] < LL_MSG_LEN:
        raise ValueError("read_headers_into: inconsistent table sizes")
    if num_threads > pool.size:
        raise ValueError("read_headers_into: pool smaller than num_threads")
    cdef Inputs inp = Inputs(bufs)
    cdef Py_ssize_t i
    try:
        # NOTE [ Dynamic schedule ]: JPEGs differ in size by 10x or more, so a static split
        # leaves threads idle; dynamic hands out one item at a time.
        for i in prange(n, nogil=True, schedule="dynamic", num_threads=num_threads):
            status[i] = _plan_one(&pool.w[threadid()].dec, inp.ptrs[i], inp.sizes[i], mode, denom,
                                  &crops[i, 0], max_pixels, &info[i, 0], <char*>&msgs[i, 0])
    finally:
        inp.release()


@cython.boundscheck(False)
@cython.wraparound(False)
def decode_into(list bufs, list outs, int mode, int denom, const int32_t[:, ::1] crops not None,
                long long max_pixels, int strict, int32_t[::1] status not None,
                uint8_t[:, ::1] msgs not None, int num_threads, Workers pool not None, bint fast=False):
    """Decode item i of ``bufs`` into ``outs[i]`` (C-contiguous uint8 HWC), in parallel.

    ``fast``: libjpeg's fast integer IDCT and merged upsampling instead of the exact
    (OpenCV-equal) decode (NOTE [ Fast decode ] in include/ll_jpeg.h).

    ``outs[i]`` may be None to skip an item (its status is left untouched). Per item:
    status[i] is LL_OK, LL_WARNED (decoded; libjpeg recovered from corrupt data, reason in
    msgs[i]) or an error code with the reason in msgs[i]; outputs of failed items hold
    unspecified bytes. Thread-safe only with a pool no other caller is using.
    """
    cdef Py_ssize_t n = len(bufs)
    if len(outs) != n or crops.shape[0] != n or crops.shape[1] != 4 or status.shape[0] != n \
            or msgs.shape[0] != n or msgs.shape[1] < LL_MSG_LEN:
        raise ValueError("decode_into: inconsistent table sizes")
    if num_threads > pool.size:
        raise ValueError("decode_into: pool smaller than num_threads")
    cdef uintptr_t* optr = <uintptr_t*>calloc(max(n, 1), sizeof(uintptr_t))
    cdef int32_t* oshape = <int32_t*>calloc(max(n, 1) * 3, sizeof(int32_t))
    if optr == NULL or oshape == NULL:
        free(optr); free(oshape)
        raise MemoryError()
    cdef Py_ssize_t i
    cdef cnp.ndarray a
    cdef Inputs inp = None
    try:
        for i in range(n):
            o = outs[i]
            if o is None:
                continue
            if not isinstance(o, cnp.ndarray):
                raise TypeError(f"outs[{i}] must be a numpy array, got {type(o).__name__}")
            a = <cnp.ndarray>o
            if a.dtype.num != cnp.NPY_UINT8 or a.ndim != 3 or not cnp.PyArray_IS_C_CONTIGUOUS(a) \
                    or not cnp.PyArray_ISWRITEABLE(a):
                raise ValueError(f"outs[{i}] must be a writeable C-contiguous uint8 HxWxC array")
            optr[i] = <uintptr_t>cnp.PyArray_DATA(a)
            oshape[3 * i] = <int32_t>a.shape[0]
            oshape[3 * i + 1] = <int32_t>a.shape[1]
            oshape[3 * i + 2] = <int32_t>a.shape[2]
        inp = Inputs(bufs)
        # See NOTE [ Dynamic schedule ] in read_headers_into.
        for i in prange(n, nogil=True, schedule="dynamic", num_threads=num_threads):
            if optr[i] == 0:
                continue
            status[i] = ll_jpeg_decode_item(
                &pool.w[threadid()].dec, inp.ptrs[i], inp.sizes[i], mode, denom,
                crops[i, 0], crops[i, 1], crops[i, 2], crops[i, 3], max_pixels, strict,
                <uint8_t*>optr[i], <Py_ssize_t>oshape[3 * i + 1] * oshape[3 * i + 2],
                oshape[3 * i], oshape[3 * i + 1], oshape[3 * i + 2], <char*>&msgs[i, 0], fast)
    finally:
        if inp is not None:
            inp.release()
        free(optr)
        free(oshape)
