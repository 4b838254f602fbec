/* One decompressor, reused as the kernels reuse theirs: each file is decoded with libjpeg's
 * separate colour converter (fancy upsampling), then with the merged upsampler (fast=True on a
 * subsampled image), each time with a crop that starts below the top so that
 * jpeg_skip_scanlines runs (NOTE [ Merged upsampling leaves cconvert stale ] in ll_jpeg.h).
 *
 * The program brings its own malloc: every block gets pages of its own, and free() makes them
 * inaccessible instead of giving them back. libjpeg (a system library, not built with a
 * sanitizer) allocates through it too, so any later read or write of a freed block, in libjpeg
 * or in ours, stops the program with SIGSEGV, on every run.
 *
 * Usage: decoder_reuse A.jpg B.jpg ...  Prints "decodes N bad items M" (M: decodes that did
 * not return LL_OK). Built and run by test_decode_bad_input.py. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ll_jpeg.h"

/* -- the fenced allocator ------------------------------------------------------------------ */
#define HDR 64 /* keeps the returned pointers 64-byte aligned; holds the block's mapped size */

static size_t mapped_size(size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (n + HDR + page - 1) / page * page;
}

void *malloc(size_t n) {
    const size_t total = mapped_size(n);
    unsigned char *p = (unsigned char *)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        errno = ENOMEM;
        return NULL;
    }
    memcpy(p, &total, sizeof(total));
    return p + HDR;
}

void free(void *q) {
    if (q == NULL) return;
    unsigned char *p = (unsigned char *)q - HDR;
    size_t total;
    memcpy(&total, p, sizeof(total));
    mprotect(p, total, PROT_NONE); /* never unmapped: its addresses are not reused */
}

void *calloc(size_t a, size_t b) {
    if (b != 0 && a > (size_t)-1 / b) return NULL;
    return malloc(a * b); /* fresh anonymous pages are zero */
}

void *realloc(void *q, size_t n) {
    void *r = malloc(n);
    if (q != NULL && r != NULL) {
        size_t total;
        memcpy(&total, (unsigned char *)q - HDR, sizeof(total));
        memcpy(r, q, total - HDR < n ? total - HDR : n);
        free(q);
    }
    return r;
}

/* -- the decodes --------------------------------------------------------------------------- */
/* Crop tops: inside the first iMCU row, at its end, past it, and far down. */
static const int TOPS[] = {1, 3, 7, 15, 16, 17, 30, 47, 80, 121};
#define NTOPS ((int)(sizeof(TOPS) / sizeof(TOPS[0])))

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = (unsigned char *)malloc((size_t)size);
    if (buf != NULL && fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = (size_t)size;
    return buf;
}

int main(int argc, char **argv) {
    ll_jpeg_dec d;
    if (ll_jpeg_create(&d) != LL_OK) return 2;
    int bad = 0, done = 0;
    for (int k = 1; k < argc; k++) {
        size_t n = 0;
        unsigned char *buf = slurp(argv[k], &n);
        if (buf == NULL) {
            fprintf(stderr, "cannot read %s\n", argv[k]);
            return 2;
        }
        for (int j = 0; j < 2 * NTOPS; j++) {
            const int fast = j & 1;
            ll_jpeg_info info;
            if (ll_jpeg_header(&d, buf, n, &info) != LL_OK) {
                bad++;
                continue;
            }
            const int y0 = TOPS[j / 2] % info.height, h = (info.height - y0) / 2 + 1;
            const int x0 = info.width / 4, w = info.width / 2;
            unsigned char *out = (unsigned char *)malloc((size_t)w * (size_t)h * 3);
            if (out == NULL) return 2;
            if (ll_jpeg_decode(&d, LL_MODE_RGB, 1, x0, y0, w, h, out, (ptrdiff_t)w * 3, LL_STRICT_TRUNCATED, fast) !=
                LL_OK)
                bad++;
            done++;
            free(out);
        }
        free(buf);
    }
    ll_jpeg_destroy(&d);
    printf("decodes %d bad items %d\n", done, bad);
    return 0;
}
