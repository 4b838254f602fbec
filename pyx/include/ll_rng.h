/* Counter-based randomness for per-sample augmentation.
 *
 * NOTE [ Counter-based sample randomness ]
 * Every random number a transform uses is a pure function of
 * (seed, epoch, sample index, transform position, draw counter), so a sample's
 * augmentation never depends on which thread ran it, in what order, or how many samples
 * came before it: any thread count gives identical output and a resumed epoch
 * reproduces the same crops. The construction is SplitMix64 (Steele, Lea, Flood 2014):
 *
 *   mix(z)   = the SplitMix64 finaliser (xor-shift 30/27/31, two odd multipliers)
 *   key      = k4 where k0 = 0x243F6A8885A308D3 and k(n+1) = mix((kn ^ xn) + G)
 *              for x = (seed, epoch, index, position), all taken modulo 2**64
 *   u64(c)   = mix(key + (c + 1) * G)          G = 0x9E3779B97F4A7C15
 *   uniform  = (u64(c) >> 11) * 2**-53         53 random bits, in [0, 1)
 *   below(n) = (u64(c) * n) >> 64              integer in [0, n), 128-bit product
 *
 * loaderlib/transforms/_rng.py has a bit-identical pure-Python twin (_Rng); a test checks
 * that both give the same draws and the same RandomResizedCrop boxes.
 */
#ifndef LL_RNG_H
#define LL_RNG_H

#include <math.h>
#include <stdint.h>

#define LL_RNG_GAMMA 0x9E3779B97F4A7C15ULL
#define LL_RNG_INIT 0x243F6A8885A308D3ULL

/* The box arithmetic below must round exactly like the Python twin, so no fused
 * multiply-add may be introduced by the compiler (-march with FMA and fp-contract). */
#if defined(__GNUC__) && !defined(__clang__)
#define LL_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define LL_NO_CONTRACT
#endif

static inline uint64_t ll_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t ll_rng_key(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t pos) {
    uint64_t k = LL_RNG_INIT;
    k = ll_mix64((k ^ seed) + LL_RNG_GAMMA);
    k = ll_mix64((k ^ epoch) + LL_RNG_GAMMA);
    k = ll_mix64((k ^ index) + LL_RNG_GAMMA);
    k = ll_mix64((k ^ pos) + LL_RNG_GAMMA);
    return k;
}

static inline uint64_t ll_rng_u64(uint64_t key, uint64_t ctr) {
    return ll_mix64(key + (ctr + 1) * LL_RNG_GAMMA);
}

static inline double ll_rng_uniform(uint64_t key, uint64_t ctr) {
    return (double)(ll_rng_u64(key, ctr) >> 11) * (1.0 / 9007199254740992.0);
}

static inline int64_t ll_rng_below(uint64_t key, uint64_t ctr, uint64_t n) {
    return (int64_t)(((unsigned __int128)ll_rng_u64(key, ctr) * n) >> 64);
}

/* torchvision's RandomResizedCrop.get_params for an image of width x height, with
 * draws from the generator above: attempt k (0..9) uses counters 4k (area fraction),
 * 4k+1 (log aspect ratio), 4k+2 (top) and 4k+3 (left). The area fraction is uniform in
 * [s0, s1), the aspect ratio exp(uniform(log r0, log r1)); w = round(sqrt(area * ratio)),
 * h = round(sqrt(area / ratio)) with round-half-even (Python's round, C's rint). After 10
 * failed attempts: the largest central crop whose ratio is clamped to [r0, r1] (at least
 * one pixel on each side, where torchvision's rounding would give an empty box).
 * Writes the box as top i, left j, height h, width w. */
LL_NO_CONTRACT
static void ll_rrc_params(uint64_t key, int width, int height, double s0, double s1, double r0, double r1,
                          int *bi, int *bj, int *bh, int *bw) {
    double area = (double)width * (double)height;
    double lr0 = log(r0), lr1 = log(r1);
    for (int k = 0; k < 10; k++) {
        double target = area * (s0 + (s1 - s0) * ll_rng_uniform(key, 4 * (uint64_t)k));
        double ar = exp(lr0 + (lr1 - lr0) * ll_rng_uniform(key, 4 * (uint64_t)k + 1));
        double fw = rint(sqrt(target * ar)), fh = rint(sqrt(target / ar));
        if (fw > 0 && fw <= width && fh > 0 && fh <= height) {
            int w = (int)fw, h = (int)fh;
            *bi = (int)ll_rng_below(key, 4 * (uint64_t)k + 2, (uint64_t)(height - h + 1));
            *bj = (int)ll_rng_below(key, 4 * (uint64_t)k + 3, (uint64_t)(width - w + 1));
            *bh = h;
            *bw = w;
            return;
        }
    }
    double in_ratio = (double)width / (double)height;
    int w, h;
    double rmin = r0 < r1 ? r0 : r1, rmax = r0 < r1 ? r1 : r0;
    if (in_ratio < rmin) {
        w = width;
        h = (int)rint((double)w / rmin);
    } else if (in_ratio > rmax) {
        h = height;
        w = (int)rint((double)h * rmax);
    } else {
        w = width;
        h = height;
    }
    if (h < 1) h = 1; /* torchvision would return an empty box here (and then fail) */
    if (w < 1) w = 1;
    *bi = (height - h) / 2;
    *bj = (width - w) / 2;
    *bh = h;
    *bw = w;
}

#endif
