/* ops/ref/attention_backward.c — readable reference for the attention gradients.
 * For each (b, h, i) with kv head g = h / (Hq / Hkv), the softmax row over the visible
 * keys is recomputed exactly as the forward (ops/ref/attention.c), then with
 * p_j the probabilities and dO = dout[b, h, i, :]:
 *   dv[g, j] += p_j dO                 dp_j = dO . v[g, j]
 *   ds_j = p_j (dp_j - sum_l p_l dp_l)  (softmax Jacobian; sum_l p_l dp_l = dO . out_i)
 *   dq[h, i] = scale sum_j ds_j k[g, j] dk[g, j] += scale ds_j q[h, i]
 * A window (causal only) gives the keys before the query's last `window` probability
 * 0, as in the forward. Only one row of Tk probabilities exists at a time (no Tq x Tk matrix). dk and dv
 * collect contributions from every query row and every head of the group in double
 * workspaces, rounded once at the end. O(B Hq Tq Tk (D + Dv)) time; workspaces of
 * numel(k) + numel(v) + Tk + D doubles.
 */
#include "ops/ref/attention_backward.h"

static int64_t off3(const lm_tensor_view *t, int64_t i0, int64_t i1, int64_t i2) {
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2];
}

static double ld4(const lm_tensor_view *t, int64_t base, int64_t d) {
    return lm__ld(t->dtype, t->data, base + d * t->stride[3]);
}

/* Normalized probabilities p[0..nkeys) of query row (b, h, i) against kv head g; keys
 * before j0 (outside a window) get probability 0. */
static void probabilities(const lm_tensor_view *q, const lm_tensor_view *k, int64_t b, int64_t h, int64_t g,
                          int64_t i, int64_t j0, int64_t nkeys, double scale, double *p) {
    int64_t D = q->shape[3], q0 = off3(q, b, h, i);
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < j0; j++) p[j] = -INFINITY;
    for (int64_t j = j0; j < nkeys; j++) {
        int64_t k0 = off3(k, b, g, j);
        double dot = 0.0;
        for (int64_t d = 0; d < D; d++) dot += ld4(q, q0, d) * ld4(k, k0, d);
        p[j] = scale * dot;
        if (p[j] > mx) mx = p[j];
    }
    for (int64_t j = 0; j < nkeys; j++) sum += (p[j] = j < j0 ? 0.0 : exp(p[j] - mx));
    for (int64_t j = 0; j < nkeys; j++) p[j] /= sum;
}

typedef struct grads {
    double *dk;  /* [B, Hkv, Tk, D] row-major, or NULL */
    double *dv;  /* [B, Hkv, Tk, Dv] row-major, or NULL */
    double *ds;  /* [Tk] scratch: dp, then ds */
    double *dqr; /* [D] scratch: one dq row */
} grads;

/* Contributions of query row (b, h, i) given its probabilities p. */
static void row_grads(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                      const lm_tensor_view *dout, int64_t b, int64_t h, int64_t g, int64_t i, int64_t nkeys,
                      double scale, const double *p, grads *w, const lm_tensor_view *dq) {
    int64_t Hkv = k->shape[1], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    int64_t o0 = off3(dout, b, h, i), q0 = off3(q, b, h, i), base = (b * Hkv + g) * Tk;
    double rowdot = 0.0;
    for (int64_t j = 0; j < nkeys; j++) {
        int64_t v0 = off3(v, b, g, j);
        double dp = 0.0;
        for (int64_t e = 0; e < Dv; e++) {
            double dO = ld4(dout, o0, e);
            dp += dO * ld4(v, v0, e);
            if (w->dv) w->dv[(base + j) * Dv + e] += p[j] * dO;
        }
        w->ds[j] = dp;
        rowdot += p[j] * dp;
    }
    for (int64_t d = 0; d < D; d++) w->dqr[d] = 0.0;
    for (int64_t j = 0; j < nkeys; j++) {
        double ds = p[j] * (w->ds[j] - rowdot) * scale;
        int64_t k0 = off3(k, b, g, j);
        for (int64_t d = 0; d < D; d++) {
            w->dqr[d] += ds * ld4(k, k0, d);
            if (w->dk) w->dk[(base + j) * D + d] += ds * ld4(q, q0, d);
        }
    }
    if (dq)
        for (int64_t d = 0; d < D; d++) lm__st(dq->dtype, dq->data, off3(dq, b, h, i) + d * dq->stride[3], w->dqr[d]);
}

/* Rounds a row-major [B, H, T, E] workspace into a 4-d view. */
static void store4(const lm_tensor_view *t, const double *w) {
    int64_t idx[LM_MAX_DIMS] = {0}, n = 0;
    if (lm_tensor_view_numel(t) == 0) return;
    do lm__st(t->dtype, t->data, lm__offset(t, idx), w[n++]);
    while (lm__nd_next(4, t->shape, idx));
}

lm_status lm__ref_attention_backward(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                     const lm_tensor_view *dout, double scale, int causal, int64_t window,
                                     const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv) {
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], Tk = k->shape[2];
    int64_t nk = dk ? lm_tensor_view_numel(k) : 0, nv = dv ? lm_tensor_view_numel(v) : 0;
    double *ws = lm__calloc((size_t)(nk + nv + 2 * Tk + D + 1), sizeof(double));
    if (!ws) return lm__error_context(LM_OUT_OF_MEMORY, "attention_backward workspace");
    grads w = {dk ? ws : NULL, dv ? ws + nk : NULL, ws + nk + nv, ws + nk + nv + Tk};
    double *p = w.dqr + D; /* [Tk] */
    int64_t group = Hkv ? Hq / Hkv : 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int64_t nkeys = causal ? i + (Tk - Tq) + 1 : Tk;
                int64_t j0 = causal && window > 0 ? LM_MAX(0, nkeys - window) : 0;
                probabilities(q, k, b, h, h / group, i, j0, nkeys, scale, p);
                row_grads(q, k, v, dout, b, h, h / group, i, nkeys, scale, p, &w, dq);
            }
    if (dk) store4(dk, w.dk);
    if (dv) store4(dv, w.dv);
    lm__free(ws);
    return LM_OK;
}
