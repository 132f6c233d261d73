/* ops/select.c — public argmax and top-k over the last dim: validation and dispatch.
 * Ranking (see ops.h): NaN counts as largest; ties go to the lower index. x is a float
 * view [..., N] with any strides; index outputs are i64 or i32 (LM_OUT_OF_RANGE when
 * N does not fit in i32). Outputs must not overlap themselves, each other or x.
 * Only the reference level exists on the CPU so far.
 */
#include "ops/alias.h"
#include "ops/internal.h"
#include "ops/ref/select.h"

/* x is a float view with a last dim to select over. */
static lm_status check_select_input(const char *op, const lm_tensor_view *x) {
    LM_TRY(lm__op_check_float(op, "x", x));
    if (x->ndim < 1) return lm__error(LM_SHAPE_MISMATCH, "%s: x is a scalar; it needs a last dim to select over", op);
    return LM_OK;
}

/* An output of shape [ndim, shape] that does not overlap itself or x. */
static lm_status check_select_output(const char *op, const char *name, const lm_tensor_view *out,
                                     const lm_tensor_view *x, int ndim, const int64_t *shape) {
    LM_TRY(lm__op_check_shape(op, name, out, ndim, shape));
    LM_TRY(lm__op_check_out(op, name, out));
    return lm__op_check_alias(op, name, out, "x", x, 0);
}

/* An i32/i64 output able to hold every index below n. */
static lm_status check_index_dtype(const char *op, const char *name, const lm_tensor_view *out, int64_t n) {
    LM_TRY(lm__op_check_index(op, name, out));
    if (out->dtype == LM_I32 && n - 1 > INT32_MAX)
        return lm__error(LM_OUT_OF_RANGE, "%s: %s is i32 but x has %lld entries in its last dim", op, name, (long long)n);
    return LM_OK;
}

lm_status lm_argmax_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *out) {
    const char *op = "argmax";
    const lm_tensor_view *vs[] = {x, out};
    static const char *const names[] = {"x", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 2, vs, names));
    LM_TRY(check_select_input(op, x));
    int64_t n = x->shape[x->ndim - 1];
    if (n == 0) {
        char sx[128];
        return lm__error(LM_SHAPE_MISMATCH, "%s: x %s has an empty last dim; argmax needs N > 0", op,
                         lm__shape_str(x, sx, sizeof sx));
    }
    LM_TRY(check_index_dtype(op, "out", out, n));
    LM_TRY(check_select_output(op, "out", out, x, x->ndim - 1, x->shape));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->argmax(x, out, lm_ctx_stream(ctx));
    lm__ref_argmax(x, out);
    return LM_OK;
}

lm_status lm_topk_out(lm_ctx *ctx, const lm_tensor_view *x, int64_t k, const lm_tensor_view *values,
                      const lm_tensor_view *indices) {
    const char *op = "topk";
    const lm_tensor_view *vs[] = {x, values, indices};
    static const char *const names[] = {"x", "values", "indices"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(check_select_input(op, x));
    int64_t n = x->shape[x->ndim - 1];
    if (k < 0 || k > n) return lm__error(LM_OUT_OF_RANGE, "%s: k = %lld is outside [0, %lld]", op, (long long)k, (long long)n);
    LM_TRY(lm__op_check_dtype(op, "values", values, x->dtype));
    LM_TRY(check_index_dtype(op, "indices", indices, n));
    int64_t shape[LM_MAX_DIMS]; /* x's shape with the last dim replaced by k */
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = k;
    LM_TRY(check_select_output(op, "values", values, x, x->ndim, shape));
    LM_TRY(check_select_output(op, "indices", indices, x, x->ndim, shape));
    LM_TRY(lm__op_check_alias(op, "indices", indices, "values", values, 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->topk(x, k, values, indices, lm_ctx_stream(ctx));
    return lm__ref_topk(x, k, values, indices);
}
