/* ops/ref/attention.c — readable reference for softmax(q k^T * scale) v per head.
 * q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], out [B, Hq, Tq, Dv], any
 * strides. Query head h reads kv head h / (Hq / Hkv): K and V are indexed, never
 * copied. For each (b, h, i): scores over the visible keys in double, a numerically
 * stable softmax (subtract the max), then the probability-weighted sum of V rows.
 * Causal rows see keys j <= i + (Tk - Tq), and with a window only the last `window`
 * of those (j > i + (Tk - Tq) - window). A row with no visible key (Tk = 0) is 0,
 * matching matmul + softmax + matmul over an empty key axis.
 * O(B * Hq * Tq * Tk * (D + Dv)) time, one [Tk + Dv] double workspace.
 */
#include "ops/ref/attention.h"

/* Element offset of [i0, i1, i2, 0] in a 4-d view. */
static int64_t off3(const lm_tensor_view *t, int64_t i0, int64_t i1, int64_t i2) {
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2];
}

/* p[j] = exp(s_j - max s) for j0 <= j < nkeys, s_j = scale * q[b, h, i, :] . k[b, kvh,
 * j, :]; returns sum_j p[j]. */
static double softmax_weights(const lm_tensor_view *q, const lm_tensor_view *k, int64_t b, int64_t h, int64_t kvh,
                              int64_t i, int64_t j0, int64_t nkeys, double scale, double *p /* [nkeys] */) {
    int64_t D = q->shape[3], q0 = off3(q, b, h, i);
    double mx = -INFINITY;
    for (int64_t j = j0; j < nkeys; j++) {
        int64_t k0 = off3(k, b, kvh, j);
        double dot = 0.0;
        for (int64_t d = 0; d < D; d++)
            dot += lm__ld(q->dtype, q->data, q0 + d * q->stride[3]) * lm__ld(k->dtype, k->data, k0 + d * k->stride[3]);
        p[j] = scale * dot;
        if (p[j] > mx) mx = p[j];
    }
    double sum = 0.0;
    for (int64_t j = j0; j < nkeys; j++) {
        p[j] = exp(p[j] - mx);
        sum += p[j];
    }
    return sum;
}

/* out[b, h, i, :] = sum_j p[j] * v[b, kvh, j, :] / sum. */
static void weighted_values(const lm_tensor_view *v, int64_t b, int64_t kvh, const double *p /* [nkeys] */,
                            int64_t j0, int64_t nkeys, double sum, double *acc /* [Dv] */, const lm_tensor_view *out,
                            int64_t h, int64_t i) {
    int64_t Dv = v->shape[3], o0 = off3(out, b, h, i);
    for (int64_t e = 0; e < Dv; e++) acc[e] = 0.0;
    for (int64_t j = j0; j < nkeys; j++) {
        int64_t v0 = off3(v, b, kvh, j);
        for (int64_t e = 0; e < Dv; e++) acc[e] += p[j] * lm__ld(v->dtype, v->data, v0 + e * v->stride[3]);
    }
    for (int64_t e = 0; e < Dv; e++)
        lm__st(out->dtype, out->data, o0 + e * out->stride[3], nkeys > j0 ? acc[e] / sum : 0.0);
}

lm_status lm__ref_attention(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, double scale,
                            int causal, int64_t window, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2];
    int64_t Hkv = k->shape[1], Tk = k->shape[2], Dv = v->shape[3];
    int64_t group = Hq / Hkv; /* query heads per kv head */
    double *work = lm__calloc((size_t)(Tk + Dv), sizeof(double));
    if (!work) return lm__error_context(LM_OUT_OF_MEMORY, "attention workspace of %lld doubles", (long long)(Tk + Dv));
    double *p = work, *acc = work + Tk; /* p [Tk], acc [Dv] */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int64_t nkeys = causal ? i + (Tk - Tq) + 1 : Tk;
                int64_t j0 = window > 0 ? LM_MAX(0, nkeys - window) : 0;
                double sum = softmax_weights(q, k, b, h, h / group, i, j0, nkeys, scale, p);
                weighted_values(v, b, h / group, p, j0, nkeys, sum, acc, out, h, i);
            }
    lm__free(work);
    return LM_OK;
}
