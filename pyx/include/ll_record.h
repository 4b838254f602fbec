/* What a packed record carries besides its pixels: the raw record's header and the original
 * size of a re-encoded JPEG. Parsed by the fused chain (ll_chain.h) for every sample, written
 * by ``pack`` (ll_pack.h); loaderlib/_pack.py has the Python twin.
 *
 * NOTE [ Packed records ]
 * ``pack --max-side N`` stores an image whose longer side exceeds N at a smaller size, and
 * ``--raw-below P`` stores small images as pixels. Either way the record keeps the size of
 * the image it came from, the *original size*, so that the chain's geometry means what it
 * meant on the original (NOTE [ Original coordinates ] in ll_chain.h). Two record kinds:
 * - a JPEG re-encoded by pack starts, after SOI and the JFIF APP0 segment, with an APP9
 *   segment of 16 bytes: ``LLPACK\0``, a version byte (1), then the original width and
 *   height as big-endian uint32. Every JPEG reader skips it, so the record stays a plain
 *   JPEG file; a JPEG without it (a file kept as it was) is its own original.
 * - a raw record is a 32-byte header, then height x width x channels uint8 pixels (HWC,
 *   RGB or grayscale): the magic ``LLRAW\x01\0\0``, then little-endian uint32 height,
 *   width, channels (1 or 3), original height, original width and a zero word. The size
 *   must be exactly 32 + height * width * channels bytes.
 * Parsing never reads outside the buffer and refuses anything else (a bad raw header is a
 * decode error naming what is wrong); the original size must be 1 to LL_ORIG_MAX per side.
 */
#ifndef LL_RECORD_H
#define LL_RECORD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ll_common.h"

#define LL_RAW_HEADER 32
#define LL_PACK_APP 9 /* APP9 */
#define LL_PACK_APP_LEN 16
#define LL_ORIG_MAX (1 << 20)
static const unsigned char ll_raw_magic[8] = {'L', 'L', 'R', 'A', 'W', 1, 0, 0};
static const unsigned char ll_pack_tag[8] = {'L', 'L', 'P', 'A', 'C', 'K', 0, 1}; /* identifier + version */

typedef struct {
    int h, w, c;           /* the stored pixels */
    int orig_h, orig_w;    /* the original size (NOTE [ Packed records ]) */
} ll_raw_info;

static inline uint32_t ll_le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline void ll_put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static inline uint32_t ll_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Whether buf starts with the raw record magic (it may still be a bad record). */
static inline int ll_is_raw(const unsigned char *buf, size_t size) {
    return buf != NULL && size >= sizeof(ll_raw_magic) && memcmp(buf, ll_raw_magic, sizeof(ll_raw_magic)) == 0;
}

/* Parses a raw record's header: LL_OK with *ri filled, or LL_ERR_DECODE with the reason in
 * msg (LL_MSG_LEN bytes, may be NULL). Call only when ll_is_raw(buf, size). */
static int ll_raw_parse(const unsigned char *buf, size_t size, ll_raw_info *ri, char *msg) {
    if (size < LL_RAW_HEADER) {
        if (msg) snprintf(msg, LL_MSG_LEN, "raw record of %zu bytes is shorter than its %d-byte header", size,
                          LL_RAW_HEADER);
        return LL_ERR_DECODE;
    }
    uint32_t h = ll_le32(buf + 8), w = ll_le32(buf + 12), c = ll_le32(buf + 16);
    uint32_t oh = ll_le32(buf + 20), ow = ll_le32(buf + 24);
    if (h < 1 || w < 1 || h > LL_ORIG_MAX || w > LL_ORIG_MAX || (c != 1 && c != 3) || oh < 1 || ow < 1 ||
        oh > LL_ORIG_MAX || ow > LL_ORIG_MAX) {
        if (msg) snprintf(msg, LL_MSG_LEN, "raw record header is damaged (%ux%ux%u pixels, original %ux%u)", w, h,
                          c, ow, oh);
        return LL_ERR_DECODE;
    }
    unsigned long long need = (unsigned long long)h * w * c + LL_RAW_HEADER;
    if ((unsigned long long)size != need) {
        if (msg) snprintf(msg, LL_MSG_LEN, "raw record of %ux%ux%u pixels needs %llu bytes, has %zu (truncated?)", w,
                          h, c, need, size);
        return LL_ERR_DECODE;
    }
    ri->h = (int)h; ri->w = (int)w; ri->c = (int)c; ri->orig_h = (int)oh; ri->orig_w = (int)ow;
    return LL_OK;
}

/* Writes the raw header for h x w x c pixels of an original of orig_w x orig_h into hdr. */
static void ll_raw_header(unsigned char *hdr, int h, int w, int c, int orig_h, int orig_w) {
    memcpy(hdr, ll_raw_magic, sizeof(ll_raw_magic));
    ll_put_le32(hdr + 8, (uint32_t)h);
    ll_put_le32(hdr + 12, (uint32_t)w);
    ll_put_le32(hdr + 16, (uint32_t)c);
    ll_put_le32(hdr + 20, (uint32_t)orig_h);
    ll_put_le32(hdr + 24, (uint32_t)orig_w);
    ll_put_le32(hdr + 28, 0);
}

/* The payload of the APP9 segment for an original of orig_w x orig_h. */
static void ll_pack_app(unsigned char *app, int orig_w, int orig_h) {
    memcpy(app, ll_pack_tag, sizeof(ll_pack_tag));
    app[8] = (unsigned char)(orig_w >> 24); app[9] = (unsigned char)(orig_w >> 16);
    app[10] = (unsigned char)(orig_w >> 8); app[11] = (unsigned char)orig_w;
    app[12] = (unsigned char)(orig_h >> 24); app[13] = (unsigned char)(orig_h >> 16);
    app[14] = (unsigned char)(orig_h >> 8); app[15] = (unsigned char)orig_h;
}

/* The original size a re-encoded JPEG carries: 1 with *ow, *oh set, or 0 when buf has no
 * valid pack segment among its first application segments (walks at most 8 APPn/COM
 * segments after SOI, never past the buffer, stops at the first other marker). */
static int ll_pack_original(const unsigned char *buf, size_t size, int *ow, int *oh) {
    if (buf == NULL || size < 4 || buf[0] != 0xFF || buf[1] != 0xD8) return 0;
    size_t pos = 2;
    for (int k = 0; k < 8 && pos + 4 <= size; k++) {
        if (buf[pos] != 0xFF) return 0;
        unsigned m = buf[pos + 1];
        if (!((m >= 0xE0 && m <= 0xEF) || m == 0xFE)) return 0;
        size_t len = ((size_t)buf[pos + 2] << 8) | buf[pos + 3];
        if (len < 2 || pos + 2 + len > size) return 0;
        if (m == 0xE0 + LL_PACK_APP && len == 2 + LL_PACK_APP_LEN &&
            memcmp(buf + pos + 4, ll_pack_tag, sizeof(ll_pack_tag)) == 0) {
            uint32_t w = ll_be32(buf + pos + 12), h = ll_be32(buf + pos + 16);
            if (w < 1 || h < 1 || w > LL_ORIG_MAX || h > LL_ORIG_MAX) return 0;
            *ow = (int)w;
            *oh = (int)h;
            return 1;
        }
        pos += 2 + len;
    }
    return 0;
}

#endif
