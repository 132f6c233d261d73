/* ops/ref/norm_backward.c — readable reference for the RMSNorm gradients. Per row of
 * D elements, with r = 1 / sqrt(mean(x^2) + eps), y = x * r * w and g = w * dy:
 *   dx[i] = r * g[i] - x[i] * r^3 * (sum_j g[j] x[j]) / D   (+ dsum[i] when fused)
 *   dw[i] = sum over rows of dy[i] * x[i] * r
 * The fused add + RMSNorm backward is the same formula evaluated at the forward's sum
 * (d sum / dx = d sum / dresidual = 1), plus the gradient dsum that other readers of
 * the sum contributed. Everything in double, each output rounded once. O(numel),
 * a [D] double workspace for dw.
 */
#include "ops/ref/norm_backward.h"

static double ld_last(const lm_tensor_view *v, int64_t base, int64_t i) {
    return lm__ld(v->dtype, v->data, base + i * v->stride[v->ndim - 1]);
}

/* One row: writes dx (if any) and adds into the dweight workspace (if any). */
static void row_backward(const lm_tensor_view *x, int64_t xb, const lm_tensor_view *w, double eps,
                         const lm_tensor_view *dout, int64_t db, const lm_tensor_view *dsum, int64_t sb,
                         const lm_tensor_view *dx, int64_t ob, double *dw /* [D] or NULL */) {
    int64_t D = x->shape[x->ndim - 1];
    double ss = 0, dot = 0;
    for (int64_t i = 0; i < D; i++) {
        double a = ld_last(x, xb, i);
        ss += a * a;
        dot += lm__ld(w->dtype, w->data, i * w->stride[0]) * ld_last(dout, db, i) * a;
    }
    double r = 1.0 / sqrt(ss / (double)D + eps), c = r * r * r * dot / (double)D;
    for (int64_t i = 0; i < D; i++) {
        double a = ld_last(x, xb, i), dy = ld_last(dout, db, i);
        if (dw) dw[i] += dy * a * r;
        if (!dx) continue;
        double g = lm__ld(w->dtype, w->data, i * w->stride[0]) * dy;
        double v = r * g - a * c + (dsum ? ld_last(dsum, sb, i) : 0.0);
        lm__st(dx->dtype, dx->data, ob + i * dx->stride[dx->ndim - 1], v);
    }
}

lm_status lm__ref_rmsnorm_backward(const lm_tensor_view *x, const lm_tensor_view *weight, double eps,
                                   const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                   const lm_tensor_view *dweight) {
    int64_t D = x->shape[x->ndim - 1];
    double *dw = NULL;
    if (dweight && !(dw = lm__calloc((size_t)D + 1, sizeof *dw)))
        return lm__error_context(LM_OUT_OF_MEMORY, "rmsnorm_backward workspace of %lld doubles", (long long)D);
    if (lm_tensor_view_numel(x) > 0) {
        int lead = x->ndim - 1;
        int64_t idx[LM_MAX_DIMS] = {0}; /* row index; idx[lead] stays 0 */
        do {
            row_backward(x, lm__offset(x, idx), weight, eps, dout, lm__offset(dout, idx), dsum,
                         dsum ? lm__offset(dsum, idx) : 0, dx, dx ? lm__offset(dx, idx) : 0, dw);
        } while (lm__nd_next(lead, x->shape, idx));
    }
    for (int64_t i = 0; dweight && i < D; i++) lm__st(dweight->dtype, dweight->data, i * dweight->stride[0], dw[i]);
    lm__free(dw);
    return LM_OK;
}
