/* Baseline Huffman decoding for libjpeg(-turbo)'s decompressor.
 *
 * NOTE [ Our Huffman decoder ]
 * Entropy decoding is most of a decode (about 70% of libjpeg's time in the training chain,
 * by benchmarks/cpu_split.py's profile), and no crop or DCT scale skips it. libjpeg lets
 * the entropy decoder be replaced: after jpeg_start_decompress, cinfo->entropy->decode_mcu
 * is called once per MCU with blocks the caller has zeroed (or NULL: decode and discard,
 * as jpeg_skip_scanlines does), and everything after it (dequantisation, IDCT, upsampling,
 * colour conversion, cropping) stays libjpeg's. For a baseline 8-bit Huffman image whose
 * one scan holds every component, ll_huff_install puts ll_huff_decode_mcu there. It
 * decodes the same coefficients faster:
 *   - one table lookup of the next LL_HB bits gives an AC coefficient's run, value and total
 *     length together when its code and extra bits fit in LL_HB bits (most of them), where
 *     libjpeg looks up the code and then reads and sign-extends the extra bits, and gives two
 *     coefficients when both fit (NOTE [ Two symbols a lookup ]);
 *   - the refill comes after a count of symbols, not a test of the bits left (NOTE [ Refill
 *     by count ]);
 *   - the bit buffer is refilled eight bytes at a time when none of them is 0xFF;
 *   - the tables are rebuilt only when an image's Huffman tables differ from the previous
 *     image's (most files of a dataset share their encoder's tables).
 * Entropy decoding is lossless, so on valid data the coefficients are libjpeg's and the
 * pixels are bitwise the same. On anything else libjpeg treats specially -- data that
 * ends before the image, a marker inside the data, a missing or out-of-order restart
 * marker, extraneous bytes before one, fill bytes, an invalid code -- the decoder stops
 * (ll_huff_bail, a longjmp like libjpeg's own error exit) and the caller decodes the image
 * again from its header with libjpeg's decoder, so warnings, errors and the pixels libjpeg
 * makes of damaged data are exactly libjpeg's (tests/kernels/test_huffman.py compares the two
 * on valid and on damaged files). LOADERLIB_HUFFMAN=libjpeg turns this decoder off. */
#ifndef LL_HUFF_H
#define LL_HUFF_H

#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#define LL_HB 10 /* bits of the one-lookup tables */

/* libjpeg's (private, but unchanged since IJG 6b) entropy decoder interface. */
struct ll_entropy_iface {
    void (*start_pass)(j_decompress_ptr cinfo);
    boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
    boolean insufficient_data;
};

#if JPEG_LIB_VERSION >= 70
#define LL_DCT_SCALED(k) ((k)->DCT_h_scaled_size)
#define LL_MIN_DCT_SCALED(c) ((c)->min_DCT_h_scaled_size)
#else
#define LL_DCT_SCALED(k) ((k)->DCT_scaled_size)
#define LL_MIN_DCT_SCALED(c) ((c)->min_DCT_scaled_size)
#endif

/* A fast entry's run for the end of block: it takes k past 63, which ends the block. */
#define LL_EOB_RUN 64

/* Fast symbols (at most LL_HB bits each) decodable after a refill, which leaves at least 56
 * bits (NOTE [ Refill by count ]). */
#define LL_FAST_PER_REFILL (56 / LL_HB)

typedef struct {
    /* (value << 16) | (run << 8) | bits for a code whose length plus its extra bits is at
     * most LL_HB, 0 otherwise: a DC difference (run 0), an AC coefficient, ZRL (run 15,
     * value 0: writing a 0 into the zeroed block changes nothing) or EOB (run LL_EOB_RUN). */
    int32_t fast[1 << LL_HB];
    uint16_t look[1 << LL_HB]; /* (symbol << 8) | code length for codes of <= LL_HB bits; 0: longer */
    uint64_t pair[1 << LL_HB]; /* AC: NOTE [ Two symbols a lookup ]; 0 where fast is 0 */
    int32_t maxcode[17];       /* the largest code of each length, -1 if none */
    int32_t valoff[17];        /* symbol index of a code of length l: code + valoff[l] */
    uint8_t key[17 + 256];     /* the JHUFF_TBL it was built from: bits, then the symbols */
    int built;                 /* 0 none, 1 DC, 2 AC, 3 AC without pair entries */
} ll_htab;

typedef struct {
    const uint8_t *p, *end; /* next byte; end of the data */
    uint64_t buf;           /* cnt bits, most significant first; below them 0 or the data's next
                             * bits (NOTE [ Refill by count ]) */
    int cnt;
    int pad;    /* zero bits appended after a marker: the data is overrun when cnt < pad */
    int marker; /* the marker's second byte once one was reached (p stays at its 0xFF) */
} ll_bits;

typedef struct {
    ll_htab tabs[8]; /* DC tables 0-3, AC tables 4-7 */
    const ll_htab *dc[D_MAX_BLOCKS_IN_MCU], *ac[D_MAX_BLOCKS_IN_MCU];
    int ci[D_MAX_BLOCKS_IN_MCU];
    unsigned char dc_needed[D_MAX_BLOCKS_IN_MCU], ac_needed[D_MAX_BLOCKS_IN_MCU];
    int nblocks;
    int last_dc[MAX_COMPS_IN_SCAN];
    unsigned restart_interval, to_go;
    int next_rst;
    /* NOTE [ Columns nobody reads ]: the MCU column of the next call, the row's MCU count, and
     * the columns whose coefficients are stored (keep0 + [0, keep_n]) */
    unsigned col, mcus_per_row, keep0, keep_n;
    ll_bits br;
    jmp_buf *jb; /* where ll_huff_bail jumps (the decode's setjmp) */
    int bailed;
    /* Progressive scans (NOTE [ Progressive scans ] in ll_phuff.h). */
    struct jpeg_progress_mgr hook;            /* called before libjpeg reads the first scan */
    void (*lib_start_pass)(j_decompress_ptr); /* libjpeg's per-scan set-up, which ours wraps */
    unsigned long mcus_left;                  /* MCUs of this scan not decoded yet */
    unsigned eobrun;                          /* blocks left in the current end-of-band run */
    int scans;                                /* scans of this image given to our decoder */
} ll_huff;

/* Zigzag index to natural order. The extra entries map every index past 63 to 63: runs past
 * coefficient 63 in corrupt data land there as in libjpeg's jpeg_natural_order (whose 16
 * extra entries cover a run of 15), and so does an EOB's k + LL_EOB_RUN. */
static const uint8_t ll_natural[64 + LL_EOB_RUN] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
    40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
    29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
    47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
    63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
    63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
    63, 63, 63, 63, 63, 63, 63, 63};

/* -1: LOADERLIB_HUFFMAN decides; 0 or 1: set by ll_huff_set (tests compare the two). Each
 * extension module has its own copy, as of the counters below. */
static int ll_huff_on = -1;
/* Images given to our decoder, and those of them it handed back to libjpeg's. */
static unsigned long long ll_huff_installed, ll_huff_bailed;

static int ll_huff_enabled(void) {
    int on = __atomic_load_n(&ll_huff_on, __ATOMIC_RELAXED);
    if (on < 0) { /* racing first reads store the same value */
        const char *e = getenv("LOADERLIB_HUFFMAN");
        on = !(e != NULL && strcmp(e, "libjpeg") == 0);
        __atomic_store_n(&ll_huff_on, on, __ATOMIC_RELAXED);
    }
    return on;
}

static void ll_huff_set(int on) { __atomic_store_n(&ll_huff_on, on < 0 ? -1 : !!on, __ATOMIC_RELAXED); }

static void ll_huff_counts(unsigned long long *installed, unsigned long long *bailed) {
    *installed = __atomic_load_n(&ll_huff_installed, __ATOMIC_RELAXED);
    *bailed = __atomic_load_n(&ll_huff_bailed, __ATOMIC_RELAXED);
}

/* The value of the s extra bits r (s >= 1): JPEG's sign extension (F.2.2.1). */
static inline int ll_extend(unsigned r, int s) {
    return (int)r - (int)(((r >> (s - 1)) ^ 1u) * ((1u << s) - 1u));
}

/* Builds t from src (libjpeg has already validated src: jpeg_make_d_derived_tbl ran in
 * jpeg_start_decompress, or for a progressive scan in its start_pass). ac: 0 a DC table, 1 an
 * AC table with its pair entries, 2 an AC table without them (progressive scans, which do not
 * use them). Returns 0 for a table it cannot represent. */
static int ll_htab_build(ll_htab *t, const JHUFF_TBL *src, int ac) {
    uint8_t key[17 + 256];
    memcpy(key, src->bits, 17);
    memcpy(key + 17, src->huffval, 256);
    if (t->built == 1 + ac && memcmp(key, t->key, sizeof key) == 0) return 1;
    t->built = 0;
    memset(t->fast, 0, sizeof t->fast);
    memset(t->look, 0, sizeof t->look);
    int code = 0, k = 0;
    for (int l = 1; l <= 16; l++) {
        int n = src->bits[l];
        if (k + n > 256) return 0;
        t->valoff[l] = k - code;
        for (int i = 0; i < n; i++, k++, code++) {
            int sym = src->huffval[k];
            if (l > LL_HB) continue;
            int shift = LL_HB - l;
            int run = sym >> 4, s = sym & 15;
            if (!ac) run = 0;
            else if (s == 0 && run != 15) run = LL_EOB_RUN;
            for (int j = 0; j < (1 << shift); j++) {
                int idx = (code << shift) | j;
                t->look[idx] = (uint16_t)((sym << 8) | l);
                if (l + s <= LL_HB && !(ac == 2 && s == 0)) { /* progressive: no EOBr or ZRL */
                    unsigned r = s ? (unsigned)(j >> (shift - s)) & ((1u << s) - 1u) : 0u;
                    uint32_t v = (uint32_t)(s ? ll_extend(r, s) : 0);
                    t->fast[idx] = (int32_t)((v << 16) | (uint32_t)(run << 8) | (uint32_t)(l + s));
                }
            }
        }
        t->maxcode[l] = n ? code - 1 : -1;
        if (code > (1 << l)) return 0; /* over-subscribed: libjpeg refuses these */
        code <<= 1;
    }
    if (ac == 1) {
        const unsigned mask = (1u << LL_HB) - 1u;
        for (unsigned idx = 0; idx <= mask; idx++) {
            const int32_t f1 = t->fast[idx];
            if (f1 == 0) { t->pair[idx] = 0; continue; }
            const uint64_t len1 = (uint64_t)(f1 & 0xFF), run1 = (uint64_t)((f1 >> 8) & 0xFF);
            const uint64_t v1 = (uint64_t)(uint16_t)(f1 >> 16);
            uint64_t e = len1 | (len1 << 8) | (run1 << 16) | (v1 << 32) | (v1 << 48);
            if (run1 != LL_EOB_RUN && len1 < LL_HB) {
                const int32_t f2 = t->fast[(idx << len1) & mask];
                if (f2 != 0 && (uint64_t)(f2 & 0xFF) <= LL_HB - len1) {
                    const uint64_t len2 = (uint64_t)(f2 & 0xFF), run2 = (uint64_t)((f2 >> 8) & 0xFF);
                    const uint64_t d2 = run2 == LL_EOB_RUN ? LL_EOB_RUN : run2 + 1;
                    e = (len1 + len2) | (len1 << 8) | (run1 << 16) | (d2 << 24) | (v1 << 32) |
                        ((uint64_t)(uint16_t)(f2 >> 16) << 48);
                }
            }
            t->pair[idx] = e;
        }
    }
    memcpy(t->key, key, sizeof key);
    t->built = 1 + ac;
    return 1;
}

static void ll_huff_bail(ll_huff *h) __attribute__((noreturn));
static void ll_huff_bail(ll_huff *h) {
    h->bailed = 1;
    __atomic_fetch_add(&ll_huff_bailed, 1, __ATOMIC_RELAXED);
    longjmp(*h->jb, 2);
}

/* Byte by byte: stuffed 0xFF 0x00, the first marker, and zero bits after it. Never reads
 * at or past b.end. */
static ll_bits ll_refill_slow(ll_huff *h, ll_bits b) {
    while (b.cnt <= 56) {
        if (b.marker) { /* zero bits after the marker; they must not be consumed (cnt >= pad) */
            b.cnt += 8;
            b.pad += 8;
            continue;
        }
        if (b.p >= b.end) ll_huff_bail(h); /* no marker before the end: libjpeg's EOF handling */
        unsigned c = *b.p;
        if (c == 0xFF) {
            if (b.p + 1 >= b.end) ll_huff_bail(h);
            unsigned c1 = b.p[1];
            if (c1 == 0xFF) ll_huff_bail(h); /* fill bytes */
            if (c1 != 0) {
                b.marker = (int)c1;
                continue;
            }
            b.p += 2;
        } else {
            b.p++;
        }
        b.buf |= (uint64_t)c << (56 - b.cnt);
        b.cnt += 8;
    }
    return b;
}

/* NOTE [ Refill by count ]
 * A refill leaves at least 56 bits in the buffer, enough for LL_FAST_PER_REFILL symbols
 * with fast entries (at most LL_HB bits each). So the decoder refills after every
 * LL_FAST_PER_REFILL symbols, counted, instead of testing the bit count before each one:
 * the count repeats the same pattern block after block, which branch predictors learn,
 * where the test of the bit count depends on the data (benchmarks/decode.py, part 3: the
 * whole decode went from 1.07x to 1.17-1.18x libjpeg's decoder's speed). A slow
 * code (up to 31 bits with its extra bits) refills for itself and starts a new count.
 * The eight-byte refill ORs in the whole word, so the bits below cnt are the data's next
 * bits rather than zeros. Every later refill ORs the same bits at the same place: the word
 * held no 0xFF, so those bytes are data, not stuffing, and a marker (whose zero bits must
 * follow the data) lies beyond them. Refills happen with cnt <= 63: each follows at least
 * one decoded symbol. */
static inline __attribute__((always_inline)) void ll_refill(ll_huff *h, ll_bits *b) {
    if (!b->marker && b->end - b->p >= 8) {
        uint64_t x;
        memcpy(&x, b->p, 8);
        uint64_t nx = ~x;
        const uint64_t ff = (nx - 0x0101010101010101ull) & ~nx & 0x8080808080808080ull;
        int nb = (63 - b->cnt) >> 3;
        if (ff == 0) { /* no 0xFF byte */
            b->buf |= __builtin_bswap64(x) >> b->cnt;
            b->cnt += 8 * nb;
            b->p += nb;
            return;
        }
        /* The bytes before the first 0xFF (the lowest flag is exact) the same way, and only
         * them: what follows the 0xFF is stuffing or a marker. */
        const int j = __builtin_ctzll(ff) >> 3;
        if (j > 0) {
            b->buf |= (__builtin_bswap64(x) & ~(~0ull >> (8 * j))) >> b->cnt;
            if (j >= nb) {
                b->cnt += 8 * nb;
                b->p += nb;
                return;
            }
            b->cnt += 8 * j;
            b->p += j;
        }
    }
    *b = ll_refill_slow(h, *b);
}

/* A code longer than LL_HB bits (b has at least 16 bits). */
static inline __attribute__((always_inline)) int ll_decode_long(ll_huff *h, const ll_htab *t, ll_bits *b) {
    int l = LL_HB + 1;
    int32_t code = (int32_t)(b->buf >> (64 - l));
    while (code > t->maxcode[l]) {
        if (++l > 16) ll_huff_bail(h); /* invalid code: libjpeg's own handling */
        code = (int32_t)(b->buf >> (64 - l));
    }
    b->buf <<= l;
    b->cnt -= l;
    return t->key[17 + ((code + t->valoff[l]) & 0xFF)];
}

/* The symbol of a code without a fast entry (idx: the next LL_HB bits of b). */
static inline __attribute__((always_inline)) int ll_decode_symbol(ll_huff *h, const ll_htab *t, ll_bits *b,
                                                                   unsigned idx) {
    unsigned e = t->look[idx];
    if (e == 0) return ll_decode_long(h, t, b);
    b->buf <<= e & 63;
    b->cnt -= (int)(e & 0xFF);
    return (int)(e >> 8);
}

/* At a restart boundary: the expected RSTn must come next, with less than one byte of data
 * left before it (libjpeg warns of extraneous bytes otherwise). */
static void ll_huff_restart(ll_huff *h) {
    ll_bits b = ll_refill_slow(h, h->br);
    if (b.marker != 0xD0 + h->next_rst || b.cnt - b.pad >= 8 || b.cnt < b.pad) ll_huff_bail(h);
    b.p += 2;
    b.buf = 0;
    b.cnt = b.pad = b.marker = 0;
    h->br = b;
    h->next_rst = (h->next_rst + 1) & 7;
    memset(h->last_dc, 0, sizeof h->last_dc);
    h->eobrun = 0; /* progressive scans: a restart ends an end-of-band run */
    h->to_go = h->restart_interval;
}

/* NOTE [ Two symbols a lookup ]
 * An AC table's pair entry holds what the next LL_HB bits say: one symbol, or two when the
 * first (not an end of block) leaves room for the whole second one. Fields, low bits first:
 * total length (bits 0-7, so NOTE [ Shift by the entry ] still holds), the first symbol's
 * length (8-15), its run (16-23; LL_EOB_RUN for an end of block), the step from the first
 * coefficient to the second (24-31: 1 + run, LL_EOB_RUN for an end of block, 0 when there
 * is no second symbol), then the two values as int16 (the first repeated when there is no
 * second, so that writing "both" writes the first twice). One lookup then advances one
 * step of the dependency chain for two symbols where the data has short codes, with no
 * branch on whether it did. The one case the entry cannot know: a first coefficient at
 * index 63 ends the block, and the bits after it belong to the next block's DC code; the
 * decoder then takes the first symbol alone (rare, and predicted). Writes land where
 * libjpeg's sequential decode puts them, runs past 63 included (ll_natural maps them to
 * 63); coefficients of blocks nobody reads go to a local sink. benchmarks/decode.py part 3
 * put the whole decode at 1.20-1.21x libjpeg's decoder with it, 1.17-1.18x without (two
 * runs each; a branching version, one entry or two by a test, was no faster). */

/* NOTE [ Shift by the entry ]
 * Decoding is one chain of dependent steps per symbol: the next LL_HB bits index a table,
 * the entry gives the length, the buffer shifts by it, and the shifted buffer gives the next
 * index. The length sits in the entry's low bits with nothing else below bit 6, so
 * `buf <<= entry & 63` is one shlx on the entry itself (shlx masks its count to 6 bits):
 * a step shorter than extracting the length first. shlx is BMI2, so the decoder is
 * compiled twice, and x86 CPUs with BMI2 get that copy (the shift by %cl of plain x86-64
 * is two micro-ops with a flags dependency on Intel cores). */
/* One block: its DC difference (into blk[0] when blk is not NULL) and its AC coefficients,
 * stored into blk only when ``store`` (a constant in each of the two inlined copies: NOTE
 * [ Columns nobody reads ]). */
static inline __attribute__((always_inline)) void ll_huff_block(ll_huff *h, ll_bits *bp, int *budgetp, int blkn,
                                                                 JCOEF *blk, const int store) {
    ll_bits b = *bp;
    int budget = *budgetp;
    const ll_htab *dc = h->dc[blkn], *ac = h->ac[blkn];
    if (budget == 0) {
        ll_refill(h, &b);
        budget = LL_FAST_PER_REFILL;
    }
    budget--;
    unsigned idx = (unsigned)(b.buf >> (64 - LL_HB));
    int32_t f = dc->fast[idx];
    int s, diff = 0;
    if (f) {
        b.buf <<= f & 63; /* NOTE [ Shift by the entry ] */
        b.cnt -= f & 0xFF;
        diff = f >> 16;
    } else {
        if (b.cnt < 32) ll_refill(h, &b); /* a slow DC code and its bits: up to 31 bits */
        budget = 0;
        s = ll_decode_symbol(h, dc, &b, idx);
        if (s) { /* s <= 15: libjpeg refuses DC tables with larger symbols */
            unsigned r = (unsigned)(b.buf >> (64 - s));
            b.buf <<= s;
            b.cnt -= s;
            diff = ll_extend(r, s);
        }
    }
    if (h->dc_needed[blkn]) { /* wraps as libjpeg's int sum does on damaged data */
        int ci = h->ci[blkn];
        h->last_dc[ci] = (int)((unsigned)h->last_dc[ci] + (unsigned)diff);
        if (blk) blk[0] = (JCOEF)h->last_dc[ci];
    }
    for (int k = 1; k < 64; k++) {
        if (budget == 0) {
            ll_refill(h, &b);
            budget = LL_FAST_PER_REFILL;
        }
        budget--;
        idx = (unsigned)(b.buf >> (64 - LL_HB));
        const uint64_t e = ac->pair[idx];
        if (e) { /* NOTE [ Two symbols a lookup ] */
            k += (int)((e >> 16) & 0xFF);
            if (__builtin_expect(k >= 63, 0) && (e & 0xFF000000u)) { /* the first one ends the block */
                const int len1 = (int)((e >> 8) & 0xFF);
                b.buf <<= len1;
                b.cnt -= len1;
                if (store) blk[ll_natural[k]] = (JCOEF)(int16_t)(e >> 32);
                continue;
            }
            if (store) blk[ll_natural[k]] = (JCOEF)(int16_t)(e >> 32);
            k += (int)((e >> 24) & 0xFF);
            if (store) blk[ll_natural[k]] = (JCOEF)(int16_t)(e >> 48);
            b.buf <<= e & 63;
            b.cnt -= (int)(e & 0xFF);
            continue;
        }
        if (b.cnt < 32) ll_refill(h, &b); /* a slow code takes up to 31 bits; idx stays valid */
        budget = 0;
        int sym = ll_decode_symbol(h, ac, &b, idx);
        int r = sym >> 4;
        s = sym & 15;
        if (s) {
            k += r;
            unsigned v = (unsigned)(b.buf >> (64 - s));
            b.buf <<= s;
            b.cnt -= s;
            if (store) blk[ll_natural[k]] = (JCOEF)ll_extend(v, s);
        } else {
            if (r != 15) break;
            k += 15;
        }
    }
    *bp = b;
    *budgetp = budget;
}

/* NOTE [ Columns nobody reads ]
 * libjpeg's single-pass decode hands every MCU of a row to decode_mcu with blocks to fill,
 * and then runs the IDCT only on the columns of jpeg_crop_scanline's region: a
 * RandomResizedCrop box leaves about a quarter of the columns of the rows it spans unread,
 * and the rows above it are skipped (decode_mcu with NULL). Their entropy data must still be
 * decoded, to reach what follows, but their coefficients need not be stored: the decoder
 * counts MCU columns (every call is the next MCU in raster order, skipped rows included)
 * and stores only those ll_huff_keep_columns named, one MCU column more on each side than
 * the region's, so a rounding of the region's edge never leaves a read block empty. The
 * others run a copy of the block loop with no stores at all: no zigzag lookup, no write
 * (benchmarks/instructions.py: Huffman decoding 3.35M -> 3.00M instructions per item of the
 * RN50 float chain, the chain 7.63M -> 7.28M). DC predictions are kept for every block. A
 * decode that never calls ll_huff_keep_columns stores every column, as before
 * (tests/kernels/test_decode.py's crop tests fail when the kept columns start one too far
 * right). */
static inline __attribute__((always_inline)) boolean ll_huff_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
    ll_huff *h = (ll_huff *)cinfo->client_data;
    if (h->restart_interval) {
        if (h->to_go == 0) ll_huff_restart(h);
        h->to_go--;
    }
    const unsigned col = h->col;
    h->col = col + 1 >= h->mcus_per_row ? 0 : col + 1;
    const int keep = MCU_data != NULL && col - h->keep0 <= h->keep_n;
    ll_bits b = h->br;
    int budget = 0; /* NOTE [ Refill by count ] */
    for (int blkn = 0; blkn < h->nblocks; blkn++) {
        JCOEF *blk = keep ? MCU_data[blkn][0] : NULL;
        if (blk != NULL && h->ac_needed[blkn]) ll_huff_block(h, &b, &budget, blkn, blk, 1);
        else ll_huff_block(h, &b, &budget, blkn, blk, 0);
    }
    if (b.cnt < b.pad) ll_huff_bail(h); /* decoded past the data: libjpeg warns and pads */
    h->br = b;
    return TRUE;
}

/* Stores only the MCU columns that hold output pixels x in [x0, x0 + w) of the current
 * output scale, plus one on each side (NOTE [ Columns nobody reads ]). Right after
 * jpeg_crop_scanline, with x0 and w as it returned them. */
static void ll_huff_keep_columns(struct jpeg_decompress_struct *c, ll_huff *h, unsigned x0, unsigned w) {
    const unsigned mcu_px = (unsigned)(c->comps_in_scan == 1 ? 1 : c->max_h_samp_factor) *
                            (unsigned)LL_MIN_DCT_SCALED(c);
    if (mcu_px == 0 || w == 0) return;
    const unsigned first = x0 / mcu_px, last = (x0 + w - 1) / mcu_px;
    h->keep0 = first > 0 ? first - 1 : 0;
    h->keep_n = last + 1 - h->keep0;
}

static boolean ll_huff_decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) { return ll_huff_mcu(cinfo, MCU_data); }

typedef boolean (*ll_decode_mcu_fn)(j_decompress_ptr, JBLOCKROW *);

#if defined(__GNUC__) && defined(__x86_64__)
__attribute__((target("bmi2"))) static boolean ll_huff_decode_mcu_bmi2(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
    return ll_huff_mcu(cinfo, MCU_data);
}
#endif

/* Whether this CPU has BMI1, BMI2 and POPCNT (the BMI2 copies' targets); found once. */
static int ll_has_bmi2(void) {
    static int has = -1; /* racing first calls store the same value */
    if (has < 0) {
        int h = 0;
#if defined(__GNUC__) && defined(__x86_64__)
        __builtin_cpu_init();
        h = __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("popcnt");
#endif
        has = h;
    }
    return has;
}

/* The copy of the decoder this CPU runs (NOTE [ Shift by the entry ]). */
static ll_decode_mcu_fn ll_huff_decoder(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (ll_has_bmi2()) return ll_huff_decode_mcu_bmi2;
#endif
    return ll_huff_decode_mcu;
}

/* A scan's start: its MCU's blocks, DC predictions, restart count and end-of-band run reset,
 * and the bit reader at the scan's first byte (libjpeg's source, right after the SOS). */
static void ll_huff_start_scan(struct jpeg_decompress_struct *c, ll_huff *h) {
    h->nblocks = c->blocks_in_MCU;
    memset(h->last_dc, 0, sizeof h->last_dc);
    h->eobrun = 0;
    h->restart_interval = c->restart_interval;
    h->to_go = c->restart_interval;
    h->next_rst = 0;
    h->col = 0;
    h->mcus_per_row = c->MCUs_per_row;
    h->keep0 = 0;
    h->keep_n = ~0u; /* every column, until ll_huff_keep_columns says otherwise */
    h->br.p = c->src->next_input_byte;
    h->br.end = c->src->next_input_byte + c->src->bytes_in_buffer;
    h->br.buf = 0;
    h->br.cnt = h->br.pad = h->br.marker = 0;
}

/* Puts ll_huff_decode_mcu in place of libjpeg's decoder for this image, right after
 * jpeg_start_decompress; returns 0 (and changes nothing) when the image is not a
 * single-scan baseline Huffman one or a table cannot be represented. */
static int ll_huff_install(struct jpeg_decompress_struct *c, ll_huff *h, jmp_buf *jb) {
    if (c->progressive_mode || c->arith_code || c->data_precision != 8) return 0;
    if (c->comps_in_scan != c->num_components || c->comps_in_scan < 1 || c->comps_in_scan > MAX_COMPS_IN_SCAN)
        return 0;
    if (c->Ss != 0 || c->Se != 63 || c->Ah != 0 || c->Al != 0) return 0;
    if (c->blocks_in_MCU < 1 || c->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU || c->unread_marker != 0) return 0;
    if (c->entropy == NULL || c->src == NULL || c->src->next_input_byte == NULL) return 0;
    for (int b = 0; b < c->blocks_in_MCU; b++) {
        int ci = c->MCU_membership[b];
        if (ci < 0 || ci >= c->comps_in_scan) return 0;
        const jpeg_component_info *k = c->cur_comp_info[ci];
        if (k->dc_tbl_no < 0 || k->dc_tbl_no >= 4 || k->ac_tbl_no < 0 || k->ac_tbl_no >= 4) return 0;
        const JHUFF_TBL *dt = c->dc_huff_tbl_ptrs[k->dc_tbl_no], *at = c->ac_huff_tbl_ptrs[k->ac_tbl_no];
        if (dt == NULL || at == NULL) return 0;
        if (!ll_htab_build(&h->tabs[k->dc_tbl_no], dt, 0) || !ll_htab_build(&h->tabs[4 + k->ac_tbl_no], at, 1))
            return 0;
        h->dc[b] = &h->tabs[k->dc_tbl_no];
        h->ac[b] = &h->tabs[4 + k->ac_tbl_no];
        h->ci[b] = ci;
        h->dc_needed[b] = k->component_needed ? 1 : 0;
        h->ac_needed[b] = k->component_needed && LL_DCT_SCALED(k) > 1;
    }
    ll_huff_start_scan(c, h);
    h->jb = jb;
    h->bailed = 0;
    c->client_data = h;
    ((struct ll_entropy_iface *)c->entropy)->decode_mcu = ll_huff_decoder();
    __atomic_fetch_add(&ll_huff_installed, 1, __ATOMIC_RELAXED);
    return 1;
}

#endif
