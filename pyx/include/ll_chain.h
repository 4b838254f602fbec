/* The fused per-sample executor: decode -> crop -> resize -> flip -> normalize -> layout.
 *
 * A chain of native transforms is compiled once (loaderlib/_chain.py) into an ll_plan:
 * an array of geometric ops plus a per-channel lookup table for the point-wise tail
 * (Normalize / Cast) and the output layout. Per sample, ll_chain_run():
 *   1. reads the JPEG header (width, height);
 *   2. walks the geometric ops symbolically (NOTE [ Fused geometry ]), drawing random
 *      boxes and flips from the counter-based generator (NOTE [ Counter-based sample
 *      randomness ] in ll_rng.h), which gives one affine map from output pixels to
 *      source pixels per axis;
 *   3. picks the DCT scale (NOTE [ DCT scale choice ]) and decodes only the source
 *      region the resampling taps read, at that scale;
 *   4. resamples that region (ll_resize.h) one output row at a time and writes the row
 *      straight into the caller's output through the lookup table, in the final layout.
 * No full-size intermediate, no float image, and no allocation once the per-thread
 * scratch buffers have grown to the largest sample seen.
 *
 * NOTE [ Fused geometry ]
 * Per axis the walk keeps the current size n, the map source = a * current + b and the
 * clamp domain [d0, d1) (NOTE [ Resampling geometry ] in ll_resize.h). A crop by (off,
 * len) moves b by a*off; before any resize it also narrows the domain to the crop, so
 * resampling clamps at the crop box exactly as crop-then-cv2.resize does. A resize to m
 * pixels multiplies a by n/m. A horizontal flip negates a. The result: output pixel o
 * samples source coordinate a*(o+0.5)+b, which for a chain with one resize is exactly the
 * sampling of decode -> crop -> resize -> crop done step by step (so Resize(256) +
 * CenterCrop(224) needs only the central source box). A second resize starts a new
 * stage: the walk stops there, the stage is resampled into an intermediate image in
 * per-thread scratch, and the walk restarts on that image, so a chain with several
 * resizes computes what it computes step by step. A crop larger than the image (CenterCrop
 * pads, as torchvision does) widens the domain beyond the image; those pixels read 0.
 *
 * NOTE [ Augmentations in the chain ]
 * Augmentations (ColorJitter, TrivialAugmentWide, RandomCrop, ...; ll_augment.h) come after
 * the geometry: when the plan has any, the last stage resamples into per-thread scratch
 * instead of the output, each augmentation maps that uint8 image to the next (ping-pong
 * between the two intermediate buffers, parameters drawn with the op's own position key),
 * and only then are the rows emitted through the lookup table. RandomErasing runs last, on
 * the output itself (after Normalize, as torchvision applies it), in either layout.
 *
 * NOTE [ DCT scale choice ]
 * When the chain resizes and DCT scaling is allowed, the decoder reduces by d in
 * {1, 2, 4, 8}: the largest d for which the region of the source the output covers (the
 * RandomResizedCrop box, for instance: span = a * out pixels) still has at least as many
 * pixels as the output on both axes, ceil(span / d) >= out. The scaled decode is a
 * proper low-pass, so the resize after it never downscales by 2x or more unless d = 8.
 * The map is rescaled by 1/d and the domain becomes [floor(d0/d), ceil(d1/d)), the
 * region geometry of ll_jpeg_region, so the result matches decode-at-1/d-then-crop.
 * With antialiased bilinear (the default, as torchvision v2) d is the largest with
 * ceil(span / d) >= 2 * out instead: the residual reduction stays >= 2x, so the triangle
 * filter (half-width >= 2 scaled pixels) dominates the scaled IDCT's own low-pass, and the
 * fused output stays within 1 level on average of the same chain called on a full decode
 * (the IDCT low-pass followed by a triangle of half-width 1 to 2 blurs visibly more than
 * the one triangle of the step-by-step chain: up to 1.5 levels mean per image measured).
 */
#ifndef LL_CHAIN_H
#define LL_CHAIN_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "ll_augment.h"
#include "ll_common.h"
#include "ll_jpeg.h"
#include "ll_read.h"
#include "ll_record.h"
#include "ll_resize.h"
#include "ll_rng.h"
#include "ll_worker.h"

#define LL_OP_RRC 1
#define LL_OP_RESIZE 2
#define LL_OP_CENTER_CROP 3
#define LL_OP_HFLIP 4
#define LL_MAX_OPS 32

#define LL_DTYPE_UINT8 0
#define LL_DTYPE_FLOAT32 1
/* 16-bit output (float16 or bfloat16 bits): values come from lut16 (NOTE [ Half-precision output ]) */
#define LL_DTYPE_UINT16 2

typedef struct {
    int kind;
    int pos;           /* transform position: the last element of the random key */
    int h, w;          /* output size; LL_OP_RESIZE with h <= 0: shorter side to w */
    int interp, antialias;
    double s0, s1, r0, r1; /* RandomResizedCrop scale and ratio ranges */
    double p;              /* flip probability */
} ll_op;

typedef struct {
    int nops;
    ll_op ops[LL_MAX_OPS];
    int mode, channels;    /* decode mode (LL_MODE_*), channels of the output */
    int dct_scaling, strict;
    long long max_pixels;
    int dtype, chw, use_lut;
    int out_h, out_w;      /* the fixed output size (every chain that runs into a batch has one) */
    float lutf[4 * 256];   /* per channel: output value for each uint8 value (float32 output) */
    uint8_t lut8[4 * 256]; /* the same for uint8 output when use_lut */
    ll_aug_plan aug;       /* augmentations after the geometry (ll_augment.h) */
    uint16_t lut16[4 * 256]; /* the same for 16-bit output: float16 or bfloat16 bit patterns */
    int fast;              /* decode with NOTE [ Fast decode ] (ll_jpeg.h) */
    /* NOTE [ Emitting float planes in AVX-512 ]: filled by ll_plan_prepare (emit_ok = 1) */
    int emit_ok;
    uint8_t lutb[3 * 4 * 256];  /* per channel, per byte k: byte k of lutf[256 c + v], v = 0..255 */
    uint8_t emit_sel[3 * 128];  /* per channel: the byte permutes that take its 64 indices */
    uint64_t emit_kb[3];        /* per channel: which of them come from the chunk's last 64 bytes */
} ll_plan;

/* The per-axis state of NOTE [ Fused geometry ]. */
typedef struct {
    int n;
    double a, b;
    long d0, d1;
} ll_axis;

static void ll_axis_crop(ll_axis *x, long off, int len, int resampled) {
    x->b += x->a * (double)off;
    if (!resampled) {
        /* a is +-1 here, or +-(stored / original) on a packed record (NOTE [ Original
         * coordinates ]): the domain is the source pixels the crop box overlaps, exactly the
         * box when a is +-1 */
        double e0 = x->b, e1 = x->b + x->a * len;
        double lo = e0 < e1 ? e0 : e1, hi = e0 < e1 ? e1 : e0;
        x->d0 = (long)floor(lo + 1e-9);
        x->d1 = (long)ceil(hi - 1e-9);
        if (x->d1 <= x->d0) x->d1 = x->d0 + 1;
    }
    x->n = len;
}

static void ll_axis_resize(ll_axis *x, int m) {
    x->a *= (double)x->n / (double)m;
    x->n = m;
}

static void ll_axis_flip(ll_axis *x) {
    x->b += x->a * x->n;
    x->a = -x->a;
}

/* torchvision CenterCrop offset (pads symmetrically when the crop is larger). */
static long ll_center_offset(int n, int len) {
    if (len > n) return -(long)((len - n) / 2);
    return (long)rint((double)(n - len) / 2.0);
}

/* Result of the geometry walk for one sample. */
typedef struct {
    ll_axis x, y;
    int interp, antialias, resampled, flip;
} ll_geom;

/* NOTE [ Original coordinates ]
 * A packed record may hold its image at a smaller size than the original (NOTE [ Packed
 * records ] in ll_record.h). The chain's geometry is then walked over the original size,
 * width x height, so a RandomResizedCrop box is drawn with the same key from the same
 * distribution, in the same place, as on the original file, and Resize(256) gives the
 * shape it gave there; the walk's map starts at a = stored / original per axis instead of
 * 1, which maps original coordinates to the stored pixels src_w x src_h: output pixel o
 * samples stored coordinate a * (o + 0.5) + b, the box scaled to the stored image. A crop
 * before the resize narrows the clamp domain to the stored pixels the scaled box overlaps
 * (floor of its start, ceiling of its end). The DCT scale, the taps and the rest follow from
 * the map as for any image; on an image that is its own original (a = 1) nothing changes.
 * tests/kernels/test_pack.py checks it against OpenCV's decode of the packed bytes and a
 * numpy model of this mapping. */
LL_NO_CONTRACT
/* Walk ops[start..] over an input of width x height (mapped to src_w x src_h pixels: NOTE
 * [ Original coordinates ]) until the chain would resize a second time; *next gets the first
 * op not consumed (pl->nops when the walk finished). */
static int ll_chain_geometry(const ll_plan *pl, int start, int width, int height, int src_w, int src_h,
                             uint64_t seed, uint64_t epoch, uint64_t index, ll_geom *g, int *next) {
    memset(g, 0, sizeof(*g));
    *next = pl->nops;
    g->x.n = width; g->x.a = width == src_w ? 1.0 : (double)src_w / width; g->x.b = 0.0; g->x.d0 = 0;
    g->x.d1 = src_w;
    g->y.n = height; g->y.a = height == src_h ? 1.0 : (double)src_h / height; g->y.b = 0.0; g->y.d0 = 0;
    g->y.d1 = src_h;
    g->interp = LL_INTERP_LINEAR;
    for (int k = start; k < pl->nops; k++) {
        const ll_op *op = &pl->ops[k];
        if (g->resampled && (op->kind == LL_OP_RRC || op->kind == LL_OP_RESIZE)) {
            *next = k; /* a second resize: it starts the next stage */
            break;
        }
        uint64_t key = ll_rng_key(seed, epoch, index, (uint64_t)op->pos);
        if (op->kind == LL_OP_RRC) {
            int i, j, h, w;
            ll_rrc_params(key, g->x.n, g->y.n, op->s0, op->s1, op->r0, op->r1, &i, &j, &h, &w);
            ll_axis_crop(&g->x, j, w, g->resampled);
            ll_axis_crop(&g->y, i, h, g->resampled);
            ll_axis_resize(&g->x, op->w);
            ll_axis_resize(&g->y, op->h);
            g->resampled = 1;
            g->interp = op->interp;
            g->antialias = op->antialias;
        } else if (op->kind == LL_OP_CENTER_CROP) {
            ll_axis_crop(&g->x, ll_center_offset(g->x.n, op->w), op->w, g->resampled);
            ll_axis_crop(&g->y, ll_center_offset(g->y.n, op->h), op->h, g->resampled);
        } else if (op->kind == LL_OP_RESIZE) {
            int oh = op->h, ow = op->w;
            if (oh <= 0) { /* torchvision: the shorter side becomes w, the longer int(w*long/short) */
                if (g->x.n <= g->y.n) { ow = op->w; oh = (int)((double)op->w * g->y.n / g->x.n); }
                else { oh = op->w; ow = (int)((double)op->w * g->x.n / g->y.n); }
            }
            if (oh < 1 || ow < 1) return LL_ERR_SHAPE;
            ll_axis_resize(&g->x, ow);
            ll_axis_resize(&g->y, oh);
            g->resampled = 1;
            g->interp = op->interp;
            g->antialias = op->antialias;
        } else if (op->kind == LL_OP_HFLIP) {
            if (ll_rng_uniform(key, 0) < op->p) ll_axis_flip(&g->x);
        } else {
            return LL_ERR_STATE;
        }
    }
    if (g->x.a < 0) { /* sample unflipped, mirror the taps (NOTE [ Fused geometry ]) */
        g->x.b += g->x.a * g->x.n;
        g->x.a = -g->x.a;
        g->flip = 1;
    }
    return LL_OK;
}

/* NOTE [ DCT scale choice ] */
static int ll_chain_denom(const ll_geom *g, int allow) {
    if (!allow || !g->resampled) return 1;
    double sx = g->x.a * g->x.n, sy = g->y.a * g->y.n;
    int k = (g->antialias && g->interp == LL_INTERP_LINEAR) ? 2 : 1; /* NOTE [ DCT scale choice ] */
    for (int d = 8; d > 1; d /= 2) {
        if (ceil(sx / d - 1e-9) >= k * g->x.n && ceil(sy / d - 1e-9) >= k * g->y.n) return d;
    }
    return 1;
}

static long ll_floor_div(long a, long b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static long ll_ceil_div_l(long a, long b) { return -ll_floor_div(-a, b); }

#if defined(LL_HAVE_AVX2_KERNELS)
/* NOTE [ Emitting float planes in AVX2 ]
 * The float CHW row of three channels, 8 pixels per step: two loads take the 24 bytes of 8
 * RGB pixels, byte shuffles gather each channel's 8 values, which widen to 8 int32 indices
 * into that channel's table, and one gather per channel reads the 8 floats, stored to the
 * channel's plane. The values are the table's, so the output is bitwise the scalar
 * loop's. Returns the pixels done (a multiple of 8); the caller finishes the row.
 *
 * Stores are plain by default. Non-temporal stores (no read of each line before it is
 * overwritten, fenced at the end of the row) would save memory traffic, but on the 2-core
 * machine of benchmarks/ they cost more than they save (two builds run side by side). On
 * a many-core machine whose memory bandwidth the batches saturate the balance may turn:
 * LOADERLIB_NT_STORES=1 (read once per process) writes outputs of 256 KiB or more with
 * them. The values are the same either way. */
static int ll_nt_stores(void) {
    static int on = -1; /* racing first reads store the same value */
    if (on < 0) {
        const char *e = getenv("LOADERLIB_NT_STORES");
        on = e != NULL && e[0] != 0 && e[0] != '0';
    }
    return on;
}

__attribute__((target("avx2"))) static int ll_emit_chw3_avx2(const float *lut, const uint8_t *row, int ow,
                                                              float *d0, float *d1, float *d2, int large) {
    /* channel c of pixels 0-4 (and 5 for c = 0) sits in bytes 3k + c of the first load; the
     * rest in the second load, which starts at byte 16 */
    const __m128i a0 = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i b0 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i a1 = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i b1 = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i a2 = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i b2 = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, -1, -1, -1, -1, -1, -1, -1, -1);
    const float *l0 = lut, *l1 = lut + 256, *l2 = lut + 512;
    /* ``large``: non-temporal stores asked for and the output is large (see the NOTE) */
    const int stream = large && !(((uintptr_t)d0 | (uintptr_t)d1 | (uintptr_t)d2) & 31);
    int x = 0;
    for (; x + 8 <= ow; x += 8) {
        const uint8_t *p = row + 3 * x;
        __m128i u = _mm_loadu_si128((const __m128i *)p), v = _mm_loadl_epi64((const __m128i *)(p + 16));
        __m256i i0 = _mm256_cvtepu8_epi32(_mm_or_si128(_mm_shuffle_epi8(u, a0), _mm_shuffle_epi8(v, b0)));
        __m256i i1 = _mm256_cvtepu8_epi32(_mm_or_si128(_mm_shuffle_epi8(u, a1), _mm_shuffle_epi8(v, b1)));
        __m256i i2 = _mm256_cvtepu8_epi32(_mm_or_si128(_mm_shuffle_epi8(u, a2), _mm_shuffle_epi8(v, b2)));
        if (stream) {
            _mm256_stream_ps(d0 + x, _mm256_i32gather_ps(l0, i0, 4));
            _mm256_stream_ps(d1 + x, _mm256_i32gather_ps(l1, i1, 4));
            _mm256_stream_ps(d2 + x, _mm256_i32gather_ps(l2, i2, 4));
        } else {
            _mm256_storeu_ps(d0 + x, _mm256_i32gather_ps(l0, i0, 4));
            _mm256_storeu_ps(d1 + x, _mm256_i32gather_ps(l1, i1, 4));
            _mm256_storeu_ps(d2 + x, _mm256_i32gather_ps(l2, i2, 4));
        }
    }
    if (stream) _mm_sfence();
    return x;
}
#endif

/* NOTE [ Emitting float planes in AVX-512 ]
 * The float CHW row of three channels without a gather: a table lookup of a float is four
 * byte lookups, and VBMI looks up 64 bytes at once (vpermi2b takes a 128-entry table in two
 * registers, a mask blend on the index's top bit picks between the two halves of 256). Per
 * channel, per 64 pixels: the three 64-byte loads of the chunk's RGB bytes, two byte
 * permutes and a blend take the channel's 64 indices; four lookups of 2 permutes and a
 * blend give bytes 0-3 of the 64 floats; byte and word unpacks put them together as
 * floats. The unpacks work within 128-bit lanes, so the index permute already places pixel
 * 16m + 4L + d at position 16L + 4m + d: the unpacked registers then hold pixels 0-15,
 * 16-31, 32-47 and 48-63 in order. The last chunk of a row is loaded and stored with masks.
 * The floats are the table's bytes, so the output is bitwise the scalar loop's. The gather
 * loop is bound by its loads (a table read per value); this one by shuffles, several per 64
 * values (benchmarks/cpu_split.py: float planes 0.067 -> 0.038 CPU-ms per image). The byte
 * tables are built once per plan (ll_plan_prepare). */
static void ll_plan_prepare(ll_plan *pl) {
    pl->emit_ok = 0;
    if (pl->dtype != LL_DTYPE_FLOAT32 || !pl->chw || pl->channels != 3) return;
    for (int c = 0; c < 3; c++) {
        for (int v = 0; v < 256; v++) {
            uint32_t u;
            memcpy(&u, pl->lutf + 256 * c + v, 4);
            for (int k = 0; k < 4; k++) pl->lutb[1024 * c + 256 * k + v] = (uint8_t)(u >> (8 * k));
        }
        pl->emit_kb[c] = 0;
        for (int q = 0; q < 64; q++) {
            int L = q / 16, m = (q % 16) / 4, d = q % 4, e = 16 * m + 4 * L + d, b = 3 * e + c;
            if (b < 128) {
                pl->emit_sel[128 * c + q] = (uint8_t)b;
                pl->emit_sel[128 * c + 64 + q] = 0;
            } else {
                pl->emit_sel[128 * c + q] = 0;
                pl->emit_sel[128 * c + 64 + q] = (uint8_t)(b - 128);
                pl->emit_kb[c] |= (uint64_t)1 << q;
            }
        }
    }
    pl->emit_ok = 1;
}

#if defined(LL_HAVE_AVX2_KERNELS)
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void
ll_emit_chw3_vbmi(const ll_plan *pl, const uint8_t *row, int ow, float *d0, float *d1, float *d2) {
    float *dst[3] = {d0, d1, d2};
    for (int c = 0; c < 3; c++) {
        const uint8_t *T = pl->lutb + 1024 * c;
        __m512i t[16];
        for (int i = 0; i < 16; i++) t[i] = _mm512_loadu_si512((const void *)(T + 64 * i));
        const __m512i selA = _mm512_loadu_si512((const void *)(pl->emit_sel + 128 * c));
        const __m512i selB = _mm512_loadu_si512((const void *)(pl->emit_sel + 128 * c + 64));
        const __mmask64 kB = pl->emit_kb[c];
        float *d = dst[c];
        for (int x = 0; x < ow; x += 64) {
            const uint8_t *p = row + 3 * x;
            const int nb = 3 * (ow - x); /* bytes of this chunk; the row's last may be short */
            __m512i z0, z1, z2;
            if (nb >= 192) {
                z0 = _mm512_loadu_si512((const void *)p);
                z1 = _mm512_loadu_si512((const void *)(p + 64));
                z2 = _mm512_loadu_si512((const void *)(p + 128));
            } else {
                z0 = _mm512_maskz_loadu_epi8(nb >= 64 ? ~0ULL : ((uint64_t)1 << nb) - 1, p);
                z1 = _mm512_maskz_loadu_epi8(nb >= 128 ? ~0ULL : nb <= 64 ? 0 : ((uint64_t)1 << (nb - 64)) - 1, p + 64);
                z2 = _mm512_maskz_loadu_epi8(nb <= 128 ? 0 : ((uint64_t)1 << (nb - 128)) - 1, p + 128);
            }
            const __m512i idx = _mm512_mask_blend_epi8(kB, _mm512_permutex2var_epi8(z0, selA, z1),
                                                       _mm512_permutexvar_epi8(selB, z2));
            const __mmask64 hi = _mm512_movepi8_mask(idx);
            __m512i b[4];
            for (int k = 0; k < 4; k++)
                b[k] = _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(t[4 * k], idx, t[4 * k + 1]),
                                              _mm512_permutex2var_epi8(t[4 * k + 2], idx, t[4 * k + 3]));
            const __m512i w01l = _mm512_unpacklo_epi8(b[0], b[1]), w01h = _mm512_unpackhi_epi8(b[0], b[1]);
            const __m512i w23l = _mm512_unpacklo_epi8(b[2], b[3]), w23h = _mm512_unpackhi_epi8(b[2], b[3]);
            const __m512i o[4] = {_mm512_unpacklo_epi16(w01l, w23l), _mm512_unpackhi_epi16(w01l, w23l),
                                  _mm512_unpacklo_epi16(w01h, w23h), _mm512_unpackhi_epi16(w01h, w23h)};
            for (int q = 0; q < 4; q++) {
                const int left = ow - x - 16 * q;
                if (left >= 16) _mm512_storeu_si512((void *)(d + x + 16 * q), o[q]);
                else if (left > 0) _mm512_mask_storeu_epi32(d + x + 16 * q, (__mmask16)((1u << left) - 1), o[q]);
            }
        }
    }
}
#endif

/* Writes one finished uint8 output row (out_w * C, HWC order) into the sample's output. */
static void ll_emit_row(const ll_plan *pl, const uint8_t *row, int oy, int oh, int ow, int C, void *out) {
    size_t plane = (size_t)oh * ow;
    if (pl->dtype == LL_DTYPE_FLOAT32) {
        float *o = (float *)out;
        if (pl->chw && C == 3) {
            /* The common case in one pass over the row: three planes written side by side,
             * each channel's table in registers' reach, no stride-C re-reads of the row. */
            const float *restrict l0 = pl->lutf, *restrict l1 = pl->lutf + 256, *restrict l2 = pl->lutf + 512;
            float *restrict d0 = o + (size_t)oy * ow, *restrict d1 = d0 + plane, *restrict d2 = d1 + plane;
            int x = 0;
#if defined(LL_HAVE_AVX2_KERNELS)
            const int nt = ll_nt_stores() && plane * 3 * sizeof(float) >= (256u << 10);
            if (ll_simd_level() >= LL_SIMD_AVX512 && pl->emit_ok && !nt) {
                ll_emit_chw3_vbmi(pl, row, ow, d0, d1, d2);
                x = ow;
            } else if (ll_simd_level() >= LL_SIMD_AVX2)
                x = ll_emit_chw3_avx2(pl->lutf, row, ow, d0, d1, d2, nt);
#endif
            for (; x < ow; x++) {
                const uint8_t *p = row + 3 * x;
                d0[x] = l0[p[0]];
                d1[x] = l1[p[1]];
                d2[x] = l2[p[2]];
            }
        } else if (pl->chw) {
            for (int c = 0; c < C; c++) {
                const float *lut = pl->lutf + 256 * c;
                float *d = o + c * plane + (size_t)oy * ow;
                for (int x = 0; x < ow; x++) d[x] = lut[row[x * C + c]];
            }
        } else {
            float *d = o + (size_t)oy * ow * C;
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < C; c++) d[x * C + c] = pl->lutf[256 * c + row[x * C + c]];
        }
    } else if (pl->dtype == LL_DTYPE_UINT16) {
        /* NOTE [ Half-precision output ]
         * float16 and bfloat16 outputs are 16-bit patterns looked up per channel, like
         * float32: the table holds the Python tail's own values (float32 arithmetic, then
         * one rounding to half precision), so the fused output is bitwise that of the
         * step-by-step chain and the kernel does no float arithmetic at all. */
        uint16_t *o = (uint16_t *)out;
        if (pl->chw) {
            for (int c = 0; c < C; c++) {
                const uint16_t *lut = pl->lut16 + 256 * c;
                uint16_t *d = o + c * plane + (size_t)oy * ow;
                for (int x = 0; x < ow; x++) d[x] = lut[row[x * C + c]];
            }
        } else {
            uint16_t *d = o + (size_t)oy * ow * C;
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < C; c++) d[x * C + c] = pl->lut16[256 * c + row[x * C + c]];
        }
    } else {
        uint8_t *o = (uint8_t *)out;
        if (pl->chw) {
            for (int c = 0; c < C; c++) {
                uint8_t *d = o + c * plane + (size_t)oy * ow;
                if (pl->use_lut) for (int x = 0; x < ow; x++) d[x] = pl->lut8[256 * c + row[x * C + c]];
                else for (int x = 0; x < ow; x++) d[x] = row[x * C + c];
            }
        } else {
            uint8_t *d = o + (size_t)oy * ow * C;
            if (pl->use_lut) {
                for (int x = 0; x < ow; x++)
                    for (int c = 0; c < C; c++) d[x * C + c] = pl->lut8[256 * c + row[x * C + c]];
            } else if (d != row) {
                memcpy(d, row, (size_t)ow * C);
            }
        }
    }
}

/* Resample the decoded region src (rows stride bytes apart, each with row_len readable bytes
 * from its start) through taps tx, ty (relative to the region) and emit every output row.
 * Scratch from wk.
 *
 * Horizontal-pass rows live in a ring of ty->maxt slots (row r in slot r % maxt): output
 * rows read source rows in non-decreasing order, so a row is evicted only after the
 * last output row that reads it, each source row is filtered once, and the ring stays in
 * L1/L2 however tall the source is. */
static int ll_chain_resample(const ll_plan *pl, ll_worker *wk, const uint8_t *src, ptrdiff_t stride, int row_len,
                             const ll_taps *tx, const ll_taps *ty, int C, void *out) {
    int ow = tx->n, oh = ty->n, K = ty->maxt;
    size_t hrow = (size_t)ow * C;
    size_t hstride = hrow + 8; /* spare int16 for the SIMD pass's overlapping stores */
    if (ll_buf_reserve(&wk->hbuf, (size_t)K * hstride * sizeof(int16_t) + 64) != 0) return LL_ERR_NOMEM;
    const int simd = ll_simd_on();
    size_t wide_bytes = 0;
#if defined(LL_HAVE_AVX2_KERNELS)
    /* NOTE [ Horizontal pass in AVX2 ] (ll_resize.h): every filter width */
    const int avx2 = ll_simd_level() >= LL_SIMD_AVX2 && C == 3 && ll_wide_ok(tx);
    if (avx2) wide_bytes = (size_t)((ow + 1) / 2) * (((tx->maxt + 1) / 2) * 16 * sizeof(int16_t) + 3 * sizeof(int32_t)) + 32;
    /* NOTE [ Horizontal pass in AVX-512 ]: its tables after the AVX2 pass's (which it falls back to) */
    const int try_vbmi = avx2 && ll_simd_level() >= LL_SIMD_AVX512;
    if (try_vbmi) wide_bytes += ll_vbmi_bytes(ow, tx->maxt) + 64;
#else
    const int avx2 = 0;
#endif
#if defined(__SSE2__)
    /* NOTE [ Wide taps in pairs ] (ll_resize.h) */
    const int wide = !avx2 && simd && C == 3 && tx->maxt > 2 && ll_wide_ok(tx);
    if (wide) wide_bytes = (size_t)ow * ((tx->maxt + 1) / 2) * 8 * sizeof(int16_t) + 16;
#else
    const int wide = 0;
#endif
    size_t misc = 16 * (size_t)ow + 16 + (size_t)ow * 4 * sizeof(int32_t) + 16 +
                  (size_t)K * (sizeof(void *) + sizeof(int)) + hrow + 64 + wide_bytes;
    if (ll_buf_reserve(&wk->misc, misc) != 0) return LL_ERR_NOMEM;
    int16_t *hbuf = (int16_t *)wk->hbuf.p;
    ll_pairs pairs, *pr = NULL;
    pairs.wv = (int16_t *)(((uintptr_t)wk->misc.p + 15) & ~(uintptr_t)15);
    pairs.off = (int32_t *)(pairs.wv + 8 * (size_t)ow);
    pairs.w = pairs.off + 2 * (size_t)ow;
    if (tx->maxt <= 2 && !avx2) {
        if (!simd) pairs.wv = NULL; /* NOTE [ SIMD switch ] */
        ll_pairs_build(tx, C, row_len > 0 ? row_len : 0, &pairs);
        pr = &pairs;
    }
    const int16_t **rows = (const int16_t **)(((uintptr_t)(pairs.w + 2 * (size_t)ow) + 15) & ~(uintptr_t)15);
    int *slot_row = (int *)(rows + K);
    uint8_t *row = (uint8_t *)(slot_row + K);
    int16_t *wide_wv = NULL;
    int32_t *wide_meta = NULL;
    uint8_t *vbmi_tab = NULL;
#if defined(__SSE2__)
    if (wide) {
        wide_wv = (int16_t *)(((uintptr_t)(row + hrow) + 15) & ~(uintptr_t)15);
        ll_wide_build(tx, wide_wv);
    }
#endif
#if defined(LL_HAVE_AVX2_KERNELS)
    if (avx2) {
        wide_wv = (int16_t *)(((uintptr_t)(row + hrow) + 31) & ~(uintptr_t)31);
        wide_meta = (int32_t *)(wide_wv + (size_t)((ow + 1) / 2) * ((tx->maxt + 1) / 2) * 16);
        if (try_vbmi) {
            vbmi_tab = (uint8_t *)(((uintptr_t)(wide_meta + 3 * (size_t)((ow + 1) / 2)) + 63) & ~(uintptr_t)63);
            if (!ll_vbmi_build(tx, row_len, vbmi_tab)) vbmi_tab = NULL;
        }
        if (vbmi_tab == NULL) ll_wide2_build(tx, row_len, wide_wv, wide_meta);
    }
#endif
    for (int k = 0; k < K; k++) slot_row[k] = -1;
    int direct = (pl->dtype == LL_DTYPE_UINT8 && !pl->chw && !pl->use_lut);
    for (int oy = 0; oy < oh; oy++) {
        int nt = ty->ntap[oy], s = ty->start[oy];
        for (int t = 0; t < nt; t++) {
            int r = s + t, k = r % K;
            int16_t *h = hbuf + (size_t)k * hstride;
            if (slot_row[k] != r) {
#if defined(LL_HAVE_AVX2_KERNELS)
                if (vbmi_tab) ll_hpass3_vbmi(src + (ptrdiff_t)r * stride, tx, vbmi_tab, h);
                else if (avx2) ll_hpass3_avx2(src + (ptrdiff_t)r * stride, tx, wide_wv, wide_meta, h);
                else
#endif
#if defined(__SSE2__)
                if (wide) ll_hpass3_wide_sse2(src + (ptrdiff_t)r * stride, tx, wide_wv, row_len, h);
                else
#endif
                ll_hpass_any(src + (ptrdiff_t)r * stride, tx, pr, h, C);
                slot_row[k] = r;
            }
            rows[t] = h;
        }
        uint8_t *dst = direct ? (uint8_t *)out + (size_t)oy * hrow : row;
        if (nt == 0) memset(dst, 0, hrow);
        else ll_vpass(rows, ty->w + (size_t)oy * ty->maxt, nt, (int)hrow, dst);
        ll_emit_row(pl, dst, oy, oh, ow, C, out);
    }
    return LL_OK;
}

/* Carve the tap tables of both axes out of the worker's scratch. */
static int ll_chain_taps(ll_worker *wk, ll_taps *tx, ll_taps *ty, int ow, int oh, int mx, int my, double **tmp) {
    size_t nx = (size_t)ow, ny = (size_t)oh;
    size_t need = (nx + ny) * 2 * sizeof(int32_t) + (nx * mx + ny * my) * sizeof(int16_t) +
                  (size_t)(mx > my ? mx : my) * sizeof(double) + 64;
    if (ll_buf_reserve(&wk->taps, need) != 0) return LL_ERR_NOMEM;
    unsigned char *p = wk->taps.p;
    *tmp = (double *)p; p += (size_t)(mx > my ? mx : my) * sizeof(double);
    tx->start = (int32_t *)p; p += nx * sizeof(int32_t);
    tx->ntap = (int32_t *)p; p += nx * sizeof(int32_t);
    ty->start = (int32_t *)p; p += ny * sizeof(int32_t);
    ty->ntap = (int32_t *)p; p += ny * sizeof(int32_t);
    tx->w = (int16_t *)p; p += nx * mx * sizeof(int16_t);
    ty->w = (int16_t *)p;
    tx->n = ow; tx->maxt = mx;
    ty->n = oh; ty->maxt = my;
    return LL_OK;
}

/* The interpolation each axis uses (cv2's INTER_AREA is two-tap when either axis upscales). */
static int ll_axis_interp(int interp, double ax, double ay) {
    if (interp == LL_INTERP_AREA && (ax < 1.0 || ay < 1.0)) return LL_INTERP_AREA_LINEAR;
    return interp;
}

/* The output size the chain gives for an image of width x height (all stages). */
static int ll_chain_out_size(const ll_plan *pl, int width, int height, uint64_t seed, uint64_t epoch,
                             uint64_t index, int *oh, int *ow) {
    int op = 0, w = width, h = height;
    for (;;) {
        ll_geom g;
        int next, st = ll_chain_geometry(pl, op, w, h, w, h, seed, epoch, index, &g, &next);
        if (st != LL_OK) return st;
        w = g.x.n;
        h = g.y.n;
        if (next >= pl->nops) break;
        op = next;
    }
    *oh = h;
    *ow = w;
    return LL_OK;
}

/* The augmentations of NOTE [ Augmentations in the chain ]: the pixel ops on the last stage's
 * image (in wk->inter[cur], h x w), emitted into out, then the erasing ops on out. */
static int ll_chain_augment(const ll_plan *pl, ll_worker *wk, int cur, int h, int w, uint64_t seed, uint64_t epoch,
                            uint64_t index, void *out, char *msg) {
    int C = pl->channels;
    double prm[LL_AUG_NPRM];
    if (pl->aug.n) {
        for (int k = 0; k < pl->aug.n; k++) {
            const ll_aug *op = &pl->aug.ops[k];
            uint64_t key = ll_rng_key(seed, epoch, index, (uint64_t)op->pos);
            int oh, ow;
            if (ll_aug_sample(op, key, h, w, C, prm) != LL_OK) {
                if (msg) snprintf(msg, LL_MSG_LEN, "RandomCrop to %dx%d does not fit this %dx%d image (use "
                                  "pad_if_needed=True)", op->ia[0], op->ia[1], h, w);
                return LL_ERR_SHAPE;
            }
            ll_aug_out_size(op, h, w, &oh, &ow);
            ll_buf *dst = &wk->inter[cur ^ 1];
            if (ll_buf_reserve(dst, (size_t)oh * ow * C + 16) != 0) goto nomem;
            int st = ll_aug_apply(op, prm, wk->inter[cur].p, h, w, C, dst->p, &wk->misc, &wk->hbuf);
            if (st == LL_ERR_NOMEM) goto nomem;
            if (st != LL_OK) return st;
            cur ^= 1;
            h = oh;
            w = ow;
        }
        if (h != pl->out_h || w != pl->out_w) {
            if (msg) snprintf(msg, LL_MSG_LEN, "output is %dx%d but the chain gives %dx%d for this image",
                              pl->out_w, pl->out_h, w, h);
            return LL_ERR_SHAPE;
        }
        for (int oy = 0; oy < h; oy++)
            ll_emit_row(pl, wk->inter[cur].p + (size_t)oy * w * C, oy, h, w, C, out);
    }
    for (int k = 0; k < pl->aug.nerase; k++) {
        const ll_aug *op = &pl->aug.erase[k];
        uint64_t key = ll_rng_key(seed, epoch, index, (uint64_t)op->pos);
        ll_aug_sample(op, key, pl->out_h, pl->out_w, C, prm);
        ll_aug_erase(op, prm, key, out, pl->dtype == LL_DTYPE_FLOAT32, pl->chw, pl->out_h, pl->out_w, C);
    }
    return LL_OK;
nomem:
    if (msg) snprintf(msg, LL_MSG_LEN, "out of memory (per-thread scratch)");
    return LL_ERR_NOMEM;
}

/* The stages of a chain (NOTE [ Fused geometry ]) from a source of in_w x in_h pixels, whose
 * original was orig_w x orig_h (NOTE [ Original coordinates ]; the same for most images):
 * the JPEG whose header wk->dec holds (pixels == NULL: the first stage decodes only the
 * region its taps read, at a DCT scale), or an HWC uint8 image of pl->channels channels
 * already in memory (pixels: a cached decode; the taps read it directly).
 *
 * Stage 1 resamples from the decoded region; a chain that resizes again (Resize then
 * RandomResizedCrop, say) has further stages, each resampling the previous stage's
 * image, held in per-thread scratch, exactly as the step-by-step chain would. With
 * ``timed``, adds the nanoseconds spent decoding and transforming to the two counters. */
static int ll_chain_stages(const ll_plan *pl, ll_worker *wk, const uint8_t *pixels, int in_w, int in_h,
                           int orig_w, int orig_h, uint64_t seed, uint64_t epoch, uint64_t index, void *out, char *msg,
                           int timed,
                           int64_t *t_decode_io, int64_t *t_transform_io) {
    static const ll_plan intermediate; /* zero: uint8 HWC rows straight into the buffer */
    int64_t t_decode = 0, t_transform = 0;
    int C = pl->channels;
    int st = LL_OK;
    const int src_w = in_w, src_h = in_h;
    const uint8_t *src = pixels; /* a stage's input: the decoded region (or pixels), then intermediates */
    int from_jpeg = pixels == NULL, op = 0;
    const int t_dec = timed; /* read the clock only when timed */
    for (int stage = 0;; stage++) {
        int64_t t1 = t_dec ? ll_now_ns() : 0;
        ll_geom g;
        int next;
        int gs = stage == 0 ? ll_chain_geometry(pl, op, orig_w, orig_h, in_w, in_h, seed, epoch, index, &g, &next)
                            : ll_chain_geometry(pl, op, in_w, in_h, in_w, in_h, seed, epoch, index, &g, &next);
        int last = next >= pl->nops;
        if (gs != LL_OK) {
            if (msg) snprintf(msg, LL_MSG_LEN, "transform chain gives an empty output for a %dx%d image",
                              src_w, src_h);
            return gs;
        }
        if (last && !pl->aug.n && (g.x.n != pl->out_w || g.y.n != pl->out_h)) {
            if (msg) snprintf(msg, LL_MSG_LEN, "output is %dx%d but the chain gives %dx%d for this %dx%d image",
                              pl->out_w, pl->out_h, g.x.n, g.y.n, src_w, src_h);
            return LL_ERR_SHAPE;
        }
        if ((long)g.x.n * g.y.n > (1L << 28)) {
            if (msg) snprintf(msg, LL_MSG_LEN, "an intermediate image of %dx%d is too large", g.x.n, g.y.n);
            return LL_ERR_TOO_LARGE;
        }
        int d = from_jpeg ? ll_chain_denom(&g, pl->dct_scaling) : 1;
        long sw = ll_ceil_div_l(in_w, d), sh = ll_ceil_div_l(in_h, d);
        double ax = g.x.a / d, bx = g.x.b / d, ay = g.y.a / d, by = g.y.b / d;
        long dx0 = ll_floor_div(g.x.d0, d), dx1 = ll_ceil_div_l(g.x.d1, d);
        long dy0 = ll_floor_div(g.y.d0, d), dy1 = ll_ceil_div_l(g.y.d1, d);
        if (dx1 <= dx0) dx1 = dx0 + 1;
        if (dy1 <= dy0) dy1 = dy0 + 1;
        int ix = ll_axis_interp(g.interp, ax, ay);
        int mx = ll_taps_max(ix, g.antialias, ax), my = ll_taps_max(ix, g.antialias, ay);
        ll_taps tx, ty;
        double *tmp;
        if (ll_chain_taps(wk, &tx, &ty, g.x.n, g.y.n, mx, my, &tmp) != LL_OK) goto nomem;
        ll_taps_compute(&tx, ix, g.antialias, ax, bx, (int)dx0, (int)dx1, 0, (int)sw, tmp);
        ll_taps_compute(&ty, ix, g.antialias, ay, by, (int)dy0, (int)dy1, 0, (int)sh, tmp);
        if (g.flip) ll_taps_reverse(&tx);
        int rx0 = 0, rx1 = 0, ry0 = 0, ry1 = 0;
        int any = ll_taps_span(&tx, &rx0, &rx1) & ll_taps_span(&ty, &ry0, &ry1);
        int rw = 0, rh = 0, row_len = 0;
        ptrdiff_t stride = 0;
        if (t_dec) t_transform += ll_now_ns() - t1;
        if (!any) { /* every output pixel is padding */
            for (int o = 0; o < ty.n; o++) ty.ntap[o] = 0;
        } else if (from_jpeg) { /* decode only the region the taps read, at scale 1/d */
            rw = rx1 - rx0;
            rh = ry1 - ry0;
            t1 = t_dec ? ll_now_ns() : 0;
            int col = 0;
            st = ll_jpeg_decode_wide(&wk->dec, pl->mode, d, rx0, ry0, rw, rh, &wk->region, &stride, &col,
                                     pl->strict, pl->fast); /* NOTE [ Decoding in place ] */
            ll_jpeg_status_msg(&wk->dec, st, msg);
            if (st < 0) return st;
            if (t_dec) t_decode += ll_now_ns() - t1;
            ll_taps_shift(&tx, rx0);
            ll_taps_shift(&ty, ry0);
            src = wk->region.p + (size_t)col * C;
            row_len = (int)(stride - (ptrdiff_t)col * C);
        } else { /* the previous stage's whole image */
            rh = in_h;
            stride = (ptrdiff_t)in_w * C;
            row_len = (int)stride;
        }
        t1 = t_dec ? ll_now_ns() : 0;
        void *dst = out;
        const ll_plan *emit = pl;
        if (!last || pl->aug.n) { /* augmentations start from the last stage's image */
            ll_buf *ib = &wk->inter[stage & 1];
            if (ll_buf_reserve(ib, (size_t)g.x.n * g.y.n * C + 16) != 0) goto nomem;
            dst = ib->p;
            emit = &intermediate;
        }
        if (ll_chain_resample(emit, wk, any ? src : NULL, stride, row_len, &tx, &ty, C, dst) != LL_OK) goto nomem;
        if (t_dec) t_transform += ll_now_ns() - t1;
        if (last) {
            t1 = t_dec ? ll_now_ns() : 0;
            int as = ll_chain_augment(pl, wk, stage & 1, g.y.n, g.x.n, seed, epoch, index, out, msg);
            if (as != LL_OK) return as;
            if (t_dec) t_transform += ll_now_ns() - t1;
            break;
        }
        src = (const uint8_t *)dst;
        in_w = g.x.n;
        in_h = g.y.n;
        from_jpeg = 0;
        op = next;
    }
    if (timed) {
        *t_decode_io += t_decode;
        *t_transform_io += t_transform;
    }
    return st;
nomem:
    if (msg) snprintf(msg, LL_MSG_LEN, "out of memory (per-thread scratch)");
    return LL_ERR_NOMEM;
}

/* NOTE [ Raw records need no decode ]
 * A raw record (NOTE [ Packed records ] in ll_record.h) holds its pixels: the chain reads
 * them in place, as it reads a Pipeline's cached pixels, through the same stages into the
 * same output slot, and no decode time is counted. When the plan wants other channels
 * than the record has (BGR or GRAY from RGB pixels, RGB from gray ones) the pixels are
 * converted first into the worker's region buffer, which only a JPEG decode uses: BGR
 * swaps, GRAY is ITU-R BT.601 luma in 14-bit fixed point (as ll_cmyk_row's), RGB from gray
 * repeats the value (as libjpeg does for a grayscale JPEG). The max_pixels guard applies to
 * the stored size. */
static int ll_chain_run_raw(const ll_plan *pl, ll_worker *wk, const uint8_t *buf, size_t size, uint64_t seed,
                            uint64_t epoch, uint64_t index, void *out, char *msg, int64_t *t_tr) {
    ll_raw_info ri;
    int64_t t_decode = 0, t_transform = 0;
    int st = ll_raw_parse(buf, size, &ri, msg);
    if (st != LL_OK) return st;
    if (pl->max_pixels > 0 && (long long)ri.w * ri.h > pl->max_pixels) {
        if (msg) snprintf(msg, LL_MSG_LEN, "raw record of %dx%d = %lld pixels, more than max_pixels=%lld", ri.w, ri.h,
                          (long long)ri.w * ri.h, pl->max_pixels);
        return LL_ERR_TOO_LARGE;
    }
    int C = pl->channels, want = pl->mode == LL_MODE_GRAY ? 1 : 3;
    if (C != want) {
        if (msg) snprintf(msg, LL_MSG_LEN, "a raw record gives %d channels, the chain wants %d", want, C);
        return LL_ERR_UNSUPPORTED;
    }
    const uint8_t *px = buf + LL_RAW_HEADER;
    if (ri.c != C || pl->mode == LL_MODE_BGR) {
        size_t n = (size_t)ri.h * ri.w;
        if (ll_buf_reserve(&wk->region, n * C + 16) != 0) {
            if (msg) snprintf(msg, LL_MSG_LEN, "out of memory (per-thread scratch)");
            return LL_ERR_NOMEM;
        }
        uint8_t *d = wk->region.p;
        if (ri.c == 1) {
            for (size_t i = 0; i < n; i++, d += 3) d[0] = d[1] = d[2] = px[i];
        } else if (C == 1) {
            for (size_t i = 0; i < n; i++, px += 3)
                d[i] = (uint8_t)((px[0] * 4899 + px[1] * 9617 + px[2] * 1868 + (1 << 13)) >> 14);
        } else {
            for (size_t i = 0; i < n; i++, px += 3, d += 3) { d[0] = px[2]; d[1] = px[1]; d[2] = px[0]; }
        }
        px = wk->region.p;
    }
    st = ll_chain_stages(pl, wk, px, ri.w, ri.h, ri.orig_w, ri.orig_h, seed, epoch, index, out, msg, t_tr != NULL,
                         &t_decode, &t_transform);
    if (t_tr) *t_tr = t_transform;
    return st;
}

/* One sample: JPEG bytes (or a raw record: NOTE [ Raw records need no decode ]) -> the
 * finished output (out_h x out_w x C, or C x out_h x out_w). Returns LL_OK, LL_WARNED or an
 * error code (reason in msg). t_dec / t_tr (may be NULL) get the nanoseconds spent decoding
 * and transforming. Thread-safe for distinct workers. */
static int ll_chain_run(const ll_plan *pl, ll_worker *wk, const uint8_t *buf, size_t size, uint64_t seed,
                        uint64_t epoch, uint64_t index, void *out, char *msg, int64_t *t_dec, int64_t *t_tr) {
    if (ll_is_raw(buf, size)) {
        if (t_dec) *t_dec = 0;
        return ll_chain_run_raw(pl, wk, buf, size, seed, epoch, index, out, msg, t_dec ? t_tr : NULL);
    }
    int64_t t0 = t_dec ? ll_now_ns() : 0, t_decode = 0, t_transform = 0;
    ll_jpeg_info info;
    int x0, y0, oh0, ow0, oc0;
    int st = ll_jpeg_plan_item(&wk->dec, buf, size, pl->mode, 1, 0, 0, 0, 0, pl->max_pixels, &info, &x0, &y0,
                               &oh0, &ow0, &oc0, msg);
    if (st != LL_OK) return st;
    int orig_w = info.width, orig_h = info.height;
    ll_pack_original(buf, size, &orig_w, &orig_h); /* NOTE [ Original coordinates ] */
    if (t_dec) t_decode = ll_now_ns() - t0;
    st = ll_chain_stages(pl, wk, NULL, info.width, info.height, orig_w, orig_h, seed, epoch, index, out, msg,
                         t_dec != NULL, &t_decode, &t_transform);
    if (t_dec) {
        *t_dec = t_decode;
        *t_tr = t_transform;
    }
    return st;
}

/* The chain on an image already decoded (a C-contiguous HWC uint8 image of pl->channels
 * channels: a Pipeline's cache): the same stages and keyed randomness as ll_chain_run,
 * reading the pixels instead of decoding. t_tr (may be NULL) gets the transform time. */
static int ll_chain_run_pixels(const ll_plan *pl, ll_worker *wk, const uint8_t *pixels, int h, int w,
                               uint64_t seed, uint64_t epoch, uint64_t index, void *out, char *msg, int64_t *t_tr) {
    int64_t t_decode = 0, t_transform = 0;
    if (msg) msg[0] = 0;
    if (h < 1 || w < 1) {
        if (msg) snprintf(msg, LL_MSG_LEN, "an empty %dx%d image", w, h);
        return LL_ERR_SHAPE;
    }
    int st = ll_chain_stages(pl, wk, pixels, w, h, w, h, seed, epoch, index, out, msg, t_tr != NULL, &t_decode,
                             &t_transform);
    if (t_tr) *t_tr = t_transform;
    return st;
}

/* Resize a whole HWC uint8 image with the scratch of worker wk (its taps, hbuf and misc
 * buffers; pack's resize): the same taps and passes as the fused executor, with the image
 * as the clamp domain. Returns LL_OK or LL_ERR_NOMEM. */
static int ll_resize_image_wk(ll_worker *wk, const uint8_t *src, int sh, int sw, int C, uint8_t *dst, int dh,
                              int dw, int interp, int antialias) {
    static const ll_plan direct_plan; /* zero: uint8 HWC, no LUT: rows go straight to dst */
    double ax = (double)sw / dw, ay = (double)sh / dh;
    int ix = ll_axis_interp(interp, ax, ay);
    int mx = ll_taps_max(ix, antialias, ax), my = ll_taps_max(ix, antialias, ay);
    ll_taps tx, ty;
    double *tmp;
    if (ll_chain_taps(wk, &tx, &ty, dw, dh, mx, my, &tmp) != LL_OK) return LL_ERR_NOMEM;
    ll_taps_compute(&tx, ix, antialias, ax, 0.0, 0, sw, 0, sw, tmp);
    ll_taps_compute(&ty, ix, antialias, ay, 0.0, 0, sh, 0, sh, tmp);
    return ll_chain_resample((ll_plan *)&direct_plan, wk, src, (ptrdiff_t)sw * C, sw * C, &tx, &ty, C, dst);
}

/* Resize a whole HWC uint8 image (the single-image path of Resize and
 * RandomResizedCrop), as ll_resize_image_wk. Allocates its scratch per call. Returns LL_OK
 * or LL_ERR_NOMEM. */
static int ll_resize_image(const uint8_t *src, int sh, int sw, int C, uint8_t *dst, int dh, int dw, int interp,
                           int antialias) {
    ll_worker wk;
    memset(&wk, 0, sizeof(wk));
    int st = ll_resize_image_wk(&wk, src, sh, sw, C, dst, dh, dw, interp, antialias);
    ll_worker_free(&wk); /* no decoder was created: frees the scratch only */
    return st;
}

#endif
