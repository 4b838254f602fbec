# cython: freethreading_compatible = False
"""The fused per-sample executor (owner: loaderlib/_chain.py).

``run_into`` runs one ``prange`` over a batch: per item it reads the bytes (from a
buffer, a file, or a record of an open file), then ``ll_chain_run`` (include/ll_chain.h)
decodes the region the chain needs at the chosen DCT scale and resamples it straight
into the item's output slot. Per-item failures become status codes and messages; this
module never raises for them.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.stdio cimport snprintf
from libc.string cimport memcpy

import numpy as np

cimport cython
cimport numpy as cnp
from cython.parallel cimport prange, threadid

from _common cimport *
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

# Where run_into's items come from.
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
                   void* out, char* msg, int64_t* times) noexcept nogil:
    """One item: read (files, records), then decode and transform into ``out``; or, for
    SRC_PIXELS, transform the decoded HWC image ``buf`` of ``offset >> 32`` rows and
    ``offset & 0xffffffff`` columns. ``times`` (or NULL): read, decode, transform nanoseconds."""
    cdef int64_t t0 = 0
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
    if times != NULL:
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
    if times != NULL:
        times[0] = ll_now_ns() - t0
        times[1] = 0
        times[2] = 0
    if st != LL_OK:
        return st
    if times != NULL:
        return ll_chain_run(plan, wk, buf, n, seed, epoch, index, out, msg, &times[1], &times[2])
    return ll_chain_run(plan, wk, buf, n, seed, epoch, index, out, msg, NULL, NULL)


@cython.boundscheck(False)
@cython.wraparound(False)
def run_into(CompiledChain chain not None, Workers workers not None, int kind, list items, int fd,
             const int64_t[::1] offsets, cnp.ndarray out not None, const int64_t[::1] indices not None,
             uint64_t seed, uint64_t epoch, int num_threads, int64_t[:, ::1] timings,
             int32_t[::1] status not None, uint8_t[:, ::1] msgs not None, const int32_t[::1] fds=None):
    """Run the fused chain for every item of a batch, in parallel, into ``out[i]``.

    ``kind``: SOURCE_BUFFERS: ``items`` are bytes-like buffers; SOURCE_FILES: ``items``
    are file paths (bytes), read inside the pass; SOURCE_RECORDS: records of the open file
    ``fd`` (or of ``fds[i]`` when given: records of several shard files in one pass):
    ``offsets[i]`` and ``items[i]`` (the size, an int). ``workers``: the per-thread pool
    (NOTE [ One per-thread pool ]). Per item: status[i] is LL_OK, LL_WARNED or an error
    code with the reason in msgs[i]. Thread-safe only with workers no other caller is using.
    """
    cdef Py_ssize_t n = len(items)
    if indices.shape[0] != n or status.shape[0] != n or msgs.shape[0] != n or msgs.shape[1] < LL_MSG_LEN:
        raise ValueError("run_into: inconsistent table sizes")
    if timings is not None and (timings.shape[0] != n or timings.shape[1] != 3):
        raise ValueError("run_into: timings must be (N, 3)")
    if num_threads < 1 or num_threads > workers.size:
        raise ValueError("run_into: workers smaller than num_threads")
    if kind != SRC_BUFFERS and kind != SRC_FILES and kind != SRC_RECORDS and kind != SRC_PIXELS:
        raise ValueError(f"run_into: unknown source kind {kind}")
    if (kind == SRC_RECORDS or kind == SRC_PIXELS) and (offsets is None or offsets.shape[0] != n):
        raise ValueError("run_into: offsets must have one entry per record (per image: rows << 32 | columns)")
    if out.shape[0] != n or not cnp.PyArray_IS_C_CONTIGUOUS(out) or not cnp.PyArray_ISWRITEABLE(out):
        raise ValueError("run_into: out must be a writeable C-contiguous (N, ...) array")
    cdef Py_ssize_t item_bytes = out.nbytes // n if n > 0 else 0
    cdef Py_ssize_t expect = <Py_ssize_t>chain.out_h * chain.out_w * chain.channels * (
        4 if chain.dtype == LL_DTYPE_FLOAT32 else 2 if chain.dtype == LL_DTYPE_UINT16 else 1)
    if n > 0 and item_bytes != expect:
        raise ValueError(f"run_into: each output slot has {item_bytes} bytes, the chain writes {expect}")
    cdef char* base = <char*>cnp.PyArray_DATA(out)
    cdef uintptr_t* ptrs = <uintptr_t*>calloc(max(n, 1), sizeof(uintptr_t))
    cdef size_t* sizes = <size_t*>calloc(max(n, 1), sizeof(size_t))
    if ptrs == NULL or sizes == NULL:
        free(ptrs); free(sizes)
        raise MemoryError()
    cdef Py_ssize_t i
    cdef long long sz
    cdef bint timed = timings is not None
    cdef int64_t* tptr = NULL
    cdef const int32_t* fdp = NULL
    cdef Inputs inp = None
    try:
        if kind == SRC_BUFFERS or kind == SRC_PIXELS:
            inp = Inputs(items)
            for i in range(n):
                ptrs[i] = <uintptr_t>inp.ptrs[i]
                sizes[i] = inp.sizes[i]
        else:
            for i in range(n):
                it = items[i]
                if kind == SRC_FILES:
                    if not isinstance(it, bytes):
                        raise TypeError(f"item {i}: paths must be bytes (os.fsencode)")
                    ptrs[i] = <uintptr_t><const char*>(<bytes>it)
                else:
                    sz = it
                    if sz < 0 or offsets[i] < 0:
                        raise ValueError(f"record {i}: negative offset or size")
                    sizes[i] = <size_t>sz
        if timed:
            tptr = &timings[0, 0] if n > 0 else NULL
        if fds is not None:
            if fds.shape[0] != n:
                raise ValueError(f"run_into: {fds.shape[0]} descriptors for {n} items")
            if n > 0:
                fdp = &fds[0]
        # NOTE [ Dynamic schedule ] (see _jpeg.pyx): item cost varies with the JPEG size.
        for i in prange(n, nogil=True, schedule="dynamic", num_threads=num_threads):
            status[i] = _run_item(
                chain.plan, &workers.w[threadid()], kind,
                <const uint8_t*>ptrs[i] if kind == SRC_BUFFERS or kind == SRC_PIXELS else NULL, sizes[i],
                <const char*>ptrs[i] if kind == SRC_FILES else NULL, fdp[i] if fdp != NULL else fd,
                offsets[i] if kind == SRC_RECORDS or kind == SRC_PIXELS else 0, seed, epoch, <uint64_t>indices[i],
                base + i * item_bytes, <char*>&msgs[i, 0], tptr + 3 * i if timed else NULL)
    finally:
        if inp is not None:
            inp.release()
        free(ptrs)
        free(sizes)
