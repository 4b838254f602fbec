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
 * The tokens of a row are first widened into a per-thread int64 scratch row (S + 1 entries,
 * 64 KB at S = 8192: it stays in L2), and the three outputs are then written from it in one
 * pass each. The per-type work is in the widening loop alone (6 source types), the writes are
 * 6 (ids type x index type) small loops the compiler vectorises; the outputs are written once,
 * which is the pass over main memory that the batch's bytes cost.
 */
#ifndef LL_TOKENS_H
#define LL_TOKENS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Widen tokens [lo, lo + n) of file f into out; 0, or the offset of the first id out of range + 1. */
static int64_t ll_tok_widen(const ll_tok_file *f, int64_t lo, int64_t n, int64_t limit, int64_t *out) {
    int64_t mn = 0, mx = 0;
    int64_t i;
#define LL_TOK_WIDEN(T) do { \
        const T *src = (const T *)f->data + lo; \
        int64_t a = n ? (int64_t)src[0] : 0, b = a; \
        for (i = 0; i < n; i++) { int64_t v = (int64_t)src[i]; out[i] = v; a = v < a ? v : a; b = v > b ? v : b; } \
        mn = a; mx = b; \
    } while (0)
    switch (f->dtype) {
    case LL_TOK_U8: LL_TOK_WIDEN(uint8_t); break;
    case LL_TOK_U16: LL_TOK_WIDEN(uint16_t); break;
    case LL_TOK_I16: LL_TOK_WIDEN(int16_t); break;
    case LL_TOK_U32: LL_TOK_WIDEN(uint32_t); break;
    case LL_TOK_I32: LL_TOK_WIDEN(int32_t); break;
    default: LL_TOK_WIDEN(int64_t); break;
    }
#undef LL_TOK_WIDEN
    if (n && (mn < 0 || mx >= limit)) {
        for (i = 0; i < n; i++)
            if (out[i] < 0 || out[i] >= limit) return i + 1;
    }
    return 0;
}

/* First k with bounds[k] / bdiv > x (bounds sorted; a corrupt index only gives wrong starts). */
static int64_t ll_tok_bound_after(const ll_tok_file *f, int64_t x) {
    int64_t lo = 0, hi = f->nbounds;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (f->bounds[mid] / f->bdiv > x) hi = mid; else lo = mid + 1;
    }
    return lo;
}

static void ll_tok_push(int32_t *starts, int64_t *ns, int64_t cap, int64_t p) {
    if (*ns < cap && (*ns == 0 || p > starts[*ns - 1])) starts[(*ns)++] = (int32_t)p;
}

/* Copy span [g, g + n) of the corpus to row[at...]; with ``detect`` push the document starts
 * inside it (NOTE [ A token row ]). Returns LL_TOK_OK or a status, ``fail`` says where. */
static int ll_tok_span(const ll_tok_spec *sp, int64_t g, int64_t n, int64_t at, int detect, int64_t *row,
                       int32_t *starts, int64_t *ns, int64_t cap, ll_tok_fail *fail) {
    int64_t total = sp->file_start[sp->nfiles];
    if (g < 0 || n < 0 || g > total || n > total - g) {
        fail->status = LL_TOK_SPAN; fail->where = g;
        return LL_TOK_SPAN;
    }
    int64_t done = 0;
    while (done < n) {
        int64_t pos = g + done;
        int64_t fi = ll_tok_file_of(sp, pos);
        const ll_tok_file *f = &sp->files[fi];
        int64_t lo = pos - sp->file_start[fi];
        int64_t k = f->ntok - lo;
        if (k <= 0) { fail->status = LL_TOK_SPAN; fail->where = pos; return LL_TOK_SPAN; }
        if (k > n - done) k = n - done;
        int64_t p0 = at + done;
        int64_t bad = ll_tok_widen(f, lo, k, sp->limit, row + p0);
        if (bad) { fail->status = LL_TOK_RANGE; fail->where = pos + bad - 1; return LL_TOK_RANGE; }
        if (detect) {
            if (lo == 0) ll_tok_push(starts, ns, cap, p0);   /* a file's first token starts a document */
            if (f->bounds != NULL) {
                int64_t b = ll_tok_bound_after(f, lo);
                for (; b < f->nbounds; b++) {
                    int64_t v = f->bounds[b] / f->bdiv;
                    if (v >= lo + k) break;
                    ll_tok_push(starts, ns, cap, p0 + (v - lo));
                }
            } else if (f->eos_split && sp->eos >= 0) {
                int64_t e = sp->eos;
                for (int64_t j = p0; j + 1 < p0 + k; j++)
                    if (row[j] == e) ll_tok_push(starts, ns, cap, j + 1);
            }
        }
        done += k;
    }
    return LL_TOK_OK;
}

/* Write one row's outputs from the widened tokens (NOTE [ Token rows in two passes ]). ``fill``
 * tokens were placed (the rest is padding); ``starts[0..ns)`` are the document starts in (0, S]
 * (row position 0 is implied). Positions restart at each start below S and at the padding. */
#define LL_TOK_WRITE(TI, TX) do { \
        TI *ids = (TI *)ids_v; TX *lab = (TX *)lab_v; TX *pos = (TX *)pos_v; \
        int64_t real = fill < S ? fill : S; \
        for (j = 0; j < real; j++) ids[j] = (TI)row[j]; \
        for (j = real; j < S; j++) ids[j] = (TI)pad; \
        int64_t lab_real = fill - 1 < S ? fill - 1 : S; \
        if (lab_real < 0) lab_real = 0; \
        for (j = 0; j < lab_real; j++) lab[j] = (TX)row[j + 1]; \
        for (j = lab_real; j < S; j++) lab[j] = (TX)ign; \
        if (sp->mask_doc_starts) \
            for (k = 0; k < ns; k++) if (starts[k] >= 1 && starts[k] <= S) lab[starts[k] - 1] = (TX)ign; \
        int64_t from = 0; \
        for (k = 0; k <= ns; k++) { \
            int64_t to = real; \
            if (k < ns) { to = starts[k]; if (to <= from || to >= real) continue; } \
            for (j = from; j < to; j++) pos[j] = (TX)(j - from); \
            from = to; \
        } \
        for (j = real; j < S; j++) pos[j] = (TX)(j - real); \
    } while (0)

static void ll_tok_write(const ll_tok_spec *sp, const int64_t *row, int64_t fill, const int32_t *starts, int64_t ns,
                         void *ids_v, void *lab_v, void *pos_v) {
    int64_t S = sp->S, pad = sp->pad_id, ign = sp->ignore, j, k;
    if (sp->idx_type == LL_TOK_OUT_I64) {
        if (sp->ids_type == LL_TOK_OUT_U16) LL_TOK_WRITE(uint16_t, int64_t);
        else if (sp->ids_type == LL_TOK_OUT_I32) LL_TOK_WRITE(int32_t, int64_t);
        else LL_TOK_WRITE(int64_t, int64_t);
    } else {
        if (sp->ids_type == LL_TOK_OUT_U16) LL_TOK_WRITE(uint16_t, int32_t);
        else if (sp->ids_type == LL_TOK_OUT_I32) LL_TOK_WRITE(int32_t, int32_t);
        else LL_TOK_WRITE(int64_t, int32_t);
    }
}
#undef LL_TOK_WRITE

/* One row from spans seg_g[0..nseg), seg_n[0..nseg) placed one after the other (``detect``:
 * a concat window, whose document starts are found inside it; otherwise every span is a
 * document piece and starts a document). ``row``: S + 1 int64 of scratch; ``starts``: S + 2
 * int32 of the row's own scratch, left holding the segment starts below S (0 first, the
 * padding's start last) and their count in *nseg_out. Thread-safe: touches only its arguments. */
static int ll_tok_row(const ll_tok_spec *sp, const int64_t *seg_g, const int64_t *seg_n, int64_t nseg, int detect,
                      int64_t *row, int32_t *starts, int64_t *nseg_out, void *ids, void *lab, void *pos,
                      ll_tok_fail *fail) {
    int64_t S = sp->S, cap = S + 2, ns = 0, fill = 0;
    fail->status = LL_TOK_OK; fail->where = -1;
    for (int64_t s = 0; s < nseg; s++) {
        int64_t n = seg_n[s];
        if (n > S + 1 - fill) n = S + 1 - fill;   /* a plan never overfills; a corrupt one is cut */
        if (n <= 0) continue;
        if (!detect && fill > 0) ll_tok_push(starts, &ns, cap, fill);
        int st = ll_tok_span(sp, seg_g[s], n, fill, detect, row, starts, &ns, cap, fail);
        if (st != LL_TOK_OK) return st;
        fill += n;
    }
    /* starts[] now holds document starts in [0, S]; write, then keep the segment starts below S:
     * 0, the document starts among the tokens placed, and the padding's start. */
    int64_t first = (ns > 0 && starts[0] == 0) ? 1 : 0;
    ll_tok_write(sp, row, fill, starts + first, ns - first, ids, lab, pos);
    int64_t real = fill < S ? fill : S;
    if (!first) {   /* room for it: at most S + 1 starts were pushed into S + 2 */
        memmove(starts + 1, starts, (size_t)ns * sizeof(int32_t));
        starts[0] = 0;
        ns++;
    }
    int64_t m = 1;
    for (int64_t k = 1; k < ns; k++)
        if (starts[k] > 0 && starts[k] < real) starts[m++] = starts[k];
    if (real < S) starts[m++] = (int32_t)real;   /* the padding, a segment of its own */
    *nseg_out = m;
    return LL_TOK_OK;
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
