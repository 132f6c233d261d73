/* ops/reduce.c — public sum and max over one dim, and concat: validation and
 * dispatch. dim may be negative (counted from the end, as in PyTorch). sum and max
 * take float x with at least one dim and write out in x's dtype; max over an empty
 * dim has no value and is rejected. concat joins n >= 1 inputs of one dtype (any
 * dtype: it only copies). Outputs may share memory with no input (detectable
 * overlaps are rejected, ops/alias.h). Only the reference level exists so far. */
#include "ops/alias.h"
#include "ops/ref/reduce.h"

#include <stdio.h>

/* Normalizes dim against ndim; LM_OUT_OF_RANGE when it names no dim. */
static lm_status normalize_dim(const char *op, const char *name, int ndim, int *dim) {
    int d = *dim < 0 ? *dim + ndim : *dim;
    if (d < 0 || d >= ndim)
        return lm__error(LM_OUT_OF_RANGE, "%s: dim %d is out of range for %s with %d dims", op, *dim, name, ndim);
    *dim = d;
    return LM_OK;
}

static lm_status reduce_out(lm_ctx *ctx, const char *op, lm__reduce_op kind, const lm_tensor_view *x, int dim,
                            const lm_tensor_view *out) {
    const lm_tensor_view *vs[] = {x, out};
    static const char *const names[] = {"x", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 2, vs, names));
    LM_TRY(lm__op_check_float(op, "x", x));
    LM_TRY(lm__op_check_dtype(op, "out", out, x->dtype));
    LM_TRY(normalize_dim(op, "x", x->ndim, &dim));
    int64_t shape[LM_MAX_DIMS];
    for (int i = 0, j = 0; i < x->ndim; i++)
        if (i != dim) shape[j++] = x->shape[i];
    LM_TRY(lm__op_check_shape(op, "out", out, x->ndim - 1, shape));
    LM_TRY(lm__op_check_out(op, "out", out));
    if (kind == LM__RED_MAX && x->shape[dim] == 0)
        return lm__error(LM_INVALID_ARGUMENT, "%s: dim %d of x has size 0; the maximum of nothing is undefined", op,
                         dim);
    LM_TRY(lm__op_check_alias(op, "out", out, "x", x, 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return (kind == LM__RED_MAX ? cu->max : cu->sum)(x, dim, out, lm_ctx_stream(ctx));
    lm__ref_reduce(kind, x, dim, out);
    return LM_OK;
}

lm_status lm_sum_out(lm_ctx *ctx, const lm_tensor_view *x, int dim, const lm_tensor_view *out) {
    return reduce_out(ctx, "sum", LM__RED_SUM, x, dim, out);
}

lm_status lm_max_out(lm_ctx *ctx, const lm_tensor_view *x, int dim, const lm_tensor_view *out) {
    return reduce_out(ctx, "max", LM__RED_MAX, x, dim, out);
}

/* Input k against inputs[0]: device, dtype, rank and every dim but dim. */
static lm_status check_concat_input(lm_ctx *ctx, const char *op, const lm_tensor_view *const *inputs, int k,
                                    int dim) {
    char name[32];
    snprintf(name, sizeof name, "inputs[%d]", k);
    const char *names[] = {name};
    const lm_tensor_view *vs[] = {inputs[k]};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    const lm_tensor_view *first = inputs[0], *in = inputs[k];
    LM_TRY(lm__op_check_dtype(op, name, in, first->dtype));
    int64_t want[LM_MAX_DIMS];
    for (int i = 0; i < first->ndim; i++) want[i] = i == dim ? -1 : first->shape[i];
    return lm__op_check_shape(op, name, in, first->ndim, want);
}

lm_status lm_concat_out(lm_ctx *ctx, int n, const lm_tensor_view *const *inputs, int dim,
                        const lm_tensor_view *out) {
    const char *op = "concat";
    if (n < 1 || !inputs) return lm__error(LM_INVALID_ARGUMENT, "%s: needs n >= 1 inputs (got n = %d%s)", op, n,
                                           inputs ? "" : ", inputs NULL");
    const lm_tensor_view *vs[] = {inputs[0], out};
    static const char *const names[] = {"inputs[0]", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 2, vs, names));
    LM_TRY(normalize_dim(op, "inputs[0]", inputs[0]->ndim, &dim));
    int64_t shape[LM_MAX_DIMS], joined = 0;
    for (int k = 0; k < n; k++) {
        LM_TRY(check_concat_input(ctx, op, inputs, k, dim));
        joined += inputs[k]->shape[dim];
    }
    memcpy(shape, inputs[0]->shape, sizeof shape);
    shape[dim] = joined;
    LM_TRY(lm__op_check_dtype(op, "out", out, inputs[0]->dtype));
    LM_TRY(lm__op_check_shape(op, "out", out, inputs[0]->ndim, shape));
    LM_TRY(lm__op_check_out(op, "out", out));
    for (int k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof name, "inputs[%d]", k);
        LM_TRY(lm__op_check_alias(op, "out", out, name, inputs[k], 0));
    }
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->concat(n, inputs, dim, out, lm_ctx_stream(ctx));
    lm__ref_concat(n, inputs, dim, out);
    return LM_OK;
}
