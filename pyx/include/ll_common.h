/* Project-wide status codes, modes and the growable scratch buffer, shared by the C helpers
 * and the Cython kernels.
 *
 * NOTE [ Status codes ]
 * Kernels never raise inside a parallel region: every item gets one of these codes and
 * the Python owner module turns non-zero codes into exceptions (DecodeError.from_status in
 * loaderlib/errors.py). Codes >= 0 mean the output was written; codes < 0 mean it was not.
 * LL_STATUS_LIST is their only definition: the enum below, ll_status_table and the Python
 * table loaderlib._ext._jpeg.Status (code -> name and message) are all generated from it.
 * The message is the fallback reason when a kernel wrote none of its own.
 */
#ifndef LL_COMMON_H
#define LL_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef _WIN32
#include <sys/mman.h>
#endif
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim */
#endif

/* CLOCK_MONOTONIC nanoseconds: the kernels' timings, the read-ahead's and the team's idle time. */
static inline int64_t ll_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Items one kernel thread may hold staged (NOTE [ Staged items ] in ll_pool.h): its scratch
 * slots in ll_worker and the pool's claims. */
#define LL_STAGE_PER_THREAD 4

/* X(name, code, message) */
#define LL_STATUS_LIST(X) \
    X(OK, 0, "written") \
    X(WARNED, 1, "written, but libjpeg recovered from corrupt data") \
    X(ERR_DECODE, -1, "the decoder failed") \
    X(ERR_EMPTY, -2, "empty input (0 bytes)") \
    X(ERR_NOT_JPEG, -3, "not a JPEG (no SOI marker)") \
    X(ERR_TOO_LARGE, -4, "the image has more pixels than max_pixels") \
    X(ERR_SHAPE, -5, "the output buffer does not match the decoded shape") \
    X(ERR_CROP, -6, "the crop box is outside the image") \
    X(ERR_STRICT, -7, "corrupt data, refused because strict=True") \
    X(ERR_NOMEM, -8, "out of memory") \
    X(ERR_UNSUPPORTED, -9, "a colour space or layout this build cannot produce") \
    X(ERR_STATE, -10, "internal error: decode without a header") \
    X(ERR_READ, -11, "read failed")

#define LL_STATUS_ENUM(name, code, message) LL_##name = (code),
enum { LL_STATUS_LIST(LL_STATUS_ENUM) };
#undef LL_STATUS_ENUM

typedef struct {
    int code;
    const char *name;
    const char *message;
} ll_status_info;

#define LL_STATUS_ROW(name, code, message) {(code), #name, message},
static const ll_status_info ll_status_table[] = { LL_STATUS_LIST(LL_STATUS_ROW) };
#undef LL_STATUS_ROW
#define LL_STATUS_COUNT ((int)(sizeof(ll_status_table) / sizeof(ll_status_table[0])))

/* The fallback message of a code ("" for a code not in the list). */
static const char *ll_status_message(int code) {
    for (int k = 0; k < LL_STATUS_COUNT; k++)
        if (ll_status_table[k].code == code) return ll_status_table[k].message;
    return "";
}

/* Output modes (channel order of the HWC result). */
#define LL_MODE_RGB 0
#define LL_MODE_BGR 1
#define LL_MODE_GRAY 2

/* How strict a decode is about data libjpeg recovered from (NOTE [ Truncated JPEG is an error ]). */
#define LL_STRICT_NONE 0      /* keep partial images: warnings only */
#define LL_STRICT_ALL 1       /* any recovered damage is an error */
#define LL_STRICT_TRUNCATED 2 /* the default: truncated data is an error, other damage a warning */

/* Length of per-item message buffers. */
#define LL_MSG_LEN 200

/* A growable scratch buffer: never shrinks, freed by its owner. The one growable buffer of
 * every kernel (per-thread scratch in ll_worker.h, the decoder's row buffer in ll_jpeg.h, the
 * read-ahead's slots).
 *
 * NOTE [ Scratch grows to fit ]
 * A buffer grows to the size asked for plus an eighth, in whole pages, not to the next
 * power of two: its memory is resident for as long as its owner lives (a kernel thread, a
 * read slot), and a power of two holds up to twice what the largest item needs (a 1.1 MB
 * decoded region took a 2 MB buffer per thread; 96 read slots of 47 KB photos held 9.3 MB;
 * both counted by a profiling script). Sizes of one dataset vary within a range, so the
 * buffer is reallocated only when an item is larger than any before it by an eighth: a few
 * times per run.
 * Buffers of LL_BUF_MAP_MIN and more are mappings of their own, not malloc's: each kernel
 * and IO thread allocates in its own malloc arena, and memory freed there stays resident
 * until the allocator trims it, so a kernel team's scratch freed at the end of an epoch sat
 * beside the next team's, a few MB at every epoch boundary of the RN50 bench (a profiling
 * script's smaps). A mapping is resident for exactly as long as its buffer. */
typedef struct {
    unsigned char *p;
    size_t cap;
} ll_buf;

#define LL_BUF_MAP_MIN ((size_t)256 << 10)

static void ll_buf_release_mem(unsigned char *p, size_t cap) {
#ifndef _WIN32
    if (cap >= LL_BUF_MAP_MIN) {
        munmap(p, cap);
        return;
    }
#endif
    (void)cap;
    free(p);
}

static int ll_buf_reserve(ll_buf *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = need + need / 8;
    if (cap < need) return -1; /* overflow */
    cap = (cap + 4095) & ~(size_t)4095;
#ifndef _WIN32
    if (cap >= LL_BUF_MAP_MIN) {
        void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return -1;
        if (b->p != NULL) {
            memcpy(m, b->p, b->cap);
            ll_buf_release_mem(b->p, b->cap);
        }
        b->p = (unsigned char *)m;
        b->cap = cap;
        return 0;
    }
#endif
    unsigned char *p = (unsigned char *)realloc(b->p, cap);
    if (p == NULL) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Give the allocator's free pages back to the system (glibc's malloc_trim; a no-op
 * elsewhere): buffers freed by other threads stay in their malloc arenas otherwise. */
static void ll_release_free_memory(void) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

static void ll_buf_free(ll_buf *b) {
    if (b->p != NULL) ll_buf_release_mem(b->p, b->cap);
    b->p = NULL;
    b->cap = 0;
}

#endif
