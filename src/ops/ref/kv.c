/* ops/ref/kv.c — readable references of the KV-cache step operators.
 *
 * kv_store copies element by element through lm__ld/lm__st (any float dtypes, any
 * strides; the cache's dtype rounds), each position into its block (ops.h).
 * attention_cache is, per row b, lm__ref_attention of the row's queries [1, Hq, T, D]
 * (a permuted view of q) over the row's first p_last + 1 cached positions (a view of
 * its slot, or those positions gathered from their blocks), causal (the queries are
 * the last T of those keys) with the window; so the cached-attention reference is the
 * plain attention reference.
 * qkv_rope_store does per head what its composition does (bias, per-head RMSNorm,
 * split-half RoPE with angles in double, the stores), all in double.
 * O(B * T * Hkv * D) and O(B * Hq * T * P * D) time.
 */
#include "ops/ref/kv.h"

#include "ops/ref/attention.h"

#include <string.h>

void lm__ref_kv_store(const lm_tensor_view *cache, const lm_tensor_view *x, const lm_tensor_view *slots,
                      const lm_tensor_view *positions) {
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3], P = cache->shape[2];
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            int64_t p = lm__ld_index(positions->dtype, positions->data, b * positions->stride[0] + t * positions->stride[1]);
            int64_t s = lm__kv_block(slots, b, p, P), o = p % P;
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    int64_t xo = b * x->stride[0] + t * x->stride[1] + h * x->stride[2] + d * x->stride[3];
                    int64_t co = s * cache->stride[0] + h * cache->stride[1] + o * cache->stride[2] + d * cache->stride[3];
                    lm__st(cache->dtype, cache->data, co, lm__ld(x->dtype, x->data, xo));
                }
        }
    }
}

/* Row b of a [B, T, H, D] view as [1, H, T, D]. */
static void row_heads(const lm_tensor_view *v, int64_t b, lm_tensor_view *out) {
    *out = *v;
    out->data = (char *)v->data + (size_t)(b * v->stride[0]) * lm_dtype_size(v->dtype);
    out->shape[0] = 1;
    out->shape[1] = v->shape[2], out->stride[1] = v->stride[2];
    out->shape[2] = v->shape[1], out->stride[2] = v->stride[1];
}

/* Slot s of a cache [S, H, P, D], positions [0, n), as [1, H, n, D]. */
static void slot_keys(const lm_tensor_view *c, int64_t s, int64_t n, lm_tensor_view *out) {
    *out = *c;
    out->data = (char *)c->data + (size_t)(s * c->stride[0]) * lm_dtype_size(c->dtype);
    out->shape[0] = 1;
    out->shape[2] = n;
}

lm_status lm__kv_gather_row(const lm_tensor_view *c, const lm_tensor_view *slots, int64_t b, int64_t n,
                            lm_tensor_view *out, void **buf) {
    int64_t H = c->shape[1], P = c->shape[2], D = c->shape[3];
    *buf = NULL;
    if (lm__kv_blocks_per_row(slots) == 1) { /* the row's slot: a view, no copy */
        slot_keys(c, lm__index_at(slots, b), n, out);
        return LM_OK;
    }
    size_t es = lm_dtype_size(c->dtype);
    char *dst = lm__alloc((size_t)(H * n * D) * es, 64);
    if (!dst) return lm__error_context(LM_OUT_OF_MEMORY, "attention_cache: %lld gathered positions", (long long)n);
    for (int64_t j = 0; j < n; j++) {
        int64_t blk = lm__kv_block(slots, b, j, P), o = j % P;
        for (int64_t h = 0; h < H; h++) {
            const char *src = (const char *)c->data + (size_t)(blk * c->stride[0] + h * c->stride[1] + o * c->stride[2]) * es;
            char *row = dst + (size_t)((h * n + j) * D) * es;
            if (c->stride[3] == 1) {
                memcpy(row, src, (size_t)D * es);
            } else {
                for (int64_t d = 0; d < D; d++) memcpy(row + (size_t)d * es, src + (size_t)(d * c->stride[3]) * es, es);
            }
        }
    }
    int64_t shape[4] = {1, H, n, D};
    lm_status st = lm_tensor_view_init(out, dst, c->dtype, c->device, 4, shape, NULL);
    if (st != LM_OK) {
        lm__free(dst);
        return st;
    }
    *buf = dst;
    return LM_OK;
}

lm_status lm__ref_attention_cache(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                  const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                  const lm_tensor_view *positions, double scale, int64_t window,
                                  const lm_tensor_view *out) {
    int64_t B = q->shape[0], T = q->shape[1];
    for (int64_t b = 0; b < B; b++) {
        int64_t last = lm__ld_index(positions->dtype, positions->data, b * positions->stride[0] + (T - 1) * positions->stride[1]);
        lm_tensor_view qr, orow, kr, vr;
        row_heads(q, b, &qr);
        row_heads(out, b, &orow);
        void *kb = NULL, *vb = NULL;
        lm_status st = lm__kv_gather_row(k_cache, slots, b, last + 1, &kr, &kb);
        if (st == LM_OK) st = lm__kv_gather_row(v_cache, slots, b, last + 1, &vr, &vb);
        if (st == LM_OK) st = lm__ref_attention(&qr, &kr, &vr, scale, 1, window, &orow);
        lm__free(kb);
        lm__free(vb);
        LM_TRY(st);
    }
    return LM_OK;
}

static double vec(const lm_tensor_view *v, int64_t i) { return lm__ld(v->dtype, v->data, i * v->stride[0]); }

/* Head h (of q, then k, then v) of token (b, t) through bias, norm and RoPE into row[D]. */
static void head_row(const lm_tensor_view *qkv, const lm_qkv_rope_params *p, int64_t b, int64_t t, int64_t h,
                     int64_t heads_qk, int64_t D, int64_t pos, double *row) {
    for (int64_t d = 0; d < D; d++) {
        int64_t c = h * D + d;
        row[d] = lm__ld(qkv->dtype, qkv->data, b * qkv->stride[0] + t * qkv->stride[1] + c * qkv->stride[2]) +
                 (p->bias ? vec(p->bias, c) : 0.0);
    }
    if (h >= heads_qk) return; /* v heads: bias only */
    const lm_tensor_view *nw = h < p->q_heads ? p->q_norm : p->k_norm;
    if (nw) {
        double ss = 0.0;
        for (int64_t d = 0; d < D; d++) ss += row[d] * row[d];
        double inv = 1.0 / sqrt(ss / (double)D + (double)p->eps);
        for (int64_t d = 0; d < D; d++) row[d] *= inv * vec(nw, d);
    }
    int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        double angle = (double)pos * vec(p->inv_freq, i), c = cos(angle) * p->attn_factor, s = sin(angle) * p->attn_factor;
        double a = row[i], bb = row[i + half];
        row[i] = a * c - bb * s;
        row[i + half] = bb * c + a * s;
    }
}

lm_status lm__ref_qkv_rope_store(const lm_tensor_view *qkv, const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                 const lm_tensor_view *positions, const lm_tensor_view *k_cache,
                                 const lm_tensor_view *v_cache, const lm_tensor_view *q) {
    int64_t B = qkv->shape[0], T = qkv->shape[1], Hq = p->q_heads, Hkv = k_cache->shape[1], D = k_cache->shape[3];
    int64_t P = k_cache->shape[2];
    double *row = lm__alloc(sizeof *row * (size_t)D, 64);
    if (!row) return lm__error_context(LM_OUT_OF_MEMORY, "qkv_rope_store: a row of %lld doubles", (long long)D);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            int64_t pos = lm__ld_index(positions->dtype, positions->data, b * positions->stride[0] + t * positions->stride[1]);
            int64_t s = lm__kv_block(slots, b, pos, P), o = pos % P;
            for (int64_t h = 0; h < Hq + 2 * Hkv; h++) {
                head_row(qkv, p, b, t, h, Hq + Hkv, D, pos, row);
                const lm_tensor_view *dst = h < Hq ? q : h < Hq + Hkv ? k_cache : v_cache;
                int64_t base = h < Hq ? b * q->stride[0] + t * q->stride[1] + h * q->stride[2]
                                      : s * dst->stride[0] + (h < Hq + Hkv ? h - Hq : h - Hq - Hkv) * dst->stride[1] +
                                            o * dst->stride[2];
                for (int64_t d = 0; d < D; d++) lm__st(dst->dtype, dst->data, base + d * dst->stride[3], row[d]);
            }
        }
    }
    lm__free(row);
    return LM_OK;
}
