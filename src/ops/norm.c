/* ops/norm.c — public RMSNorm and fused residual add + RMSNorm: validation and
 * dispatch. x [..., D] (at least 1-d), weight [D] (and residual, sum_out) in one float
 * dtype; out may have another float dtype (the normalized rows rounded to it, the
 * step's f32 -> bf16 GEMM input); eps must be finite and >= 0. Aliasing: rmsnorm's out may be x's very view (in place);
 * add_rmsnorm's sum_out may be residual's (or x's) very view, the in-place residual
 * stream update, while out may share memory with no operand. Detectable partial
 * overlaps are rejected (ops/alias.h). On the CPU the tuned level (ops/cpu/norm.c)
 * takes f32 operands with unit-stride rows and weight; other views run the reference. On CUDA the mixed forms need
 * contiguous f32 rows and an f32 weight normalized into bf16. */
#include "ops/alias.h"
#include "ops/cpu/pointwise.h"
#include "ops/ref/norm.h"

static const char *const k_needs = "f32 operands whose last dims (and weight) have unit stride";

/* Checks shared by both operators for x, weight, eps and the output out. */
static lm_status norm_check(const char *op, const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                            const lm_tensor_view *out) {
    LM_TRY(lm__op_check_float(op, "x", x));
    LM_TRY(lm__op_check_dtype(op, "weight", weight, x->dtype));
    LM_TRY(lm__op_check_float(op, "out", out)); /* may round to another float dtype */
    if (x->ndim < 1) return lm__error(LM_SHAPE_MISMATCH, "%s: x is a scalar; expected [..., D]", op);
    int64_t d = x->shape[x->ndim - 1];
    LM_TRY(lm__op_check_shape(op, "weight", weight, 1, &d));
    LM_TRY(lm__op_check_same_shape(op, "out", out, x));
    LM_TRY(lm__op_check_out(op, "out", out));
    if (!isfinite(eps) || eps < 0) return lm__error(LM_INVALID_ARGUMENT, "%s: eps %g must be finite and >= 0", op, eps);
    return lm__op_check_alias(op, "out", out, "weight", weight, 0);
}

lm_status lm_rmsnorm_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                         const lm_tensor_view *out) {
    const char *op = "rmsnorm";
    const lm_tensor_view *vs[] = {x, weight, out};
    static const char *const names[] = {"x", "weight", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(norm_check(op, x, weight, eps, out));
    LM_TRY(lm__op_check_alias(op, "out", out, "x", x, out->dtype == x->dtype)); /* in place only in one dtype */
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->rmsnorm(x, weight, eps, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_rmsnorm_supported(x, weight, out)) {
            lm__cpu_rmsnorm(lm_ctx_threadpool(ctx), x, weight, eps, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, op, k_needs));
    }
    lm__ref_rmsnorm(x, weight, eps, out);
    return LM_OK;
}

lm_status lm_rmsnorm(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *weight, float eps, lm_tensor **out) {
    if (!x) return lm__error(LM_INVALID_ARGUMENT, "rmsnorm: x is NULL");
    LM_TRY(lm__op_alloc(ctx, x->dtype, x->ndim, x->shape, out));
    return lm__op_finish(lm_rmsnorm_out(ctx, x, weight, eps, lm_tensor_as_view(*out)), out);
}

lm_status lm_add_rmsnorm_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *residual,
                             const lm_tensor_view *weight, float eps, const lm_tensor_view *sum_out,
                             const lm_tensor_view *out) {
    const char *op = "add_rmsnorm";
    const lm_tensor_view *vs[] = {x, residual, weight, sum_out, out};
    static const char *const names[] = {"x", "residual", "weight", "sum_out", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 5, vs, names));
    LM_TRY(norm_check(op, x, weight, eps, out));
    LM_TRY(lm__op_check_dtype(op, "residual", residual, x->dtype));
    LM_TRY(lm__op_check_dtype(op, "sum_out", sum_out, x->dtype));
    LM_TRY(lm__op_check_same_shape(op, "residual", residual, x));
    LM_TRY(lm__op_check_same_shape(op, "sum_out", sum_out, x));
    LM_TRY(lm__op_check_out(op, "sum_out", sum_out));
    /* x + residual is symmetric, so sum_out may replace either input in place. */
    LM_TRY(lm__op_check_alias(op, "sum_out", sum_out, "residual", residual, 1));
    LM_TRY(lm__op_check_alias(op, "sum_out", sum_out, "x", x, 1));
    LM_TRY(lm__op_check_alias(op, "sum_out", sum_out, "weight", weight, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "x", x, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "residual", residual, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "sum_out", sum_out, 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->add_rmsnorm(x, residual, weight, eps, sum_out, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_add_rmsnorm_supported(x, residual, weight, sum_out, out)) {
            lm__cpu_add_rmsnorm(lm_ctx_threadpool(ctx), x, residual, weight, eps, sum_out, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, op, k_needs));
    }
    lm__ref_add_rmsnorm(x, residual, weight, eps, sum_out, out);
    return LM_OK;
}
