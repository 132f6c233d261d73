/* ops/ref/elementwise.c — readable reference for add, mul, scale, cast, SiLU and
 * SwiGLU: one loop over out's index space, each element computed in double and
 * rounded once to out's dtype. O(numel). */
#include "ops/ref/elementwise.h"

static double silu(double x) { return x / (1.0 + exp(-x)); }

void lm__ref_binary(lm__binary_op op, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return;
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        double x = lm__ld(a->dtype, a->data, lm__offset(a, idx));
        double y = lm__ld(b->dtype, b->data, lm__offset(b, idx));
        lm__st(out->dtype, out->data, lm__offset(out, idx), op == LM__BIN_ADD ? x + y : x * y);
    } while (lm__nd_next(out->ndim, out->shape, idx));
}

void lm__ref_unary(lm__unary_op op, const lm_tensor_view *x, double s, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return;
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        double v = lm__ld(x->dtype, x->data, lm__offset(x, idx));
        if (op == LM__UN_SCALE) v *= s;
        else if (op == LM__UN_SILU) v = silu(v);
        lm__st(out->dtype, out->data, lm__offset(out, idx), v);
    } while (lm__nd_next(out->ndim, out->shape, idx));
}

void lm__ref_swiglu(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return;
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        double g = lm__ld(gate->dtype, gate->data, lm__offset(gate, idx));
        double u = lm__ld(up->dtype, up->data, lm__offset(up, idx));
        lm__st(out->dtype, out->data, lm__offset(out, idx), silu(g) * u);
    } while (lm__nd_next(out->ndim, out->shape, idx));
}

lm_status lm__ref_cast_int(const lm_tensor_view *x, const lm_tensor_view *out) {
    int64_t lo = out->dtype == LM_U8 ? 0 : out->dtype == LM_I32 ? INT32_MIN : INT64_MIN;
    int64_t hi = out->dtype == LM_U8 ? 255 : out->dtype == LM_I32 ? INT32_MAX : INT64_MAX;
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        int64_t v = lm__ld_index(x->dtype, x->data, lm__offset(x, idx));
        if (v < lo || v > hi)
            return lm__error(LM_OUT_OF_RANGE, "cast: value %lld does not fit in %s", (long long)v, lm_dtype_name(out->dtype));
        int64_t off = lm__offset(out, idx);
        if (out->dtype == LM_U8) ((uint8_t *)out->data)[off] = (uint8_t)v;
        else lm__st_index(out->dtype, out->data, off, v);
    } while (lm__nd_next(out->ndim, out->shape, idx));
    return LM_OK;
}
