# The one per-thread pool entry (include/ll_worker.h) and the growable buffer it holds
# (include/ll_common.h). Extern declarations only; cimported by _jpeg.pyx, _chain.pyx
# and fused.pxd. See NOTE [ One per-thread pool ].

from libc.stdint cimport int64_t

from jpeglib cimport ll_jpeg_dec


cdef extern from "ll_common.h":
    enum: LL_STAGE_PER_THREAD
    ctypedef struct ll_buf:
        unsigned char* p
        size_t cap

    int ll_buf_reserve(ll_buf* b, size_t need) noexcept nogil
    void ll_buf_free(ll_buf* b) noexcept nogil


cdef extern from "ll_worker.h":
    ctypedef struct ll_worker:
        ll_jpeg_dec dec
        ll_buf file
        ll_buf stage[LL_STAGE_PER_THREAD]
        int64_t stage_item[LL_STAGE_PER_THREAD]

    const int LL_CACHE_LINE
    ll_worker* ll_workers_alloc(int n) noexcept nogil
    int ll_worker_init(ll_worker* w) noexcept nogil
    void ll_worker_free(ll_worker* w) noexcept nogil
