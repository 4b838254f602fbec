/* Project-wide status codes shared by the C helpers and the Cython kernels.
 *
 * Kernels never raise inside a parallel region: every item gets one of these codes and
 * the Python owner module turns non-zero codes into exceptions (loaderlib/errors.py).
 * Codes >= 0 mean the output was written; codes < 0 mean it was not.
 */
#ifndef LL_COMMON_H
#define LL_COMMON_H

#define LL_OK 0
#define LL_WARNED 1             /* decoded, but libjpeg recovered from corrupt data */
#define LL_ERR_DECODE (-1)      /* libjpeg fatal error; message in the item's text */
#define LL_ERR_EMPTY (-2)       /* zero-length input */
#define LL_ERR_NOT_JPEG (-3)    /* no SOI marker: the owner may try another decoder */
#define LL_ERR_TOO_LARGE (-4)   /* declared pixels exceed max_pixels */
#define LL_ERR_SHAPE (-5)       /* caller's output buffer does not match the decoded shape */
#define LL_ERR_CROP (-6)        /* crop box outside the image */
#define LL_ERR_STRICT (-7)      /* strict mode: a recoverable libjpeg warning */
#define LL_ERR_NOMEM (-8)       /* scratch allocation failed */
#define LL_ERR_UNSUPPORTED (-9) /* colour space or layout this build cannot produce */
#define LL_ERR_STATE (-10)      /* internal misuse (decode without header) */
#define LL_ERR_READ (-11)       /* reading the source failed (I/O) */

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

#include <stdlib.h>

/* A growable scratch buffer: grows geometrically, never shrinks, freed by its owner. */
typedef struct {
    unsigned char *p;
    size_t cap;
} ll_buf;

static int ll_buf_reserve(ll_buf *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) cap *= 2;
    unsigned char *p = (unsigned char *)realloc(b->p, cap);
    if (p == NULL) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static void ll_buf_free(ll_buf *b) {
    free(b->p);
    b->p = NULL;
    b->cap = 0;
}

#endif
