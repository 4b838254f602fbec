/* A template, included by ll_tokens.h once per output type pair: TI is the type of input_ids,
 * TX that of labels and position_ids, LL_TOK_SUFFIX names the instance. No include guard on
 * purpose. See NOTE [ A token row ] and NOTE [ Token rows in two passes ] in ll_tokens.h. */

#define LL_TOK_CAT2(a, b) a##_##b
#define LL_TOK_CAT(a, b) LL_TOK_CAT2(a, b)
#define LL_TOK_FN(name) LL_TOK_CAT(name, LL_TOK_SUFFIX)
#ifndef LL_TOK_ATTR
#define LL_TOK_ATTR
#endif

/* Tokens [lo, lo + m) of file f to row positions [p0, p0 + m): those below S into ids, the one
 * at S (if any) into *extra. 0, or 1 + the offset (from lo) of the first id out of [0, limit). */
LL_TOK_ATTR static int64_t LL_TOK_FN(ll_tok_copy)(const ll_tok_file *f, int64_t lo, int64_t m, int64_t p0, int64_t S,
                                                  int64_t limit, TI *ids, int64_t *extra) {
    int64_t in_ids = p0 + m > S ? S - p0 : m;
    int64_t mn = INT64_MAX, mx = INT64_MIN, i;
    TI *dst = ids + p0;
    /* NOTE [ Token ranges checked only where they can fail ]: ids of a type whose every value
     * lies in [0, limit) (uint8/uint16 below a limit of 65,536 or more) are copied without a
     * check; unsigned types check their maximum only. Either way the loop is a plain copy
     * the compiler vectorises. */
#define LL_TOK_CONVERT(TS, LO, HI) do { \
        const TS *src = (const TS *)f->data + lo; \
        if (in_ids > 0) { \
            if ((int64_t)(LO) >= 0 && (int64_t)(HI) < limit) { \
                for (i = 0; i < in_ids; i++) dst[i] = (TI)src[i]; \
                mn = 0; mx = 0; \
            } else if ((int64_t)(LO) >= 0) { \
                TS b = src[0]; \
                for (i = 0; i < in_ids; i++) { TS v = src[i]; dst[i] = (TI)v; b = v > b ? v : b; } \
                mn = 0; mx = (int64_t)b; \
            } else { \
                TS a = src[0], b = src[0]; \
                for (i = 0; i < in_ids; i++) { TS v = src[i]; dst[i] = (TI)v; a = v < a ? v : a; b = v > b ? v : b; } \
                mn = (int64_t)a; mx = (int64_t)b; \
            } \
        } \
    } while (0)
    switch (f->dtype) {
    case LL_TOK_U8: LL_TOK_CONVERT(uint8_t, 0, UINT8_MAX); break;
    case LL_TOK_U16: LL_TOK_CONVERT(uint16_t, 0, UINT16_MAX); break;
    case LL_TOK_I16: LL_TOK_CONVERT(int16_t, INT16_MIN, INT16_MAX); break;
    case LL_TOK_U32: LL_TOK_CONVERT(uint32_t, 0, UINT32_MAX); break;
    case LL_TOK_I32: LL_TOK_CONVERT(int32_t, INT32_MIN, INT32_MAX); break;
    default: LL_TOK_CONVERT(int64_t, INT64_MIN, INT64_MAX); break;
    }
#undef LL_TOK_CONVERT
    if (in_ids < m) {   /* the row's last token: a label only */
        int64_t v = ll_tok_load(f, lo + in_ids);
        *extra = v;
        if (v < mn) mn = v;
        if (v > mx) mx = v;
    }
    if (m > 0 && (mn < 0 || mx >= limit)) {
        for (i = 0; i < m; i++) {
            int64_t v = ll_tok_load(f, lo + i);
            if (v < 0 || v >= limit) return i + 1;
        }
    }
    return 0;
}

/* Copy span [g, g + n) of the corpus to row position ``at``; with ``detect`` push the document
 * starts inside it. LL_TOK_OK, or a status with ``fail`` saying where. */
LL_TOK_ATTR static int LL_TOK_FN(ll_tok_span)(const ll_tok_spec *sp, int64_t g, int64_t n, int64_t at, int detect, TI *ids,
                                  int64_t *extra, int32_t *starts, int64_t *ns, int64_t cap, ll_tok_fail *fail) {
    int64_t total = sp->file_start[sp->nfiles], S = sp->S;
    if (g < 0 || n < 0 || g > total || n > total - g) {
        fail->status = LL_TOK_SPAN; fail->where = g;
        return LL_TOK_SPAN;
    }
    int64_t done = 0;
    while (done < n) {
        int64_t gpos = g + done;
        int64_t fi = ll_tok_file_of(sp, gpos);
        const ll_tok_file *f = &sp->files[fi];
        int64_t lo = gpos - sp->file_start[fi];
        int64_t k = f->ntok - lo;
        if (k <= 0 || f->data == NULL) { fail->status = LL_TOK_SPAN; fail->where = gpos; return LL_TOK_SPAN; }
        if (k > n - done) k = n - done;
        int64_t p0 = at + done;
        int64_t bad = LL_TOK_FN(ll_tok_copy)(f, lo, k, p0, S, sp->limit, ids, extra);
        if (bad) { fail->status = LL_TOK_RANGE; fail->where = gpos + bad - 1; return LL_TOK_RANGE; }
        if (detect) {
            if (lo == 0) ll_tok_push(starts, ns, cap, p0);   /* a file's first token starts a document */
            if (f->bounds != NULL) {
                for (int64_t b = ll_tok_bound_after(f, lo); b < f->nbounds; b++) {
                    int64_t v = ll_tok_bound(f, b);
                    if (v >= lo + k) break;
                    ll_tok_push(starts, ns, cap, p0 + (v - lo));
                }
            } else if (f->eos_split && sp->eos >= 0) {
                /* a token after EOS starts a document: EOS at row positions p0.. below S */
                int64_t end = p0 + k - 1 < S ? p0 + k - 1 : S;
                TI e = (TI)sp->eos;
                int64_t j = p0;
                for (; j + 32 <= end; j += 32) {   /* most blocks hold no EOS: test 32 at once */
                    int any = 0;
                    for (int q = 0; q < 32; q++) any |= ids[j + q] == e;
                    if (any)
                        for (int q = 0; q < 32; q++)
                            if (ids[j + q] == e) ll_tok_push(starts, ns, cap, j + q + 1);
                }
                for (; j < end; j++)
                    if (ids[j] == e) ll_tok_push(starts, ns, cap, j + 1);
            }
        }
        done += k;
    }
    return LL_TOK_OK;
}

LL_TOK_ATTR static int LL_TOK_FN(ll_tok_row)(const ll_tok_spec *sp, const int64_t *seg_g, const int64_t *seg_n, int64_t nseg,
                                 int detect, int32_t *starts, int64_t *nseg_out, void *ids_v, void *lab_v, void *pos_v,
                                 ll_tok_fail *fail) {
    TI *ids = (TI *)ids_v;
    TX *lab = (TX *)lab_v;
    TX *pos = (TX *)pos_v;
    int64_t S = sp->S, cap = S + 2, ns = 0, fill = 0, extra = 0, j, k;
    fail->status = LL_TOK_OK; fail->where = -1;
    for (int64_t s = 0; s < nseg; s++) {
        int64_t n = seg_n[s];
        if (n > S + 1 - fill) n = S + 1 - fill;   /* a plan never overfills; a corrupt one is cut */
        if (n <= 0) continue;
        if (!detect && fill > 0) ll_tok_push(starts, &ns, cap, fill);
        int st = LL_TOK_FN(ll_tok_span)(sp, seg_g[s], n, fill, detect, ids, &extra, starts, &ns, cap, fail);
        if (st != LL_TOK_OK) return st;
        fill += n;
    }
    /* starts[0..ns) are the document starts in [0, S] (NOTE [ A token row ]). */
    int64_t real = fill < S ? fill : S;
    TI pad = (TI)sp->pad_id;
    TX ign = (TX)sp->ignore;
    for (j = real; j < S; j++) ids[j] = pad;
    int64_t lab_real = fill - 1 < S ? fill - 1 : S;
    if (lab_real < 0) lab_real = 0;
    int64_t shifted = lab_real < S - 1 ? lab_real : S - 1;
    for (j = 0; j < shifted; j++) lab[j] = (TX)ids[j + 1];
    if (lab_real == S) lab[S - 1] = (TX)extra;
    for (j = lab_real; j < S; j++) lab[j] = ign;
    if (sp->mask_doc_starts)
        for (k = 0; k < ns; k++)
            if (starts[k] >= 1 && starts[k] <= S) lab[starts[k] - 1] = ign;
    /* segment starts below S: 0, the document starts among the tokens placed, the padding's */
    int64_t first = (ns > 0 && starts[0] == 0) ? 1 : 0;
    if (!first) {   /* room for it: at most S + 1 starts were pushed into S + 2 */
        memmove(starts + 1, starts, (size_t)ns * sizeof(int32_t));
        starts[0] = 0;
        ns++;
    }
    int64_t m = 1;
    for (k = 1; k < ns; k++)
        if (starts[k] > 0 && starts[k] < real) starts[m++] = starts[k];
    if (real < S) starts[m++] = (int32_t)real;   /* the padding, a segment of its own */
    for (k = 0; k < m; k++) {
        int64_t from = starts[k], to = k + 1 < m ? starts[k + 1] : S;
        for (j = from; j < to; j++) pos[j] = (TX)(j - from);
    }
    *nseg_out = m;
    return LL_TOK_OK;
}

#undef LL_TOK_FN
#undef LL_TOK_ATTR
#undef LL_TOK_CAT
#undef LL_TOK_CAT2
#undef LL_TOK_SUFFIX
#undef TI
#undef TX
