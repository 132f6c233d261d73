/* ops/ref/swiglu_backward.c — readable reference for the gradients of
 * out = silu(g) * u with silu(g) = g * s(g), s the logistic sigmoid:
 *   dup   = dout * silu(g)
 *   dgate = dout * u * silu'(g),   silu'(g) = s(g) * (1 + g * (1 - s(g)))
 * One loop over the index space in double, each output rounded once. O(numel).
 */
#include "ops/ref/swiglu_backward.h"

void lm__ref_swiglu_backward(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *dout,
                             const lm_tensor_view *dgate, const lm_tensor_view *dup) {
    if (lm_tensor_view_numel(gate) == 0) return;
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        double g = lm__ld(gate->dtype, gate->data, lm__offset(gate, idx));
        double u = lm__ld(up->dtype, up->data, lm__offset(up, idx));
        double dy = lm__ld(dout->dtype, dout->data, lm__offset(dout, idx));
        double s = 1.0 / (1.0 + exp(-g));
        if (dup) lm__st(dup->dtype, dup->data, lm__offset(dup, idx), dy * g * s);
        if (dgate) lm__st(dgate->dtype, dgate->data, lm__offset(dgate, idx), dy * u * s * (1.0 + g * (1.0 - s)));
    } while (lm__nd_next(gate->ndim, gate->shape, idx));
}
