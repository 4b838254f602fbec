/* Token sequences for language-model training: one row of a batch from a few spans of a
 * token corpus, and the placement of document pieces into rows.
 *
 * NOTE [ A token row ]
 * A training sequence of seq_len S is a row of S + 1 tokens: the model reads the first S
 * (``input_ids``) and predicts the last S (``labels[j] = row[j + 1]``), so in ``concat`` mode
 * consecutive windows overlap by one token and every token of the corpus is predicted exactly
 * once. A row is assembled from spans of the corpus (``concat``: one span of S + 1 tokens,
 * which may cross files; ``pad`` and ``pack``: one or more document pieces, then padding). A
 * row position p starts a document when p == 0, when a span (a piece) begins at p, or, inside
 * a span of a concat window, when p is the first token of a file, a document start of the
 * file's index, or (files delimited by an EOS id) follows an EOS token. Per input position:
 *   - ``position_ids[j]`` counts from 0 at the last document start at or before j; padding
 *     (row positions at or past the tokens placed) is one more segment, counted from 0 too;
 *   - ``labels[j]`` is ``row[j + 1]``, or the ignore index where ``row[j + 1]`` is padding, or
 *     (when asked: ``mask_doc_starts``) where ``row[j + 1]`` starts a document;
 *   - the segment starts below S are the row's entries of ``cu_seqlens`` (offset by r * S in
 *     the batch), so varlen attention never crosses a document.
 * Every read is bounds-checked against the file it comes from: a span outside the corpus is an
 * item status, never a read past a mapping, whatever the index files say.
 *
 * NOTE [ Token rows in two passes ]
 * The tokens of a row go from the file straight into ``input_ids`` (converted, their range
 * checked on the way), the row's last token, which only ``labels`` read, aside; ``labels`` are
 * then ``input_ids`` shifted by one, read back while still in cache, and ``position_ids`` are
 * runs counted from each segment start. Each output is written once, which is the pass over
 * main memory that a batch's bytes cost. A first version widened every row into an int64
 * scratch row and wrote the three outputs from it: 3.1 GB/s of output on one core here,
 * against 6.7 GB/s of memcpy. The row is one function per (ids type, index type) pair, made
 * from the template ll_tokens_row.h, with a loop per source type inside.
 */
#ifndef LL_TOKENS_H
#define LL_TOKENS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ll_common.h" /* ll_now_ns */
#ifndef _WIN32
#include <sys/mman.h>
#include <unistd.h>
#endif

enum { LL_TOK_U8 = 0, LL_TOK_U16 = 1, LL_TOK_I16 = 2, LL_TOK_U32 = 3, LL_TOK_I32 = 4, LL_TOK_I64 = 5 };
enum { LL_TOK_OUT_U16 = 0, LL_TOK_OUT_I32 = 1, LL_TOK_OUT_I64 = 2 };
/* Per-row status. */
enum { LL_TOK_OK = 0, LL_TOK_RANGE = 1, LL_TOK_SPAN = 2, LL_TOK_NOMEM = 3 };

typedef struct {
    const void *data;        /* the file's tokens (a mapping) */
    int64_t ntok;            /* tokens in the file */
    int dtype;               /* LL_TOK_* */
    const int64_t *bounds;   /* sorted document starts, in units of 1 / bdiv tokens; NULL: none */
    int64_t nbounds;
    int64_t bdiv;
    int bshift;              /* log2(bdiv) when bdiv is a power of two, else -1 */
    int eos_split;           /* no index: documents end at the EOS id */
} ll_tok_file;

typedef struct {
    const ll_tok_file *files;
    int64_t nfiles;
    const int64_t *file_start;   /* nfiles + 1 global token offsets, file_start[0] = 0 */
    int64_t eos;                 /* < 0: none */
    int64_t limit;               /* every id must be in [0, limit) */
    int64_t pad_id;
    int64_t ignore;
    int mask_doc_starts;
    int64_t S;
    int ids_type;                /* LL_TOK_OUT_* of input_ids */
    int idx_type;                /* LL_TOK_OUT_I32 / I64 of labels and position_ids */
} ll_tok_spec;

/* What a failed row reports: the global token position at fault (-1: none). */
typedef struct {
    int status;
    int64_t where;
} ll_tok_fail;

/* The file holding global token g (g < total): the last non-empty file starting at or before g. */
static int64_t ll_tok_file_of(const ll_tok_spec *sp, int64_t g) {
    int64_t lo = 0, hi = sp->nfiles;   /* file_start[lo] <= g < file_start[hi] */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (sp->file_start[mid] <= g) lo = mid; else hi = mid;
    }
    while (lo < sp->nfiles - 1 && sp->file_start[lo + 1] <= g) lo++;   /* skip empty files */
    return lo;
}

/* Token ``i`` of file f (the rare paths: one token, or finding the bad one). */
static int64_t ll_tok_load(const ll_tok_file *f, int64_t i) {
    switch (f->dtype) {
    case LL_TOK_U8: return ((const uint8_t *)f->data)[i];
    case LL_TOK_U16: return ((const uint16_t *)f->data)[i];
    case LL_TOK_I16: return ((const int16_t *)f->data)[i];
    case LL_TOK_U32: return ((const uint32_t *)f->data)[i];
    case LL_TOK_I32: return ((const int32_t *)f->data)[i];
    default: return ((const int64_t *)f->data)[i];
    }
}

/* Document start b of file f in tokens: bounds[b] / bdiv, a shift when bdiv is a power of two
 * (Megatron's byte pointers over 1, 2, 4 or 8-byte tokens): a row's search in
 * ll_tok_bound_after made about 20 64-bit divisions. The row kernel alone on 64 x 2,048 rows
 * measured 1,116 against 1,052 M tokens/s (best of 4 alternating runs each), within this
 * machine's noise. Negative bounds (a corrupt index) round differently under the shift; they
 * only give wrong starts either way. */
static inline int64_t ll_tok_bound(const ll_tok_file *f, int64_t b) {
    return f->bshift >= 0 ? f->bounds[b] >> f->bshift : f->bounds[b] / f->bdiv;
}

static int ll_tok_log2(int64_t d) {
    if (d <= 0 || (d & (d - 1)) != 0) return -1;
    int k = 0;
    while ((d >> k) != 1) k++;
    return k;
}

/* First k with bounds[k] / bdiv > x (bounds sorted; a corrupt index only gives wrong starts). */
static int64_t ll_tok_bound_after(const ll_tok_file *f, int64_t x) {
    int64_t lo = 0, hi = f->nbounds;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ll_tok_bound(f, mid) > x) hi = mid; else lo = mid + 1;
    }
    return lo;
}

static void ll_tok_push(int32_t *starts, int64_t *ns, int64_t cap, int64_t p) {
    if (*ns < cap && (*ns == 0 || p > starts[*ns - 1])) starts[(*ns)++] = (int32_t)p;
}

/* One row function per (input_ids type, labels/positions type), each built twice: for the
 * baseline x86-64 (SSE2) and for AVX2, picked at run time (ll_tok_avx2()): ll_tokens_row.h is
 * a template. */
#define LL_TOK_SUFFIX u16_i32
#define TI uint16_t
#define TX int32_t
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX i32_i32
#define TI int32_t
#define TX int32_t
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX i64_i32
#define TI int64_t
#define TX int32_t
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX u16_i64
#define TI uint16_t
#define TX int64_t
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX i32_i64
#define TI int32_t
#define TX int64_t
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX i64_i64
#define TI int64_t
#define TX int64_t
#include "ll_tokens_row.h"
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LL_TOK_HAVE_AVX2 1
#define LL_TOK_SUFFIX u16_i32_avx2
#define TI uint16_t
#define TX int32_t
#define LL_TOK_ATTR __attribute__((target("avx2")))
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX i32_i32_avx2
#define TI int32_t
#define TX int32_t
#define LL_TOK_ATTR __attribute__((target("avx2")))
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX i64_i32_avx2
#define TI int64_t
#define TX int32_t
#define LL_TOK_ATTR __attribute__((target("avx2")))
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX u16_i64_avx2
#define TI uint16_t
#define TX int64_t
#define LL_TOK_ATTR __attribute__((target("avx2")))
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX i32_i64_avx2
#define TI int32_t
#define TX int64_t
#define LL_TOK_ATTR __attribute__((target("avx2")))
#include "ll_tokens_row.h"
#define LL_TOK_SUFFIX i64_i64_avx2
#define TI int64_t
#define TX int64_t
#define LL_TOK_ATTR __attribute__((target("avx2")))
#include "ll_tokens_row.h"
#endif

static int ll_tok_avx2(void) {
#ifdef LL_TOK_HAVE_AVX2
    static int have = -1;
    if (have < 0) have = __builtin_cpu_supports("avx2") ? 1 : 0;
    return have;
#else
    return 0;
#endif
}

/* One row from spans seg_g[0..nseg), seg_n[0..nseg) placed one after the other (``detect``:
 * a concat window, whose document starts are found inside it; otherwise every span is a
 * document piece and starts a document). ``starts``: S + 2 int32 of the row's own scratch,
 * left holding the segment starts below S (0 first, the padding's start last) and their count
 * in *nseg_out. Thread-safe: touches only its arguments. */
static int ll_tok_row(const ll_tok_spec *sp, const int64_t *seg_g, const int64_t *seg_n, int64_t nseg, int detect,
                      int32_t *starts, int64_t *nseg_out, void *ids, void *lab, void *pos, ll_tok_fail *fail) {
#define LL_TOK_CALL(SUF) return ll_tok_row_##SUF(sp, seg_g, seg_n, nseg, detect, starts, nseg_out, ids, lab, pos, fail)
#ifdef LL_TOK_HAVE_AVX2
    if (ll_tok_avx2()) {
        if (sp->idx_type == LL_TOK_OUT_I64) {
            if (sp->ids_type == LL_TOK_OUT_U16) LL_TOK_CALL(u16_i64_avx2);
            if (sp->ids_type == LL_TOK_OUT_I32) LL_TOK_CALL(i32_i64_avx2);
            LL_TOK_CALL(i64_i64_avx2);
        }
        if (sp->ids_type == LL_TOK_OUT_U16) LL_TOK_CALL(u16_i32_avx2);
        if (sp->ids_type == LL_TOK_OUT_I32) LL_TOK_CALL(i32_i32_avx2);
        LL_TOK_CALL(i64_i32_avx2);
    }
#endif
    if (sp->idx_type == LL_TOK_OUT_I64) {
        if (sp->ids_type == LL_TOK_OUT_U16) LL_TOK_CALL(u16_i64);
        if (sp->ids_type == LL_TOK_OUT_I32) LL_TOK_CALL(i32_i64);
        LL_TOK_CALL(i64_i64);
    }
    if (sp->ids_type == LL_TOK_OUT_U16) LL_TOK_CALL(u16_i32);
    if (sp->ids_type == LL_TOK_OUT_I32) LL_TOK_CALL(i32_i32);
    LL_TOK_CALL(i64_i32);
#undef LL_TOK_CALL
}

/* A batch of rows as a job of the kernel team (ll_pool.h, NOTE [ Token rows on the kernel
 * team ] in loaderlib/_datasets/tokens/dataset.py): item i is output row out_rows[i], made
 * from the spans row_ptr[i]..row_ptr[i + 1]. Every pointer stays valid until the job is
 * waited for (the Python owner keeps the arrays alive). */
typedef struct {
    ll_tok_spec sp;
    const int64_t *seg_g, *seg_n, *row_ptr, *out_rows;
    int detect;
    char *ids, *lab, *pos;
    int64_t ids_stride, idx_stride;    /* bytes between output rows */
    int32_t *starts;
    int64_t starts_stride;             /* int32 entries between rows of starts */
    int64_t *counts;
    int32_t *status;
    int64_t *where;
    int64_t *item_ns;                  /* each row's time on its thread (NULL: not timed) */
} ll_tok_job;

static void ll_tok_job_item(void *ctx, int64_t i, int tid) {
    ll_tok_job *c = (ll_tok_job *)ctx;
    ll_tok_fail fail;
    int64_t r = c->out_rows[i], a = c->row_ptr[i], b = c->row_ptr[i + 1];
    int64_t t0 = c->item_ns != NULL ? ll_now_ns() : 0;
    (void)tid;
    c->status[i] = ll_tok_row(&c->sp, c->seg_g + a, c->seg_n + a, b - a, c->detect, c->starts + r * c->starts_stride,
                              c->counts + r, c->ids + r * c->ids_stride, c->lab + r * c->idx_stride,
                              c->pos + r * c->idx_stride, &fail);
    c->where[i] = fail.where;
    if (c->item_ns != NULL) c->item_ns[i] = ll_now_ns() - t0;
}

/* Ask the kernel to read spans [g, g + n) of the corpus ahead (MADV_WILLNEED on the pages of
 * each file's mapping they cover; NOTE [ Token read-ahead ] in loaderlib/_datasets/tokens/dataset.py).
 * Returns the bytes advised. Spans outside the corpus or in files not mapped are skipped. */
static int64_t ll_tok_will_need(const ll_tok_spec *sp, const int64_t *seg_g, const int64_t *seg_n, int64_t nseg) {
#if defined(MADV_WILLNEED) && !defined(_WIN32)
    static const int64_t ITEM[] = {1, 2, 2, 4, 4, 8};
    int64_t total = sp->file_start[sp->nfiles], advised = 0;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    for (int64_t s = 0; s < nseg; s++) {
        int64_t g = seg_g[s], n = seg_n[s];
        if (g < 0 || n <= 0 || g >= total) continue;
        if (n > total - g) n = total - g;
        while (n > 0) {
            int64_t fi = ll_tok_file_of(sp, g);
            const ll_tok_file *f = &sp->files[fi];
            int64_t lo = g - sp->file_start[fi], k = f->ntok - lo;
            if (k <= 0) break;
            if (k > n) k = n;
            if (f->data != NULL && f->dtype >= 0 && f->dtype <= LL_TOK_I64) {
                int64_t w = ITEM[f->dtype];
                uintptr_t a = (uintptr_t)f->data + (uintptr_t)(lo * w);
                uintptr_t b = a + (uintptr_t)(k * w);
                a &= ~(uintptr_t)(page - 1);
                if (madvise((void *)a, (size_t)(b - a), MADV_WILLNEED) == 0) advised += (int64_t)(b - a);
            }
            g += k;
            n -= k;
        }
    }
    return advised;
#else
    (void)sp; (void)seg_g; (void)seg_n; (void)nseg;
    return 0;
#endif
}

/* cu_seqlens over a batch of ``n`` rows from each row's segment starts (``starts`` rows of
 * ``stride`` int32, ``counts`` per row): writes counts-sum + 1 offsets, returns that number
 * and the longest segment in *max_len. */
static int64_t ll_tok_cu_seqlens(const int32_t *starts, int64_t stride, const int64_t *counts, int64_t n, int64_t S,
                                 int32_t *cu, int64_t *max_len) {
    int64_t m = 0, longest = 0;
    for (int64_t r = 0; r < n; r++) {
        const int32_t *st = starts + r * stride;
        for (int64_t k = 0; k < counts[r]; k++) {
            int64_t end = k + 1 < counts[r] ? st[k + 1] : S;
            if (end - st[k] > longest) longest = end - st[k];
            cu[m++] = (int32_t)(r * S + st[k]);
        }
    }
    cu[m++] = (int32_t)(n * S);
    *max_len = longest;
    return m;
}

/* Best-fit decreasing placement of ``n`` pieces of lengths lens[i] (1..cap) into rows of
 * capacity ``cap`` (NOTE [ Packing in blocks ] in loaderlib/_datasets/tokens/packing.py).
 * Pieces are taken longest first (ties: lower index first); each goes into the row with the
 * least room that still holds it, or a new row. Writes the row of each piece (row_of) and the
 * order the pieces were placed in (order); returns the number of rows, or -1 when memory ran
 * out. The same lengths give the same placement on every machine. */
static int64_t ll_tok_best_fit(const int64_t *lens, int64_t n, int64_t cap, int64_t *row_of, int64_t *order) {
    if (n == 0) return 0;
    int64_t words = cap / 64 + 1;
    int64_t *count = (int64_t *)calloc((size_t)(cap + 2), sizeof(int64_t));
    int64_t *head = (int64_t *)malloc((size_t)(cap + 1) * sizeof(int64_t));
    int64_t *next = (int64_t *)malloc((size_t)n * sizeof(int64_t));
    int64_t *room = (int64_t *)malloc((size_t)n * sizeof(int64_t));
    uint64_t *bits = (uint64_t *)calloc((size_t)words, sizeof(uint64_t));
    if (!count || !head || !next || !room || !bits) {
        free(count); free(head); free(next); free(room); free(bits);
        return -1;
    }
    /* counting sort by length, longest first, stable */
    for (int64_t i = 0; i < n; i++) {
        int64_t l = lens[i] < 1 ? 1 : (lens[i] > cap ? cap : lens[i]);
        count[cap - l + 1]++;
    }
    for (int64_t v = 1; v <= cap + 1; v++) count[v] += count[v - 1];
    for (int64_t i = 0; i < n; i++) {
        int64_t l = lens[i] < 1 ? 1 : (lens[i] > cap ? cap : lens[i]);
        order[count[cap - l]++] = i;
    }
    for (int64_t v = 0; v <= cap; v++) head[v] = -1;
    int64_t rows = 0;
    for (int64_t t = 0; t < n; t++) {
        int64_t i = order[t];
        int64_t l = lens[i] < 1 ? 1 : (lens[i] > cap ? cap : lens[i]);
        /* the smallest room >= l that some row has */
        int64_t w = l / 64, found = -1;
        uint64_t word = bits[w] & (~(uint64_t)0 << (l % 64));
        for (;;) {
            if (word) { found = w * 64 + __builtin_ctzll(word); break; }
            if (++w >= words) break;
            word = bits[w];
        }
        int64_t r;
        if (found >= 0 && found <= cap) {
            r = head[found];
            head[found] = next[r];
            if (head[found] < 0) bits[found / 64] &= ~((uint64_t)1 << (found % 64));
        } else {
            r = rows++;
            room[r] = cap;
        }
        row_of[i] = r;
        room[r] -= l;
        if (room[r] > 0) {
            int64_t v = room[r];
            next[r] = head[v];
            head[v] = r;
            bits[v / 64] |= (uint64_t)1 << (v % 64);
        }
    }
    free(count); free(head); free(next); free(room); free(bits);
    return rows;
}

#endif /* LL_TOKENS_H */
