/* libjpeg(-turbo) decode helpers with a setjmp-guarded error exit.
 *
 * NOTE [ Why libjpeg is wrapped in C ]
 * libjpeg reports fatal errors by calling error_exit(), which must not return. The only
 * safe way to recover is longjmp() back to a setjmp() in the frame that called libjpeg.
 * Cython cannot place a setjmp() safely (it may keep locals in registers that longjmp
 * clobbers, and a longjmp across Python frames or Cython cleanup code leaks references),
 * so every libjpeg call goes through the small functions below. Each one sets its own
 * jump buffer, touches no Python object and needs no GIL, and on error aborts the
 * decompressor (which stays reusable) and returns a status code from ll_common.h with
 * libjpeg's own message in dec->err.msg. Nothing here prints: warnings are counted and
 * the first one is kept in dec->err.warn.
 *
 * One ll_jpeg_dec is used by one thread at a time; different decoders are independent.
 */
#ifndef LL_JPEG_H
#define LL_JPEG_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "ll_common.h"
#include "ll_huff.h"
#include "ll_phuff.h"

#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#define LIBJPEG_TURBO_VERSION_NUMBER 0
#endif
#ifdef WITH_SIMD
#define LL_JPEG_SIMD 1
#else
#define LL_JPEG_SIMD 0
#endif

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];  /* fatal error message */
    char warn[JMSG_LENGTH_MAX]; /* first warning of the current image */
    int nwarn;
    int truncated;              /* the data ended before the decoder stopped reading (JWRN_JPEG_EOF) */
    int eof_warnings;           /* how many of nwarn were JWRN_JPEG_EOF */
    int hit_marker;             /* the entropy decoder needed bits after the data (JWRN_HIT_MARKER) */
    char warn_other[JMSG_LENGTH_MAX]; /* first warning that was not JWRN_JPEG_EOF */
} ll_jpeg_err;

typedef struct {
    struct jpeg_decompress_struct cinfo;
    ll_jpeg_err err;
    int created;
    int have_header;
    ll_buf row; /* one output row (crop margins, CMYK conversion); grows, reused */
    const unsigned char *src; /* the buffer of the last ll_jpeg_header, to decode again */
    size_t src_size;
    ll_huff *huff; /* NOTE [ Our Huffman decoder ]; allocated on first use */
    int headers;   /* headers read since the decompressor was created (NOTE [ Tables end with their image ]) */
    /* libjpeg's own alloc_sarray, which ll_jpeg_alloc_sarray wraps (NOTE [ Sample rows are cleared ]) */
    JSAMPARRAY (*lib_alloc_sarray)(j_common_ptr, int, JDIMENSION, JDIMENSION);
} ll_jpeg_dec;

/* Header facts. subsampling: 444, 422, 420, 440, 411, 410, 0 (grayscale), -1 (other). */
typedef struct {
    int width, height, components, color_space, subsampling;
    int progressive, arithmetic, precision, adobe;
    /* iMCU size in full-resolution pixels (8 for grayscale, 16x16 for 4:2:0). */
    int imcu_w, imcu_h;
} ll_jpeg_info;

static void ll_jpeg_error_exit(j_common_ptr cinfo) {
    ll_jpeg_err *err = (ll_jpeg_err *)cinfo->err;
    err->pub.format_message(cinfo, err->msg);
    longjmp(err->jb, 1);
}

static void ll_jpeg_emit_message(j_common_ptr cinfo, int msg_level) {
    ll_jpeg_err *err = (ll_jpeg_err *)cinfo->err;
    if (msg_level < 0) { /* a warning: corrupt data libjpeg recovered from */
        /* NOTE [ Truncated JPEG is an error ]: libjpeg "recovers" from data that ends early
         * by filling the rest of the image with grey. A training set must not train on that,
         * and PIL and PyTorch users expect an error, so by default (LL_STRICT_TRUNCATED) a
         * truncated image fails. Other recoverable damage (extraneous bytes before a marker,
         * a bad restart marker) stays a warning: ImageNet has such files and PIL reads them.
         * strict=True (LL_STRICT_ALL) refuses every warning; strict=False (LL_STRICT_NONE)
         * keeps partial images, as PIL's LOAD_TRUNCATED_IMAGES does. */
        int code = cinfo->err->msg_code;
        if (code == JWRN_JPEG_EOF) {
            err->truncated = 1;
            err->eof_warnings++;
        } else if (err->nwarn == err->eof_warnings) {
            err->pub.format_message(cinfo, err->warn_other);
        }
        if (code == JWRN_HIT_MARKER) err->hit_marker = 1;
        if (err->nwarn == 0) err->pub.format_message(cinfo, err->warn);
        err->nwarn++;
        err->pub.num_warnings++;
    }
}

static void ll_jpeg_output_message(j_common_ptr cinfo) { (void)cinfo; }

static void ll_jpeg_destroy(ll_jpeg_dec *d) {
    if (d == NULL) return;
    if (d->created) jpeg_destroy_decompress(&d->cinfo);
    d->created = 0;
    ll_buf_free(&d->row);
    free(d->huff);
    d->huff = NULL;
}

/* NOTE [ Sample rows are cleared ]
 * libjpeg-turbo's SIMD kernels (colour conversion, upsampling, merged upsampling) work on
 * whole vectors: at the end of a row they read the samples past the last one the IDCT wrote,
 * in the padding to which alloc_sarray rounds every row (64 samples with SIMD), and, in a
 * cropped decode, past the columns of the crop. Those lanes are computed and never stored:
 * decoding every 333x251 and 640x480 image of tests/kernels/test_fast_decode.py (fast, at each
 * scale, whole and with the test's four crops) gave the same bytes with SIMD off
 * (JSIMD_FORCENONE=1), at SSE2 and at AVX2, and with glibc's MALLOC_PERTURB_ filling
 * libjpeg's fresh blocks with 85, 170, 1 (AVX2) and 17 (SSE2). But valgrind's definedness
 * tracking of those vector instructions is coarser than one lane: it marked the green channel
 * of the last two pixels of every row undefined (a 42-pixel row at 1/8 scale, 4:4:4 and
 * 4:2:0 alike, in fast decodes), so `make memcheck` failed on pixels that were never in doubt,
 * and would have hidden one that was. So every sample array libjpeg allocates for a decode
 * comes cleared, padding included: the uninitialised reads are gone at their source, whatever
 * a SIMD kernel or a later libjpeg does with them, and a decode's pixels cannot depend on what
 * the previous image left in reused memory. The cost is one memset of the main and upsampling
 * buffers per image (a few row groups: 137,728 bytes in 5 arrays for a 4000x3000 4:2:0 image,
 * 21,760 for 640x480); decodes timed alternately with and without it differed by less than
 * the noise (19.49 against 19.51 ms, 0.656 against 0.664 ms). The row pitch is read from the
 * rows' addresses (alloc_sarray lays the rows of a chunk one after another), so a single row
 * is allocated as two: at 1/8 scale the main buffer of a 4:4:4 image has one row per
 * component, and its padding was what valgrind still saw when only the requested width was
 * cleared. */
static JSAMPARRAY ll_jpeg_alloc_sarray(j_common_ptr cinfo, int pool_id, JDIMENSION samplesperrow,
                                       JDIMENSION numrows) {
    ll_jpeg_dec *d = (ll_jpeg_dec *)cinfo; /* cinfo is the first member of ll_jpeg_dec */
    /* two rows at least, so that the pitch can be read (one unused row for a single-row array) */
    JSAMPARRAY rows = d->lib_alloc_sarray(cinfo, pool_id, samplesperrow, numrows < 2 ? 2 : numrows);
    size_t span = (size_t)samplesperrow * sizeof(JSAMPLE);
    if (rows[1] > rows[0]) {
        size_t pitch = (size_t)(rows[1] - rows[0]) * sizeof(JSAMPLE);
        if (pitch >= span && pitch - span < 256) span = pitch; /* libjpeg-turbo's rounding, never more */
    }
    for (JDIMENSION r = 0; r < numrows; r++) memset(rows[r], 0, span);
    return rows;
}

/* jpeg_create_decompress, with the sample arrays of NOTE [ Sample rows are cleared ]. */
static void ll_jpeg_new(ll_jpeg_dec *d) {
    jpeg_create_decompress(&d->cinfo);
    d->lib_alloc_sarray = d->cinfo.mem->alloc_sarray;
    d->cinfo.mem->alloc_sarray = ll_jpeg_alloc_sarray;
}

/* Returns LL_OK, or LL_ERR_NOMEM when libjpeg could not allocate its state. */
static int ll_jpeg_create(ll_jpeg_dec *d) {
    memset(d, 0, sizeof(*d));
    d->cinfo.err = jpeg_std_error(&d->err.pub);
    d->err.pub.error_exit = ll_jpeg_error_exit;
    d->err.pub.emit_message = ll_jpeg_emit_message;
    d->err.pub.output_message = ll_jpeg_output_message;
    if (setjmp(d->err.jb)) return LL_ERR_NOMEM;
    ll_jpeg_new(d);
    d->created = 1;
    return LL_OK;
}

static int ll_jpeg_subsampling(const struct jpeg_decompress_struct *c) {
    if (c->num_components == 1) return 0;
    if (c->num_components != 3) return -1;
    const jpeg_component_info *k = c->comp_info;
    if (k[1].h_samp_factor != 1 || k[1].v_samp_factor != 1 || k[2].h_samp_factor != 1 ||
        k[2].v_samp_factor != 1)
        return -1;
    int h = k[0].h_samp_factor, v = k[0].v_samp_factor;
    if (h == 1 && v == 1) return 444;
    if (h == 2 && v == 1) return 422;
    if (h == 2 && v == 2) return 420;
    if (h == 1 && v == 2) return 440;
    if (h == 4 && v == 1) return 411;
    if (h == 4 && v == 2) return 410;
    return -1;
}

/* NOTE [ Tables end with their image ]
 * libjpeg keeps Huffman and quantization tables in its decompressor from one image to the
 * next, for abbreviated datastreams that define them once. A decoder reused across a
 * dataset's files then decodes a file that lacks a table it uses (damaged, or cut from a
 * stream) with the table of whichever file the same thread decoded before: the pixels,
 * warnings and errors of one file depended on another (differential fuzzing of the
 * progressive decoder found it: the same damaged file failed with "Huffman table 0x00 was
 * not defined" on a fresh decoder and decoded with warnings after another image). Every file
 * must decode as on a fresh decoder, so each header starts with no tables: the pointers are
 * cleared (libjpeg then defines the tables the file has, installs its standard Huffman
 * tables where a file has none, as for Motion-JPEG frames, and fails on a missing
 * quantization table). The tables a file defines are allocated in libjpeg's permanent pool,
 * so the decompressor is created again every LL_JPEG_RENEW headers, which bounds that memory
 * (a few KB an image) at a negligible cost. */
#define LL_JPEG_RENEW 64

/* Called with d->err.jb set (jpeg_create_decompress fails only when out of memory). */
static void ll_jpeg_forget_tables(ll_jpeg_dec *d) {
    struct jpeg_decompress_struct *c = &d->cinfo;
    if (++d->headers >= LL_JPEG_RENEW) {
        d->headers = 0;
        jpeg_destroy_decompress(c); /* keeps c->err and c->client_data */
        d->created = 0;
        ll_jpeg_new(d);
        d->created = 1;
        return; /* a new decompressor has no tables */
    }
    for (int i = 0; i < NUM_QUANT_TBLS; i++) c->quant_tbl_ptrs[i] = NULL;
    for (int i = 0; i < NUM_HUFF_TBLS; i++) c->dc_huff_tbl_ptrs[i] = c->ac_huff_tbl_ptrs[i] = NULL;
}

/* Parses the headers of buf[0:size] (never reads outside it). On LL_OK, info is filled
 * and the decoder is ready for ll_jpeg_decode on the same buffer. */
static int ll_jpeg_header(ll_jpeg_dec *d, const unsigned char *buf, size_t size, ll_jpeg_info *info) {
    struct jpeg_decompress_struct *c = &d->cinfo;
    d->have_header = 0;
    d->err.nwarn = 0;
    d->err.truncated = 0;
    d->err.eof_warnings = 0;
    d->err.hit_marker = 0;
    d->err.msg[0] = 0;
    d->err.warn[0] = 0;
    d->err.warn_other[0] = 0;
    if (size == 0 || buf == NULL) return LL_ERR_EMPTY;
    if (size < 3 || buf[0] != 0xFF || buf[1] != 0xD8 || buf[2] != 0xFF) return LL_ERR_NOT_JPEG;
    if (setjmp(d->err.jb)) {
        jpeg_abort_decompress(c);
        return LL_ERR_DECODE;
    }
    jpeg_abort_decompress(c);
    ll_jpeg_forget_tables(d);
    d->src = buf;
    d->src_size = size;
    jpeg_mem_src(c, buf, (unsigned long)size);
    jpeg_read_header(c, TRUE);
    info->width = (int)c->image_width;
    info->height = (int)c->image_height;
    info->components = c->num_components;
    info->color_space = (int)c->jpeg_color_space;
    info->subsampling = ll_jpeg_subsampling(c);
    info->progressive = c->progressive_mode ? 1 : 0;
    info->arithmetic = c->arith_code ? 1 : 0;
    info->precision = c->data_precision;
    info->adobe = c->saw_Adobe_marker ? 1 : 0;
    info->imcu_w = 8 * (c->num_components == 1 ? 1 : c->max_h_samp_factor);
    info->imcu_h = 8 * (c->num_components == 1 ? 1 : c->max_v_samp_factor);
    d->have_header = 1;
    return LL_OK;
}

static inline int ll_ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

/* The output region for a decode at 1/denom scale of the crop box (cx, cy, cw, ch) given
 * in full-resolution pixels (cw <= 0: the whole image). The region, in scaled pixels, is
 * [floor(cx/denom), ceil((cx+cw)/denom)) x [floor(cy/denom), ceil((cy+ch)/denom)), which
 * is exactly the slice of a full decode at that scale that covers the box. */
static int ll_jpeg_region(const ll_jpeg_info *info, int denom, int cx, int cy, int cw, int ch,
                          int *x0, int *y0, int *w, int *h) {
    int sw = ll_ceil_div(info->width, denom), sh = ll_ceil_div(info->height, denom);
    if (cw <= 0 || ch <= 0) {
        *x0 = 0; *y0 = 0; *w = sw; *h = sh;
        return LL_OK;
    }
    if (cx < 0 || cy < 0 || (long)cx + cw > info->width || (long)cy + ch > info->height)
        return LL_ERR_CROP;
    *x0 = cx / denom;
    *y0 = cy / denom;
    *w = ll_ceil_div((long)cx + cw, denom) - *x0;
    *h = ll_ceil_div((long)cy + ch, denom) - *y0;
    return LL_OK;
}

/* CMYK (as stored by Adobe: inverted) to RGB/BGR/GRAY, the conversion OpenCV uses. */
static void ll_cmyk_row(const unsigned char *src, unsigned char *dst, int n, int mode) {
    for (int i = 0; i < n; i++, src += 4) {
        int k = src[3];
        int c = k - ((255 - src[0]) * k >> 8);
        int m = k - ((255 - src[1]) * k >> 8);
        int y = k - ((255 - src[2]) * k >> 8);
        if (mode == LL_MODE_RGB) {
            dst[0] = (unsigned char)c; dst[1] = (unsigned char)m; dst[2] = (unsigned char)y; dst += 3;
        } else if (mode == LL_MODE_BGR) {
            dst[0] = (unsigned char)y; dst[1] = (unsigned char)m; dst[2] = (unsigned char)c; dst += 3;
        } else { /* ITU-R BT.601 luma in 14-bit fixed point, rounded */
            *dst++ = (unsigned char)((c * 4899 + m * 9617 + y * 1868 + (1 << 13)) >> 14);
        }
    }
}

/* Decodes the region (x0, y0, w, h) -- in scaled pixels, as given by ll_jpeg_region -- of
 * the image whose header was just read, at scale 1/denom (1, 2, 4 or 8), into out
 * (h rows of w*channels bytes, row stride out_stride). Must follow ll_jpeg_header on the
 * same buffer. Returns LL_OK, LL_WARNED (libjpeg recovered from corrupt data; in strict
 * mode LL_ERR_STRICT instead), or an error code.
 *
 * NOTE [ Exact crop decode ]
 * Decoding only a region (jpeg_crop_scanline + jpeg_skip_scanlines) would change pixels
 * at the region's edges: the fancy (smooth) chroma upsampler treats the region's borders
 * as image borders, and a skip loses the context row above. Each reaches one output pixel:
 * the upsampler blends a chroma sample with its one neighbour on each side (h2v1, h2v2; the
 * other ratios replicate, and at reduced DCT scales libjpeg scales chroma in the IDCT
 * instead), and after a skip only the first row of the iMCU row it lands in lacks the row
 * above. So the decoded area reaches LL_CROP_CONTEXT output pixels past the region on the
 * left, the right and the top (clipped to the image; jpeg_crop_scanline then moves its left
 * edge to an iMCU boundary), and they are dropped: the result is bitwise equal to slicing a
 * full decode at the same scale, for every subsampling
 * (tests/kernels/test_decode.py sweeps the region's edges over two iMCUs of offsets; with no
 * context pixels it fails for 4:2:0 and 4:2:2, with one it passes). This used to be a whole
 * iMCU on each side and above: under callgrind, 320 items of the float ResNet-50 chain on
 * the ImageNet-like photos ran 0.9% fewer instructions with the narrower margin (libjpeg's
 * scanline reading and skipping 1.5% fewer).
 *
 * NOTE [ Fast decode ]
 * fast != 0 trades exactness for speed, as tf.data's dct_method="INTEGER_FAST" with
 * fancy_upscaling=False: libjpeg's fast integer IDCT (JDCT_IFAST, 8-bit multipliers, less
 * accurate rounding) and merged (non-fancy) chroma upsampling, where each chroma sample is
 * replicated over its 2x1 or 2x2 luma pixels and colour conversion is fused with the
 * upsampling. The result is no longer OpenCV's; its measured error against the exact decode
 * is stated in loaderlib.decoding.decode. At a reduced DCT scale libjpeg uses its scaled
 * IDCTs whatever dct_method says, so there only the upsampling changes. The crop margins
 * of NOTE [ Exact crop decode ] are kept: a crop stays bitwise equal to slicing a full
 * fast decode at the same scale. */
/* NOTE [ Decoding in place ]
 * With ``wide`` (ll_jpeg_decode_wide), the rows are not cut to the region: libjpeg writes
 * each row of its cropped output (the region plus the iMCU margins of NOTE [ Exact crop
 * decode ], up to the image's edges) straight into the caller's buffer, which it grows to
 * h rows of that width, and the region starts at column *wide_col of each row of
 * *wide_stride bytes. A reader that only needs the region's pixels (the fused chain's
 * resampling) then skips the copy of every row out of libjpeg's buffer, which cost a
 * memory pass over the region. CMYK rows need converting, so they are cut as before
 * (column 0, stride w * channels). */
/* NOTE [ Block smoothing needs two iMCUs on the left ]
 * A progressive JPEG whose scans leave some low AC coefficients unrefined (a valid file with a
 * short scan script, or a truncated one decoded with strict=False) is decoded with libjpeg's
 * inter-block smoothing (do_block_smoothing, on as in OpenCV): each block's missing
 * coefficients are estimated from the DC values of a 5x5 window of blocks around it (in the
 * libjpeg-turbo 2.1.5 and 3.1.3 sources). After jpeg_crop_scanline, decompress_smooth_data
 * starts its window at the crop's first block column and replicates that block's DC for the
 * two columns left of it, where a full decode has the real neighbours: the first two block
 * columns of every component are smoothed differently, up to 2 * 8 / denom pixels of the
 * coarsest component (two iMCUs) from the crop's left edge, a few levels in the pixels (the
 * fuzzing finding fuzz/corpus/native-chain3-fused-differs.jpg: a fused chain on a 32x24 4:2:0
 * progressive image differed from the same chain on its full decode by up to 3 levels). The
 * right edge, the rows above and below read the real neighbours from the whole-image
 * coefficient array. So on a progressive image the crop starts two iMCUs (2 *
 * max_h_samp_factor * 8 / denom pixels) further left than LL_CROP_CONTEXT alone asks, and
 * those columns are dropped with the margin: the crop stays the slice of a full decode
 * (tests/kernels/test_progressive.py: files whose AC scans are never refined, against OpenCV,
 * and a truncated file kept with strict=False). A baseline image has every coefficient and is
 * never smoothed; the wider margin costs a progressive crop little, since its entropy decoding
 * covers the whole image anyway. */
#define LL_CROP_CONTEXT 2 /* NOTE [ Exact crop decode ] */
#define LL_HUFF_BAILED (-1000) /* internal: decode again with libjpeg's Huffman decoder */

static int ll_jpeg_decode_pass(ll_jpeg_dec *d, int mode, int denom, int x0, int y0, int w, int h,
                               unsigned char *out, ptrdiff_t out_stride, int strict, int fast, ll_buf *wide,
                               ptrdiff_t *wide_stride, int *wide_col, int huff) {
    struct jpeg_decompress_struct *c = &d->cinfo;
    if (!d->have_header) return LL_ERR_STATE;
    d->have_header = 0;
    if (setjmp(d->err.jb)) {
        c->progress = NULL;
        jpeg_abort_decompress(c);
        if (d->huff != NULL && d->huff->bailed) return LL_HUFF_BAILED;
        return LL_ERR_DECODE;
    }
    int cmyk = (c->jpeg_color_space == JCS_CMYK || c->jpeg_color_space == JCS_YCCK);
    int nch = (mode == LL_MODE_GRAY) ? 1 : 3;
    if (cmyk) {
        c->out_color_space = JCS_CMYK;
    } else if (c->num_components != 1 && c->num_components != 3) {
        jpeg_abort_decompress(c);
        snprintf(d->err.msg, sizeof(d->err.msg), "unsupported JPEG with %d components", c->num_components);
        return LL_ERR_UNSUPPORTED;
    } else {
        c->out_color_space = mode == LL_MODE_GRAY ? JCS_GRAYSCALE : (mode == LL_MODE_BGR ? JCS_EXT_BGR : JCS_EXT_RGB);
    }
    c->scale_num = 1;
    c->scale_denom = (unsigned int)denom;
    c->dct_method = fast ? JDCT_IFAST : JDCT_ISLOW; /* NOTE [ Fast decode ] */
    c->do_fancy_upsampling = fast ? FALSE : TRUE;
    c->do_block_smoothing = TRUE;
    if (huff && c->progressive_mode) { /* NOTE [ Progressive scans ] in ll_phuff.h */
        if (d->huff == NULL) d->huff = (ll_huff *)calloc(1, sizeof(ll_huff));
        if (d->huff != NULL) ll_phuff_hook(c, d->huff, &d->err.jb);
    }
    /* NOTE [ Merged upsampling leaves cconvert stale ]
     * With do_fancy_upsampling off (fast=True) on a 4:2:0 or 4:2:2 image, libjpeg-turbo's
     * merged upsampler converts colours itself and jpeg_start_decompress leaves
     * cinfo->cconvert as it was: NULL on a fresh decompressor, but on ours, reused from image
     * to image, a pointer into the previous image's pool, which jpeg_abort_decompress has
     * freed. jpeg_skip_scanlines (read_and_discard_scanlines, in 2.1 and 3.0) tests cconvert
     * for NULL only, then reads its color_convert and writes a no-op there until the skip is
     * done: a read and two writes of freed memory, which by then may hold this image's
     * tables. That crashed a test run once in many (SIGSEGV in a kernel thread); valgrind
     * shows it on every fast crop. Cleared here, cconvert is set again by the converter that
     * uses it and stays NULL under the merged upsampler. tests/kernels/decoder_reuse.c
     * decodes through an allocator that makes freed memory inaccessible. */
    c->cconvert = NULL;
    c->cquantize = NULL; /* tested the same way; never set here (no colour quantisation) */
    jpeg_start_decompress(c);
    c->progress = NULL;
    int ours = 0; /* our baseline decoder runs this image */
    if (huff) { /* NOTE [ Our Huffman decoder ] */
        if (d->huff == NULL) d->huff = (ll_huff *)calloc(1, sizeof(ll_huff));
        if (d->huff != NULL) ours = ll_huff_install(c, d->huff, &d->err.jb);
    }

    int full_w = (int)c->output_width, full_h = (int)c->output_height;
    if (x0 < 0 || y0 < 0 || w <= 0 || h <= 0 || x0 + w > full_w || y0 + h > full_h) {
        jpeg_abort_decompress(c);
        return LL_ERR_SHAPE;
    }
    int in_ch = c->output_components; /* 1, 3 or 4 (CMYK) */

    JDIMENSION xoff = 0, xw = (JDIMENSION)full_w;
    if (w < full_w) {
        int left = LL_CROP_CONTEXT;
        /* NOTE [ Block smoothing needs two iMCUs on the left ] */
        if (c->progressive_mode && c->do_block_smoothing) left += 2 * c->max_h_samp_factor * (DCTSIZE / denom);
        int xs = x0 - left < 0 ? 0 : x0 - left;
        int xe = x0 + w + LL_CROP_CONTEXT > full_w ? full_w : x0 + w + LL_CROP_CONTEXT;
        xoff = (JDIMENSION)xs;
        xw = (JDIMENSION)(xe - xs);
        jpeg_crop_scanline(c, &xoff, &xw); /* moves xoff left to an iMCU boundary */
        if (ours) ll_huff_keep_columns(c, d->huff, xoff, xw); /* NOTE [ Columns nobody reads ] */
    }
    int skip_cols = x0 - (int)xoff;
    if (wide != NULL) { /* NOTE [ Decoding in place ] */
        ptrdiff_t stride = cmyk ? (ptrdiff_t)w * nch : (ptrdiff_t)c->output_width * nch;
        if (ll_buf_reserve(wide, (size_t)stride * (size_t)h + 16) != 0) {
            jpeg_abort_decompress(c);
            return LL_ERR_NOMEM;
        }
        out = wide->p;
        out_stride = stride;
        *wide_stride = stride;
        *wide_col = cmyk ? 0 : skip_cols;
    }
    int direct = !cmyk && ((xoff == 0 && (int)c->output_width == w) || wide != NULL);
    if (!direct && ll_buf_reserve(&d->row, (size_t)c->output_width * (size_t)in_ch) != 0) {
        jpeg_abort_decompress(c);
        return LL_ERR_NOMEM;
    }
    int ys = y0 - LL_CROP_CONTEXT < 0 ? 0 : y0 - LL_CROP_CONTEXT;
    if (ys > 0) jpeg_skip_scanlines(c, (JDIMENSION)ys);
    while ((int)c->output_scanline < y0) { /* the margin rows: decoded for context, dropped */
        JSAMPROW row = d->row.p;
        if (direct) row = out; /* full-width rows: output row 0 is free until y0 */
        if (jpeg_read_scanlines(c, &row, 1) != 1) goto stalled;
    }
    while ((int)c->output_scanline < y0 + h) {
        int r = (int)c->output_scanline - y0;
        unsigned char *dst = out + (ptrdiff_t)r * out_stride;
        if (direct) {
            JSAMPROW rows[4];
            int n = 0;
            while (n < 4 && r + n < h) { rows[n] = dst + (ptrdiff_t)n * out_stride; n++; }
            if (jpeg_read_scanlines(c, rows, (JDIMENSION)n) == 0) goto stalled;
        } else {
            JSAMPROW row = d->row.p;
            if (jpeg_read_scanlines(c, &row, 1) != 1) goto stalled;
            const unsigned char *src = d->row.p + (size_t)skip_cols * in_ch;
            if (cmyk) ll_cmyk_row(src, dst, w, mode);
            else memcpy(dst, src, (size_t)w * nch);
        }
    }
    if (d->err.truncated && !d->err.hit_marker && !c->arith_code) {
        /* NOTE [ A missing EOI is not a truncation ]
         * libjpeg's Huffman bit reader reads ahead of the bits it decodes. On data that has
         * every bit of the image but no EOI marker after it (cut right after the last scan
         * byte, or trailing garbage in place of the marker), that read-ahead runs off the end,
         * and the memory source warns "Premature end of JPEG file" although no pixel is
         * missing; loaderlib's Huffman decoder (ll_huff.h) reads ahead less and finished such
         * files without a word. The two decoders must not disagree (differential fuzzing found
         * 24 such files in 200,000 mutated ones, all with complete pixels), and the right
         * outcome is the complete image: data is missing only when the entropy decoder needed
         * bits after the end, which libjpeg reports as JWRN_HIT_MARKER (it then pads with
         * zeros, the grey of a truncated image). So an end of data without it is no warning
         * and no truncation. Arithmetic decoding pads without that warning, so there the end
         * of data still counts as a truncation. */
        d->err.nwarn -= d->err.eof_warnings;
        d->err.truncated = 0;
        if (d->err.nwarn > 0) memcpy(d->err.warn, d->err.warn_other, sizeof(d->err.warn));
    }
    jpeg_abort_decompress(c); /* cheaper than finish_decompress, and allowed mid-image */
    if (d->err.nwarn > 0) {
        if (strict == LL_STRICT_ALL) return LL_ERR_STRICT;
        if (d->err.truncated && strict == LL_STRICT_TRUNCATED) { /* NOTE [ Truncated JPEG is an error ] */
            snprintf(d->err.msg, sizeof(d->err.msg),
                     "truncated: the data ends before the image (%s); pass strict=False to keep partial images",
                     d->err.warn);
            return LL_ERR_DECODE;
        }
        return LL_WARNED;
    }
    return LL_OK;
stalled: /* cannot happen with a memory source; never loop forever if it does */
    snprintf(d->err.msg, sizeof(d->err.msg), "decoder stopped at scanline %u", c->output_scanline);
    jpeg_abort_decompress(c);
    return LL_ERR_DECODE;
}

/* Decodes with our Huffman decoder where it applies, and again from the header with
 * libjpeg's wherever it stopped (NOTE [ Our Huffman decoder ]). */
static int ll_jpeg_decode_impl(ll_jpeg_dec *d, int mode, int denom, int x0, int y0, int w, int h,
                               unsigned char *out, ptrdiff_t out_stride, int strict, int fast, ll_buf *wide,
                               ptrdiff_t *wide_stride, int *wide_col) {
    int st = ll_jpeg_decode_pass(d, mode, denom, x0, y0, w, h, out, out_stride, strict, fast, wide, wide_stride,
                                 wide_col, ll_huff_enabled());
    if (st != LL_HUFF_BAILED) return st;
    d->huff->bailed = 0; /* it stays 0 outside a hand-back, so a libjpeg error is never taken for one */
    ll_jpeg_info info;   /* the header is read again (and warns again, its warnings cleared first) */
    st = ll_jpeg_header(d, d->src, d->src_size, &info);
    if (st != LL_OK) return st;
    return ll_jpeg_decode_pass(d, mode, denom, x0, y0, w, h, out, out_stride, strict, fast, wide, wide_stride,
                               wide_col, 0);
}

static int ll_jpeg_decode(ll_jpeg_dec *d, int mode, int denom, int x0, int y0, int w, int h,
                          unsigned char *out, ptrdiff_t out_stride, int strict, int fast) {
    return ll_jpeg_decode_impl(d, mode, denom, x0, y0, w, h, out, out_stride, strict, fast, NULL, NULL, NULL);
}

/* The region decoded in place (NOTE [ Decoding in place ]): into *buf, grown as needed; the
 * region's pixel (0, 0) is at buf->p + *col * channels, rows *stride bytes apart. */
static int ll_jpeg_decode_wide(ll_jpeg_dec *d, int mode, int denom, int x0, int y0, int w, int h, ll_buf *buf,
                               ptrdiff_t *stride, int *col, int strict, int fast) {
    return ll_jpeg_decode_impl(d, mode, denom, x0, y0, w, h, NULL, 0, strict, fast, buf, stride, col);
}

static void ll_copy_msg(char *dst, const char *src) {
    if (dst == NULL) return;
    strncpy(dst, src, LL_MSG_LEN - 1);
    dst[LL_MSG_LEN - 1] = 0;
}

/* The reason for status st of the last ll_jpeg_decode on d: libjpeg's first warning for
 * LL_WARNED / LL_ERR_STRICT, its fatal message otherwise. Writes nothing for LL_OK. */
static void ll_jpeg_status_msg(const ll_jpeg_dec *d, int st, char *msg) {
    if (st == LL_WARNED || st == LL_ERR_STRICT) ll_copy_msg(msg, d->err.warn);
    else if (st != LL_OK) ll_copy_msg(msg, d->err.msg[0] ? d->err.msg : ll_status_message(st));
}

/* NOTE [ Coefficient memory budget ]
 * A baseline (single-scan) JPEG decodes one iMCU row at a time, but a progressive or
 * multi-scan one makes libjpeg keep every DCT coefficient of the whole image (2 bytes x 64
 * per 8x8 block, per component, rounded up to whole iMCUs), allocated at
 * jpeg_start_decompress whatever the output scale or crop: a 16 KB progressive file
 * declaring 13000x13000 costs 515 MB per decode even for a 64x64 crop at 1/8. The header
 * gives that size exactly, so such an image is refused before any allocation when it
 * exceeds 1.5 bytes per pixel of max_pixels: with the default max_pixels (2 x Pillow's
 * 89,478,485) that is 256 MiB, which admits 4:2:0 progressive images up to Pillow's
 * 89.5 megapixels (3 bytes per pixel), 4:4:4 ones up to 44.7 and grayscale up to 134.
 * Raising max_pixels raises the budget; max_pixels=None disables both guards. */

/* Bytes of the whole-image coefficient buffer this image needs (0 for single-scan images,
 * which need none). Valid after ll_jpeg_header. */
static long long ll_jpeg_coef_bytes(ll_jpeg_dec *d) {
    struct jpeg_decompress_struct *c = &d->cinfo;
    if (!c->progressive_mode && c->comps_in_scan >= c->num_components) return 0;
    long long total = 0;
    for (int ci = 0; ci < c->num_components; ci++) {
        const jpeg_component_info *k = &c->comp_info[ci];
        long long bw = k->width_in_blocks, bh = k->height_in_blocks;
        long long hs = k->h_samp_factor > 0 ? k->h_samp_factor : 1, vs = k->v_samp_factor > 0 ? k->v_samp_factor : 1;
        bw = (bw + hs - 1) / hs * hs;
        bh = (bh + vs - 1) / vs * vs;
        total += bw * bh * (long long)sizeof(JBLOCK);
    }
    return total;
}

static inline long long ll_jpeg_coef_budget(long long max_pixels) { return max_pixels + max_pixels / 2; }

/* Header phase of one item: parse, apply the max_pixels guard, and compute the output
 * shape (*oh, *ow, *oc) of a decode with these parameters; a progressive image whose
 * coefficients exceed the budget is refused too (NOTE [ Coefficient memory budget ]).
 * msg (LL_MSG_LEN bytes) gets the reason for any non-zero code. */
static int ll_jpeg_plan_item(ll_jpeg_dec *d, const unsigned char *buf, size_t size, int mode, int denom,
                             int cx, int cy, int cw, int ch, long long max_pixels, ll_jpeg_info *info,
                             int *x0, int *y0, int *oh, int *ow, int *oc, char *msg) {
    int st = ll_jpeg_header(d, buf, size, info);
    if (st == LL_ERR_DECODE) { ll_copy_msg(msg, d->err.msg); return st; }
    if (st == LL_ERR_EMPTY || st == LL_ERR_NOT_JPEG) { ll_copy_msg(msg, ll_status_message(st)); return st; }
    if (max_pixels > 0 && (long long)info->width * (long long)info->height > max_pixels) {
        d->have_header = 0;
        if (msg) snprintf(msg, LL_MSG_LEN, "image declares %dx%d = %lld pixels, more than max_pixels=%lld "
                          "(decompression bomb guard)", info->width, info->height,
                          (long long)info->width * info->height, max_pixels);
        return LL_ERR_TOO_LARGE;
    }
    long long coef = ll_jpeg_coef_bytes(d);
    if (max_pixels > 0 && coef > ll_jpeg_coef_budget(max_pixels)) { /* NOTE [ Coefficient memory budget ] */
        d->have_header = 0;
        if (msg) snprintf(msg, LL_MSG_LEN, "%s JPEG of %dx%d needs %.1f MB of coefficients at any scale or crop, "
                          "over the budget of %.1f MB (1.5 B/pixel of max_pixels); raise max_pixels to %lld or "
                          "pass None", info->progressive ? "progressive" : "multi-scan", info->width, info->height,
                          coef / 1e6, ll_jpeg_coef_budget(max_pixels) / 1e6, (coef * 2 + 2) / 3);
        return LL_ERR_TOO_LARGE;
    }
    st = ll_jpeg_region(info, denom, cx, cy, cw, ch, x0, y0, ow, oh);
    if (st != LL_OK) {
        d->have_header = 0;
        if (msg) snprintf(msg, LL_MSG_LEN, "crop box (x=%d, y=%d, w=%d, h=%d) is outside the %dx%d image",
                          cx, cy, cw, ch, info->width, info->height);
        return st;
    }
    *oc = (mode == LL_MODE_GRAY) ? 1 : 3;
    return LL_OK;
}

/* One item, bytes to pixels, into out (out_h x out_w x out_c, row stride out_stride), which
 * must have exactly the planned shape; fast: NOTE [ Fast decode ]. Thread-safe for distinct
 * decoders. */
static int ll_jpeg_decode_item(ll_jpeg_dec *d, const unsigned char *buf, size_t size, int mode, int denom,
                               int cx, int cy, int cw, int ch, long long max_pixels, int strict,
                               unsigned char *out, ptrdiff_t out_stride, int out_h, int out_w, int out_c,
                               char *msg, int fast) {
    ll_jpeg_info info;
    int x0, y0, oh, ow, oc;
    int st = ll_jpeg_plan_item(d, buf, size, mode, denom, cx, cy, cw, ch, max_pixels, &info, &x0, &y0, &oh, &ow,
                               &oc, msg);
    if (st != LL_OK) return st;
    if (oh != out_h || ow != out_w || oc != out_c) {
        d->have_header = 0;
        if (msg) snprintf(msg, LL_MSG_LEN, "output buffer is %dx%dx%d but the decoded image is %dx%dx%d",
                          out_h, out_w, out_c, oh, ow, oc);
        return LL_ERR_SHAPE;
    }
    st = ll_jpeg_decode(d, mode, denom, x0, y0, ow, oh, out, out_stride, strict, fast);
    ll_jpeg_status_msg(d, st, msg);
    return st;
}

/* NOTE [ The encoder ]
 * ``pack`` re-encodes resized images with libjpeg's compressor, guarded as the decoder is
 * (NOTE [ Why libjpeg is wrapped in C ]): a fatal error longjmps back into ll_jpeg_encode,
 * which aborts the compressor (it stays reusable) and returns LL_ERR_DECODE with libjpeg's
 * message. The output goes to a destination manager over an ll_buf that grows by doubling
 * (NOTE [ Scratch grows to fit ]), so nothing is allocated per image once it has grown and a
 * failed encode leaks nothing (libjpeg's own jpeg_mem_dest allocates a buffer of its own
 * when it grows, which an abort would leak). Settings: baseline (sequential, not
 * progressive: loaderlib's Huffman decoder takes baseline files), ISLOW DCT, optimised
 * Huffman tables (smaller files, fewer bits for the entropy decoder the loader spends most
 * of its time in: NOTE [ Our Huffman decoder ] in ll_huff.h), 4:2:0 chroma for colour
 * (libjpeg's default, as cv2.imencode and PIL's), a JFIF header, and one application
 * segment given by the caller right after it. One ll_jpeg_enc serves one thread at a time. */
typedef struct {
    struct jpeg_destination_mgr pub;
    ll_buf *buf;
    size_t len;
} ll_jpeg_dest;

typedef struct {
    struct jpeg_compress_struct cinfo;
    ll_jpeg_err err;
    ll_jpeg_dest dest;
    int created;
} ll_jpeg_enc;

static void ll_jpeg_dest_init(j_compress_ptr c) {
    ll_jpeg_dest *d = (ll_jpeg_dest *)c->dest;
    if (ll_buf_reserve(d->buf, 16384) != 0) ERREXIT(c, JERR_OUT_OF_MEMORY);
    d->pub.next_output_byte = d->buf->p;
    d->pub.free_in_buffer = d->buf->cap;
    d->len = 0;
}

static boolean ll_jpeg_dest_grow(j_compress_ptr c) {
    ll_jpeg_dest *d = (ll_jpeg_dest *)c->dest;
    size_t used = d->buf->cap; /* libjpeg calls this when the whole buffer is full */
    if (used * 2 < used || ll_buf_reserve(d->buf, used * 2) != 0) ERREXIT(c, JERR_OUT_OF_MEMORY);
    d->pub.next_output_byte = d->buf->p + used;
    d->pub.free_in_buffer = d->buf->cap - used;
    return TRUE;
}

static void ll_jpeg_dest_term(j_compress_ptr c) {
    ll_jpeg_dest *d = (ll_jpeg_dest *)c->dest;
    d->len = (size_t)(d->pub.next_output_byte - d->buf->p);
}

/* Returns LL_OK, or LL_ERR_NOMEM when libjpeg could not allocate its state. */
static int ll_jpeg_enc_create(ll_jpeg_enc *e) {
    memset(e, 0, sizeof(*e));
    e->cinfo.err = jpeg_std_error(&e->err.pub);
    e->err.pub.error_exit = ll_jpeg_error_exit;
    e->err.pub.emit_message = ll_jpeg_emit_message;
    e->err.pub.output_message = ll_jpeg_output_message;
    if (setjmp(e->err.jb)) return LL_ERR_NOMEM;
    jpeg_create_compress(&e->cinfo);
    e->created = 1;
    e->dest.pub.init_destination = ll_jpeg_dest_init;
    e->dest.pub.empty_output_buffer = ll_jpeg_dest_grow;
    e->dest.pub.term_destination = ll_jpeg_dest_term;
    return LL_OK;
}

static void ll_jpeg_enc_destroy(ll_jpeg_enc *e) {
    if (e == NULL) return;
    if (e->created) jpeg_destroy_compress(&e->cinfo);
    e->created = 0;
}

/* Encodes h rows of w pixels of c channels (1: grayscale, 3: RGB), row stride ``stride``
 * bytes, at ``quality`` (1-100), into *out (grown as needed); *out_len gets the length.
 * ``app`` (app_len bytes, or NULL) is written as segment APP<app_marker> after the JFIF
 * header. msg (LL_MSG_LEN bytes) gets the reason for any non-zero code. NOTE [ The encoder ] */
static int ll_jpeg_encode(ll_jpeg_enc *e, const unsigned char *px, int h, int w, int c, ptrdiff_t stride,
                          int quality, int app_marker, const unsigned char *app, unsigned int app_len, ll_buf *out,
                          size_t *out_len, char *msg) {
    struct jpeg_compress_struct *ci = &e->cinfo;
    *out_len = 0;
    if (!e->created || px == NULL || out == NULL || h < 1 || w < 1 || h > JPEG_MAX_DIMENSION ||
        w > JPEG_MAX_DIMENSION || (c != 1 && c != 3) || quality < 1 || quality > 100 || app_len > 65533) {
        if (msg) snprintf(msg, LL_MSG_LEN, "cannot encode a %dx%dx%d image at quality %d", w, h, c, quality);
        return LL_ERR_SHAPE;
    }
    e->err.nwarn = 0;
    e->err.msg[0] = 0;
    e->dest.buf = out;
    if (setjmp(e->err.jb)) {
        jpeg_abort_compress(ci);
        if (msg) ll_copy_msg(msg, e->err.msg[0] ? e->err.msg : "the encoder failed");
        return LL_ERR_DECODE;
    }
    ci->dest = &e->dest.pub;
    ci->image_width = (JDIMENSION)w;
    ci->image_height = (JDIMENSION)h;
    ci->input_components = c;
    ci->in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(ci);
    jpeg_set_quality(ci, quality, TRUE);
    ci->optimize_coding = TRUE;
    ci->dct_method = JDCT_ISLOW;
    jpeg_start_compress(ci, TRUE);
    if (app != NULL && app_len > 0) jpeg_write_marker(ci, JPEG_APP0 + app_marker, app, app_len);
    while (ci->next_scanline < ci->image_height) {
        JSAMPROW row = (JSAMPROW)(px + (ptrdiff_t)ci->next_scanline * stride);
        if (jpeg_write_scanlines(ci, &row, 1) != 1) {
            jpeg_abort_compress(ci);
            if (msg) snprintf(msg, LL_MSG_LEN, "the encoder stopped at row %u", ci->next_scanline);
            return LL_ERR_DECODE;
        }
    }
    jpeg_finish_compress(ci);
    *out_len = e->dest.len;
    return LL_OK;
}

#endif
