/* Per-sample augmentations (torchvision v2 semantics) for the fused chain and for one image.
 *
 * Every op is described by an ll_aug (kind, transform position, integer and double
 * configuration) built once by loaderlib/transforms/. Per sample an op runs in two steps:
 *   ll_aug_sample()  draws the op's parameters into a vector of LL_AUG_NPRM doubles from
 *                    the counter-based generator (NOTE [ Counter-based sample randomness ]);
 *                    the single place where an augmentation's randomness is decided, used by
 *                    the fused chain and (through _transform.pyx) by a transform called on
 *                    one image, so a preview equals what the loader produces;
 *   ll_aug_apply()   applies those parameters to an HWC uint8 image (src -> dst, distinct).
 * RandomErasing instead runs on the finished output (float32 or uint8, HWC or CHW) with
 * ll_aug_erase(), because torchvision applies it after Normalize.
 *
 * NOTE [ Augmentation arithmetic ]
 * The pixel arithmetic follows torchvision's tensor kernels for uint8 images step by step,
 * in float32: blends are x * r followed by a fused multiply-add of the other image with
 * 1 - r (torch's CPU add_ with alpha is an FMA; fmaf reproduces it), clamped to [0, 255] and
 * truncated toward zero (torch's .to(uint8)); grayscale is 0.2989 R + 0.587 G + 0.114 B the
 * same way (floored where torchvision floors it); hue goes through float32 HSV and back with
 * x * 255.999 truncated; blur and sharpness convolve in float32 and round half to even;
 * geometric ops map each output pixel centre through torchvision's inverse affine matrix
 * (_get_inverse_affine_matrix) in its own float32 steps (normalised grid, grid_sample with
 * align_corners=False) and take the nearest pixel (round half to even) or bilinear weights,
 * pixels outside the image reading the fill. `make check-torchvision` finds every op
 * bitwise equal to torchvision 0.28 on its test images except the Gaussian blur, whose
 * convolution sums in another order (a value a hair from .5 can round the other way).
 *
 * All functions are noexcept, take no locks, allocate only through the ll_buf scratch they
 * are given, and return LL_OK, LL_ERR_NOMEM or LL_ERR_SHAPE (a configuration the Python
 * owner should have refused).
 */
#ifndef LL_AUGMENT_H
#define LL_AUGMENT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ll_common.h"
#include "ll_resize.h" /* ll_simd_level (NOTE [ SIMD switch ]) */
#include "ll_rng.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

#define LL_AUG_COLOR_JITTER 1
#define LL_AUG_GRAYSCALE 2
#define LL_AUG_BLUR 3
#define LL_AUG_TRIVIAL 4
#define LL_AUG_RANDAUG 5
#define LL_AUG_AUTOAUG 6
#define LL_AUG_RANDOM_CROP 7
#define LL_AUG_ROTATION 8
#define LL_AUG_AFFINE 9
#define LL_AUG_ERASE 10
#define LL_AUG_MAX 16   /* augmentation ops per chain */
#define LL_AUG_NPRM 40  /* sampled parameters per op */
#define LL_AUG_NI 8
#define LL_AUG_ND 16

/* Primitive ops of the automatic policies (ids shared with transforms/_auto_augment.py _AUG_OPS). */
#define LL_PRIM_IDENTITY 0
#define LL_PRIM_SHEAR_X 1
#define LL_PRIM_SHEAR_Y 2
#define LL_PRIM_TRANSLATE_X 3
#define LL_PRIM_TRANSLATE_Y 4
#define LL_PRIM_ROTATE 5
#define LL_PRIM_BRIGHTNESS 6
#define LL_PRIM_COLOR 7
#define LL_PRIM_CONTRAST 8
#define LL_PRIM_SHARPNESS 9
#define LL_PRIM_POSTERIZE 10
#define LL_PRIM_SOLARIZE 11
#define LL_PRIM_AUTOCONTRAST 12
#define LL_PRIM_EQUALIZE 13
#define LL_PRIM_INVERT 14
#define LL_PRIM_HUE 15

#define LL_PAD_CONSTANT 0
#define LL_PAD_EDGE 1
#define LL_PAD_REFLECT 2
#define LL_PAD_SYMMETRIC 3

/* Configuration of one op (what each slot means is listed per kind in ll_aug_sample). The
 * fill of the geometric ops is always da[12..15] and ia[7] says whether one was given. */
typedef struct {
    int kind;
    int pos;              /* transform position: the last element of the random key */
    int ia[LL_AUG_NI];
    double da[LL_AUG_ND];
} ll_aug;

/* Ops of a chain: pixel ops on the uint8 image after the crop, then erasing ops on the
 * finished output. */
typedef struct {
    int n;
    ll_aug ops[LL_AUG_MAX];
    int nerase;
    ll_aug erase[LL_AUG_MAX];
} ll_aug_plan;

/* ------------------------------------------------------------------ policies' spaces */

/* float32 torch.linspace(start, end, n)[k] (the magnitude tables of the policies). */
static inline double ll_aug_linspace(double start, double end, int n, int k) {
    if (n <= 1) return (double)(float)start;
    float step = (float)((end - start) / (double)(n - 1));
    if (k < n / 2) return (double)((float)start + step * (float)k);
    return (double)((float)end - step * (float)(n - 1 - k));
}

/* The magnitude of primitive `prim` at bin k of n (unsigned); returns 0 for ops without
 * one. `randaug` selects RandAugment/AutoAugment's space over TrivialAugmentWide's. */
static double ll_aug_magnitude(int prim, int k, int n, int randaug, int h, int w) {
    switch (prim) {
    case LL_PRIM_SHEAR_X: case LL_PRIM_SHEAR_Y: return ll_aug_linspace(0.0, randaug ? 0.3 : 0.99, n, k);
    case LL_PRIM_TRANSLATE_X: return ll_aug_linspace(0.0, randaug ? 150.0 / 331.0 * w : 32.0, n, k);
    case LL_PRIM_TRANSLATE_Y: return ll_aug_linspace(0.0, randaug ? 150.0 / 331.0 * h : 32.0, n, k);
    case LL_PRIM_ROTATE: return ll_aug_linspace(0.0, randaug ? 30.0 : 135.0, n, k);
    case LL_PRIM_BRIGHTNESS: case LL_PRIM_COLOR: case LL_PRIM_CONTRAST: case LL_PRIM_SHARPNESS:
        return ll_aug_linspace(0.0, randaug ? 0.9 : 0.99, n, k);
    case LL_PRIM_POSTERIZE: { /* (8 - (arange(n) / ((n - 1) / d))).round().int() */
        float den = (float)(n - 1) / (float)(randaug ? 4 : 6);
        return rintf(8.0f - (float)k / den);
    }
    case LL_PRIM_SOLARIZE: return ll_aug_linspace(1.0, 0.0, n, k);
    default: return 0.0;
    }
}

static inline int ll_prim_signed(int prim) { return prim >= LL_PRIM_SHEAR_X && prim <= LL_PRIM_SHARPNESS; }

/* torchvision's AutoAugmentPolicy tables: 25 sub-policies, each a pair of (op, probability,
 * magnitude bin of 10; 0 for ops without a magnitude), in torchvision's order (the sub-policy
 * drawn is an index into it). ll_autoaug_policies[ia[0]] is the one an op uses: 0 IMAGENET,
 * 1 CIFAR10, 2 SVHN (the order of transforms/_auto_augment.py AutoAugmentPolicy). */
typedef struct { int op; double p; int mag; } ll_autoaug_pair;
static const ll_autoaug_pair ll_autoaug_imagenet[25][2] = {
    {{LL_PRIM_POSTERIZE, 0.4, 8}, {LL_PRIM_ROTATE, 0.6, 9}},
    {{LL_PRIM_SOLARIZE, 0.6, 5}, {LL_PRIM_AUTOCONTRAST, 0.6, 0}},
    {{LL_PRIM_EQUALIZE, 0.8, 0}, {LL_PRIM_EQUALIZE, 0.6, 0}},
    {{LL_PRIM_POSTERIZE, 0.6, 7}, {LL_PRIM_POSTERIZE, 0.6, 6}},
    {{LL_PRIM_EQUALIZE, 0.4, 0}, {LL_PRIM_SOLARIZE, 0.2, 4}},
    {{LL_PRIM_EQUALIZE, 0.4, 0}, {LL_PRIM_ROTATE, 0.8, 8}},
    {{LL_PRIM_SOLARIZE, 0.6, 3}, {LL_PRIM_EQUALIZE, 0.6, 0}},
    {{LL_PRIM_POSTERIZE, 0.8, 5}, {LL_PRIM_EQUALIZE, 1.0, 0}},
    {{LL_PRIM_ROTATE, 0.2, 3}, {LL_PRIM_SOLARIZE, 0.6, 8}},
    {{LL_PRIM_EQUALIZE, 0.6, 0}, {LL_PRIM_POSTERIZE, 0.4, 6}},
    {{LL_PRIM_ROTATE, 0.8, 8}, {LL_PRIM_COLOR, 0.4, 0}},
    {{LL_PRIM_ROTATE, 0.4, 9}, {LL_PRIM_EQUALIZE, 0.6, 0}},
    {{LL_PRIM_EQUALIZE, 0.0, 0}, {LL_PRIM_EQUALIZE, 0.8, 0}},
    {{LL_PRIM_INVERT, 0.6, 0}, {LL_PRIM_EQUALIZE, 1.0, 0}},
    {{LL_PRIM_COLOR, 0.6, 4}, {LL_PRIM_CONTRAST, 1.0, 8}},
    {{LL_PRIM_ROTATE, 0.8, 8}, {LL_PRIM_COLOR, 1.0, 2}},
    {{LL_PRIM_COLOR, 0.8, 8}, {LL_PRIM_SOLARIZE, 0.8, 7}},
    {{LL_PRIM_SHARPNESS, 0.4, 7}, {LL_PRIM_INVERT, 0.6, 0}},
    {{LL_PRIM_SHEAR_X, 0.6, 5}, {LL_PRIM_EQUALIZE, 1.0, 0}},
    {{LL_PRIM_COLOR, 0.4, 0}, {LL_PRIM_EQUALIZE, 0.6, 0}},
    {{LL_PRIM_EQUALIZE, 0.4, 0}, {LL_PRIM_SOLARIZE, 0.2, 4}},
    {{LL_PRIM_SOLARIZE, 0.6, 5}, {LL_PRIM_AUTOCONTRAST, 0.6, 0}},
    {{LL_PRIM_INVERT, 0.6, 0}, {LL_PRIM_EQUALIZE, 1.0, 0}},
    {{LL_PRIM_COLOR, 0.6, 4}, {LL_PRIM_CONTRAST, 1.0, 8}},
    {{LL_PRIM_EQUALIZE, 0.8, 0}, {LL_PRIM_EQUALIZE, 0.6, 0}},
};

static const ll_autoaug_pair ll_autoaug_cifar10[25][2] = {
    {{LL_PRIM_INVERT, 0.1, 0}, {LL_PRIM_CONTRAST, 0.2, 6}},
    {{LL_PRIM_ROTATE, 0.7, 2}, {LL_PRIM_TRANSLATE_X, 0.3, 9}},
    {{LL_PRIM_SHARPNESS, 0.8, 1}, {LL_PRIM_SHARPNESS, 0.9, 3}},
    {{LL_PRIM_SHEAR_Y, 0.5, 8}, {LL_PRIM_TRANSLATE_Y, 0.7, 9}},
    {{LL_PRIM_AUTOCONTRAST, 0.5, 0}, {LL_PRIM_EQUALIZE, 0.9, 0}},
    {{LL_PRIM_SHEAR_Y, 0.2, 7}, {LL_PRIM_POSTERIZE, 0.3, 7}},
    {{LL_PRIM_COLOR, 0.4, 3}, {LL_PRIM_BRIGHTNESS, 0.6, 7}},
    {{LL_PRIM_SHARPNESS, 0.3, 9}, {LL_PRIM_BRIGHTNESS, 0.7, 9}},
    {{LL_PRIM_EQUALIZE, 0.6, 0}, {LL_PRIM_EQUALIZE, 0.5, 0}},
    {{LL_PRIM_CONTRAST, 0.6, 7}, {LL_PRIM_SHARPNESS, 0.6, 5}},
    {{LL_PRIM_COLOR, 0.7, 7}, {LL_PRIM_TRANSLATE_X, 0.5, 8}},
    {{LL_PRIM_EQUALIZE, 0.3, 0}, {LL_PRIM_AUTOCONTRAST, 0.4, 0}},
    {{LL_PRIM_TRANSLATE_Y, 0.4, 3}, {LL_PRIM_SHARPNESS, 0.2, 6}},
    {{LL_PRIM_BRIGHTNESS, 0.9, 6}, {LL_PRIM_COLOR, 0.2, 8}},
    {{LL_PRIM_SOLARIZE, 0.5, 2}, {LL_PRIM_INVERT, 0.0, 0}},
    {{LL_PRIM_EQUALIZE, 0.2, 0}, {LL_PRIM_AUTOCONTRAST, 0.6, 0}},
    {{LL_PRIM_EQUALIZE, 0.2, 0}, {LL_PRIM_EQUALIZE, 0.6, 0}},
    {{LL_PRIM_COLOR, 0.9, 9}, {LL_PRIM_EQUALIZE, 0.6, 0}},
    {{LL_PRIM_AUTOCONTRAST, 0.8, 0}, {LL_PRIM_SOLARIZE, 0.2, 8}},
    {{LL_PRIM_BRIGHTNESS, 0.1, 3}, {LL_PRIM_COLOR, 0.7, 0}},
    {{LL_PRIM_SOLARIZE, 0.4, 5}, {LL_PRIM_AUTOCONTRAST, 0.9, 0}},
    {{LL_PRIM_TRANSLATE_Y, 0.9, 9}, {LL_PRIM_TRANSLATE_Y, 0.7, 9}},
    {{LL_PRIM_AUTOCONTRAST, 0.9, 0}, {LL_PRIM_SOLARIZE, 0.8, 3}},
    {{LL_PRIM_EQUALIZE, 0.8, 0}, {LL_PRIM_INVERT, 0.1, 0}},
    {{LL_PRIM_TRANSLATE_Y, 0.7, 9}, {LL_PRIM_AUTOCONTRAST, 0.9, 0}},
};
static const ll_autoaug_pair ll_autoaug_svhn[25][2] = {
    {{LL_PRIM_SHEAR_X, 0.9, 4}, {LL_PRIM_INVERT, 0.2, 0}},
    {{LL_PRIM_SHEAR_Y, 0.9, 8}, {LL_PRIM_INVERT, 0.7, 0}},
    {{LL_PRIM_EQUALIZE, 0.6, 0}, {LL_PRIM_SOLARIZE, 0.6, 6}},
    {{LL_PRIM_INVERT, 0.9, 0}, {LL_PRIM_EQUALIZE, 0.6, 0}},
    {{LL_PRIM_EQUALIZE, 0.6, 0}, {LL_PRIM_ROTATE, 0.9, 3}},
    {{LL_PRIM_SHEAR_X, 0.9, 4}, {LL_PRIM_AUTOCONTRAST, 0.8, 0}},
    {{LL_PRIM_SHEAR_Y, 0.9, 8}, {LL_PRIM_INVERT, 0.4, 0}},
    {{LL_PRIM_SHEAR_Y, 0.9, 5}, {LL_PRIM_SOLARIZE, 0.2, 6}},
    {{LL_PRIM_INVERT, 0.9, 0}, {LL_PRIM_AUTOCONTRAST, 0.8, 0}},
    {{LL_PRIM_EQUALIZE, 0.6, 0}, {LL_PRIM_ROTATE, 0.9, 3}},
    {{LL_PRIM_SHEAR_X, 0.9, 4}, {LL_PRIM_SOLARIZE, 0.3, 3}},
    {{LL_PRIM_SHEAR_Y, 0.8, 8}, {LL_PRIM_INVERT, 0.7, 0}},
    {{LL_PRIM_EQUALIZE, 0.9, 0}, {LL_PRIM_TRANSLATE_Y, 0.6, 6}},
    {{LL_PRIM_INVERT, 0.9, 0}, {LL_PRIM_EQUALIZE, 0.6, 0}},
    {{LL_PRIM_CONTRAST, 0.3, 3}, {LL_PRIM_ROTATE, 0.8, 4}},
    {{LL_PRIM_INVERT, 0.8, 0}, {LL_PRIM_TRANSLATE_Y, 0.0, 2}},
    {{LL_PRIM_SHEAR_Y, 0.7, 6}, {LL_PRIM_SOLARIZE, 0.4, 8}},
    {{LL_PRIM_INVERT, 0.6, 0}, {LL_PRIM_ROTATE, 0.8, 4}},
    {{LL_PRIM_SHEAR_Y, 0.3, 7}, {LL_PRIM_TRANSLATE_X, 0.9, 3}},
    {{LL_PRIM_SHEAR_X, 0.1, 6}, {LL_PRIM_INVERT, 0.6, 0}},
    {{LL_PRIM_SOLARIZE, 0.7, 2}, {LL_PRIM_TRANSLATE_Y, 0.6, 7}},
    {{LL_PRIM_SHEAR_Y, 0.8, 4}, {LL_PRIM_INVERT, 0.8, 0}},
    {{LL_PRIM_SHEAR_X, 0.7, 9}, {LL_PRIM_TRANSLATE_Y, 0.8, 3}},
    {{LL_PRIM_SHEAR_Y, 0.8, 5}, {LL_PRIM_AUTOCONTRAST, 0.7, 0}},
    {{LL_PRIM_SHEAR_X, 0.7, 2}, {LL_PRIM_INVERT, 0.1, 0}},
};
#define LL_AUTOAUG_POLICIES 3
static const ll_autoaug_pair (*const ll_autoaug_policies[LL_AUTOAUG_POLICIES])[2] = {
    ll_autoaug_imagenet, ll_autoaug_cifar10, ll_autoaug_svhn};

/* ------------------------------------------------------------------ parameter sampling */

static inline double ll_aug_uniform_in(uint64_t key, uint64_t c, double a, double b) {
    return a + (b - a) * ll_rng_uniform(key, c);
}

/* Append primitive `prim` at magnitude bin `bin` (signed draw at counter c_sign) to the op
 * list prm[0] = count, then (id, magnitude) pairs. */
static void ll_aug_push(double *prm, int prim, int bin, int nbins, int randaug, uint64_t key, uint64_t c_sign,
                        int h, int w) {
    int k = (int)prm[0];
    double m = ll_aug_magnitude(prim, bin, nbins, randaug, h, w);
    if (ll_prim_signed(prim) && ll_rng_uniform(key, c_sign) <= 0.5) m = -m;
    prm[1 + 2 * k] = prim;
    prm[2 + 2 * k] = m;
    prm[0] = k + 1;
}

/* Draw op's parameters for an h x w x C input into prm[LL_AUG_NPRM] (zeroed first).
 *
 * COLOR_JITTER  da[0..7] brightness, contrast, saturation, hue ranges; ia[0..3] which are on.
 *               prm[0..3] the order (torch.randperm(4) by Fisher-Yates, counters 0-2),
 *               prm[4..7] the factors (counters 3-6; torchvision draws each one that is on).
 * GRAYSCALE     da[0] p.  prm[0] 1 when applied (counter 0 < p).
 * BLUR          ia[0], ia[1] kernel x, y; da[0..1] sigma range.  prm[0] sigma (counter 0).
 * TRIVIAL       ia[0] bins.  op list: id below(14) (counter 0), bin below(bins) (1), sign (2).
 * RANDAUG       ia[0] num_ops, ia[1] magnitude bin, ia[2] bins.  op k: id (3k), sign (3k+1).
 * AUTOAUG       ia[0] the policy (index of ll_autoaug_policies).  sub-policy below(25) (counter
 *               0, in prm[LL_AUG_NPRM-1]); sub-op k: applied when uniform (1+2k) <= p, sign (2+2k).
 * RANDOM_CROP   ia[0..1] out h, w; ia[2..5] pad left, right, top, bottom; ia[6] pad_if_needed;
 *               da[0] padding mode.  prm[0..1] top, left (counters 0, 1), prm[2..5] pad left,
 *               top, right, bottom; an image too small gives LL_ERR_SHAPE.
 * ROTATION      da[0..1] degrees; ia[0] centre given, da[2..3] centre.  prm[0] angle.
 * AFFINE        da[0..1] degrees, ia[0] translate on: da[2..3]; ia[1] scale on: da[4..5];
 *               ia[2] shear count 0/2/4: da[6..9].  prm[0] angle, [1..2] tx, ty, [3] scale,
 *               [4..5] shear x, y (counters 0-5 in torchvision's order); ia[3] centre
 *               given: da[10..11].  ROTATION and AFFINE: ia[6] 1 for bilinear.
 * ERASE         da[0] p, da[1..2] scale, da[3..4] log ratio.  prm[0] 1 when erased, prm[1..4]
 *               top, left, height, width (p: counter 40; attempt k: counters 4k..4k+3).
 */
LL_NO_CONTRACT
static int ll_aug_sample(const ll_aug *op, uint64_t key, int h, int w, int C, double *prm) {
    memset(prm, 0, LL_AUG_NPRM * sizeof(double));
    (void)C;
    switch (op->kind) {
    case LL_AUG_COLOR_JITTER: {
        int perm[4] = {0, 1, 2, 3};
        for (int i = 3; i > 0; i--) {
            int j = (int)ll_rng_below(key, (uint64_t)(3 - i), (uint64_t)(i + 1));
            int t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
        for (int i = 0; i < 4; i++) prm[i] = perm[i];
        for (int f = 0; f < 4; f++)
            prm[4 + f] = op->ia[f] ? ll_aug_uniform_in(key, 3 + f, op->da[2 * f], op->da[2 * f + 1]) : (f == 3 ? 0.0 : 1.0);
        return LL_OK;
    }
    case LL_AUG_GRAYSCALE:
        prm[0] = ll_rng_uniform(key, 0) < op->da[0];
        return LL_OK;
    case LL_AUG_BLUR:
        prm[0] = ll_aug_uniform_in(key, 0, op->da[0], op->da[1]);
        return LL_OK;
    case LL_AUG_TRIVIAL: {
        int prim = (int)ll_rng_below(key, 0, 14);
        int bin = (int)ll_rng_below(key, 1, (uint64_t)op->ia[0]);
        ll_aug_push(prm, prim, bin, op->ia[0], 0, key, 2, h, w);
        return LL_OK;
    }
    case LL_AUG_RANDAUG:
        for (int k = 0; k < op->ia[0]; k++) {
            int prim = (int)ll_rng_below(key, 3 * (uint64_t)k, 14);
            ll_aug_push(prm, prim, op->ia[1], op->ia[2], 1, key, 3 * (uint64_t)k + 1, h, w);
        }
        return LL_OK;
    case LL_AUG_AUTOAUG: {
        if (op->ia[0] < 0 || op->ia[0] >= LL_AUTOAUG_POLICIES) return LL_ERR_STATE;
        const ll_autoaug_pair (*table)[2] = ll_autoaug_policies[op->ia[0]];
        int pol = (int)ll_rng_below(key, 0, 25);
        prm[LL_AUG_NPRM - 1] = pol;
        for (int k = 0; k < 2; k++) {
            if (!(ll_rng_uniform(key, 1 + 2 * (uint64_t)k) <= table[pol][k].p)) continue;
            ll_aug_push(prm, table[pol][k].op, table[pol][k].mag, 10, 1, key, 2 + 2 * (uint64_t)k, h, w);
        }
        return LL_OK;
    }
    case LL_AUG_RANDOM_CROP: {
        int pl = op->ia[2], pr = op->ia[3], pt = op->ia[4], pb = op->ia[5];
        long ph = (long)h + pt + pb, pw = (long)w + pl + pr;
        int ch = op->ia[0], cw = op->ia[1];
        if (op->ia[6]) {
            if (ph < ch) { long d = ch - ph; pt += (int)d; pb += (int)d; ph += 2 * d; }
            if (pw < cw) { long d = cw - pw; pl += (int)d; pr += (int)d; pw += 2 * d; }
        }
        if (ph < ch || pw < cw) return LL_ERR_SHAPE;
        prm[0] = ph > ch ? (double)ll_rng_below(key, 0, (uint64_t)(ph - ch + 1)) : 0.0;
        prm[1] = pw > cw ? (double)ll_rng_below(key, 1, (uint64_t)(pw - cw + 1)) : 0.0;
        prm[2] = pl; prm[3] = pt; prm[4] = pr; prm[5] = pb;
        return LL_OK;
    }
    case LL_AUG_ROTATION:
        prm[0] = ll_aug_uniform_in(key, 0, op->da[0], op->da[1]);
        return LL_OK;
    case LL_AUG_AFFINE: {
        prm[0] = ll_aug_uniform_in(key, 0, op->da[0], op->da[1]);
        if (op->ia[0]) {
            double mx = op->da[2] * w, my = op->da[3] * h;
            prm[1] = rint(ll_aug_uniform_in(key, 1, -mx, mx));
            prm[2] = rint(ll_aug_uniform_in(key, 2, -my, my));
        }
        prm[3] = op->ia[1] ? ll_aug_uniform_in(key, 3, op->da[4], op->da[5]) : 1.0;
        if (op->ia[2] >= 2) prm[4] = ll_aug_uniform_in(key, 4, op->da[6], op->da[7]);
        if (op->ia[2] == 4) prm[5] = ll_aug_uniform_in(key, 5, op->da[8], op->da[9]);
        return LL_OK;
    }
    case LL_AUG_ERASE: {
        if (!(ll_rng_uniform(key, 40) < op->da[0])) return LL_OK;
        double area = (double)h * (double)w;
        for (int k = 0; k < 10; k++) {
            double ea = area * ll_aug_uniform_in(key, 4 * (uint64_t)k, op->da[1], op->da[2]);
            double ar = exp(ll_aug_uniform_in(key, 4 * (uint64_t)k + 1, op->da[3], op->da[4]));
            double eh = rint(sqrt(ea * ar)), ew = rint(sqrt(ea / ar));
            if (!(eh < h && ew < w)) continue;
            prm[0] = 1;
            prm[1] = (double)ll_rng_below(key, 4 * (uint64_t)k + 2, (uint64_t)(h - (int)eh + 1));
            prm[2] = (double)ll_rng_below(key, 4 * (uint64_t)k + 3, (uint64_t)(w - (int)ew + 1));
            prm[3] = eh;
            prm[4] = ew;
            return LL_OK;
        }
        return LL_OK; /* torchvision leaves the image alone when no attempt fits */
    }
    default:
        return LL_ERR_STATE;
    }
}

/* The output size of op with parameters prm for an h x w input. */
static void ll_aug_out_size(const ll_aug *op, int h, int w, int *oh, int *ow) {
    if (op->kind == LL_AUG_RANDOM_CROP) {
        *oh = op->ia[0];
        *ow = op->ia[1];
    } else {
        *oh = h;
        *ow = w;
    }
}

/* ------------------------------------------------------------------ colour kernels */

/* NOTE [ Inline float rounding ]
 * The build targets baseline x86-64 (no SSE4.1, no FMA), where rintf, floorf and fmaf are
 * library calls that keep the per-pixel loops from vectorising. These equivalents are exact
 * in the ranges used: adding and subtracting 1.5 * 2**23 rounds half to even for |v| < 2**22
 * in the default rounding mode (the builds never change it and contraction is off); the
 * double-precision a * b + c is exact before its rounding (a product of two floats fits in
 * 53 bits), so rounding it to float equals fmaf except when that double lands exactly
 * halfway between two floats, which needs a 29-bit coincidence. */
static inline float ll_rint_f(float v) {
    if (!(fabsf(v) < 4194304.0f)) return rintf(v);
    const float m = 12582912.0f; /* IEEE semantics (no -ffast-math) keep (v + m) - m as written */
    return (v + m) - m;
}

static inline float ll_floor_f(float v) {
    if (!(fabsf(v) < 2147483520.0f)) return floorf(v);
    float t = (float)(int)v;
    return t > v ? t - 1.0f : t;
}

static inline float ll_fma_f(float a, float b, float c) { return (float)((double)a * (double)b + (double)c); }

static inline uint8_t ll_u8_trunc(float v) { /* clamp to [0, 255] (NaN to 0), truncate (torch .to(uint8)) */
    v = v > 0.0f ? v : 0.0f; /* selects, not branches: the loops stay vectorisable */
    v = v < 255.0f ? v : 255.0f;
    return (uint8_t)(int)v;
}

/* torchvision's _blend of one value before the clamp: x * r + other * (1 - r) as its float32
 * FMA, given xr = (float)x * r and oq = other * (1 - r) exact in double (the double sum
 * rounded once to float is the FMA's single rounding). The one definition of the blend: the
 * contrast table and the contrast and saturation twins use it. A macro, not a function: the
 * twins carry their own optimisation attributes, and GCC does not inline a function whose
 * attributes differ, which would keep their loops from vectorising (4-5x slower). */
#define LL_BLEND_F(xr, oq) ((float)((double)(oq) + (double)(xr)))

/* ll_rint_f for values known to be small (|v| < 2**22): no range check. */
static inline float ll_rint_small(float v) {
    const float m = 12582912.0f;
    return (v + m) - m;
}

static inline uint8_t ll_u8_round(float v) { /* round half to even, clamp (torch .round_().to(uint8)) */
    v = ll_rint_f(v);
    if (!(v > 0.0f)) return 0;
    if (v >= 255.0f) return 255;
    return (uint8_t)v;
}

/* torch's r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114): its CPU add with alpha is
 * a fused multiply-add, so fmaf reproduces it bit for bit. */
static inline float ll_gray_f(const uint8_t *p) {
    return ll_fma_f((float)p[2], 0.114f, ll_fma_f((float)p[1], 0.587f, (float)p[0] * 0.2989f));
}

/* NOTE [ Augmentation twins ]
 * The per-pixel loops of the colour ops, sharpness, blur and the warps (ll_augment_twins.h)
 * are written once, branch-free, and compiled four times: the scalar twin with the
 * vectoriser off, then for SSE2 (the build's baseline), AVX2 and AVX-512 (target
 * attributes, chosen at run time by ll_simd_level under the LOADERLIB_SIMD cap, NOTE [ SIMD
 * switch ]). Vectorising changes no result: the loops do only IEEE operations (float32 and
 * float64 add, multiply, divide, conversions, compares and selects) with contraction off
 * (an FMA only where the source writes fmaf, NOTE [ Exact sums in FMA ]), and none of them is
 * a reduction over floats (the one reduction sums integers), so every level computes each
 * value by the same operations in the same order; tests/kernels/test_simd_equals_scalar.py runs every op at every level and requires
 * bitwise-equal output. One source for the four twins means they cannot drift apart, which
 * hand-written intrinsics per level could. The loops need -fno-trapping-math to be
 * if-converted (it changes no value: nothing reads the floating-point flags), and the hue
 * loop is split in two (to HSV, back to RGB) because GCC 12 does not vectorise it whole.
 * Measured with one thread on a 224x224x3 image (ll_prim_apply, best of 5 x 300 calls,
 * AVX-512 Xeon), the loops before this change -> the AVX-512 twin (AVX2 twin):
 * saturation 0.55 -> 0.10 (0.15) ms, contrast 0.31 -> 0.08 (0.14), brightness 0.10 -> 0.03
 * (0.06), hue 1.09 -> 0.15 (0.22), sharpness 0.25 -> 0.13 (0.18), GaussianBlur(23) 0.87 ->
 * 0.36 (0.43; four taps per pass over the row), nearest warps 0.23 -> 0.05 (0.07), bilinear
 * rotation 1.01 -> 0.40 (0.57; its taps are read by a scalar loop, with a fast path where all
 * four are inside), autocontrast 0.36 -> 0.07 (a table per channel, the same at every level).
 * Brightness, contrast and solarize then became tables (NOTE [ Point ops as tables ]). */
/* Pixels per run of the twins that need per-pixel scratch (stack buffers of this length). */
#define LL_AUG_RUN 1024
#if defined(__clang__)
/* clang ignores the optimize attributes below and contracts a * b + c into an FMA by
 * default where the target has one (the AVX-512 twins): keep every product rounded. */
#pragma clang fp contract(off)
#endif
#if defined(__GNUC__) && !defined(__clang__)
#define LL_TW_NO_THREADING __attribute__((optimize("no-tree-vrp", "no-tree-dominator-opts", "no-tree-pre")))
#else
#define LL_TW_NO_THREADING
#endif
#define LL_TW_FMA 0
#define LL_TW(name) ll_tw_##name##_scalar
#define LL_TW_ATTR LL_NO_CONTRACT __attribute__((optimize("no-tree-vectorize", "no-trapping-math")))
#include "ll_augment_twins.h"
#undef LL_TW
#undef LL_TW_ATTR
#define LL_TW(name) ll_tw_##name##_sse2
#define LL_TW_ATTR LL_NO_CONTRACT __attribute__((optimize("no-trapping-math")))
#include "ll_augment_twins.h"
#undef LL_TW
#undef LL_TW_ATTR
#if defined(LL_HAVE_AVX2_KERNELS)
#define LL_TW(name) ll_tw_##name##_avx2
#define LL_TW_ATTR LL_NO_CONTRACT __attribute__((optimize("no-trapping-math"), target("avx2")))
#include "ll_augment_twins.h"
#undef LL_TW
#undef LL_TW_ATTR
#undef LL_TW_FMA
#define LL_TW_FMA 1 /* every AVX-512 CPU has FMA */
#define LL_TW(name) ll_tw_##name##_avx512
#if defined(__clang__) /* no prefer-vector-width in clang's target attribute */
#define LL_TW_ATTR __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))
#else
#define LL_TW_ATTR                                                                                  \
    LL_NO_CONTRACT __attribute__((optimize("no-trapping-math"),                                    \
                                  target("avx2,fma,avx512f,avx512bw,avx512vl,prefer-vector-width=512")))
#endif
#include "ll_augment_twins.h"
#undef LL_TW
#undef LL_TW_ATTR
/* Call twin `name` of the current level (NOTE [ Augmentation twins ]). */
#define LL_TWIN(name, ...)                                                             \
    (ll_simd_level() >= LL_SIMD_AVX512 ? ll_tw_##name##_avx512(__VA_ARGS__)            \
     : ll_simd_level() >= LL_SIMD_AVX2 ? ll_tw_##name##_avx2(__VA_ARGS__)              \
     : ll_simd_level() >= LL_SIMD_SSE2 ? ll_tw_##name##_sse2(__VA_ARGS__)              \
                                        : ll_tw_##name##_scalar(__VA_ARGS__))
#else
#define LL_TWIN(name, ...)                                                             \
    (ll_simd_level() >= LL_SIMD_SSE2 ? ll_tw_##name##_sse2(__VA_ARGS__) : ll_tw_##name##_scalar(__VA_ARGS__))
#endif
#undef LL_TW_FMA

/* NOTE [ Exact sums in FMA ]
 * The blends' multiply-adds are float32 FMAs in torchvision; the scalar, SSE2 and AVX2 twins
 * compute a * b + c in double and round once to float, which equals fmaf whenever the
 * exact sum fits in double's 53 bits (then the double sum is exact and the one rounding is
 * fmaf's). The AVX-512 twins use the FMA instruction where that is proven, so they stay
 * bitwise equal to the others:
 * - gray: the products g * 0.587f and b * 0.114f of an integer 0..255 have their lowest bit
 *   at 2**-24 and 2**-27 or above, the running sum is 0 or at least 0.2989 (lowest bit
 *   >= 2**-25) and below 2**8: at most 35 bits;
 * - the saturation blend g * q + (float)(s * r) (g, s integers 0..255): with q = 0 or
 *   2**-8 <= |q| <= 1 and 2**-8 <= r <= 2**8 every term's lowest bit is >= 2**-31 and the sum
 *   is below 2**17: at most 48 bits. Other factors take the double loop at every level.
 * Measured on 224x224x3 (AVX-512 Xeon, one thread), the double loops -> FMA: saturation
 * (gray and blend) 0.099 -> 0.064 ms, contrast (gray and blend) 0.080 -> 0.063 ms. */

/* NOTE [ Point ops as tables ]
 * Brightness, the contrast blend (once its mean is known) and solarize map each value
 * through a function of that value alone, so they build a 256-entry table per image with
 * the reference formula (256 evaluations instead of one per value) and apply it. At the
 * avx512 level (which includes VBMI, NOTE [ SIMD switch ]) two vpermi2b look up 64 values in
 * the two 128-byte halves of the table and the top bit of the value picks one. Below that
 * level a scalar table read is slower than the compiled formula (brightness 0.076 against
 * 0.057 ms at avx2), so those levels compute the formula per value (the twins); the table
 * holds the formula's values, so every level gives the same output. Measured on 224x224x3
 * (AVX-512 Xeon, one thread): brightness 0.030 -> 0.005 ms, contrast 0.063 -> 0.024 (its
 * gray pass remains), solarize 0.029 -> 0.005. */
#if defined(LL_HAVE_AVX2_KERNELS)
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static size_t ll_lut_apply_vbmi(const uint8_t *s, size_t n,
                                                                                       const uint8_t *lut,
                                                                                       uint8_t *d) {
    const __m512i t0 = _mm512_loadu_si512((const void *)lut), t1 = _mm512_loadu_si512((const void *)(lut + 64));
    const __m512i t2 = _mm512_loadu_si512((const void *)(lut + 128)), t3 = _mm512_loadu_si512((const void *)(lut + 192));
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i x = _mm512_loadu_si512((const void *)(s + i));
        __m512i lo = _mm512_permutex2var_epi8(t0, x, t1), hi = _mm512_permutex2var_epi8(t2, x, t3);
        _mm512_storeu_si512((void *)(d + i), _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi));
    }
    return i;
}
#endif

/* d[i] = lut[s[i]] for n values (NOTE [ Point ops as tables ]). */
static void ll_lut_apply(const uint8_t *s, size_t n, const uint8_t *lut, uint8_t *d) {
    size_t i = 0;
#if defined(LL_HAVE_AVX2_KERNELS)
    if (ll_simd_level() >= LL_SIMD_AVX512) i = ll_lut_apply_vbmi(s, n, lut, d);
#endif
    for (; i < n; i++) d[i] = lut[s[i]];
}

LL_NO_CONTRACT
static void ll_prim_brightness(const uint8_t *s, uint8_t *d, size_t n, double f) {
    float ff = (float)f;
    if (ll_simd_level() < LL_SIMD_AVX512) { LL_TWIN(scale, s, n, ff, d); return; }
    uint8_t lut[256]; /* NOTE [ Point ops as tables ] */
    for (int v = 0; v < 256; v++) lut[v] = ll_u8_trunc((float)v * ff);
    ll_lut_apply(s, n, lut, d);
}

/* x * r + other * (1 - r) per value (torchvision's _blend), other the mean of floor(gray).
 * The sum of those integers is kept as an integer (exact, as the double sum it replaces);
 * mean * (1 - r) is exact in double, so the blend is one add per value. */
LL_NO_CONTRACT
static void ll_prim_contrast(const uint8_t *s, uint8_t *d, size_t npx, int C, double f) {
    uint64_t sum = 0;
    if (C == 3) {
        uint8_t g[LL_AUG_RUN];
        for (size_t i = 0; i < npx; i += LL_AUG_RUN) {
            size_t n = npx - i < LL_AUG_RUN ? npx - i : LL_AUG_RUN;
            LL_TWIN(gray_floor, s + 3 * i, n, g);
            sum += LL_TWIN(sum_u8, g, n);
        }
    } else {
        for (size_t i = 0; i < npx * C; i += (size_t)1 << 24) {
            size_t n = npx * C - i < ((size_t)1 << 24) ? npx * C - i : ((size_t)1 << 24);
            sum += LL_TWIN(sum_u8, s + i, n);
        }
    }
    float mean = (float)((double)sum / (double)(npx * (C == 3 ? 1 : C)));
    float r = (float)f, q = (float)(1.0 - f);
    if (ll_simd_level() < LL_SIMD_AVX512) { LL_TWIN(scale_add, s, npx * C, r, (double)mean * (double)q, d); return; }
    uint8_t lut[256]; /* NOTE [ Point ops as tables ] */
    for (int v = 0; v < 256; v++) lut[v] = ll_u8_trunc(LL_BLEND_F((float)v * r, (double)mean * (double)q));
    ll_lut_apply(s, npx * C, lut, d);
}

LL_NO_CONTRACT
static void ll_prim_saturation(const uint8_t *s, uint8_t *d, size_t npx, int C, double f) {
    if (C != 3) { memcpy(d, s, npx * C); return; }
    float r = (float)f, q = (float)(1.0 - f), aq = fabsf(q);
    int exact_fma = (q == 0.0f || (aq >= 0.00390625f && aq <= 1.0f)) && r >= 0.00390625f && r <= 256.0f;
    uint8_t g[LL_AUG_RUN];
    for (size_t i = 0; i < npx; i += LL_AUG_RUN) {
        size_t n = npx - i < LL_AUG_RUN ? npx - i : LL_AUG_RUN;
        LL_TWIN(gray_floor, s + 3 * i, n, g);
        LL_TWIN(blend_gray, s + 3 * i, g, n, r, q, exact_fma, d + 3 * i);
    }
}

/* torchvision's _rgb_to_hsv / _hsv_to_rgb in float32, hue shifted by f (mod 1): the
 * reference loop, for shifts too large for the twin's truncations. */
LL_NO_CONTRACT
static void ll_prim_hue_ref(const uint8_t *s, uint8_t *d, size_t npx, float hf) {
    for (size_t i = 0; i < npx; i++) {
        const float k = 1.0f / 255.0f;
        float r = s[3 * i] * k, g = s[3 * i + 1] * k, b = s[3 * i + 2] * k;
        float maxc = r > g ? (r > b ? r : b) : (g > b ? g : b);
        float minc = r < g ? (r < b ? r : b) : (g < b ? g : b);
        int eqc = maxc == minc;
        float cr = maxc - minc;
        float sat = cr / (eqc ? 1.0f : maxc);
        float div = eqc ? 1.0f : cr;
        float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
        float h;
        if (maxc == r) h = bc - gc;
        else if (maxc == g) h = 2.0f + rc - bc;
        else h = 4.0f + gc - rc;
        h = h * (1.0f / 6.0f) + 1.0f; /* in (0, 2): fmod(h, 1) = h - floor(h), exactly */
        h = h - ll_floor_f(h);
        h = h + hf;
        h = h - ll_floor_f(h); /* torch remainder: result in [0, 1) */
        if (h >= 1.0f) h = 0.0f;
        float h6 = h * 6.0f, fi = ll_floor_f(h6), fr = h6 - fi;
        int sector = ((int)fi % 6 + 6) % 6;
        float v = maxc, sxf = sat * fr, oms = 1.0f - sat;
        float q = (1.0f - sxf) * v, t = (sxf + oms) * v, p = oms * v;
        q = q < 0 ? 0 : (q > 1 ? 1 : q);
        t = t < 0 ? 0 : (t > 1 ? 1 : t);
        p = p < 0 ? 0 : (p > 1 ? 1 : p);
        float vpqt[4] = {v, p, q, t};
        static const int sel[3][6] = {{0, 2, 1, 1, 3, 0}, {3, 0, 0, 2, 1, 1}, {1, 1, 3, 0, 0, 2}};
        for (int c = 0; c < 3; c++) d[3 * i + c] = ll_u8_trunc(vpqt[sel[c][sector]] * 255.999f);
    }
}

LL_NO_CONTRACT
static void ll_prim_hue(const uint8_t *s, uint8_t *d, size_t npx, int C, double f) {
    if (C != 3) { memcpy(d, s, npx * C); return; }
    float hf = (float)f;
    if (!(fabsf(hf) < 1048576.0f)) { ll_prim_hue_ref(s, d, npx, hf); return; }
    for (size_t i = 0; i < npx; i += LL_AUG_RUN)
        LL_TWIN(hue, s + 3 * i, npx - i < LL_AUG_RUN ? npx - i : LL_AUG_RUN, hf, d + 3 * i);
}

/* rgb_to_grayscale with num_output_channels = C (float32, truncated). */
static void ll_prim_grayscale(const uint8_t *s, uint8_t *d, size_t npx, int C) {
    if (C != 3) { memcpy(d, s, npx * C); return; }
    uint8_t g[LL_AUG_RUN]; /* the gray twin: in [0, 255), so truncation is its floor */
    for (size_t i = 0; i < npx; i += LL_AUG_RUN) {
        size_t n = npx - i < LL_AUG_RUN ? npx - i : LL_AUG_RUN;
        LL_TWIN(gray_floor, s + 3 * i, n, g);
        uint8_t *o = d + 3 * i;
        for (size_t k = 0; k < n; k++) o[3 * k] = o[3 * k + 1] = o[3 * k + 2] = g[k];
    }
}

static void ll_prim_posterize(const uint8_t *s, uint8_t *d, size_t n, int bits) {
    if (bits >= 8) { memcpy(d, s, n); return; }
    if (bits < 0) bits = 0;
    uint8_t mask = (uint8_t)(((1 << bits) - 1) << (8 - bits));
    for (size_t i = 0; i < n; i++) d[i] = s[i] & mask;
}

static void ll_prim_solarize(const uint8_t *s, uint8_t *d, size_t n, double threshold) {
    float t = (float)threshold;
    if (ll_simd_level() < LL_SIMD_AVX512) {
        for (size_t i = 0; i < n; i++) d[i] = (float)s[i] >= t ? (uint8_t)(255 - s[i]) : s[i];
        return;
    }
    uint8_t lut[256]; /* NOTE [ Point ops as tables ] */
    for (int v = 0; v < 256; v++) lut[v] = (float)v >= t ? (uint8_t)(255 - v) : (uint8_t)v;
    ll_lut_apply(s, n, lut, d);
}

static void ll_prim_invert(const uint8_t *s, uint8_t *d, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(255 - s[i]);
}

/* Per channel (s - min) / ((max - min) / 255), truncated: a function of the value, so it
 * runs as one table per channel (256 divisions instead of one per value). */
LL_NO_CONTRACT
static void ll_prim_autocontrast(const uint8_t *s, uint8_t *d, size_t npx, int C) {
    uint8_t lo[4] = {255, 255, 255, 255}, hi[4] = {0, 0, 0, 0}, lut[4][256];
    if (C < 1 || C > 4) return;
    if (C == 3) {
        for (size_t i = 0; i < npx; i++) {
            const uint8_t *p = s + 3 * i;
            lo[0] = p[0] < lo[0] ? p[0] : lo[0]; hi[0] = p[0] > hi[0] ? p[0] : hi[0];
            lo[1] = p[1] < lo[1] ? p[1] : lo[1]; hi[1] = p[1] > hi[1] ? p[1] : hi[1];
            lo[2] = p[2] < lo[2] ? p[2] : lo[2]; hi[2] = p[2] > hi[2] ? p[2] : hi[2];
        }
    } else {
        for (size_t i = 0; i < npx * C; i++) {
            int c = (int)(i % (size_t)C);
            if (s[i] < lo[c]) lo[c] = s[i];
            if (s[i] > hi[c]) hi[c] = s[i];
        }
    }
    for (int c = 0; c < C; c++) {
        float mn = lo[c], inv = ((float)hi[c] - (float)lo[c]) * (1.0f / 255.0f);
        if (hi[c] == lo[c]) { mn = 0.0f; inv = 1.0f; }
        for (int v = 0; v < 256; v++) lut[c][v] = ll_u8_trunc(((float)v - mn) / inv);
    }
    if (C == 3) {
        for (size_t i = 0; i < npx; i++) {
            d[3 * i] = lut[0][s[3 * i]];
            d[3 * i + 1] = lut[1][s[3 * i + 1]];
            d[3 * i + 2] = lut[2][s[3 * i + 2]];
        }
    } else {
        for (size_t i = 0; i < npx * C; i++) d[i] = lut[i % (size_t)C][s[i]];
    }
}

/* PIL's equalize as torchvision computes it: per channel, step = (pixels - count of the
 * largest present value) // 255, lut[k] = (cum[k-1] + step // 2) // step, unchanged when
 * step is 0. */
static void ll_prim_equalize(const uint8_t *s, uint8_t *d, size_t npx, int C) {
    for (int c = 0; c < C; c++) {
        long hist[256] = {0};
        uint8_t lut[256];
        for (size_t i = 0; i < npx; i++) hist[s[i * C + c]]++;
        int last = 255;
        while (last > 0 && hist[last] == 0) last--;
        long step = ((long)npx - hist[last]) / 255;
        if (step == 0) {
            for (size_t i = 0; i < npx; i++) d[i * C + c] = s[i * C + c];
            continue;
        }
        long cum = 0;
        lut[0] = 0;
        for (int k = 1; k < 256; k++) {
            cum += hist[k - 1];
            long v = (cum + step / 2) / step;
            lut[k] = (uint8_t)(v > 255 ? 255 : v);
        }
        for (size_t i = 0; i < npx; i++) d[i * C + c] = lut[s[i * C + c]];
    }
}

/* adjust_sharpness: the 3x3 kernel [1 1 1; 1 5 1; 1 1 1] / 13 on the interior, blended
 * x + (1 - f) * (round(blur) - x); the border rows and columns are kept. */
LL_NO_CONTRACT
static void ll_prim_sharpness(const uint8_t *s, uint8_t *d, int h, int w, int C, double f) {
    memcpy(d, s, (size_t)h * w * C);
    if (h <= 2 || w <= 2) return;
    const float r = (float)(1.0 - f);
    size_t st = (size_t)w * C;
    for (int y = 1; y < h - 1; y++) { /* along the row's interior values (NOTE [ Augmentation twins ]) */
        const uint8_t *r0 = s + (size_t)(y - 1) * st, *r1 = r0 + st, *r2 = r1 + st;
        LL_TWIN(sharpen_row, r0, r1, r2, st, C, r, d + (size_t)y * st);
    }
}

/* reflect (torch "reflect" / cv2 BORDER_REFLECT_101) and symmetric indices, any distance. */
static inline long ll_reflect101(long i, long n) {
    if (n == 1) return 0;
    long period = 2 * (n - 1);
    i %= period;
    if (i < 0) i += period;
    return i < n ? i : period - i;
}

static inline long ll_symmetric(long i, long n) {
    long period = 2 * n;
    i %= period;
    if (i < 0) i += period;
    return i < n ? i : period - 1 - i;
}

/* NOTE [ Blur taps ]
 * torchvision's Gaussian kernel keeps every tap of kernel_size, however small: at sigma 0.3-0.8
 * with kernel 23 the outer taps are 1e-40 to 1e-300 (subnormal floats, or 0 after the
 * float32 exp), and on CPUs that take a microcode assist for a multiply-add with a subnormal
 * operand or result (many x86 cores, about 100 cycles each) a 224x224 blur took 1.7 ms at sigma
 * 0.3-0.8 against 0.34 ms at 1.0-2.0 (docs/augment.md, round 3). The kernel cuts the taps under LL_BLUR_TAP_MIN (2^-60, 8.7e-19) after normalising with
 * all of them, so no subnormal arises anywhere: a kept tap times a pixel (>= 1) is >= 2^-60,
 * so a nonzero value of the horizontal pass is too, and the vertical pass's products are
 * >= 2^-120, above FLT_MIN (2^-126). A cut tap changes a blurred value by at most
 * 2 x (k / 2) x 2^-60 x 255, 3e-15 for k = 23, far under the float32 spacing of any value
 * that could round the other way, so the output equals the uncut convolution's up to the
 * summation-order tolerance torchvision comparisons already allow (the NOTE above the
 * file's functions). Cut taps are the outer ones (the kernel falls off from its centre), so
 * the loops run over taps lo..k-1-lo, fewer multiply-adds at small sigma. */
#define LL_BLUR_TAP_MIN 8.673617379884035e-19f /* 2^-60 */

/* The k float32 taps of gaussian_blur at sigma (torch: linspace(-lim, lim, k).pow(2).neg().exp()
 * / sum), those under LL_BLUR_TAP_MIN set to 0 (NOTE [ Blur taps ]); returns the first kept
 * tap's index lo (taps lo..k-1-lo are kept: the kernel is symmetric). */
static int ll_blur_taps(int k, double sigma, float *wt) {
    double sum = 0.0;
    float lim = (float)((k - 1) / (2.0 * sqrt(2.0) * sigma));
    for (int i = 0; i < k; i++) {
        float x = (float)ll_aug_linspace(-lim, lim, k, i);
        wt[i] = expf(-(x * x));
        sum += wt[i];
    }
    int lo = k / 2;
    for (int i = 0; i < k; i++) {
        wt[i] = (float)(wt[i] / sum);
        if (!(wt[i] >= LL_BLUR_TAP_MIN)) wt[i] = 0.0f;
        else if (i < lo) lo = i;
    }
    return lo;
}

/* gaussian_blur: kernel exp(-x^2 / (2 sigma^2)) over x = -(k-1)/2 .. (k-1)/2, normalised, the
 * taps under LL_BLUR_TAP_MIN cut (NOTE [ Blur taps ]); reflect padding; separable passes in
 * float32 (torchvision convolves with the outer product), rounded half to even. Needs
 * (h * w * C) floats of scratch. */
LL_NO_CONTRACT
static int ll_prim_blur(const uint8_t *s, uint8_t *d, int h, int w, int C, int kx, int ky, double sigma,
                        ll_buf *scratch) {
    if (kx < 1 || ky < 1 || kx > 4097 || ky > 4097) return LL_ERR_STATE;
    int rx = kx / 2, ry = ky / 2;
    size_t st = (size_t)w * C, prow = ((size_t)w + 2 * (size_t)rx) * C;
    if (ll_buf_reserve(scratch, ((size_t)h * w * C + (size_t)kx + (size_t)ky + prow + (size_t)h + 2 * (size_t)ry) *
                                    sizeof(float) + 64) != 0)
        return LL_ERR_NOMEM;
    float *tmp = (float *)scratch->p;
    float *wx = tmp + (size_t)h * w * C, *wy = wx + kx;
    float *pad = wy + ky;             /* one reflect-padded row, float */
    int *rows = (int *)(pad + prow);  /* reflect-padded row indices */
    int lox = ll_blur_taps(kx, sigma, wx), loy = ll_blur_taps(ky, sigma, wy);
    int hix = kx - 1 - lox, hiy = ky - 1 - loy;
    /* horizontal pass into float scratch, from a reflect-padded float copy of each row; the
     * loops along the row run as twins (NOTE [ Augmentation twins ]) */
    for (int y = 0; y < h; y++) {
        const uint8_t *row = s + (size_t)y * st;
        for (int x = -rx; x < w + rx; x++) {
            if (x == 0 && rx < w) { /* the row itself: no reflection */
                LL_TWIN(u8_to_f, row, st, pad + (size_t)rx * C);
                x = w - 1;
                continue;
            }
            const uint8_t *p = row + ll_reflect101(x, w) * C;
            for (int c = 0; c < C; c++) pad[(size_t)(x + rx) * C + c] = (float)p[c];
        }
        /* taps outermost so the inner loop runs along the row; each value still sums tap 0, 1, ... */
        float *o = tmp + (size_t)y * st;
        LL_TWIN(axpy0, o, pad + (size_t)lox * C, st, wx[lox]);
        int t = lox + 1;
        for (; t + 4 <= hix + 1; t += 4)
            LL_TWIN(axpy4, o, pad + (size_t)t * C, pad + (size_t)(t + 1) * C, pad + (size_t)(t + 2) * C,
                    pad + (size_t)(t + 3) * C, st, wx + t);
        for (; t <= hix; t++) LL_TWIN(axpy, o, pad + (size_t)t * C, st, wx[t]);
    }
    for (int y = -ry; y < h + ry; y++) rows[y + ry] = (int)ll_reflect101(y, h);
    float *acc = pad; /* the padded row is free now and at least one row long */
    for (int y = 0; y < h; y++) {
        LL_TWIN(axpy0, acc, tmp + (size_t)rows[y + loy] * st, st, wy[loy]);
        int t = loy + 1;
        for (; t + 4 <= hiy + 1; t += 4)
            LL_TWIN(axpy4, acc, tmp + (size_t)rows[y + t] * st, tmp + (size_t)rows[y + t + 1] * st,
                    tmp + (size_t)rows[y + t + 2] * st, tmp + (size_t)rows[y + t + 3] * st, st, wy + t);
        for (; t <= hiy; t++) LL_TWIN(axpy, acc, tmp + (size_t)rows[y + t] * st, st, wy[t]);
        LL_TWIN(round_u8, acc, st, d + (size_t)y * st); /* a weighted mean of 0..255 values: small */
    }
    return LL_OK;
}

/* ------------------------------------------------------------------ geometric kernels */

/* torchvision's _get_inverse_affine_matrix (inverted=True): output -> input, about the
 * centre (cx, cy) given relative to the image centre. */
static void ll_inverse_affine(double cx, double cy, double angle, double tx, double ty, double scale,
                              double shx, double shy, double *m) {
    double rot = angle * M_PI / 180.0, sx = shx * M_PI / 180.0, sy = shy * M_PI / 180.0;
    double a = cos(rot - sy) / cos(sy);
    double b = -cos(rot - sy) * tan(sx) / cos(sy) - sin(rot);
    double c = sin(rot - sy) / cos(sy);
    double d = -sin(rot - sy) * tan(sx) / cos(sy) + cos(rot);
    m[0] = d / scale; m[1] = -b / scale; m[2] = 0.0;
    m[3] = -c / scale; m[4] = a / scale; m[5] = 0.0;
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
}

/* Warp through the inverse matrix m (NOTE [ Augmentation arithmetic ]): output pixel
 * (x, y) reads input (m0 X + m1 Y + m2 + (w-1)/2, m3 X + m4 Y + m5 + (h-1)/2) with
 * X = x - (w-1)/2, Y = y - (h-1)/2. Computed in float32 in torchvision's own steps (the
 * matrix divided by (w/2, h/2), the normalised grid, then grid_sample's ((g + 1) w - 1) / 2),
 * so that half-pixel ties, common under shears, round to the same neighbour. */
LL_NO_CONTRACT
static void ll_warp_ref(const uint8_t *s, uint8_t *d, int h, int w, int C, const double *m, int bilinear,
                    int has_fill, const double *fill) {
    float hw = (float)(0.5 * w), hh = (float)(0.5 * h);
    float t0 = (float)m[0] / hw, t1 = (float)m[1] / hw, t2 = (float)m[2] / hw;
    float t3 = (float)m[3] / hh, t4 = (float)m[4] / hh, t5 = (float)m[5] / hh;
    float hx = (w - 1) * 0.5f, hy = (h - 1) * 0.5f;
    size_t st = (size_t)w * C;
    for (int y = 0; y < h; y++) {
        float Y = (float)y - hy;
        for (int x = 0; x < w; x++) {
            float X = (float)x - hx;
            float gx = X * t0 + Y * t1 + t2, gy = X * t3 + Y * t4 + t5;
            float sx = ((gx + 1.0f) * (float)w - 1.0f) / 2.0f, sy = ((gy + 1.0f) * (float)h - 1.0f) / 2.0f;
            uint8_t *o = d + (size_t)y * st + (size_t)x * C;
            if (!bilinear) {
                float fx = ll_rint_f(sx), fy = ll_rint_f(sy);
                if (fx >= 0 && fx < w && fy >= 0 && fy < h) {
                    const uint8_t *p = s + (size_t)fy * st + (size_t)fx * C;
                    if (C == 3) { o[0] = p[0]; o[1] = p[1]; o[2] = p[2]; }
                    else for (int c = 0; c < C; c++) o[c] = p[c];
                } else {
                    for (int c = 0; c < C; c++) o[c] = has_fill ? ll_u8_round((float)fill[c]) : 0;
                }
                continue;
            }
            float x0f = ll_floor_f(sx), y0f = ll_floor_f(sy);
            float ax = sx - x0f, ay = sy - y0f;
            long x0 = (long)x0f, y0 = (long)y0f;
            float wts[4] = {(1 - ax) * (1 - ay), ax * (1 - ay), (1 - ax) * ay, ax * ay};
            long xs[4] = {x0, x0 + 1, x0, x0 + 1}, ys[4] = {y0, y0, y0 + 1, y0 + 1};
            float acc[4] = {0, 0, 0, 0}, mask = 0.0f;
            for (int k = 0; k < 4; k++) {
                if (xs[k] < 0 || xs[k] >= w || ys[k] < 0 || ys[k] >= h) continue;
                const uint8_t *p = s + (size_t)ys[k] * st + (size_t)xs[k] * C;
                for (int c = 0; c < C; c++) acc[c] += wts[k] * (float)p[c];
                mask += wts[k];
            }
            for (int c = 0; c < C; c++) {
                float v = acc[c];
                if (has_fill) v = (v - (float)fill[c]) * mask + (float)fill[c];
                o[c] = ll_u8_round(v);
            }
        }
    }
}

/* NOTE [ Warps in two passes ]
 * A warp spends its time on the float coordinate arithmetic, not on reading pixels. Each
 * row is done in runs of LL_AUG_RUN outputs: a twin (NOTE [ Augmentation twins ]) computes
 * the coordinates of the run with the reference loop's float32 steps (ll_warp_ref above),
 * vectorised, and writes the source pixel index (nearest) or the top-left tap and the two
 * fractions (bilinear) into a stack buffer; then a scalar loop reads the pixels. The
 * coordinates stay per pixel X * t0 + Y * t1 + t2 rather than an incremental sum: an
 * increment would round differently and move half-pixel ties, which torchvision's result
 * depends on (NOTE [ Augmentation arithmetic ]). Images of 2**31 pixels or more take the
 * reference loop. */
LL_NO_CONTRACT
static void ll_warp(const uint8_t *s, uint8_t *d, int h, int w, int C, const double *m, int bilinear,
                    int has_fill, const double *fill) {
    if ((size_t)h * (size_t)w >= ((size_t)1 << 31) || C < 1 || C > 4) {
        ll_warp_ref(s, d, h, w, C, m, bilinear, has_fill, fill);
        return;
    }
    float hw = (float)(0.5 * w), hh = (float)(0.5 * h);
    float t[6] = {(float)m[0] / hw, (float)m[1] / hw, (float)m[2] / hw,
                  (float)m[3] / hh, (float)m[4] / hh, (float)m[5] / hh};
    float hx = (w - 1) * 0.5f, hy = (h - 1) * 0.5f;
    size_t st = (size_t)w * C;
    uint8_t fnn[4];
    float ff[4];
    for (int c = 0; c < C; c++) {
        fnn[c] = has_fill ? ll_u8_round((float)fill[c]) : 0;
        ff[c] = has_fill ? (float)fill[c] : 0.0f;
    }
    int32_t ib[2 * LL_AUG_RUN];
    float fb[2 * LL_AUG_RUN];
    for (int y = 0; y < h; y++) {
        float Y = (float)y - hy;
        uint8_t *orow = d + (size_t)y * st;
        for (int xa = 0; xa < w; xa += LL_AUG_RUN) {
            int n = w - xa < LL_AUG_RUN ? w - xa : LL_AUG_RUN;
            uint8_t *o = orow + (size_t)xa * C;
            if (!bilinear) {
                LL_TWIN(warp_nn_row, t, Y, hx, w, h, xa, n, ib);
                if (C == 3) {
                    for (int j = 0; j < n; j++, o += 3) {
                        const uint8_t *p = ib[j] >= 0 ? s + (size_t)ib[j] * 3 : fnn;
                        o[0] = p[0]; o[1] = p[1]; o[2] = p[2];
                    }
                } else {
                    for (int j = 0; j < n; j++, o += C) {
                        const uint8_t *p = ib[j] >= 0 ? s + (size_t)ib[j] * C : fnn;
                        for (int c = 0; c < C; c++) o[c] = p[c];
                    }
                }
                continue;
            }
            LL_TWIN(warp_bl_row, t, Y, hx, w, h, xa, n, ib, ib + LL_AUG_RUN, fb, fb + LL_AUG_RUN);
            for (int j = 0; j < n; j++, o += C) { /* the reference loop's taps, in its order */
                long x0 = ib[j], y0 = ib[LL_AUG_RUN + j];
                float ax = fb[j], ay = fb[LL_AUG_RUN + j];
                float wts[4] = {(1 - ax) * (1 - ay), ax * (1 - ay), (1 - ax) * ay, ax * ay};
                if (C == 3 && x0 >= 0 && x0 + 1 < w && y0 >= 0 && y0 + 1 < h) { /* all four taps inside */
                    const uint8_t *p = s + (size_t)y0 * st + (size_t)x0 * 3, *q = p + st;
                    float mask = 0.0f + wts[0];
                    mask += wts[1];
                    mask += wts[2];
                    mask += wts[3];
                    for (int c = 0; c < 3; c++) {
                        float v = 0.0f + wts[0] * (float)p[c];
                        v += wts[1] * (float)p[3 + c];
                        v += wts[2] * (float)q[c];
                        v += wts[3] * (float)q[3 + c];
                        if (has_fill) v = (v - ff[c]) * mask + ff[c];
                        o[c] = ll_u8_round(v);
                    }
                    continue;
                }
                long xs[4] = {x0, x0 + 1, x0, x0 + 1}, ys[4] = {y0, y0, y0 + 1, y0 + 1};
                float acc[4] = {0, 0, 0, 0}, mask = 0.0f;
                for (int k = 0; k < 4; k++) {
                    if (xs[k] < 0 || xs[k] >= w || ys[k] < 0 || ys[k] >= h) continue;
                    const uint8_t *p = s + (size_t)ys[k] * st + (size_t)xs[k] * C;
                    for (int c = 0; c < C; c++) acc[c] += wts[k] * (float)p[c];
                    mask += wts[k];
                }
                for (int c = 0; c < C; c++) {
                    float v = acc[c];
                    if (has_fill) v = (v - ff[c]) * mask + ff[c];
                    o[c] = ll_u8_round(v);
                }
            }
        }
    }
}

/* rotate(angle) counter-clockwise about the centre (or da-given centre), nearest. */
static void ll_prim_rotate(const uint8_t *s, uint8_t *d, int h, int w, int C, double angle, int bilinear,
                           int has_center, double cx, double cy, int has_fill, const double *fill) {
    double a = fmod(angle, 360.0);
    if (a < 0) a += 360.0;
    if (a == 0.0 && !has_center) { memcpy(d, s, (size_t)h * w * C); return; }
    double m[6];
    double ccx = has_center ? cx - w * 0.5 : 0.0, ccy = has_center ? cy - h * 0.5 : 0.0;
    ll_inverse_affine(ccx, ccy, -a, 0.0, 0.0, 1.0, 0.0, 0.0, m);
    ll_warp(s, d, h, w, C, m, bilinear, has_fill, fill);
}

/* One primitive of the automatic policies (magnitude as torchvision passes it). */
static int ll_prim_apply(int prim, double mag, const uint8_t *s, uint8_t *d, int h, int w, int C, int bilinear,
                         int has_fill, const double *fill) {
    size_t npx = (size_t)h * w, n = npx * C;
    double m[6];
    switch (prim) {
    case LL_PRIM_IDENTITY: memcpy(d, s, n); break;
    case LL_PRIM_SHEAR_X:
    case LL_PRIM_SHEAR_Y: {
        double sh = atan(mag) * 180.0 / M_PI;
        ll_inverse_affine(-w * 0.5, -h * 0.5, 0.0, 0.0, 0.0, 1.0, prim == LL_PRIM_SHEAR_X ? sh : 0.0,
                          prim == LL_PRIM_SHEAR_Y ? sh : 0.0, m);
        ll_warp(s, d, h, w, C, m, bilinear, has_fill, fill);
        break;
    }
    case LL_PRIM_TRANSLATE_X:
    case LL_PRIM_TRANSLATE_Y: {
        double t = fabs(mag) < 1e9 ? (double)(long)mag : 0.0; /* int(magnitude); nonsense values move nothing */
        ll_inverse_affine(0.0, 0.0, 0.0, prim == LL_PRIM_TRANSLATE_X ? t : 0.0, prim == LL_PRIM_TRANSLATE_Y ? t : 0.0,
                          1.0, 0.0, 0.0, m);
        ll_warp(s, d, h, w, C, m, bilinear, has_fill, fill);
        break;
    }
    case LL_PRIM_ROTATE: ll_prim_rotate(s, d, h, w, C, mag, bilinear, 0, 0, 0, has_fill, fill); break;
    case LL_PRIM_BRIGHTNESS: ll_prim_brightness(s, d, n, 1.0 + mag); break;
    case LL_PRIM_COLOR: ll_prim_saturation(s, d, npx, C, 1.0 + mag); break;
    case LL_PRIM_CONTRAST: ll_prim_contrast(s, d, npx, C, 1.0 + mag); break;
    case LL_PRIM_SHARPNESS: ll_prim_sharpness(s, d, h, w, C, 1.0 + mag); break;
    case LL_PRIM_POSTERIZE: ll_prim_posterize(s, d, n, mag >= 8.0 ? 8 : (mag > 0.0 ? (int)mag : 0)); break;
    case LL_PRIM_SOLARIZE: ll_prim_solarize(s, d, n, 255.0 * mag); break;
    case LL_PRIM_AUTOCONTRAST: ll_prim_autocontrast(s, d, npx, C); break;
    case LL_PRIM_EQUALIZE: ll_prim_equalize(s, d, npx, C); break;
    case LL_PRIM_INVERT: ll_prim_invert(s, d, n); break;
    case LL_PRIM_HUE: ll_prim_hue(s, d, npx, C, mag); break;
    default: return LL_ERR_STATE;
    }
    return LL_OK;
}

/* Run a list of primitives (ids[k], mags[k]) src -> dst through one uint8 scratch image. */
static int ll_prim_run(int n, const int *ids, const double *mags, const uint8_t *s, uint8_t *d, int h, int w, int C,
                       int bilinear, int has_fill, const double *fill, ll_buf *tmp8) {
    size_t bytes = (size_t)h * w * C;
    if (n == 0) { memcpy(d, s, bytes); return LL_OK; }
    if (n > 1 && ll_buf_reserve(tmp8, bytes + 16) != 0) return LL_ERR_NOMEM;
    /* ping-pong so that the last primitive writes d */
    uint8_t *bufs[2] = {d, n > 1 ? tmp8->p : d};
    const uint8_t *cur = s;
    for (int k = 0; k < n; k++) {
        uint8_t *out = bufs[(n - 1 - k) & 1];
        int st = ll_prim_apply(ids[k], mags[k], cur, out, h, w, C, bilinear, has_fill, fill);
        if (st != LL_OK) return st;
        cur = out;
    }
    return LL_OK;
}

/* Apply op with parameters prm: src (h x w x C) -> dst (the size ll_aug_out_size gives).
 * Scratch: tmp8 (a uint8 image), tmpf (float32 rows for blur). */
static int ll_aug_apply(const ll_aug *op, const double *prm, const uint8_t *src, int h, int w, int C, uint8_t *dst,
                        ll_buf *tmp8, ll_buf *tmpf) {
    int has_fill = op->ia[7];
    const double *fill = op->da + 12;
    int ids[LL_AUG_NPRM];
    double mags[LL_AUG_NPRM];
    switch (op->kind) {
    case LL_AUG_COLOR_JITTER: { /* the factors go to the kernels as drawn (not as 1 + magnitude) */
        int n = 0;
        for (int i = 0; i < 4; i++) {
            if (!(prm[i] >= 0.0 && prm[i] <= 3.0)) return LL_ERR_STATE;
            int f = (int)prm[i];
            if (op->ia[f]) ids[n++] = f;
        }
        size_t bytes = (size_t)h * w * C;
        if (n == 0) { memcpy(dst, src, bytes); return LL_OK; }
        if (n > 1 && ll_buf_reserve(tmp8, bytes + 16) != 0) return LL_ERR_NOMEM;
        uint8_t *bufs[2] = {dst, n > 1 ? tmp8->p : dst};
        const uint8_t *cur = src;
        for (int k = 0; k < n; k++) {
            uint8_t *o = bufs[(n - 1 - k) & 1];
            double fac = prm[4 + ids[k]];
            if (ids[k] == 0) ll_prim_brightness(cur, o, bytes, fac);
            else if (ids[k] == 1) ll_prim_contrast(cur, o, (size_t)h * w, C, fac);
            else if (ids[k] == 2) ll_prim_saturation(cur, o, (size_t)h * w, C, fac);
            else ll_prim_hue(cur, o, (size_t)h * w, C, fac);
            cur = o;
        }
        return LL_OK;
    }
    case LL_AUG_GRAYSCALE:
        if (prm[0] != 0) ll_prim_grayscale(src, dst, (size_t)h * w, C);
        else memcpy(dst, src, (size_t)h * w * C);
        return LL_OK;
    case LL_AUG_BLUR:
        return ll_prim_blur(src, dst, h, w, C, op->ia[0], op->ia[1], prm[0], tmpf);
    case LL_AUG_TRIVIAL:
    case LL_AUG_RANDAUG:
    case LL_AUG_AUTOAUG: {
        if (!(prm[0] >= 0.0 && 2.0 * prm[0] + 1.0 <= LL_AUG_NPRM - 1)) return LL_ERR_STATE;
        int n = (int)prm[0];
        for (int k = 0; k < n; k++) {
            if (!(prm[1 + 2 * k] >= 0.0 && prm[1 + 2 * k] <= LL_PRIM_HUE)) return LL_ERR_STATE;
            ids[k] = (int)prm[1 + 2 * k];
            mags[k] = prm[2 + 2 * k];
        }
        return ll_prim_run(n, ids, mags, src, dst, h, w, C, op->ia[6], has_fill, fill, tmp8);
    }
    case LL_AUG_RANDOM_CROP: {
        int oh = op->ia[0], ow = op->ia[1], mode = (int)op->da[0];
        for (int k = 0; k < 6; k++)
            if (!(fabs(prm[k]) < 1e9)) return LL_ERR_STATE;
        long top = (long)prm[0] - (long)prm[3], left = (long)prm[1] - (long)prm[2];
        /* the outputs whose source is inside the image: one copy per row */
        long xa = left < 0 ? -left : 0, xb = (long)w - left < ow ? (long)w - left : ow;
        for (int y = 0; y < oh; y++) {
            long sy = y + top;
            int inside = sy >= 0 && sy < h && xa < xb;
            if (inside)
                memcpy(dst + ((size_t)y * ow + (size_t)xa) * C, src + ((size_t)sy * w + (size_t)(xa + left)) * C,
                       (size_t)(xb - xa) * C);
            for (int x = 0; x < ow; x++) {
                if (inside && x == xa) { x = (int)xb - 1; continue; }
                long sx = x + left;
                uint8_t *o = dst + ((size_t)y * ow + x) * C;
                long yy = sy, xx = sx;
                if (sy < 0 || sy >= h || sx < 0 || sx >= w) {
                    if (mode == LL_PAD_CONSTANT) {
                        for (int c = 0; c < C; c++) o[c] = ll_u8_trunc((float)fill[c]);
                        continue;
                    } else if (mode == LL_PAD_EDGE) {
                        yy = sy < 0 ? 0 : (sy >= h ? h - 1 : sy);
                        xx = sx < 0 ? 0 : (sx >= w ? w - 1 : sx);
                    } else if (mode == LL_PAD_REFLECT) {
                        yy = ll_reflect101(sy, h);
                        xx = ll_reflect101(sx, w);
                    } else {
                        yy = ll_symmetric(sy, h);
                        xx = ll_symmetric(sx, w);
                    }
                }
                memcpy(o, src + ((size_t)yy * w + xx) * C, C);
            }
        }
        return LL_OK;
    }
    case LL_AUG_ROTATION:
        ll_prim_rotate(src, dst, h, w, C, prm[0], op->ia[6], op->ia[0], op->da[2], op->da[3], has_fill, fill);
        return LL_OK;
    case LL_AUG_AFFINE: {
        double m[6];
        double cx = op->ia[3] ? op->da[10] - w * 0.5 : 0.0, cy = op->ia[3] ? op->da[11] - h * 0.5 : 0.0;
        ll_inverse_affine(cx, cy, prm[0], prm[1], prm[2], prm[3], prm[4], prm[5], m);
        ll_warp(src, dst, h, w, C, m, op->ia[6], has_fill, fill);
        return LL_OK;
    }
    default:
        return LL_ERR_STATE;
    }
}

/* Standard normal number `i` of the erase stream: Box-Muller on counters 64 + 2i, 65 + 2i. */
static inline float ll_aug_normal(uint64_t key, uint64_t i) {
    double u1 = ll_rng_uniform(key, 64 + 2 * i), u2 = ll_rng_uniform(key, 65 + 2 * i);
    return (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2));
}

/* RandomErasing on the finished output (h x w x C, or C x h x w when chw; float32 when
 * is_float, uint8 otherwise). The value is da[5..8] per channel (ia[1] = how many given:
 * 1 or C), or, with ia[0] = 1 ("random"), standard normal numbers: value (c, y, x) of the
 * box is normal number (c * bh + y) * bw + x of the stream. */
static void ll_aug_erase(const ll_aug *op, const double *prm, uint64_t key, void *out, int is_float, int chw, int h,
                         int w, int C) {
    if (prm[0] == 0) return;
    int i0 = (int)prm[1], j0 = (int)prm[2], bh = (int)prm[3], bw = (int)prm[4];
    (void)h;
    for (int c = 0; c < C; c++) {
        double cv = op->da[5 + (op->ia[1] == 1 ? 0 : c)];
        for (int y = 0; y < bh; y++) {
            for (int x = 0; x < bw; x++) {
                size_t at = chw ? ((size_t)c * h + (size_t)(i0 + y)) * w + (size_t)(j0 + x)
                                : ((size_t)(i0 + y) * w + (size_t)(j0 + x)) * C + c;
                float v = op->ia[0] ? ll_aug_normal(key, ((uint64_t)c * bh + y) * bw + x) : (float)cv;
                if (is_float) ((float *)out)[at] = v;
                else ((uint8_t *)out)[at] = ll_u8_trunc(v);
            }
        }
    }
}

#endif
