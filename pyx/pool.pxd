# The kernel team of include/ll_pool.h (NOTE [ One queue across batches ]): one declaration for
# every module that queues jobs on a team (the fused chain, the token rows).

from libc.stdint cimport int64_t


cdef extern from "ll_pool.h":
    ctypedef void (*ll_job_fn)(void* ctx, int64_t i, int tid) noexcept nogil
    ctypedef int (*ll_job_stage_fn)(void* ctx, int64_t i, int tid, int slot) noexcept nogil
    ctypedef void (*ll_job_flush_fn)(void* ctx, int tid, int slot) noexcept nogil
    ctypedef struct ll_job:
        ll_job_fn fn
        void* ctx
        int64_t n
        int limit
        int gated
        ll_job_stage_fn stage
        ll_job_flush_fn flush
        int64_t stage_max
    ctypedef struct ll_pool:
        int nthreads
    ll_pool* ll_pool_new(int n) noexcept nogil
    int ll_pool_usable(const ll_pool* p) noexcept nogil
    void ll_pool_submit(ll_pool* p, ll_job* job) noexcept nogil
    void ll_pool_submit_gated(ll_pool* p, ll_job* job, int gated) noexcept nogil
    void ll_pool_wait(ll_pool* p, ll_job* job) noexcept nogil
    int ll_pool_done(ll_pool* p, ll_job* job) noexcept nogil
    void ll_pool_open(ll_pool* p, ll_job* job) noexcept nogil
    int ll_pool_withdraw(ll_pool* p, ll_job* job) noexcept nogil
    int ll_pool_gated(ll_pool* p, ll_job* job) noexcept nogil
    int64_t ll_pool_staged(ll_pool* p, ll_job* job) noexcept nogil
    int64_t ll_pool_idle_ns(ll_pool* p) noexcept nogil
    int ll_pool_wait_open(ll_pool* p, ll_job* job, int64_t timeout_ns) noexcept nogil
    void ll_pool_free(ll_pool* p) noexcept nogil
    void ll_name_thread(const char* prefix, int id) noexcept nogil
