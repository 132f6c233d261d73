/* ops/ref/kv.c — readable references of the KV-cache step operators.
 *
 * kv_store copies element by element through lm__ld/lm__st (any float dtypes, any
 * strides; the cache's dtype rounds). attention_cache is, per row b, lm__ref_attention
 * of the row's queries [1, Hq, T, D] (a permuted view of q) over its slot's first
 * p_last + 1 cached positions, causal (the queries are the last T of those keys) with
 * the window; so the cached-attention reference is the plain attention reference.
 * O(B * T * Hkv * D) and O(B * Hq * T * P * D) time.
 */
#include "ops/ref/kv.h"

#include "ops/ref/attention.h"

void lm__ref_kv_store(const lm_tensor_view *cache, const lm_tensor_view *x, const lm_tensor_view *slots,
                      const lm_tensor_view *positions) {
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3];
    for (int64_t b = 0; b < B; b++) {
        int64_t s = lm__index_at(slots, b);
        for (int64_t t = 0; t < T; t++) {
            int64_t p = lm__ld_index(positions->dtype, positions->data, b * positions->stride[0] + t * positions->stride[1]);
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    int64_t xo = b * x->stride[0] + t * x->stride[1] + h * x->stride[2] + d * x->stride[3];
                    int64_t co = s * cache->stride[0] + h * cache->stride[1] + p * cache->stride[2] + d * cache->stride[3];
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

lm_status lm__ref_attention_cache(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                  const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                  const lm_tensor_view *positions, double scale, int64_t window,
                                  const lm_tensor_view *out) {
    int64_t B = q->shape[0], T = q->shape[1];
    for (int64_t b = 0; b < B; b++) {
        int64_t s = lm__index_at(slots, b);
        int64_t last = lm__ld_index(positions->dtype, positions->data, b * positions->stride[0] + (T - 1) * positions->stride[1]);
        lm_tensor_view qr, orow, kr, vr;
        row_heads(q, b, &qr);
        row_heads(out, b, &orow);
        slot_keys(k_cache, s, last + 1, &kr);
        slot_keys(v_cache, s, last + 1, &vr);
        LM_TRY(lm__ref_attention(&qr, &kr, &vr, scale, 1, window, &orow));
    }
    return LM_OK;
}
