/* Progressive Huffman decoding for libjpeg(-turbo)'s decompressor.
 *
 * NOTE [ Progressive scans ]
 * A progressive JPEG cost about four times a baseline one of the same size in the training
 * chain (5.0 against 1.2 CPU-ms per image on the ImageNet-like benchmark photos, whose 4%
 * progressive files took 15% of the CPU): libjpeg's progressive entropy decoder (jdphuff.c)
 * reads its data a few bits at a time, through a bit buffer it loads and saves around every
 * block, and no crop or DCT scale skips any of it, because every scan must be decoded whole
 * before the first row comes out. This decodes the same scans with loaderlib's bit reader
 * (NOTE [ Our Huffman decoder ] in ll_huff.h): the 64-bit buffer refilled eight bytes at a
 * time, one lookup of the next LL_HB bits for a symbol, a first-scan AC coefficient's value
 * read with its code, and refinement scans by masks (NOTE [ Refinement by masks ]).
 * benchmarks/decode.py part 3 (one thread, libjpeg's standard script): 1.53x libjpeg's decoder
 * for the full decode, 1.66x for RandomResizedCrop boxes. Most of what is left is the
 * refinement scans' dependency chain: a symbol, then its run's end, then its correction bits,
 * then the next symbol.
 *
 * libjpeg absorbs all the scans of a multi-scan file inside jpeg_start_decompress, so the
 * decoder cannot be put in place after it, as the baseline one is. It goes in through two
 * public doors instead: libjpeg calls the progress monitor (cinfo->progress) before it
 * reads the first scan, after its entropy module exists and that scan's start_pass ran; the
 * monitor then wraps the module's start_pass, which libjpeg calls at each later scan. The
 * wrapper runs libjpeg's own start_pass first (it validates the scan's parameters and
 * tables, keeps the progression status, and warns of a bogus progression as before) and
 * then puts one of four decoders in decode_mcu, as jdphuff.c does: first and refining DC
 * scans, first and refining AC scans. A scan it cannot take keeps libjpeg's decoder.
 *
 * libjpeg reads the markers after a scan from its source, where its bit reader left it, so
 * ours hands the source back at each scan's last MCU: past the marker that ends the scan,
 * with cinfo->unread_marker set, as libjpeg's bit reader leaves it when it meets a marker.
 * Anything but a clean end -- whole bytes of data left before the marker, a restart marker,
 * fill bytes, the end of the data -- and every anomaly ll_huff.h lists (plus a refinement
 * symbol of more than one bit, which libjpeg warns of, and a coefficient past the scan's
 * band) stops the decode (ll_huff_bail) and the image is decoded again from its header by
 * libjpeg alone, so warnings, errors and damaged pixels stay exactly libjpeg's
 * (tests/kernels/test_progressive.py compares the two on valid, damaged and randomly mutated
 * files). */
#ifndef LL_PHUFF_H
#define LL_PHUFF_H

#include <limits.h>
#include <pthread.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ll_huff.h"

/* n (0..31) bits of b, which holds at least n. */
static inline __attribute__((always_inline)) unsigned ll_pbits(ll_bits *b, int n) {
    if (n == 0) return 0;
    unsigned v = (unsigned)(b->buf >> (64 - n));
    b->buf <<= n;
    b->cnt -= n;
    return v;
}

/* The next bit, refilling when none is left. */
static inline __attribute__((always_inline)) unsigned ll_pbit(ll_huff *h, ll_bits *b) {
    if (__builtin_expect(b->cnt < 1, 0)) ll_refill(h, b);
    unsigned v = (unsigned)(b->buf >> 63);
    b->buf <<= 1;
    b->cnt--;
    return v;
}

/* A symbol and its extra bits take at most 31 bits; a refill leaves at least 56. */
#define LL_PREFILL(h, b)                          \
    do {                                          \
        if ((b).cnt < 32) ll_refill((h), &(b));   \
    } while (0)

/* After the scan's last MCU: the data must end here, at a marker that is not a restart. */
static void ll_phuff_end_scan(j_decompress_ptr c, ll_huff *h) {
    ll_bits b = ll_refill_slow(h, h->br); /* to the marker, or 56 bits of data: too many */
    if (!b.marker || b.cnt < b.pad || b.cnt - b.pad >= 8 || (b.marker >= 0xD0 && b.marker <= 0xD7))
        ll_huff_bail(h);
    struct jpeg_source_mgr *src = c->src;
    const JOCTET *next = (const JOCTET *)b.p + 2; /* past 0xFF and the marker's code */
    if (next < src->next_input_byte || (size_t)(next - src->next_input_byte) > src->bytes_in_buffer) ll_huff_bail(h);
    src->bytes_in_buffer -= (size_t)(next - src->next_input_byte);
    src->next_input_byte = next;
    c->unread_marker = b.marker;
    h->br = b;
}

static inline __attribute__((always_inline)) boolean ll_phuff_done(j_decompress_ptr c, ll_huff *h, ll_bits b) {
    if (b.cnt < b.pad) ll_huff_bail(h); /* decoded past the data: libjpeg warns and pads */
    h->br = b;
    if (--h->mcus_left == 0) ll_phuff_end_scan(c, h);
    return TRUE;
}

static inline __attribute__((always_inline)) void ll_phuff_restart(ll_huff *h) {
    if (h->restart_interval) {
        if (h->to_go == 0) ll_huff_restart(h);
        h->to_go--;
    }
}

/* First DC scan: each block's DC difference, shifted left by Al (jdphuff.c's
 * decode_mcu_DC_first). */
static boolean ll_phuff_dc_first(j_decompress_ptr c, JBLOCKROW *MCU_data) {
    ll_huff *h = (ll_huff *)c->client_data;
    ll_phuff_restart(h);
    ll_bits b = h->br;
    const int Al = c->Al;
    for (int blkn = 0; blkn < h->nblocks; blkn++) {
        LL_PREFILL(h, b);
        const ll_htab *t = h->dc[blkn];
        unsigned idx = (unsigned)(b.buf >> (64 - LL_HB));
        int32_t f = t->fast[idx];
        int diff = 0;
        if (f) {
            b.buf <<= f & 63;
            b.cnt -= f & 0xFF;
            diff = f >> 16;
        } else {
            int s = ll_decode_symbol(h, t, &b, idx);
            if (s) diff = ll_extend(ll_pbits(&b, s), s);
        }
        const int ci = h->ci[blkn];
        const long long v = (long long)h->last_dc[ci] + diff;
        if (v > INT_MAX || v < INT_MIN) ll_huff_bail(h); /* libjpeg: JERR_BAD_DCT_COEF */
        h->last_dc[ci] = (int)v;
        MCU_data[blkn][0][0] = (JCOEF)(int)((unsigned)v << Al);
    }
    return ll_phuff_done(c, h, b);
}

/* DC refinement: one bit a block, the DC's bit Al. */
static boolean ll_phuff_dc_refine(j_decompress_ptr c, JBLOCKROW *MCU_data) {
    ll_huff *h = (ll_huff *)c->client_data;
    ll_phuff_restart(h);
    ll_bits b = h->br;
    const int p1 = 1 << c->Al;
    for (int blkn = 0; blkn < h->nblocks; blkn++)
        if (ll_pbit(h, &b)) MCU_data[blkn][0][0] |= (JCOEF)p1;
    return ll_phuff_done(c, h, b);
}

/* First AC scan of the band Ss..Se of one component: coefficients shifted left by Al, and
 * end-of-band runs that span blocks (EOBr: 2^r + r more bits blocks, this one included). */
static boolean ll_phuff_ac_first(j_decompress_ptr c, JBLOCKROW *MCU_data) {
    ll_huff *h = (ll_huff *)c->client_data;
    ll_phuff_restart(h);
    ll_bits b = h->br;
    if (h->eobrun > 0) {
        h->eobrun--;
        return ll_phuff_done(c, h, b);
    }
    JCOEF *blk = MCU_data[0][0];
    const ll_htab *t = h->ac[0];
    const int Se = c->Se, Al = c->Al;
    for (int k = c->Ss; k <= Se; k++) {
        LL_PREFILL(h, b);
        unsigned idx = (unsigned)(b.buf >> (64 - LL_HB));
        int32_t f = t->fast[idx]; /* a coefficient and its bits (no EOBr or ZRL here) */
        if (f) {
            k += (f >> 8) & 0xFF;
            if (k > Se) ll_huff_bail(h); /* past the band: libjpeg writes past it */
            b.buf <<= f & 63;
            b.cnt -= f & 0xFF;
            blk[ll_natural[k]] = (JCOEF)(int)((unsigned)(f >> 16) << Al);
            continue;
        }
        int sym = ll_decode_symbol(h, t, &b, idx);
        int r = sym >> 4, s = sym & 15;
        if (s) {
            k += r;
            if (k > Se) ll_huff_bail(h);
            blk[ll_natural[k]] = (JCOEF)(int)((unsigned)ll_extend(ll_pbits(&b, s), s) << Al);
        } else if (r == 15) { /* ZRL: sixteen zeros */
            k += 15;
        } else { /* EOBr */
            h->eobrun = (1u << r) + ll_pbits(&b, r) - 1u;
            break;
        }
    }
    return ll_phuff_done(c, h, b);
}

/* NOTE [ Refinement by masks ]
 * An AC refinement scan appends a correction bit to every coefficient already nonzero that
 * its runs pass over, and a run counts only the zero ones, so jdphuff.c tests the
 * coefficients one by one: a branch on the data for each of up to 63 positions of every
 * block, in two refinement scans of each component, which took half of a progressive
 * decode. Here a block's nonzero coefficients are first a 64-bit mask in zigzag order (one
 * SSE2 compare per row of eight, and a table per row that turns its eight natural-order
 * bits into zigzag positions). A run of r zeros then ends at the mask's (r+1)-th clear bit,
 * and its correction bits, one for each set bit below that, are taken from the data at once
 * and put in place by a pdep (BMI2). They change no coefficient's zeroness, so they are
 * applied at the block's end, one step per coefficient moved, without a branch on the data. */
static uint64_t ll_zz_rows[8][256]; /* row r's nonzero bits (natural order) -> zigzag bits */
static pthread_once_t ll_zz_once = PTHREAD_ONCE_INIT;

static void ll_zz_build(void) {
    int zz[64];
    for (int k = 0; k < 64; k++) zz[ll_natural[k]] = k;
    for (int r = 0; r < 8; r++)
        for (int v = 0; v < 256; v++) {
            uint64_t m = 0;
            for (int col = 0; col < 8; col++)
                if ((v >> col) & 1) m |= 1ull << zz[8 * r + col];
            ll_zz_rows[r][v] = m;
        }
}

/* Bit k set where the block's coefficient at zigzag index k is nonzero. */
static inline __attribute__((always_inline)) uint64_t ll_zz_mask(const JCOEF *blk) {
    uint64_t m = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    for (int r = 0; r < 8; r++) {
        __m128i z = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 8 * r)), zero);
        unsigned bits = (unsigned)_mm_movemask_epi8(_mm_packs_epi16(z, z)) & 0xFFu;
        m |= ll_zz_rows[r][bits ^ 0xFFu];
    }
#else
    for (int r = 0; r < 8; r++) {
        unsigned bits = 0;
        for (int col = 0; col < 8; col++) bits |= (unsigned)(blk[8 * r + col] != 0) << col;
        m |= ll_zz_rows[r][bits];
    }
#endif
    return m;
}

/* Bits 0..n-1 (n <= 64). */
static inline uint64_t ll_low_bits(int n) { return n >= 64 ? ~0ull : ((1ull << n) - 1u); }

/* x with its 64 bits in reverse order. */
static inline uint64_t ll_bitrev64(uint64_t x) {
    x = __builtin_bswap64(x);
    x = ((x >> 4) & 0x0F0F0F0F0F0F0F0Full) | ((x & 0x0F0F0F0F0F0F0F0Full) << 4);
    x = ((x >> 2) & 0x3333333333333333ull) | ((x & 0x3333333333333333ull) << 2);
    return ((x >> 1) & 0x5555555555555555ull) | ((x & 0x5555555555555555ull) << 1);
}

/* The correction bits of the nonzero coefficients at the set bits of cor, which come next in
 * the data in zigzag order: returns the mask of those whose bit is 1. With BMI2, up to 32
 * bits are taken at once and one pdep puts them in place (the data's first bit, reversed to
 * bit 0, lands at cor's lowest set bit); otherwise bit by bit. */
static inline __attribute__((always_inline)) uint64_t ll_phuff_bits_to(ll_huff *h, ll_bits *b, uint64_t cor,
                                                                       int bmi2) {
    uint64_t up = 0;
#if defined(__GNUC__) && defined(__x86_64__)
    if (bmi2) { /* no branch on whether there are any: a run passes 0, 1 or 2 as often */
        int n = __builtin_popcountll(cor);
        if (__builtin_expect(n > 32, 0)) { /* two takes */
            uint64_t low;
            __asm__("pdepq %2, %1, %0" : "=r"(low) : "r"(0xFFFFFFFFull), "r"(cor));
            if (b->cnt < 32) ll_refill(h, b);
            const uint64_t bits = ll_bitrev64(b->buf) & 0xFFFFFFFFull;
            b->buf <<= 32;
            b->cnt -= 32;
            __asm__("pdepq %2, %1, %0" : "=r"(up) : "r"(bits), "r"(low));
            cor &= ~low;
            n -= 32;
        }
        if (b->cnt < n) ll_refill(h, b);
        const uint64_t bits = ll_bitrev64(b->buf) & ll_low_bits(n); /* the data's first bit at bit 0 */
        b->buf <<= n;
        b->cnt -= n;
        uint64_t got;
        __asm__("pdepq %2, %1, %0" : "=r"(got) : "r"(bits), "r"(cor));
        up |= got;
        return up;
    }
#endif
    (void)bmi2;
    while (cor) {
        const uint64_t low = cor & (0 - cor);
        cor ^= low;
        up |= ll_pbit(h, b) ? low : 0;
    }
    return up;
}

/* Applies a block's correction bits (G.1.2.3): a 1 moves a coefficient's magnitude up by p1,
 * unless that bit is set already. Each coefficient has at most one in a scan, and the
 * positions of a scan's runs depend only on which coefficients are zero, so they wait for
 * the block's end. */
static inline __attribute__((always_inline)) void ll_phuff_correct(JCOEF *blk, uint64_t up, int p1, int m1) {
    while (up) {
        JCOEF *q = blk + ll_natural[__builtin_ctzll(up)];
        up &= up - 1;
        const int v = *q;
        *q = (JCOEF)(v + ((v >= 0 ? p1 : m1) & -(int)((v & p1) == 0)));
    }
}

/* The position of the (r+1)-th set bit of z, or 64 when z has fewer: with BMI2, one pdep
 * (which keeps the (r+1)-th set bit of z alone) and one tzcnt, no branch on the data. */
static inline __attribute__((always_inline)) int ll_nth_bit(uint64_t z, int r, int bmi2) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (bmi2) {
        uint64_t one = 1ull << r, x, n;
        __asm__("pdepq %2, %1, %0" : "=r"(x) : "r"(one), "r"(z));
        __asm__("tzcntq %1, %0" : "=r"(n) : "r"(x) : "cc");
        return (int)n;
    }
#endif
    (void)bmi2;
    for (int i = 0; i < r && z; i++) z &= z - 1;
    return z ? __builtin_ctzll(z) : 64;
}

/* AC refinement of the band Ss..Se: newly nonzero coefficients of magnitude 2^Al, and a
 * correction bit for each coefficient already nonzero that a run passes over (jdphuff.c's
 * decode_mcu_AC_refine, by NOTE [ Refinement by masks ]). */
static inline __attribute__((always_inline)) boolean ll_phuff_refine(j_decompress_ptr c, JBLOCKROW *MCU_data,
                                                                      int bmi2) {
    ll_huff *h = (ll_huff *)c->client_data;
    ll_phuff_restart(h);
    ll_bits b = h->br;
    JCOEF *blk = MCU_data[0][0];
    const ll_htab *t = h->ac[0];
    const int Se = c->Se;
    const int p1 = 1 << c->Al, m1 = (int)(~0u << c->Al);
    const uint64_t band = ll_low_bits(Se + 1) & (~0ull << c->Ss);
    uint64_t nz = ll_zz_mask(blk) & band, up = 0;
    int k = c->Ss;
    if (h->eobrun == 0) {
        for (; k <= Se; k++) {
            LL_PREFILL(h, b);
            int sym = ll_decode_symbol(h, t, &b, (unsigned)(b.buf >> (64 - LL_HB)));
            int r = sym >> 4, s = sym & 15;
            if (s) {
                if (s != 1) ll_huff_bail(h); /* libjpeg warns: JWRN_HUFF_BAD_CODE */
                s = ll_pbits(&b, 1) ? p1 : m1;
            } else if (r != 15) { /* EOBr: this block's rest and 2^r + r bits - 1 more blocks */
                h->eobrun = (1u << r) + ll_pbits(&b, r);
                break;
            }
            /* The run ends at the (r+1)-th zero coefficient from k (a ZRL's: the sixteenth),
             * or past the band (64); the nonzero ones before it get their correction bits. */
            const int end = ll_nth_bit(~nz & band & (~0ull << k), r, bmi2);
            up |= ll_phuff_bits_to(h, &b, nz & ll_low_bits(end) & (~0ull << k), bmi2);
            k = end;
            if (s) {
                if (k > Se) ll_huff_bail(h); /* past the band */
                blk[ll_natural[k]] = (JCOEF)s;
                nz |= 1ull << k;
            }
        }
    }
    if (h->eobrun > 0) { /* in an end-of-band run: only correction bits */
        if (k <= Se) up |= ll_phuff_bits_to(h, &b, nz & (~0ull << k), bmi2);
        h->eobrun--;
    }
    ll_phuff_correct(blk, up, p1, m1);
    return ll_phuff_done(c, h, b);
}

static boolean ll_phuff_ac_refine(j_decompress_ptr c, JBLOCKROW *MCU_data) { return ll_phuff_refine(c, MCU_data, 0); }

#if defined(__GNUC__) && defined(__x86_64__)
__attribute__((target("bmi,bmi2,popcnt"))) static boolean ll_phuff_ac_refine_bmi2(j_decompress_ptr c, JBLOCKROW *MCU_data) {
    return ll_phuff_refine(c, MCU_data, 1);
}
#endif

/* The copy of the refinement decoder this CPU runs. */
static ll_decode_mcu_fn ll_phuff_refiner(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (ll_has_bmi2()) return ll_phuff_ac_refine_bmi2;
#endif
    return ll_phuff_ac_refine;
}

/* After libjpeg's start_pass of a scan: our decoder for it, when the scan is one it takes. */
static void ll_phuff_setup(j_decompress_ptr c) {
    ll_huff *h = (ll_huff *)c->client_data;
    struct ll_entropy_iface *e = (struct ll_entropy_iface *)c->entropy;
    h->mcus_left = 0;
    if (c->comps_in_scan < 1 || c->comps_in_scan > MAX_COMPS_IN_SCAN) return;
    if (c->blocks_in_MCU < 1 || c->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU || c->unread_marker != 0) return;
    if (c->src == NULL || c->src->next_input_byte == NULL) return;
    pthread_once(&ll_zz_once, ll_zz_build);
    if (c->Al < 0 || c->Al > 13 || c->Ss < 0 || c->Se > 63 || c->Ss > c->Se) return;
    const int dc = c->Ss == 0;
    if (dc ? c->Se != 0 : (c->comps_in_scan != 1 || c->blocks_in_MCU != 1)) return;
    for (int b = 0; b < c->blocks_in_MCU; b++) {
        int ci = c->MCU_membership[b];
        if (ci < 0 || ci >= c->comps_in_scan) return;
        const jpeg_component_info *k = c->cur_comp_info[ci];
        h->ci[b] = ci;
        if (dc && c->Ah == 0) {
            int no = k->dc_tbl_no;
            if (no < 0 || no >= 4 || c->dc_huff_tbl_ptrs[no] == NULL) return;
            if (!ll_htab_build(&h->tabs[no], c->dc_huff_tbl_ptrs[no], 0)) return;
            h->dc[b] = &h->tabs[no];
        } else if (!dc) {
            int no = k->ac_tbl_no;
            if (no < 0 || no >= 4 || c->ac_huff_tbl_ptrs[no] == NULL) return;
            if (!ll_htab_build(&h->tabs[4 + no], c->ac_huff_tbl_ptrs[no], 2)) return;
            h->ac[b] = &h->tabs[4 + no];
        }
    }
    const unsigned long n = (unsigned long)c->MCUs_per_row * (unsigned long)c->MCU_rows_in_scan;
    if (n == 0) return;
    ll_huff_start_scan(c, h);
    h->mcus_left = n;
    e->decode_mcu = dc ? (c->Ah == 0 ? ll_phuff_dc_first : ll_phuff_dc_refine)
                       : (c->Ah == 0 ? ll_phuff_ac_first : ll_phuff_refiner());
    if (h->scans++ == 0) __atomic_fetch_add(&ll_huff_installed, 1, __ATOMIC_RELAXED);
}

static void ll_phuff_start_pass(j_decompress_ptr c) {
    ll_huff *h = (ll_huff *)c->client_data;
    h->lib_start_pass(c); /* may warn, or fail through libjpeg's error exit */
    ll_phuff_setup(c);
}

/* The progress monitor, called first before libjpeg reads the first scan's data. */
static void ll_phuff_monitor(j_common_ptr cc) {
    j_decompress_ptr c = (j_decompress_ptr)cc;
    ll_huff *h = (ll_huff *)c->client_data;
    c->progress = NULL; /* once is enough: libjpeg tests it before every call */
    struct ll_entropy_iface *e = (struct ll_entropy_iface *)c->entropy;
    if (e == NULL || e->start_pass == NULL || c->input_scan_number != 1) return;
    h->lib_start_pass = e->start_pass;
    e->start_pass = ll_phuff_start_pass;
    ll_phuff_setup(c); /* the first scan: its start_pass has run */
}

/* Right before jpeg_start_decompress of a progressive 8-bit Huffman image: our decoder for
 * its scans (NOTE [ Progressive scans ]). The caller clears cinfo->progress afterwards. */
static void ll_phuff_hook(struct jpeg_decompress_struct *c, ll_huff *h, jmp_buf *jb) {
    if (!c->progressive_mode || c->arith_code || c->data_precision != 8) return;
    memset(&h->hook, 0, sizeof h->hook);
    h->hook.progress_monitor = ll_phuff_monitor;
    h->jb = jb;
    h->bailed = 0;
    h->scans = 0;
    h->mcus_left = 0;
    c->client_data = h;
    c->progress = &h->hook;
}

#endif
