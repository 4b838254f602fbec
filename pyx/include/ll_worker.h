/* The one per-thread pool entry of every kernel: a libjpeg decoder and growable scratch.
 *
 * NOTE [ One per-thread pool ]
 * Every parallel kernel (the plain decoder in _jpeg.pyx, the fused chain in _chain.pyx)
 * runs with an array of these, one per OpenMP thread id, owned by one Python object
 * (``loaderlib._ext._jpeg.Workers``) that is created before the parallel region and freed
 * in its ``__dealloc__``. A decoder is created once per entry and reused for every image;
 * scratch buffers grow to fit (NOTE [ Scratch grows to fit ]) and are reused, so the hot
 * path does not allocate.
 */
#ifndef LL_WORKER_H
#define LL_WORKER_H

#include <stdlib.h>
#include <string.h>

#include "ll_common.h"
#include "ll_jpeg.h"

/* Per-thread state: one decoder and the scratch buffers, reused for every sample.
 *
 * NOTE [ Per-thread entries own their cache lines ]
 * The entries sit in one array indexed by thread id. libjpeg writes its decompressor state
 * on every scanline, so two threads whose entries shared a cache line would bounce it
 * between cores for every row; at 16-64 threads that is a measurable tax. Each entry is
 * therefore aligned to (and so padded to a multiple of) LL_CACHE_LINE bytes, and the array
 * comes from ll_workers_alloc, which aligns its start. The scratch buffers are allocated by
 * the thread that first grows them, inside the parallel region, so their pages are first
 * touched (and placed, on a NUMA machine) by the core that uses them. */
#define LL_CACHE_LINE 128 /* two 64-byte lines: adjacent-line prefetchers fetch pairs */

typedef struct {
    ll_jpeg_dec dec;
    int dec_ok;
    ll_buf file, region, taps, hbuf, misc;
    ll_buf inter[2]; /* intermediate images of multi-stage chains (NOTE [ Fused geometry ]) */
    ll_buf stage[LL_STAGE_PER_THREAD];       /* items run ahead of their batch's gate (NOTE [ Staged items ]) */
    int64_t stage_item[LL_STAGE_PER_THREAD]; /* their indexes in the batch */
} __attribute__((aligned(LL_CACHE_LINE))) ll_worker;

/* A zeroed array of n entries, aligned to LL_CACHE_LINE; free it with free(). */
static ll_worker *ll_workers_alloc(int n) {
    void *p = NULL;
    if (n < 1 || posix_memalign(&p, LL_CACHE_LINE, (size_t)n * sizeof(ll_worker)) != 0) return NULL;
    memset(p, 0, (size_t)n * sizeof(ll_worker));
    return (ll_worker *)p;
}

static int ll_worker_init(ll_worker *w) {
    memset(w, 0, sizeof(*w));
    if (ll_jpeg_create(&w->dec) != LL_OK) return LL_ERR_NOMEM;
    w->dec_ok = 1;
    return LL_OK;
}

static void ll_worker_free(ll_worker *w) {
    if (w->dec_ok) ll_jpeg_destroy(&w->dec);
    w->dec_ok = 0;
    ll_buf_free(&w->file);
    ll_buf_free(&w->region);
    ll_buf_free(&w->taps);
    ll_buf_free(&w->hbuf);
    ll_buf_free(&w->misc);
    ll_buf_free(&w->inter[0]);
    ll_buf_free(&w->inter[1]);
    for (int k = 0; k < LL_STAGE_PER_THREAD; k++) ll_buf_free(&w->stage[k]);
}

#endif
