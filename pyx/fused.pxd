# The fused transform executor's C helpers (include/ll_rng.h, ll_resize.h, ll_read.h,
# ll_chain.h): counter-based randomness, fixed-point resampling, POSIX reads and the
# per-sample chain. Extern declarations only; cimported by _transform.pyx and _chain.pyx.

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint64_t

from augment cimport ll_aug_plan
from jpeglib cimport ll_jpeg_dec
from worker cimport ll_buf, ll_buf_free, ll_buf_reserve, ll_worker, ll_worker_free, ll_worker_init


cdef extern from "ll_rng.h":
    uint64_t ll_rng_key(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t pos) noexcept nogil
    uint64_t ll_rng_u64(uint64_t key, uint64_t ctr) noexcept nogil
    double ll_rng_uniform(uint64_t key, uint64_t ctr) noexcept nogil
    int64_t ll_rng_below(uint64_t key, uint64_t ctr, uint64_t n) noexcept nogil
    void ll_rrc_params(uint64_t key, int width, int height, double s0, double s1, double r0, double r1,
                       int* bi, int* bj, int* bh, int* bw) noexcept nogil


cdef extern from "ll_resize.h":
    const int LL_INTERP_LINEAR, LL_INTERP_AREA, LL_INTERP_NEAREST
    const char* ll_simd_name() noexcept nogil


cdef extern from "ll_read.h":
    const long long LL_MAX_FILE_BYTES
    int ll_read_file(const char* path, ll_buf* b, size_t* size, char* msg) noexcept nogil
    int ll_pread_all(int fd, unsigned char* dst, size_t size, long long offset, char* msg) noexcept nogil


cdef extern from "ll_chain.h":
    const int LL_OP_RRC, LL_OP_RESIZE, LL_OP_CENTER_CROP, LL_OP_HFLIP, LL_MAX_OPS
    const int LL_DTYPE_UINT8, LL_DTYPE_FLOAT32, LL_DTYPE_UINT16

    ctypedef struct ll_op:
        int kind
        int pos
        int h, w
        int interp, antialias
        double s0, s1, r0, r1
        double p

    ctypedef struct ll_plan:
        int nops
        ll_op ops[32]
        int mode, channels
        int dct_scaling, strict
        long long max_pixels
        int dtype, chw, use_lut
        int out_h, out_w
        float lutf[1024]
        uint8_t lut8[1024]
        ll_aug_plan aug
        uint16_t lut16[1024]
        int fast

    void ll_plan_prepare(ll_plan* pl) noexcept nogil
    int64_t ll_now_ns() noexcept nogil
    int ll_chain_run(const ll_plan* pl, ll_worker* wk, const uint8_t* buf, size_t size, uint64_t seed,
                     uint64_t epoch, uint64_t index, void* out, char* msg, int64_t* t_dec,
                     int64_t* t_tr) noexcept nogil
    int ll_chain_run_pixels(const ll_plan* pl, ll_worker* wk, const uint8_t* pixels, int h, int w, uint64_t seed,
                            uint64_t epoch, uint64_t index, void* out, char* msg, int64_t* t_tr) noexcept nogil
    int ll_resize_image(const uint8_t* src, int sh, int sw, int C, uint8_t* dst, int dh, int dw,
                        int interp, int antialias) noexcept nogil
