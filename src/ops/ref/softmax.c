/* ops/ref/softmax.c — readable reference for softmax(x * scale) over the last dim.
 * Each row is done in three passes in double: the row max (so exp never overflows),
 * the sum of exp(v - max), and the normalized write. Causal rows ([..., Tq, Tk]) see
 * columns j <= i + (Tk - Tq); masked entries are written as exactly 0. Every element
 * of x is read before the same element of out is written, so out may be x itself.
 * A NaN in a visible entry makes its row NaN, as in PyTorch. O(3 * numel).
 */
#include "ops/ref/softmax.h"

/* One row of n elements at offsets x0 + j * xs (in) and o0 + j * os (out), of which
 * the first `visible` take part. */
static void softmax_row(const lm_tensor_view *x, int64_t x0, int64_t xs, const lm_tensor_view *out, int64_t o0,
                        int64_t os, int64_t n, int64_t visible, double scale) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < visible; j++) {
        double v = scale * lm__ld(x->dtype, x->data, x0 + j * xs);
        if (v > mx) mx = v;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < visible; j++) sum += exp(scale * lm__ld(x->dtype, x->data, x0 + j * xs) - mx);
    for (int64_t j = 0; j < visible; j++) {
        double e = exp(scale * lm__ld(x->dtype, x->data, x0 + j * xs) - mx);
        lm__st(out->dtype, out->data, o0 + j * os, e / sum);
    }
    for (int64_t j = visible; j < n; j++) lm__st(out->dtype, out->data, o0 + j * os, 0.0);
}

void lm__ref_softmax(const lm_tensor_view *x, double scale, int causal, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(x) == 0) return;
    int last = x->ndim - 1;
    int64_t n = x->shape[last];
    int64_t idx[LM_MAX_DIMS] = {0}; /* index over the leading dims; idx[last] stays 0 */
    do {
        int64_t visible = n;
        if (causal) {
            int64_t tq = x->shape[last - 1], i = idx[last - 1];
            visible = i + (n - tq) + 1;
        }
        softmax_row(x, lm__offset(x, idx), x->stride[last], out, lm__offset(out, idx), out->stride[last], n, visible,
                    scale);
    } while (lm__nd_next(last, x->shape, idx));
}
