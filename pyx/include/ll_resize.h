/* Separable uint8 resampling with fixed-point weights (bilinear, area, nearest).
 *
 * NOTE [ Resampling geometry ]
 * One output axis of n_out pixels samples a source axis through the affine map
 *     source coordinate = a * output coordinate + b        (a > 0, continuous coordinates,
 *                                                           pixel k spans [k, k+1))
 * so a plain resize of an image of n_in pixels is a = n_in / n_out, b = 0, and a crop
 * before the resize only moves b. Pixels are read from a clamp domain [d0, d1): taps that
 * fall outside it are clamped to its edge, which is what OpenCV does at the border of the
 * image it is given; a crop-then-resize therefore clamps at the crop box, and the fused
 * executor passes the box as the domain. Pixels of the domain outside [v0, v1) read as 0
 * (the zero padding of a CenterCrop larger than the image).
 *
 * Per interpolation, the weights of output pixel o (centre c = a*(o+0.5) + b):
 *   LL_INTERP_LINEAR    taps floor(c-0.5) and +1 with weights 1-f, f: cv2.INTER_LINEAR.
 *   LL_INTERP_AREA      a >= 1 on both axes: the source pixels overlapping
 *                       [a*o+b, a*(o+1)+b), weighted by overlap (cv2.INTER_AREA);
 *                       otherwise cv2's two-tap INTER_AREA coefficients (see below).
 *   LL_INTERP_NEAREST   pixel floor(c), the pixel under the centre (Pillow's NEAREST,
 *                       torchvision's "nearest-exact"; cv2.INTER_NEAREST_EXACT agrees
 *                       except where its 16.16 fixed point rounds a near-tie the other way).
 *   linear + antialias  a > 1: triangle filter of half-width a (Pillow's BILINEAR and
 *                       torchvision's antialias=True), taps renormalised at the border.
 *
 * NOTE [ Fixed-point resampling ]
 * Weights are Q14 (sum 16384). The horizontal pass keeps Q7 (value * 128, <= 32640, an
 * int16); the vertical pass of a two-tap filter keeps the high half of each 16x16-bit
 * product (Q5, so it runs in 16-bit SIMD lanes), wider filters accumulate Q21 in int32
 * ((32640 * 16384) < 2**31); both round once at the end. The total error against exact
 * arithmetic stays below 0.6 levels, so the result is within +-1 of OpenCV's own 11-bit
 * fixed point. The vertical pass is a
 * contiguous multiply-add over out_w * channels int16 values, which the compiler
 * vectorises; the horizontal pass is channel-interleaved with the channel count a
 * compile-time constant.
 */
#ifndef LL_RESIZE_H
#define LL_RESIZE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ll_common.h"

#if defined(__SSE2__) && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
/* AVX2 kernels, compiled for AVX2 by target attribute and chosen at run time
 * (NOTE [ SIMD switch ]) */
#define LL_HAVE_AVX2_KERNELS 1
#include <immintrin.h>
#endif

#define LL_INTERP_LINEAR 0
#define LL_INTERP_AREA 1
#define LL_INTERP_NEAREST 2
/* Internal: cv2's INTER_AREA coefficients when some axis upscales. */
#define LL_INTERP_AREA_LINEAR 3

#define LL_WBITS 14
#define LL_WONE (1 << LL_WBITS)


/* Taps of one axis: output o reads ntap[o] consecutive pixels from start[o] with weights
 * w[o*maxt .. o*maxt+ntap[o]). ntap[o] == 0 means the output pixel is 0 (padding). */
typedef struct {
    int32_t *start;
    int32_t *ntap;
    int16_t *w;
    int maxt;
    int n;
} ll_taps;

/* Upper bound on the taps per output pixel. */
static int ll_taps_max(int interp, int antialias, double a) {
    if (interp == LL_INTERP_NEAREST) return 1;
    if (interp == LL_INTERP_AREA) return a > 1.0 ? (int)ceil(a) + 2 : 2;
    if (interp == LL_INTERP_LINEAR && antialias && a > 1.0) return (int)ceil(2.0 * a) + 3;
    return 2;
}

/* lrint, inline. Without -fno-math-errno gcc calls lrint through the PLT, once per tap of
 * every output pixel of every image; on x86-64 glibc's lrint is this one instruction
 * (cvtsd2si, which rounds as MXCSR says: to nearest even unless a caller changed it), so
 * the weights are the same. */
static inline long ll_lrint(double x) {
#if defined(LL_HAVE_AVX2_KERNELS) && defined(__x86_64__)
    return (long)_mm_cvtsd_si64(_mm_set_sd(x));
#else
    return lrint(x);
#endif
}

/* Quantise weights wd[0..n) (sum s) to Q14 summing to round(s * 16384), trim zero
 * weights at both ends, and store them. Returns the number of taps kept. Overwrites wd. */
static int ll_taps_store(double *wd, int first, int n, double s, int32_t *start, int16_t *wq) {
    long total = 0;
    int big = 0;
    double bigw = 0.0;   /* wd[big], kept in a register: the first largest weight */
    for (int t = 0; t < n; t++) { /* quantised in place: integers are exact in a double */
        const double q = (double)ll_lrint(wd[t] * LL_WONE);
        wd[t] = q;
        total += (long)q;
        if (t == 0 || q > bigw) { big = t; bigw = q; }
    }
    if (n > 0) wd[big] += (double)(ll_lrint(s * LL_WONE) - total);
    int lo = 0, hi = n;
    while (lo < hi && wd[lo] == 0) lo++;
    while (hi > lo && wd[hi - 1] == 0) hi--;
    *start = first + lo;
    for (int t = lo; t < hi; t++) wq[t - lo] = (int16_t)wd[t];
    return hi - lo;
}

/* Fill taps for one axis (see NOTE [ Resampling geometry ]). Tap indices are absolute
 * (same coordinates as d0, d1, v0, v1) and always inside [max(d0, v0), min(d1, v1)).
 * Requires d0 < d1. tmp holds at least maxt doubles. */
static void ll_taps_compute(ll_taps *tp, int interp, int antialias, double a, double b, int d0, int d1, int v0,
                            int v1, double *tmp) {
    int maxt = tp->maxt;
    for (int o = 0; o < tp->n; o++) {
        int16_t *wq = tp->w + (size_t)o * maxt;
        int first = 0, n = 0;
        double s = 1.0;
        double c = a * (o + 0.5) + b;
        if (interp == LL_INTERP_NEAREST) {
            /* the pixel under the centre: index floor((o + 0.5) * a + b), as Pillow's and
             * torchvision's "nearest-exact" */
            int i = (int)floor(c + 1e-9); /* c is exact up to rounding: keep exact ties exact */
            if (i < d0) i = d0;
            if (i > d1 - 1) i = d1 - 1;
            first = i; n = 1; tmp[0] = 1.0;
        } else if (interp == LL_INTERP_LINEAR && !(antialias && a > 1.0)) {
            double fc = c - 0.5;
            int i = (int)floor(fc);
            double f = fc - i;
            if (i < d0) { i = d0; f = 0.0; }
            if (i >= d1 - 1) { i = d1 - 1; f = 0.0; }
            first = i; n = 2; tmp[0] = 1.0 - f; tmp[1] = f;
        } else if (interp == LL_INTERP_AREA_LINEAR) {
            /* cv2 resize(): sx = floor(o*a), fx = (o+1) - (sx+1)/a, fx = fx <= 0 ? 0 : frac(fx) */
            double lo = a * o + b;
            int i = (int)floor(lo);
            double f = (a * (o + 1) + b - (i + 1)) / a;
            f = f <= 0 ? 0.0 : f - floor(f);
            if (i < d0) { i = d0; f = 0.0; }
            if (i >= d1 - 1) { i = d1 - 1; f = 0.0; }
            first = i; n = 2; tmp[0] = 1.0 - f; tmp[1] = f;
        } else { /* area (a >= 1) or antialiased linear: weighted taps clipped to the domain */
            double lo, hi;
            int tri = (interp == LL_INTERP_LINEAR);
            if (tri) { lo = c - a; hi = c + a; }
            else { lo = a * o + b; hi = lo + a; }
            if (lo < d0) lo = d0;
            if (hi > d1) hi = d1;
            if (hi <= lo) { /* the whole support is outside the domain: nearest edge pixel */
                int i = (int)floor(c);
                if (i < d0) i = d0;
                if (i > d1 - 1) i = d1 - 1;
                first = i; n = 1; tmp[0] = 1.0;
            } else {
                int i0 = (int)floor(lo), i1 = (int)ceil(hi);
                if (i1 - i0 > maxt) i1 = i0 + maxt;
                const int nt = i1 - i0;
                /* The weights first, in a loop of independent lanes the compiler vectorises
                 * (the same IEEE operations, so the same doubles), then their sum in order. */
                if (tri) {
                    for (int t = 0; t < nt; t++) {
                        double x = fabs(((i0 + t) + 0.5 - c) / a);
                        tmp[t] = x < 1.0 ? 1.0 - x : 0.0;
                    }
                } else {
                    for (int t = 0; t < nt; t++) {
                        double l = (i0 + t) > lo ? (i0 + t) : lo, h = (i0 + t + 1) < hi ? (i0 + t + 1) : hi;
                        tmp[t] = h > l ? h - l : 0.0;
                    }
                }
                double sum = 0.0;
                for (int t = 0; t < nt; t++) sum += tmp[t];
                first = i0; n = nt;
                if (sum <= 0) { tmp[0] = 1.0; n = 1; sum = 1.0; }
                for (int t = 0; t < n; t++) tmp[t] /= sum;
            }
        }
        /* Padding: pixels outside [v0, v1) are zeros: drop their taps, keep the others'
         * weights (the zeros still count in the average). */
        if (first < v0) {
            int drop = v0 - first;
            if (drop >= n) { n = 0; } else {
                for (int t = 0; t < n - drop; t++) tmp[t] = tmp[t + drop];
                n -= drop; first = v0;
            }
        }
        if (n > 0 && first + n > v1) n = v1 - first > 0 ? v1 - first : 0;
        s = 0.0;
        for (int t = 0; t < n; t++) s += tmp[t];
        if (n == 0) { tp->start[o] = v0; tp->ntap[o] = 0; continue; }
        tp->ntap[o] = ll_taps_store(tmp, first, n, s, &tp->start[o], wq);
    }
}

/* Smallest and largest+1 source index any tap reads; returns 0 when no tap reads at all. */
static int ll_taps_span(const ll_taps *tp, int *lo, int *hi) {
    int l = 0x7fffffff, h = -0x7fffffff, any = 0;
    for (int o = 0; o < tp->n; o++) {
        if (tp->ntap[o] <= 0) continue;
        any = 1;
        if (tp->start[o] < l) l = tp->start[o];
        if (tp->start[o] + tp->ntap[o] > h) h = tp->start[o] + tp->ntap[o];
    }
    *lo = l; *hi = h;
    return any;
}

static void ll_taps_shift(ll_taps *tp, int by) {
    for (int o = 0; o < tp->n; o++) tp->start[o] -= by;
}

/* Mirror the axis: output o takes what output n-1-o had. */
static void ll_taps_reverse(ll_taps *tp) {
    int n = tp->n, m = tp->maxt;
    for (int o = 0; o < n / 2; o++) {
        int p = n - 1 - o;
        int32_t t;
        t = tp->start[o]; tp->start[o] = tp->start[p]; tp->start[p] = t;
        t = tp->ntap[o]; tp->ntap[o] = tp->ntap[p]; tp->ntap[p] = t;
        for (int k = 0; k < m; k++) {
            int16_t u = tp->w[(size_t)o * m + k];
            tp->w[(size_t)o * m + k] = tp->w[(size_t)p * m + k];
            tp->w[(size_t)p * m + k] = u;
        }
    }
}

/* Two-tap filters (bilinear, nearest, cv2's upscaling area) in a branch-free form: per
 * output, two element offsets and two weights; a one-tap output reads its pixel twice
 * with a zero second weight, so no read can leave the taps' span. */
typedef struct {
    int32_t *off; /* 2 per output: element offsets (pixel * C) */
    int32_t *w;   /* 2 per output */
    int16_t *wv;  /* 8 per output, 16-byte aligned: (w0, w1) x 3, 0, 0 for the SSE2 path */
    int row_len;  /* elements in a source row: SIMD loads must stay inside it */
} ll_pairs;

static void ll_pairs_build(const ll_taps *tx, int C, int row_len, ll_pairs *pr) {
    pr->row_len = row_len;
    for (int o = 0; o < tx->n; o++) {
        int nt = tx->ntap[o];
        const int16_t *w = tx->w + (size_t)o * tx->maxt;
        int32_t s = nt > 0 ? tx->start[o] * C : 0; /* a padding output reads nothing real */
        int32_t w0 = nt >= 1 ? w[0] : 0, w1 = nt == 2 ? w[1] : 0;
        pr->off[2 * o] = s;
        pr->off[2 * o + 1] = nt == 2 ? s + C : s;
        pr->w[2 * o] = w0;
        pr->w[2 * o + 1] = w1;
        if (pr->wv != NULL) {
            int16_t *v = pr->wv + 8 * (size_t)o;
            for (int k = 0; k < 3; k++) { v[2 * k] = (int16_t)w0; v[2 * k + 1] = (int16_t)w1; }
            v[6] = v[7] = 0;
        }
    }
}

#if defined(__SSE2__)
#include <emmintrin.h>
/* Two-tap horizontal pass for 3 channels, one output pixel per iteration: load the 8
 * bytes at the first tap (pixel a, pixel b, 2 spare), pair them up as (a_c, b_c) int16
 * lanes and let pmaddwd form a_c*w0 + b_c*w1 for the 3 channels at once. An output whose
 * 8-byte load would leave the source row (the last pixels; the first ones when the row
 * is mirrored) is computed in scalar code. Each store writes 4 int16; the 4th is
 * overwritten by the next pixel, and the row has 4 spare int16 after its end. */
static void ll_hpass3_sse2(const uint8_t *src, const ll_pairs *pr, int n, int16_t *dst) {
    const __m128i zero = _mm_setzero_si128(), round = _mm_set1_epi32(64);
    const int32_t *off = pr->off;
    const int lim = pr->row_len - 8;
    for (int o = 0; o < n; o++) {
        int e = off[2 * o];
        if (e <= lim) {
            __m128i a = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(src + e)), zero);
            __m128i b = _mm_srli_si128(a, 6); /* pixel b's channels in lanes 0-2 */
            __m128i ab = _mm_unpacklo_epi16(a, b);
            __m128i r = _mm_madd_epi16(ab, _mm_load_si128((const __m128i *)(pr->wv + 8 * (size_t)o)));
            r = _mm_srai_epi32(_mm_add_epi32(r, round), 7);
            _mm_storel_epi64((__m128i *)(dst + 3 * o), _mm_packs_epi32(r, r));
        } else {
            const uint8_t *p0 = src + e, *p1 = src + off[2 * o + 1];
            const int32_t w0 = pr->w[2 * o], w1 = pr->w[2 * o + 1];
            for (int c = 0; c < 3; c++) dst[3 * o + c] = (int16_t)((w0 * p0[c] + w1 * p1[c] + 64) >> 7);
        }
    }
}
#endif

/* NOTE [ SIMD switch ]
 * Every SIMD kernel here has a scalar twin computing the same integers, so the level only
 * changes speed. The level is the best the CPU offers (AVX2 when it has it: the AVX2
 * kernels are compiled for it with a target attribute and chosen at run time, so the
 * extension itself still runs on any x86-64), capped by the environment:
 * LOADERLIB_SIMD=scalar | sse2 | avx2 | avx512, or LOADERLIB_NO_SIMD=1 (= scalar). The
 * avx512 level (AVX-512 F, BW, VL and VBMI: Ice Lake and later Xeons, Zen 4 and later)
 * adds two kernels, NOTE [ Horizontal pass in AVX-512 ] and NOTE [ Emitting float planes in
 * AVX-512 ] (ll_chain.h); everything else runs as at avx2. A test runs the
 * same chains at every level (in subprocesses) and requires bitwise-equal output. Read
 * once per process. */
#define LL_SIMD_SCALAR 0
#define LL_SIMD_SSE2 1
#define LL_SIMD_AVX2 2
#define LL_SIMD_AVX512 3

static int ll_simd_level(void) {
    static int level = -1; /* racing first reads store the same value */
    if (level < 0) {
        int l = LL_SIMD_SCALAR;
#if defined(__SSE2__)
        l = LL_SIMD_SSE2;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2")) l = LL_SIMD_AVX2;
        /* NOTE [ Horizontal pass in AVX-512 ]; libgcc checks the OS saves the zmm state */
        if (l == LL_SIMD_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi"))
            l = LL_SIMD_AVX512;
#endif
#endif
        const char *off = getenv("LOADERLIB_NO_SIMD");
        const char *cap = getenv("LOADERLIB_SIMD");
        if (off != NULL && off[0] != 0 && off[0] != '0') l = LL_SIMD_SCALAR;
        else if (cap != NULL && strcmp(cap, "scalar") == 0) l = LL_SIMD_SCALAR;
        else if (cap != NULL && strcmp(cap, "sse2") == 0 && l > LL_SIMD_SSE2) l = LL_SIMD_SSE2;
        else if (cap != NULL && strcmp(cap, "avx2") == 0 && l > LL_SIMD_AVX2) l = LL_SIMD_AVX2;
        level = l;
    }
    return level;
}

static int ll_simd_on(void) { return ll_simd_level() > LL_SIMD_SCALAR; }

static const char *ll_simd_name(void) {
    static const char *names[] = {"scalar", "sse2", "avx2", "avx512"};
    return names[ll_simd_level()];
}

#if defined(__SSE2__)
/* NOTE [ Wide taps in pairs ]
 * Antialiased downscaling (the default) gives filters of 3 to 8+ taps, which the two-tap
 * pass cannot take. The same pmaddwd trick works for any count: per output, walk the taps
 * two at a time, load 8 bytes at tap t (pixels t and t+1 and spare bytes), interleave the
 * two pixels' channels as int16 pairs and multiply-add them with (w_t, w_t+1) for the 3
 * channels at once, accumulating in int32. An odd last tap pairs with a zero weight (its
 * partner pixel is read but contributes nothing). Integer arithmetic in the same order of
 * magnitude as the scalar loop: the sums are equal, so the output is bitwise the scalar
 * pass's (tests run both, NOTE [ SIMD switch ]). Only for non-negative weights (the
 * triangle and area filters), whose results fit int16 so the saturating pack is exact. */
static int ll_wide_ok(const ll_taps *tx) {
    /* only each output's own taps: the slots past ntap[o] hold whatever the scratch held */
    for (int o = 0; o < tx->n; o++)
        for (int t = 0; t < tx->ntap[o]; t++)
            if (tx->w[(size_t)o * tx->maxt + t] < 0) return 0;
    return 1;
}

/* Weight vectors for ll_hpass3_wide_sse2: per output, (maxt+1)/2 vectors of 8 int16,
 * (w_t, w_t+1) x 3 then two zeros; wv is 16-byte aligned. */
static void ll_wide_build(const ll_taps *tx, int16_t *wv) {
    const int m = tx->maxt, np = (m + 1) / 2;
    for (int o = 0; o < tx->n; o++) {
        const int16_t *w = tx->w + (size_t)o * m;
        const int nt = tx->ntap[o];
        for (int q = 0; q < np; q++) {
            int16_t a = 2 * q < nt ? w[2 * q] : 0, b = 2 * q + 1 < nt ? w[2 * q + 1] : 0;
            int16_t *v = wv + ((size_t)o * np + q) * 8;
            for (int k = 0; k < 3; k++) { v[2 * k] = a; v[2 * k + 1] = b; }
            v[6] = v[7] = 0;
        }
    }
}

/* One output pixel of the three-channel horizontal pass in scalar code: the SIMD passes' fallback
 * where a load would leave the source row. */
static inline void ll_hpass3_one(const uint8_t *src, const ll_taps *tx, int o, int16_t *dst) {
    const uint8_t *p = src + (ptrdiff_t)tx->start[o] * 3;
    const int16_t *w = tx->w + (size_t)o * tx->maxt;
    int32_t acc[3] = {64, 64, 64};
    for (int t = 0; t < tx->ntap[o]; t++)
        for (int c = 0; c < 3; c++) acc[c] += w[t] * p[t * 3 + c];
    for (int c = 0; c < 3; c++) dst[3 * o + c] = (int16_t)(acc[c] >> 7);
}

static void ll_hpass3_wide_sse2(const uint8_t *src, const ll_taps *tx, const int16_t *wv, int row_len,
                                int16_t *dst) {
    const __m128i zero = _mm_setzero_si128(), round = _mm_set1_epi32(64);
    const int m = tx->maxt, np = (m + 1) / 2, lim = row_len - 8;
    for (int o = 0; o < tx->n; o++) {
        const int nt = tx->ntap[o];
        const int e0 = tx->start[o] * 3;
        const int last = e0 + 3 * (2 * ((nt + 1) / 2) - 2); /* the last 8-byte load's start */
        if (nt > 0 && e0 >= 0 && last <= lim) {
            __m128i acc = round;
            const int16_t *v = wv + (size_t)o * np * 8;
            for (int t = 0; t < nt; t += 2, v += 8) {
                __m128i a = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(src + e0 + 3 * t)), zero);
                __m128i b = _mm_srli_si128(a, 6);
                acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_unpacklo_epi16(a, b), _mm_load_si128((const __m128i *)v)));
            }
            acc = _mm_srai_epi32(acc, 7);
            _mm_storel_epi64((__m128i *)(dst + 3 * o), _mm_packs_epi32(acc, acc));
        } else {
            ll_hpass3_one(src, tx, o, dst);
        }
    }
}
#endif

#if defined(LL_HAVE_AVX2_KERNELS)
/* NOTE [ Horizontal pass in AVX2 ]
 * Two output pixels per step, one in each 128-bit half. For tap pair q of an output, one
 * unaligned 16-byte load at its pixel 2q and one byte shuffle give the int16 pairs
 * (p_c, p'_c) of its two pixels' three channels (zero-extended, 4th lane zero), and one
 * pmaddwd with (w_2q, w_2q+1) x 3 adds both taps for the three channels: a load, a
 * shuffle and a multiply-add per two taps and two outputs. Weights come per output pair
 * (ll_wide2_build), zero past an output's own taps, so both halves run the pair's larger
 * count. The integers are those of the scalar loop (NOTE [ Wide taps in pairs ]). A pair
 * whose loads would leave the source row (the row's last pixels, the first ones when it is
 * mirrored) is computed in scalar code. Each output stores 4 int16: the next output's store
 * overwrites the 4th, and the row has spare int16 after its end. */

/* Weight vectors and per-pair plan for ll_hpass3_avx2. Per output pair (o, o+1): (maxt+1)/2
 * vectors of 16 int16 in wv (32-byte aligned), the first 8 for o and the last 8 for o+1,
 * each (w_t, w_t+1) x 3 then two zeros; and in meta three int32: the byte offsets of both
 * outputs' first taps and the pair count the step runs, 0 when a load would leave a source
 * row of row_len bytes (those outputs are computed in scalar code). A lone last output has
 * count 0. Everything per row is decided here, once per image. */
static void ll_wide2_build(const ll_taps *tx, int row_len, int16_t *wv, int32_t *meta) {
    const int m = tx->maxt, np = (m + 1) / 2;
    for (int o = 0; o < tx->n; o++) {
        const int16_t *w = tx->w + (size_t)o * m;
        const int nt = tx->ntap[o];
        for (int q = 0; q < np; q++) {
            int16_t a = 2 * q < nt ? w[2 * q] : 0, b = 2 * q + 1 < nt ? w[2 * q + 1] : 0;
            int16_t *v = wv + ((size_t)(o / 2) * np + q) * 16 + 8 * (o & 1);
            for (int k = 0; k < 3; k++) { v[2 * k] = a; v[2 * k + 1] = b; }
            v[6] = v[7] = 0;
        }
    }
    for (int o = 0; o < tx->n; o += 2) {
        int32_t *mt = meta + 3 * (o / 2);
        mt[0] = tx->start[o] * 3;
        mt[1] = o + 1 < tx->n ? tx->start[o + 1] * 3 : 0;
        mt[2] = 0;
        if (o + 1 >= tx->n) continue;
        const int na = tx->ntap[o], nb = tx->ntap[o + 1];
        const int pq = ((na > nb ? na : nb) + 1) / 2, reach = 6 * (pq - 1) + 16;
        if (na > 0 && nb > 0 && mt[0] >= 0 && mt[1] >= 0 && mt[0] + reach <= row_len && mt[1] + reach <= row_len)
            mt[2] = pq;
    }
}

__attribute__((target("avx2"))) static void ll_hpass3_avx2(const uint8_t *src, const ll_taps *tx,
                                                            const int16_t *wv, const int32_t *meta, int16_t *dst) {
    const __m256i mask = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    const __m256i round = _mm256_set1_epi32(64);
    const int np = (tx->maxt + 1) / 2, n = tx->n;
    const size_t vstep = (size_t)np * 16;
    for (int o = 0; o < n; o += 2, meta += 3, wv += vstep) {
        const int pq = meta[2];
        if (pq == 0) {
            ll_hpass3_one(src, tx, o, dst);
            if (o + 1 < n) ll_hpass3_one(src, tx, o + 1, dst);
            continue;
        }
        const uint8_t *a = src + meta[0], *b = src + meta[1];
        __m256i acc;
#define LL_HPASS3_TAPS(q)                                                                                        \
    _mm256_madd_epi16(                                                                                           \
        _mm256_shuffle_epi8(_mm256_inserti128_si256(                                                             \
                                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + 6 * (q)))),          \
                                _mm_loadu_si128((const __m128i *)(b + 6 * (q))), 1),                             \
                            mask),                                                                               \
        _mm256_load_si256((const __m256i *)(wv + 16 * (q))))
        /* Most pairs of a row run the same count, 1 (an upscale) or 2 (a downscale by up to
         * 1.5x): those without a loop, the two products summed first (integer sums, so the
         * result is the loop's). benchmarks/instructions.py: this pass 1.53M -> 1.10M
         * instructions per item of the RN50 float chain, the chain 8.06M -> 7.63M. */
        if (pq == 2) {
            acc = _mm256_add_epi32(round, _mm256_add_epi32(LL_HPASS3_TAPS(0), LL_HPASS3_TAPS(1)));
        } else if (pq == 1) {
            acc = _mm256_add_epi32(round, LL_HPASS3_TAPS(0));
        } else {
            acc = round;
            for (int q = 0; q < pq; q++) acc = _mm256_add_epi32(acc, LL_HPASS3_TAPS(q));
        }
#undef LL_HPASS3_TAPS
        __m256i p = _mm256_packs_epi32(_mm256_srai_epi32(acc, 7), acc);
        _mm_storel_epi64((__m128i *)(dst + 3 * o), _mm256_castsi256_si128(p));
        _mm_storel_epi64((__m128i *)(dst + 3 * o + 3), _mm256_extracti128_si256(p, 1));
    }
}

/* NOTE [ Horizontal pass in AVX-512 ]
 * Four output pixels per step, one in each 128-bit lane, from one 64-byte (masked) load of
 * the source row: the step's window. For tap pair q, one VBMI byte permute (vpermb, zero
 * masking the odd bytes) gathers, for every lane, the int16 pairs (p_c, p'_c) of its
 * output's taps 2q and 2q+1 for the three channels, exactly the lane layout of NOTE
 * [ Horizontal pass in AVX2 ], and one vpmaddwd with (w_2q, w_2q+1) x 3 adds both taps: a
 * permute and a multiply-add per two taps and four outputs, the load shared by all tap
 * pairs. The permute indices and weights are built once per image (ll_vbmi_build), with
 * zero weights past an output's own taps; the integers are the scalar loop's, so the
 * output is bitwise the same (the test runs every level). It applies when every step's taps
 * fit its window (a downscale of up to about 3.5x with the antialiasing filter, every
 * upscale); ll_vbmi_build says so, and otherwise the image takes the AVX2 pass. The window's
 * load is masked at the row's end, so no step reads past the row. */

/* Bytes of ll_vbmi_build's tables for ``n`` outputs of at most ``maxt`` taps: per step of 4
 * outputs, per tap pair, a 64-byte permute index and 64 bytes of weights; then per step an
 * int64 load mask, and an int32 window offset and an int32 count of tap pairs to run (the
 * most any of its outputs has: filters are narrower than the bound maxt). */
static size_t ll_vbmi_bytes(int n, int maxt) {
    size_t steps = (size_t)(n + 3) / 4, np = (size_t)(maxt + 1) / 2;
    return steps * np * 128 + steps * 16 + 64;
}

/* Build the tables at ``tab`` (64-byte aligned) for a source row of ``row_len`` bytes; 0 when
 * some step's taps do not fit its 64-byte window (then use ll_hpass3_avx2). */
static int ll_vbmi_build(const ll_taps *tx, int row_len, uint8_t *tab) {
    const int n = tx->n, m = tx->maxt, np = (m + 1) / 2, steps = (n + 3) / 4;
    uint8_t *perm = tab;
    uint64_t *mask = (uint64_t *)(tab + (size_t)steps * np * 128);
    int32_t *base = (int32_t *)(mask + steps);
    for (int s = 0; s < steps; s++) {
        int lo = -1, most = 0;   /* the window's first byte; the most taps of the step's outputs */
        for (int j = 0; j < 4; j++) {
            int o = 4 * s + j;
            if (o >= n || tx->ntap[o] == 0) continue;
            if (tx->start[o] < 0) return 0;
            if (lo < 0 || tx->start[o] * 3 < lo) lo = tx->start[o] * 3;
            if (tx->ntap[o] > most) most = tx->ntap[o];
        }
        if (lo < 0) lo = 0;
        for (int j = 0; j < 4; j++) {
            int o = 4 * s + j;
            int nt = o < n ? tx->ntap[o] : 0;
            if (nt > 0 && (tx->start[o] * 3 - lo + 3 * nt > 64 || tx->start[o] * 3 + 3 * nt > row_len)) return 0;
        }
        int avail = row_len - lo;
        mask[s] = avail >= 64 ? ~(uint64_t)0 : avail <= 0 ? 0 : (((uint64_t)1 << avail) - 1);
        base[2 * s] = lo;
        base[2 * s + 1] = (most + 1) / 2;   /* the tap pairs this step runs */
        for (int q = 0; q < np; q++) {
            uint8_t *ix = perm + ((size_t)s * np + q) * 128;
            int16_t *wv = (int16_t *)(ix + 64);
            memset(ix, 0, 128);
            for (int j = 0; j < 4; j++) {
                int o = 4 * s + j;
                int nt = o < n ? tx->ntap[o] : 0;
                if (nt == 0) continue;
                const int16_t *w = tx->w + (size_t)o * m;
                int off = tx->start[o] * 3 - lo;
                for (int t = 2 * q; t < 2 * q + 2 && t < nt; t++)
                    for (int c = 0; c < 3; c++) {
                        ix[16 * j + 4 * c + 2 * (t - 2 * q)] = (uint8_t)(off + 3 * t + c);
                        wv[8 * j + 2 * c + (t - 2 * q)] = w[t];
                    }
            }
        }
    }
    return 1;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) static void
ll_hpass3_vbmi(const uint8_t *src, const ll_taps *tx, const uint8_t *tab, int16_t *dst) {
    const int n = tx->n, np = (tx->maxt + 1) / 2, steps = (n + 3) / 4;
    const uint64_t *mask = (const uint64_t *)(tab + (size_t)steps * np * 128);
    const int32_t *base = (const int32_t *)(mask + steps);
    const __m512i round = _mm512_set1_epi32(64);
    /* int16 lanes (c0, c1, c2, 0) x 4 -> 12 contiguous values */
    const __m256i pack = _mm256_setr_epi16(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 15, 15, 15, 15);
    for (int s = 0; s < steps; s++) {
        const __m512i win = _mm512_maskz_loadu_epi8(mask[s], src + base[2 * s]);
        const uint8_t *ix = tab + (size_t)s * np * 128;
        __m512i acc = round;
        for (int q = 0, pq = base[2 * s + 1]; q < pq; q++, ix += 128) {
            __m512i px = _mm512_maskz_permutexvar_epi8(0x5555555555555555ULL, _mm512_load_si512((const void *)ix), win);
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(px, _mm512_load_si512((const void *)(ix + 64))));
        }
        __m256i v = _mm512_cvtepi32_epi16(_mm512_srai_epi32(acc, 7));
        v = _mm256_permutexvar_epi16(pack, v);
        int left = n - 4 * s;
        __mmask16 keep = left >= 4 ? (__mmask16)0x0fff : (__mmask16)((1u << (3 * left)) - 1);
        _mm256_mask_storeu_epi16(dst + 12 * (size_t)s, keep, v);
    }
}
#endif

/* Horizontal pass of one source row into Q7 int16 (see NOTE [ Fixed-point resampling ]).
 * C is a literal at every call site, so each channel count gets its own unrolled copy. */
static inline __attribute__((always_inline)) void ll_hpass(const uint8_t *restrict src, const ll_taps *tx,
                                                          const ll_pairs *pr, int16_t *restrict dst, const int C) {
    const int n = tx->n;
    if (pr != NULL) {
        const int32_t *restrict off = pr->off, *restrict pw = pr->w;
#if defined(__SSE2__)
        if (C == 3 && pr->wv != NULL) {
            ll_hpass3_sse2(src, pr, n, dst);
            return;
        }
#endif
        for (int o = 0; o < n; o++) {
            const uint8_t *p0 = src + off[2 * o], *p1 = src + off[2 * o + 1];
            const int32_t w0 = pw[2 * o], w1 = pw[2 * o + 1];
            for (int c = 0; c < C; c++) dst[o * C + c] = (int16_t)((w0 * p0[c] + w1 * p1[c] + 64) >> 7);
        }
        return;
    }
    const int m = tx->maxt;
    for (int o = 0; o < n; o++) {
        const int nt = tx->ntap[o];
        const uint8_t *p = src + (ptrdiff_t)tx->start[o] * C;
        const int16_t *w = tx->w + (size_t)o * m;
        int32_t acc[4] = {64, 64, 64, 64};
        for (int t = 0; t < nt; t++)
            for (int c = 0; c < C; c++) acc[c] += w[t] * p[t * C + c];
        for (int c = 0; c < C; c++) dst[o * C + c] = (int16_t)(acc[c] >> 7);
    }
}

/* Out of line, one copy per channel count: inlined into the large per-sample function
 * the loop spills its registers to the stack and runs several times slower. */
__attribute__((noinline)) static void ll_hpass3(const uint8_t *src, const ll_taps *tx, const ll_pairs *pr,
                                                int16_t *dst) { ll_hpass(src, tx, pr, dst, 3); }
__attribute__((noinline)) static void ll_hpass1(const uint8_t *src, const ll_taps *tx, const ll_pairs *pr,
                                                int16_t *dst) { ll_hpass(src, tx, pr, dst, 1); }
__attribute__((noinline)) static void ll_hpass4(const uint8_t *src, const ll_taps *tx, const ll_pairs *pr,
                                                int16_t *dst) { ll_hpass(src, tx, pr, dst, 4); }
__attribute__((noinline)) static void ll_hpass2(const uint8_t *src, const ll_taps *tx, const ll_pairs *pr,
                                                int16_t *dst) { ll_hpass(src, tx, pr, dst, 2); }

static void ll_hpass_any(const uint8_t *src, const ll_taps *tx, const ll_pairs *pr, int16_t *dst, int C) {
    if (C == 3) ll_hpass3(src, tx, pr, dst);
    else if (C == 1) ll_hpass1(src, tx, pr, dst);
    else if (C == 4) ll_hpass4(src, tx, pr, dst);
    else ll_hpass2(src, tx, pr, dst);
}

/* NOTE [ Vertical pass in SIMD ]
 * The vertical pass is a weighted sum of nt int16 rows, column by column. Two taps (the
 * common bilinear case) keep the high half of each product (pmulhw) and round once, in
 * 16-bit lanes. Wider filters pair rows the way NOTE [ Wide taps in pairs ] pairs pixels:
 * rows t and t+1 interleaved as int16 pairs, pmaddwd with (w_t, w_t+1), accumulated in
 * int32 registers across all taps (an odd last row pairs with weight 0), one shift, and
 * the saturating packs clamp to 0..255 as the scalar loop does. The sums are the scalar
 * sums (integers, no overflow: each is at most 32640 * 16384), so the result is bitwise
 * the scalar pass's. Each SIMD kernel does the longest multiple of its width and returns
 * where it stopped; the scalar loop finishes the row. */
#if defined(__SSE2__)
static int ll_vpass_sse2(const int16_t *const *rows, const int16_t *w, int nt, int n, uint8_t *out) {
    int k = 0;
    if (nt <= 2) {
        const int16_t *r0 = rows[0], *r1 = nt == 2 ? rows[1] : rows[0];
        const __m128i w0 = _mm_set1_epi16(w[0]), w1 = _mm_set1_epi16(nt == 2 ? w[1] : 0);
        const __m128i sixteen = _mm_set1_epi16(16);
        for (; k + 16 <= n; k += 16) {
            __m128i a = _mm_add_epi16(_mm_mulhi_epi16(_mm_loadu_si128((const __m128i *)(r0 + k)), w0),
                                      _mm_mulhi_epi16(_mm_loadu_si128((const __m128i *)(r1 + k)), w1));
            __m128i b = _mm_add_epi16(_mm_mulhi_epi16(_mm_loadu_si128((const __m128i *)(r0 + k + 8)), w0),
                                      _mm_mulhi_epi16(_mm_loadu_si128((const __m128i *)(r1 + k + 8)), w1));
            a = _mm_srai_epi16(_mm_add_epi16(a, sixteen), 5);
            b = _mm_srai_epi16(_mm_add_epi16(b, sixteen), 5);
            _mm_storeu_si128((__m128i *)(out + k), _mm_packus_epi16(a, b));
        }
        return k;
    }
    const __m128i round = _mm_set1_epi32(1 << 20);
    for (; k + 16 <= n; k += 16) {
        __m128i a0 = round, a1 = round, a2 = round, a3 = round;
        for (int t = 0; t < nt; t += 2) {
            const int two = t + 1 < nt;
            const int16_t *r0 = rows[t] + k, *r1 = two ? rows[t + 1] + k : r0;
            const __m128i wv = _mm_set1_epi32((int)((uint32_t)(uint16_t)w[t] |
                                                    ((uint32_t)(uint16_t)(two ? w[t + 1] : 0) << 16)));
            __m128i x0 = _mm_loadu_si128((const __m128i *)r0), y0 = _mm_loadu_si128((const __m128i *)r1);
            __m128i x1 = _mm_loadu_si128((const __m128i *)(r0 + 8)), y1 = _mm_loadu_si128((const __m128i *)(r1 + 8));
            a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi16(x0, y0), wv));
            a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi16(x0, y0), wv));
            a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi16(x1, y1), wv));
            a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi16(x1, y1), wv));
        }
        __m128i p0 = _mm_packs_epi32(_mm_srai_epi32(a0, 21), _mm_srai_epi32(a1, 21));
        __m128i p1 = _mm_packs_epi32(_mm_srai_epi32(a2, 21), _mm_srai_epi32(a3, 21));
        _mm_storeu_si128((__m128i *)(out + k), _mm_packus_epi16(p0, p1));
    }
    return k;
}
#endif

#if defined(LL_HAVE_AVX2_KERNELS)
/* The same as ll_vpass_sse2, 32 columns per step. AVX2's unpack and pack work within each
 * 128-bit half, so the packed bytes come out as columns 0-7, 16-23, 8-15, 24-31 and one
 * permute puts them in order. */
__attribute__((target("avx2"))) static int ll_vpass_avx2(const int16_t *const *rows, const int16_t *w, int nt,
                                                          int n, uint8_t *out) {
    int k = 0;
    if (nt <= 2) {
        const int16_t *r0 = rows[0], *r1 = nt == 2 ? rows[1] : rows[0];
        const __m256i w0 = _mm256_set1_epi16(w[0]), w1 = _mm256_set1_epi16(nt == 2 ? w[1] : 0);
        const __m256i sixteen = _mm256_set1_epi16(16);
        for (; k + 32 <= n; k += 32) {
            __m256i a = _mm256_add_epi16(_mm256_mulhi_epi16(_mm256_loadu_si256((const __m256i *)(r0 + k)), w0),
                                         _mm256_mulhi_epi16(_mm256_loadu_si256((const __m256i *)(r1 + k)), w1));
            __m256i b = _mm256_add_epi16(_mm256_mulhi_epi16(_mm256_loadu_si256((const __m256i *)(r0 + k + 16)), w0),
                                         _mm256_mulhi_epi16(_mm256_loadu_si256((const __m256i *)(r1 + k + 16)), w1));
            a = _mm256_srai_epi16(_mm256_add_epi16(a, sixteen), 5);
            b = _mm256_srai_epi16(_mm256_add_epi16(b, sixteen), 5);
            __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
            _mm256_storeu_si256((__m256i *)(out + k), p);
        }
        return k;
    }
    const __m256i round = _mm256_set1_epi32(1 << 20);
    for (; k + 32 <= n; k += 32) {
        __m256i a0 = round, a1 = round, a2 = round, a3 = round;
        for (int t = 0; t < nt; t += 2) {
            const int two = t + 1 < nt;
            const int16_t *r0 = rows[t] + k, *r1 = two ? rows[t + 1] + k : r0;
            const __m256i wv = _mm256_set1_epi32((int)((uint32_t)(uint16_t)w[t] |
                                                       ((uint32_t)(uint16_t)(two ? w[t + 1] : 0) << 16)));
            __m256i x0 = _mm256_loadu_si256((const __m256i *)r0), y0 = _mm256_loadu_si256((const __m256i *)r1);
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(r0 + 16));
            __m256i y1 = _mm256_loadu_si256((const __m256i *)(r1 + 16));
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi16(x0, y0), wv));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi16(x0, y0), wv));
            a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi16(x1, y1), wv));
            a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi16(x1, y1), wv));
        }
        __m256i p0 = _mm256_packs_epi32(_mm256_srai_epi32(a0, 21), _mm256_srai_epi32(a1, 21)); /* cols 0-15 */
        __m256i p1 = _mm256_packs_epi32(_mm256_srai_epi32(a2, 21), _mm256_srai_epi32(a3, 21)); /* cols 16-31 */
        _mm256_storeu_si256((__m256i *)(out + k), _mm256_permute4x64_epi64(_mm256_packus_epi16(p0, p1), 0xD8));
    }
    return k;
}
#endif

/* Vertical pass: one output row (n values) from nt horizontal-pass rows
 * (NOTE [ Vertical pass in SIMD ]). */
__attribute__((noinline)) static void ll_vpass(const int16_t *const *rows, const int16_t *w, int nt, int n,
                                               uint8_t *restrict out) {
    int k = 0;
#if defined(LL_HAVE_AVX2_KERNELS)
    if (ll_simd_level() >= LL_SIMD_AVX2) k = ll_vpass_avx2(rows, w, nt, n, out);
    else
#endif
#if defined(__SSE2__)
    if (ll_simd_level() >= LL_SIMD_SSE2) k = ll_vpass_sse2(rows, w, nt, n, out);
#endif
    if (nt <= 2) {
        /* Each product keeps its high half, (w * h) >> 16, which is Q5; the truncation
         * costs at most 2/32 of a level (NOTE [ Fixed-point resampling ]). Weights are >= 0
         * and sum to 16384 and h <= 32640, so the sum is in [0, 8160] and the result in
         * [0, 255]: no clamp. */
        const int16_t *restrict r0 = rows[0], *restrict r1 = nt == 2 ? rows[1] : rows[0];
        const int16_t w0 = w[0], w1 = nt == 2 ? w[1] : 0;
        for (; k < n; k++) {
            int16_t v = (int16_t)((int16_t)(((int32_t)w0 * r0[k]) >> 16) + (int16_t)(((int32_t)w1 * r1[k]) >> 16) + 16);
            out[k] = (uint8_t)(v >> 5);
        }
        return;
    }
    for (; k < n; k++) {
        int32_t acc = 1 << 20;
        for (int t = 0; t < nt; t++) acc += (int32_t)w[t] * rows[t][k];
        int32_t v = acc >> 21;
        out[k] = (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
}

#endif
