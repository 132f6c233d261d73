/* ops/norm_backward.c — public RMSNorm and fused add + RMSNorm backward: validation
 * and dispatch (reference level on the CPU, ops/cuda/norm_backward.cu on CUDA; both
 * are O(numel)). x / sum, dout, dsum share
 * one float dtype and the shape [..., D]; weight [D] has that dtype; eps as in the
 * forward. Gradient outputs follow ops_backward.h (operand dtype or f32, no overlap).
 */
#include "ops/backward_common.h"
#include "ops/ref/norm_backward.h"

static lm_status check(lm_ctx *ctx, const char *op, const char *xname, const lm_tensor_view *x,
                       const lm_tensor_view *weight, float eps, const lm_tensor_view *dout, const lm_tensor_view *dsum,
                       const lm_tensor_view *dx, const lm_tensor_view *dweight, const lm__cuda_ops *cu,
                       lm__level *level) {
    const lm_tensor_view *vs[] = {x, weight, dout};
    const char *const names[] = {xname, "weight", "dout"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, xname, x));
    if (x->ndim < 1) return lm__error(LM_SHAPE_MISMATCH, "%s: %s is a scalar; expected [..., D]", op, xname);
    LM_TRY(lm__op_check_dtype(op, "weight", weight, x->dtype));
    LM_TRY(lm__op_check_shape(op, "weight", weight, 1, &x->shape[x->ndim - 1]));
    LM_TRY(lm__op_check_dtype(op, "dout", dout, x->dtype));
    LM_TRY(lm__op_check_same_shape(op, "dout", dout, x));
    if (dsum) {
        const lm_tensor_view *sv[] = {dsum};
        static const char *const sn[] = {"dsum"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, sv, sn));
        LM_TRY(lm__op_check_dtype(op, "dsum", dsum, x->dtype));
        LM_TRY(lm__op_check_same_shape(op, "dsum", dsum, x));
    }
    if (!isfinite(eps) || eps < 0) return lm__error(LM_INVALID_ARGUMENT, "%s: eps %g must be finite and >= 0", op, eps);
    LM_TRY(lm__op_check_grad(ctx, op, "dx", dx, x));
    LM_TRY(lm__op_check_grad(ctx, op, "dweight", dweight, weight));
    const lm_tensor_view *ins[] = {x, weight, dout, dsum, dweight};
    const char *const in_names[] = {xname, "weight", "dout", "dsum", "dweight"};
    LM_TRY(lm__op_check_grad_alias(op, "dx", dx, 5, ins, in_names));
    LM_TRY(lm__op_check_grad_alias(op, "dweight", dweight, 4, ins, in_names));
    return lm__op_level(ctx, op, 0, cu != NULL, level);
}

lm_status lm_rmsnorm_backward_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                                  const lm_tensor_view *dout, const lm_tensor_view *dx, const lm_tensor_view *dweight) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(check(ctx, "rmsnorm_backward", "x", x, weight, eps, dout, NULL, dx, dweight, cu, &level));
    if (level == LM__LEVEL_CUDA)
        return cu->rmsnorm_backward(x, weight, eps, dout, NULL, dx, dweight, lm_ctx_stream(ctx));
    return lm__ref_rmsnorm_backward(x, weight, eps, dout, NULL, dx, dweight);
}

lm_status lm_add_rmsnorm_backward_out(lm_ctx *ctx, const lm_tensor_view *sum, const lm_tensor_view *weight, float eps,
                                      const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                      const lm_tensor_view *dweight) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(check(ctx, "add_rmsnorm_backward", "sum", sum, weight, eps, dout, dsum, dx, dweight, cu, &level));
    if (level == LM__LEVEL_CUDA)
        return cu->rmsnorm_backward(sum, weight, eps, dout, dsum, dx, dweight, lm_ctx_stream(ctx));
    return lm__ref_rmsnorm_backward(sum, weight, eps, dout, dsum, dx, dweight);
}
