/* ops/ref/linear.c — readable reference of the fused Linear (lm_linear_out).
 *
 * Per row m: the input row in double (x as it is; rmsnorm(x) * norm_weight with the
 * mean of squares in double; or silu(gate) * up from the two halves of x), then for
 * every output n the dot product with w's row n in double, plus the bias, written or
 * added to out[m, n] and rounded once. int8 weights are dequantized exactly in double
 * (q[n, k] * w_scales[n]: an 8-bit by 24-bit product) before the multiply; int4
 * weights likewise, nibble k of row n times its group's scale w_scales[n, k / group].
 * O(M * N * K) time, one [K] double row.
 */
#include "ops/ref/linear.h"

static double el(const lm_tensor_view *v, int64_t r, int64_t c) {
    return lm__ld(v->dtype, v->data, r * v->stride[0] + c * v->stride[1]);
}

/* The product's input row m of x, K values, into row[]. */
static void input_row(const lm_tensor_view *x, const lm_linear_params *p, int64_t m, int64_t K, double *row) {
    if (p->input == LM_LINEAR_IN_SWIGLU) {
        for (int64_t k = 0; k < K; k++) {
            double g = el(x, m, k), u = el(x, m, K + k);
            row[k] = g / (1.0 + exp(-g)) * u;
        }
        return;
    }
    for (int64_t k = 0; k < K; k++) row[k] = el(x, m, k);
    if (p->input != LM_LINEAR_IN_RMSNORM) return;
    double ss = 0.0;
    for (int64_t k = 0; k < K; k++) ss += row[k] * row[k];
    double inv = 1.0 / sqrt(ss / (double)K + (double)p->eps);
    const lm_tensor_view *nw = p->norm_weight;
    for (int64_t k = 0; k < K; k++) row[k] *= inv * lm__ld(nw->dtype, nw->data, k * nw->stride[0]);
}

/* Weight n, k dequantized (float w as it is; i8 times its row scale; int4 times its
 * group's scale): exact in double. */
static double weight(const lm_tensor_view *w, const lm_linear_params *p, int64_t n, int64_t k) {
    const lm_tensor_view *sc = p->w_scales;
    if (p->w_bits == 4) {
        int b = (int)el(w, n, k / 2), v = (k & 1 ? b >> 4 : b) & 15;
        double s = lm__ld(sc->dtype, sc->data, n * sc->stride[0] + k / p->w_group * sc->stride[1]);
        return (double)(v >= 8 ? v - 16 : v) * s;
    }
    return sc ? el(w, n, k) * lm__ld(sc->dtype, sc->data, n * sc->stride[0]) : el(w, n, k);
}

lm_status lm__ref_linear(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                         const lm_linear_params *p, const lm_tensor_view *out) {
    int64_t M = out->shape[0], N = out->shape[1], K = p->w_bits == 4 ? 2 * w->shape[1] : w->shape[1];
    double *row = lm__alloc(sizeof *row * (size_t)(K ? K : 1), 64);
    if (!row) return lm__error_context(LM_OUT_OF_MEMORY, "linear: a row of %lld doubles", (long long)K);
    for (int64_t m = 0; m < M; m++) {
        input_row(x, p, m, K, row);
        for (int64_t n = 0; n < N; n++) {
            double acc = bias ? lm__ld(bias->dtype, bias->data, n * bias->stride[0]) : 0.0;
            for (int64_t k = 0; k < K; k++) acc += row[k] * weight(w, p, n, k);
            int64_t o = m * out->stride[0] + n * out->stride[1];
            if (p->accumulate) acc += lm__ld(out->dtype, out->data, o);
            lm__st(out->dtype, out->data, o, acc);
        }
    }
    lm__free(row);
    return LM_OK;
}
