/* The per-pixel loops of the augmentations, written once and compiled once per SIMD level
 * (NOTE [ Augmentation twins ] in ll_augment.h). No include guard: ll_augment.h includes this
 * file once per level with LL_TW(name) (the level's function name) and LL_TW_ATTR (its
 * attributes) defined. Every loop here does the same IEEE float32/float64 operations in the
 * same order for each value as the formulas of NOTE [ Augmentation arithmetic ]; loops are
 * branch-free (selects) so the compiler can vectorise them. Each function handles one row or
 * one run of pixels; the callers own the buffers. */

/* floor(gray) of npx RGB pixels: (float)(r * 0.2989f), then the two multiply-adds of
 * ll_gray_f in double, rounded to float (in [0, 255): floor is truncation). */
LL_TW_ATTR static void LL_TW(gray_floor)(const uint8_t *restrict s, size_t npx, uint8_t *restrict g) {
    for (size_t i = 0; i < npx; i++) {
        float t = (float)s[3 * i] * 0.2989f;
#if LL_TW_FMA /* NOTE [ Exact sums in FMA ] */
        t = fmaf((float)s[3 * i + 1], 0.587f, t);
        t = fmaf((float)s[3 * i + 2], 0.114f, t);
#else
        t = (float)((double)s[3 * i + 1] * (double)0.587f + (double)t);
        t = (float)((double)s[3 * i + 2] * (double)0.114f + (double)t);
#endif
        g[i] = (uint8_t)(int)t;
    }
}

/* Sum of n bytes (the contrast mean's integer sum: exact, as the double sum it replaces). */
LL_TW_ATTR static uint64_t LL_TW(sum_u8)(const uint8_t *restrict g, size_t n) {
    uint32_t acc = 0; /* n <= 2**24 per call: no overflow */
    for (size_t i = 0; i < n; i++) acc += g[i];
    return acc;
}

/* d = trunc(clamp((float)s * r)) over n values (brightness). */
LL_TW_ATTR static void LL_TW(scale)(const uint8_t *restrict s, size_t n, float r, uint8_t *restrict d) {
    for (size_t i = 0; i < n; i++) {
        float v = (float)s[i] * r;
        v = v > 0.0f ? v : 0.0f;
        v = v < 255.0f ? v : 255.0f;
        d[i] = (uint8_t)(int)v;
    }
}

/* d = trunc(clamp(LL_BLEND_F(s * r, a))): the contrast blend (a = mean * (1 - f),
 * exact in double) over n values. */
LL_TW_ATTR static void LL_TW(scale_add)(const uint8_t *restrict s, size_t n, float r, double a, uint8_t *restrict d) {
    for (size_t i = 0; i < n; i++) {
        float v = LL_BLEND_F((float)s[i] * r, a);
        v = v > 0.0f ? v : 0.0f;
        v = v < 255.0f ? v : 255.0f;
        d[i] = (uint8_t)(int)v;
    }
}

/* Saturation blend of npx RGB pixels with their floor(gray) g: per value
 * trunc(clamp((float)(g * q + (double)((float)s * r)))), g * q exact in double; with
 * exact_fma (the factors of NOTE [ Exact sums in FMA ]) the twins with FMA compute it as
 * fmaf(g, q, s * r). */
LL_TW_ATTR static void LL_TW(blend_gray)(const uint8_t *restrict s, const uint8_t *restrict g, size_t npx, float r,
                                         float q, int exact_fma, uint8_t *restrict d) {
#if LL_TW_FMA
    if (exact_fma) {
        for (size_t i = 0; i < npx; i++) {
            float gf = (float)g[i];
            for (int c = 0; c < 3; c++) {
                float v = fmaf(gf, q, (float)s[3 * i + c] * r);
                v = v > 0.0f ? v : 0.0f;
                v = v < 255.0f ? v : 255.0f;
                d[3 * i + c] = (uint8_t)(int)v;
            }
        }
        return;
    }
#else
    (void)exact_fma;
#endif
    for (size_t i = 0; i < npx; i++) {
        double gq = (double)g[i] * (double)q;
        for (int c = 0; c < 3; c++) {
            float v = LL_BLEND_F((float)s[3 * i + c] * r, gq);
            v = v > 0.0f ? v : 0.0f;
            v = v < 255.0f ? v : 255.0f;
            d[3 * i + c] = (uint8_t)(int)v;
        }
    }
}

/* Hue shift by hf of npx <= LL_AUG_RUN RGB pixels: torchvision's _rgb_to_hsv and
 * _hsv_to_rgb in float32, the same steps as the reference loop of ll_prim_hue with its
 * branches turned into selects (every value of each select is computed by the same
 * operations), in two loops (to HSV, back to RGB) through float runs: one loop with both
 * halves does not vectorise. */
LL_TW_ATTR static void LL_TW(hue)(const uint8_t *restrict s, size_t npx, float hf, uint8_t *restrict d) {
    float hh[LL_AUG_RUN], ss[LL_AUG_RUN], vv[LL_AUG_RUN];
    for (size_t i = 0; i < npx; i++) {
        const float k = 1.0f / 255.0f;
        float r = (float)s[3 * i] * k, g = (float)s[3 * i + 1] * k, b = (float)s[3 * i + 2] * k;
        float mx = r > g ? r : g, mn = r < g ? r : g;
        float maxc = mx > b ? mx : b, minc = mn < b ? mn : b;
        int eqc = maxc == minc;
        float cr = maxc - minc;
        float sat = cr / (eqc ? 1.0f : maxc);
        float div = eqc ? 1.0f : cr;
        float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
        float hr = bc - gc, hg = 2.0f + rc - bc, hb = 4.0f + gc - rc;
        int isr = maxc == r, isg = maxc == g;
        float h = isg ? hg : hb;
        h = isr ? hr : h;
        h = h * (1.0f / 6.0f) + 1.0f;
        float fl = (float)(int)h; /* h in (0, 2): floor is truncation */
        h = h - fl;
        h = h + hf;
        float tr = (float)(int)h; /* ll_floor_f (|h| < 2**21 here) */
        tr = tr > h ? tr - 1.0f : tr;
        h = h - tr;
        hh[i] = h >= 1.0f ? 0.0f : h;
        ss[i] = sat;
        vv[i] = maxc;
    }
    for (size_t i = 0; i < npx; i++) {
        float h = hh[i], sat = ss[i], v = vv[i];
        float h6 = h * 6.0f, fi = (float)(int)h6; /* h6 in [0, 6] */
        float fr = h6 - fi;
        float sector = fi >= 6.0f ? fi - 6.0f : fi;
        float sxf = sat * fr, oms = 1.0f - sat;
        float q = (1.0f - sxf) * v, t = (sxf + oms) * v, p = oms * v;
        q = q < 0.0f ? 0.0f : q; /* clamp to [0, 1] (a NaN stays NaN, as in the reference) */
        q = q > 1.0f ? 1.0f : q;
        t = t < 0.0f ? 0.0f : t;
        t = t > 1.0f ? 1.0f : t;
        p = p < 0.0f ? 0.0f : p;
        p = p > 1.0f ? 1.0f : p;
        /* sectors 0..5: R = v q p p t v, G = t v v q p p, B = p p t v v q */
        float ro = sector == 4.0f ? t : p, go = sector == 3.0f ? q : p, bo = sector == 5.0f ? q : p;
        ro = sector == 1.0f ? q : ro;
        go = sector == 0.0f ? t : go;
        bo = sector == 2.0f ? t : bo;
        ro = sector == 0.0f ? v : ro;
        ro = sector == 5.0f ? v : ro;
        go = sector == 1.0f ? v : go;
        go = sector == 2.0f ? v : go;
        bo = sector == 3.0f ? v : bo;
        bo = sector == 4.0f ? v : bo;
        ro *= 255.999f; /* in [0, 255.999]: the clamp of ll_u8_trunc is the upper one */
        go *= 255.999f;
        bo *= 255.999f;
        ro = ro < 255.0f ? ro : 255.0f;
        go = go < 255.0f ? go : 255.0f;
        bo = bo < 255.0f ? bo : 255.0f;
        d[3 * i] = (uint8_t)(int)ro;
        d[3 * i + 1] = (uint8_t)(int)go;
        d[3 * i + 2] = (uint8_t)(int)bo;
    }
}

/* One interior row of adjust_sharpness (values C .. st - C of row 1; rows 0 and 2 around it). */
LL_TW_ATTR static void LL_TW(sharpen_row)(const uint8_t *restrict r0, const uint8_t *restrict r1,
                                          const uint8_t *restrict r2, size_t st, int C, float r,
                                          uint8_t *restrict o) {
    const float a = 1.0f / 13.0f, b = 5.0f / 13.0f;
    const float m = 12582912.0f; /* ll_rint_small */
    for (size_t i = (size_t)C; i < st - (size_t)C; i++) {
        float acc = 0.0f;
        acc += (float)r0[i - C] * a + (float)r0[i] * a + (float)r0[i + C] * a;
        acc += (float)r1[i - C] * a + (float)r1[i] * b + (float)r1[i + C] * a;
        acc += (float)r2[i - C] * a + (float)r2[i] * a + (float)r2[i + C] * a;
        float x0 = (float)r1[i];
        float v = x0 + (((acc + m) - m) - x0) * r;
        v = v > 0.0f ? v : 0.0f;
        v = v < 255.0f ? v : 255.0f;
        o[i] = (uint8_t)(int)v;
    }
}

/* o[i] += wt * p[i] for n values (one tap of a blur pass, taps summed in order). */
LL_TW_ATTR static void LL_TW(axpy)(float *restrict o, const float *restrict p, size_t n, float wt) {
    for (size_t i = 0; i < n; i++) o[i] += wt * p[i];
}

/* Four taps at once: o[i] = (((o[i] + w0 p0[i]) + w1 p1[i]) + w2 p2[i]) + w3 p3[i], the
 * additions in the order four axpy calls make them, with one load and store of o instead of
 * four (the single-tap loop was bound by them: 0.53 ms for GaussianBlur(23) on 224x224x3). */
LL_TW_ATTR static void LL_TW(axpy4)(float *restrict o, const float *restrict p0, const float *restrict p1,
                                    const float *restrict p2, const float *restrict p3, size_t n,
                                    const float *restrict w) {
    const float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
    for (size_t i = 0; i < n; i++) {
        float v = o[i];
        v = v + w0 * p0[i];
        v = v + w1 * p1[i];
        v = v + w2 * p2[i];
        v = v + w3 * p3[i];
        o[i] = v;
    }
}

/* The first tap of a blur pass: o[i] = 0 + wt * p[i] (0.0f + x is x, also for -0.0: the
 * products here are >= 0). */
LL_TW_ATTR static void LL_TW(axpy0)(float *restrict o, const float *restrict p, size_t n, float wt) {
    for (size_t i = 0; i < n; i++) o[i] = 0.0f + wt * p[i];
}

/* Round half to even and clamp n sums of the vertical blur pass to uint8. */
LL_TW_ATTR static void LL_TW(round_u8)(const float *restrict a, size_t n, uint8_t *restrict o) {
    const float m = 12582912.0f;
    for (size_t i = 0; i < n; i++) {
        float v = (a[i] + m) - m;
        v = v > 0.0f ? v : 0.0f;
        o[i] = (uint8_t)(int)(v < 255.0f ? v : 255.0f);
    }
}

/* uint8 -> float32 (the padded rows of the blur). */
LL_TW_ATTR static void LL_TW(u8_to_f)(const uint8_t *restrict s, size_t n, float *restrict o) {
    for (size_t i = 0; i < n; i++) o[i] = (float)s[i];
}

/* Nearest-neighbour warp, outputs xa .. xa + n - 1 of one row (Y = y - (h - 1) / 2): the
 * source pixel index of each (row * w + col), or -1 where the rounded point is outside the
 * image (NOTE [ Warps in two passes ]). */
LL_TW_ATTR static void LL_TW(warp_nn_row)(const float *restrict t, float Y, float hx, int w, int h, int xa, int n,
                                          int32_t *restrict idx) {
    const float m = 12582912.0f, fw = (float)w, fh = (float)h;
    const float yt1 = Y * t[1], yt4 = Y * t[4];
    for (int j = 0; j < n; j++) {
        float X = (float)(xa + j) - hx;
        float gx = X * t[0] + yt1 + t[2], gy = X * t[3] + yt4 + t[5];
        float sx = ((gx + 1.0f) * fw - 1.0f) / 2.0f, sy = ((gy + 1.0f) * fh - 1.0f) / 2.0f;
        /* ll_rint_f: exact for |v| < 2**22; beyond, the point is outside the image either way */
        int ok = (sx > -4194304.0f) & (sx < 4194304.0f) & (sy > -4194304.0f) & (sy < 4194304.0f);
        float fx = ok ? (sx + m) - m : -1.0f, fy = ok ? (sy + m) - m : -1.0f;
        ok = ok & (fx >= 0.0f) & (fx < fw) & (fy >= 0.0f) & (fy < fh);
        int ix = ok ? (int)fx : 0, iy = ok ? (int)fy : 0;
        idx[j] = ok ? iy * w + ix : -1;
    }
}

/* Bilinear warp, outputs xa .. xa + n - 1 of one row: per output the top-left tap (x0, y0)
 * and the fractions (ax, ay) of grid_sample, in four runs (NOTE [ Warps in two passes ]); points whose taps
 * all lie outside get x0 = y0 = -2 (no tap reads). GCC 12 vectorises this loop only
 * without jump threading (VRP, dominator opts and PRE duplicate its selects into branches):
 * a bilinear rotation of 224x224x3 took 0.55 ms at avx512 with this loop scalar, 0.40 vectorised. */
LL_TW_ATTR LL_TW_NO_THREADING static void LL_TW(warp_bl_row)(const float *restrict t, float Y, float hx, int w, int h, int xa, int n,
                                          int32_t *restrict x0s, int32_t *restrict y0s, float *restrict axs,
                                          float *restrict ays) {
    const float fw = (float)w, fh = (float)h;
    const float yt1 = Y * t[1], yt4 = Y * t[4];
    for (int j = 0; j < n; j++) {
        float X = (float)(xa + j) - hx;
        float gx = X * t[0] + yt1 + t[2], gy = X * t[3] + yt4 + t[5];
        float sx = ((gx + 1.0f) * fw - 1.0f) / 2.0f, sy = ((gy + 1.0f) * fh - 1.0f) / 2.0f;
        int ok = (sx > -2.0f) & (sx < fw + 1.0f) & (sy > -2.0f) & (sy < fh + 1.0f); /* else no tap is inside */
        float cx = ok ? sx : -2.0f, cy = ok ? sy : -2.0f;
        /* ll_floor_f for |v| < 2**31 */
        float x0f = (float)(int)cx, y0f = (float)(int)cy;
        x0f = x0f > cx ? x0f - 1.0f : x0f;
        y0f = y0f > cy ? y0f - 1.0f : y0f;
        x0s[j] = (int)x0f;
        y0s[j] = (int)y0f;
        axs[j] = cx - x0f;
        ays[j] = cy - y0f;
    }
}
