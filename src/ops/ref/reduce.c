/* ops/ref/reduce.c — readable reference for sum and max over one dim, and concat.
 * Reductions walk out's index space; for each output element the reduced dim of x is
 * scanned in order. sum accumulates in double and rounds once; max propagates NaN
 * (any NaN in the slice gives NaN, like torch.amax). concat copies every input into
 * its slice of out element by element as raw bytes, so it is exact for any dtype.
 * O(numel(x)) and O(numel(out)). */
#include "ops/ref/reduce.h"

/* x without dim: the view whose offsets locate the start of each reduced slice. */
static lm_tensor_view drop_dim(const lm_tensor_view *x, int dim) {
    lm_tensor_view r = *x;
    for (int i = dim; i + 1 < x->ndim; i++) {
        r.shape[i] = x->shape[i + 1];
        r.stride[i] = x->stride[i + 1];
    }
    r.ndim = x->ndim - 1;
    return r;
}

static double reduce_slice(lm__reduce_op op, const lm_tensor_view *x, int64_t base, int64_t n, int64_t step) {
    double acc = op == LM__RED_SUM ? 0.0 : lm__ld(x->dtype, x->data, base);
    for (int64_t i = op == LM__RED_SUM ? 0 : 1; i < n; i++) {
        double v = lm__ld(x->dtype, x->data, base + i * step);
        if (op == LM__RED_SUM) acc += v;
        else if (!isnan(acc) && (isnan(v) || v > acc)) acc = v; /* NaN, once seen, sticks */
    }
    return acc;
}

void lm__ref_reduce(lm__reduce_op op, const lm_tensor_view *x, int dim, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return;
    lm_tensor_view rest = drop_dim(x, dim);
    int64_t n = x->shape[dim], step = x->stride[dim];
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        double v = reduce_slice(op, x, lm__offset(&rest, idx), n, step);
        lm__st(out->dtype, out->data, lm__offset(out, idx), v);
    } while (lm__nd_next(out->ndim, out->shape, idx));
}

/* Copies src into dst (same shape and dtype) one element at a time. */
static void copy_view(const lm_tensor_view *src, const lm_tensor_view *dst) {
    if (lm_tensor_view_numel(src) == 0) return;
    size_t es = lm_dtype_size(src->dtype);
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        const char *s = (const char *)src->data + lm__offset(src, idx) * (int64_t)es;
        char *d = (char *)dst->data + lm__offset(dst, idx) * (int64_t)es;
        memcpy(d, s, es);
    } while (lm__nd_next(src->ndim, src->shape, idx));
}

void lm__ref_concat(int n, const lm_tensor_view *const *inputs, int dim, const lm_tensor_view *out) {
    size_t es = lm_dtype_size(out->dtype);
    int64_t start = 0; /* first index along dim of the current input's slice of out */
    for (int k = 0; k < n; k++) {
        lm_tensor_view slice = *out;
        slice.shape[dim] = inputs[k]->shape[dim];
        if (lm_tensor_view_numel(&slice) > 0)
            slice.data = (char *)out->data + start * out->stride[dim] * (int64_t)es;
        copy_view(inputs[k], &slice);
        start += inputs[k]->shape[dim];
    }
}
