/* ``pack`` per image: decode, resize to the cap, re-encode or store raw (owner of the
 * kernel: pyx/_pack.pyx; Python owner: loaderlib/_pack.py).
 *
 * NOTE [ Packing at a capped resolution ]
 * Per item, with no GIL and no Python object: parse the JPEG's header (the max_pixels and
 * coefficient guards of ll_jpeg_plan_item apply), take its original size (its own, or the one
 * a record packed before carries: NOTE [ Packed records ] in ll_record.h), and compute the
 * stored size: an image whose longer side exceeds max_side gets that side max_side and the
 * other round-half-up(side * max_side / longer), at least 1 (ll_pack_size). An image within
 * the cap, not raw and not asked to be re-encoded is kept: its bytes are written as they
 * are, undecoded beyond the header. Otherwise it is decoded (RGB, or grayscale for a one-
 * component JPEG; CMYK converted) at the largest DCT scale 1/d that still leaves a reduction
 * of 2x or more to the resize (the rule of NOTE [ DCT scale choice ] in ll_chain.h, so the
 * antialiased triangle filter, not the IDCT, sets the result; a 4000x3000 photo packed at
 * 512 decodes at 1/2), resized with the chain's own antialiased bilinear kernels
 * (ll_resize_image_wk: the taps of Resize(antialias=True)), and written either as a raw
 * record, when its stored pixel count is below raw_below, or as a baseline JPEG at
 * ``quality`` carrying the original size (NOTE [ The encoder ] in ll_jpeg.h). The output
 * goes to the item's own growable buffer, so items finish in any order on any thread and
 * the result does not depend on the thread count. */
#ifndef LL_PACK_H
#define LL_PACK_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ll_chain.h"
#include "ll_common.h"
#include "ll_jpeg.h"
#include "ll_record.h"
#include "ll_worker.h"

#define LL_PACK_KEEP 0
#define LL_PACK_JPEG 1
#define LL_PACK_RAW 2

/* One thread's pack state: a decoder with its scratch, and an encoder. */
typedef struct {
    ll_worker wk;
    ll_jpeg_enc enc;
    int enc_ok;
} __attribute__((aligned(LL_CACHE_LINE))) ll_pack_worker;

typedef struct {
    int max_side;         /* <= 0: no cap */
    int quality;          /* 1-100 */
    int reencode;         /* re-encode images within the cap too */
    int strict;           /* LL_STRICT_* for the decode */
    long long raw_below;  /* store as raw pixels below this many stored pixels */
    long long max_pixels; /* the decode guard (0: none) */
} ll_pack_opts;

/* What became of one item. */
typedef struct {
    int kind;             /* LL_PACK_KEEP, LL_PACK_JPEG or LL_PACK_RAW */
    int orig_w, orig_h;   /* its original size */
    int w, h, c;          /* the stored image */
} ll_pack_out;

static int ll_pack_worker_init(ll_pack_worker *p) {
    memset(p, 0, sizeof(*p));
    if (ll_worker_init(&p->wk) != LL_OK) return LL_ERR_NOMEM;
    if (ll_jpeg_enc_create(&p->enc) != LL_OK) return LL_ERR_NOMEM;
    p->enc_ok = 1;
    return LL_OK;
}

static void ll_pack_worker_free(ll_pack_worker *p) {
    ll_worker_free(&p->wk);
    if (p->enc_ok) ll_jpeg_enc_destroy(&p->enc);
    p->enc_ok = 0;
}

/* The stored size of a w x h image under max_side (NOTE [ Packing at a capped resolution ]). */
static void ll_pack_size(int w, int h, int max_side, int *tw, int *th) {
    *tw = w;
    *th = h;
    if (max_side <= 0 || (w <= max_side && h <= max_side)) return;
    if (w >= h) {
        *tw = max_side;
        *th = (int)floor((double)h * max_side / w + 0.5);
    } else {
        *th = max_side;
        *tw = (int)floor((double)w * max_side / h + 0.5);
    }
    if (*tw < 1) *tw = 1;
    if (*th < 1) *th = 1;
}

/* One item: JPEG bytes buf[0:size], or (pixels != NULL) an HWC uint8 image of ph x pw x pc
 * (pc 1 or 3, RGB) whose original is orig_w x orig_h (0: its own size), into *out (grown as
 * needed; *out_len bytes, 0 for a kept item). Returns LL_OK, LL_WARNED (decoded from data
 * libjpeg recovered from; reason in msg) or an error code with the reason in msg.
 * Thread-safe for distinct workers. NOTE [ Packing at a capped resolution ] */
static int ll_pack_item(ll_pack_worker *pw, const ll_pack_opts *o, const uint8_t *buf, size_t size,
                        const uint8_t *pixels, int ph, int pwid, int pc, int orig_w, int orig_h, ll_buf *out,
                        size_t *out_len, ll_pack_out *r, char *msg) {
    ll_worker *wk = &pw->wk;
    int w, h, c, st, warned = 0;
    const uint8_t *src;
    if (msg) msg[0] = 0;
    *out_len = 0;
    memset(r, 0, sizeof(*r));
    if (pixels == NULL) {
        ll_jpeg_info info;
        int x0, y0, oh, ow, oc;
        st = ll_jpeg_plan_item(&wk->dec, buf, size, LL_MODE_RGB, 1, 0, 0, 0, 0, o->max_pixels, &info, &x0, &y0, &oh,
                               &ow, &oc, msg);
        if (st != LL_OK) return st;
        w = info.width;
        h = info.height;
        c = info.components == 1 ? 1 : 3;
        r->orig_w = w;
        r->orig_h = h;
        ll_pack_original(buf, size, &r->orig_w, &r->orig_h);
    } else {
        if (ph < 1 || pwid < 1 || (pc != 1 && pc != 3)) {
            if (msg) snprintf(msg, LL_MSG_LEN, "cannot pack a %dx%dx%d image", pwid, ph, pc);
            return LL_ERR_SHAPE;
        }
        w = pwid;
        h = ph;
        c = pc;
        r->orig_w = orig_w > 0 ? orig_w : w;
        r->orig_h = orig_h > 0 ? orig_h : h;
    }
    int tw, th;
    ll_pack_size(w, h, o->max_side, &tw, &th);
    int resize = tw != w || th != h;
    int raw = (long long)tw * th < o->raw_below;
    r->w = tw;
    r->h = th;
    r->c = c;
    if (pixels == NULL && !resize && !raw && !o->reencode) {
        r->kind = LL_PACK_KEEP;
        return LL_OK;
    }
    if (pixels == NULL) {
        int d = 8;
        if (resize) {
            for (; d > 1; d /= 2) /* NOTE [ DCT scale choice ]: a residual reduction of 2x or more */
                if (ll_ceil_div(w, d) >= 2L * tw && ll_ceil_div(h, d) >= 2L * th) break;
        } else {
            d = 1;
        }
        int sw = ll_ceil_div(w, d), sh = ll_ceil_div(h, d);
        if (ll_buf_reserve(&wk->region, (size_t)sw * sh * c + 16) != 0) goto nomem;
        st = ll_jpeg_decode(&wk->dec, c == 1 ? LL_MODE_GRAY : LL_MODE_RGB, d, 0, 0, sw, sh, wk->region.p,
                            (ptrdiff_t)sw * c, o->strict, 0);
        ll_jpeg_status_msg(&wk->dec, st, msg);
        if (st < 0) return st;
        warned = st == LL_WARNED;
        src = wk->region.p;
        w = sw;
        h = sh;
    } else {
        src = pixels;
    }
    if (w != tw || h != th) {
        if (ll_buf_reserve(&wk->inter[0], (size_t)tw * th * c + 16) != 0) goto nomem;
        if (ll_resize_image_wk(wk, src, h, w, c, wk->inter[0].p, th, tw, LL_INTERP_LINEAR, 1) != LL_OK) goto nomem;
        src = wk->inter[0].p;
    }
    if (raw) {
        size_t n = (size_t)tw * th * c;
        if (ll_buf_reserve(out, n + LL_RAW_HEADER) != 0) goto nomem;
        ll_raw_header(out->p, th, tw, c, r->orig_h, r->orig_w);
        memcpy(out->p + LL_RAW_HEADER, src, n);
        *out_len = n + LL_RAW_HEADER;
        r->kind = LL_PACK_RAW;
    } else {
        unsigned char app[LL_PACK_APP_LEN];
        ll_pack_app(app, r->orig_w, r->orig_h);
        char emsg[LL_MSG_LEN];
        st = ll_jpeg_encode(&pw->enc, src, th, tw, c, (ptrdiff_t)tw * c, o->quality, LL_PACK_APP, app,
                            LL_PACK_APP_LEN, out, out_len, emsg);
        if (st != LL_OK) {
            if (msg) snprintf(msg, LL_MSG_LEN, "encoding failed: %s", emsg);
            return st;
        }
        r->kind = LL_PACK_JPEG;
    }
    if (warned) return LL_WARNED; /* msg holds libjpeg's warning */
    return LL_OK;
nomem:
    if (msg) snprintf(msg, LL_MSG_LEN, "out of memory (per-thread scratch)");
    return LL_ERR_NOMEM;
}

#endif
