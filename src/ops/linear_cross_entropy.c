/* ops/linear_cross_entropy.c — public fused output projection + cross-entropy, forward
 * and backward: validation and dispatch. x [N, H] float, w [V, H] in x's dtype (or
 * bf16/f16 under an f32 x, as matmul's b), targets i32/i64 [N], loss and dloss f32
 * scalars; dx, dw shaped like x, w. Targets are checked first (LM_OUT_OF_RANGE naming
 * the row), so nothing is written for a bad one. Levels: the composed, chunked path
 * (ops/composed_linear_ce.c) for f32 operands, otherwise the per-row reference.
 */
#include "ops/backward_common.h"
#include "ops/composed.h"
#include "ops/ref/loss_backward.h"

static const char *const k_composed_needs = "f32 x, w and gradients";

static lm_status check_inputs(lm_ctx *ctx, const char *op, const lm_tensor_view *x, const lm_tensor_view *w,
                              const lm_tensor_view *targets, int64_t ignore_index, int64_t *counted) {
    const lm_tensor_view *vs[] = {x, w, targets};
    static const char *const names[] = {"x", "w", "targets"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, "x", x));
    LM_TRY(lm__op_check_float(op, "w", w));
    if (w->dtype != x->dtype && x->dtype != LM_F32)
        return lm__error(LM_DTYPE_MISMATCH, "%s: w has dtype %s but x is %s", op, lm_dtype_name(w->dtype),
                         lm_dtype_name(x->dtype));
    LM_TRY(lm__op_check_index(op, "targets", targets));
    int64_t any2[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "x [N, H]", x, 2, any2));
    int64_t wshape[2] = {-1, x->shape[1]};
    LM_TRY(lm__op_check_shape(op, "w [V, H]", w, 2, wshape));
    LM_TRY(lm__op_check_shape(op, "targets [N]", targets, 1, x->shape));
    return lm__op_check_targets(op, targets, w->shape[0], ignore_index, counted);
}

lm_status lm_linear_cross_entropy_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                      const lm_tensor_view *targets, int64_t ignore_index, const lm_tensor_view *loss) {
    const char *op = "linear_cross_entropy";
    int64_t counted;
    if (!loss) return lm__error(LM_INVALID_ARGUMENT, "%s: loss is NULL", op);
    LM_TRY(check_inputs(ctx, op, x, w, targets, ignore_index, &counted));
    LM_TRY(lm__op_check_f32_scalar(ctx, op, "loss", loss));
    const lm_tensor_view *ins[] = {x, w, targets};
    static const char *const names[] = {"x", "w", "targets"};
    LM_TRY(lm__op_check_grad_alias(op, "loss", loss, 3, ins, names));
    lm__level level;
    LM_TRY(lm__op_backward_level(ctx, op, 1, 0, lm__composed_linear_ce_accepts(x, w, NULL, NULL), k_composed_needs,
                                 &level));
    if (level == LM__LEVEL_CPU) return lm__composed_linear_ce(ctx, x, w, targets, ignore_index, counted, loss);
    return lm__ref_linear_cross_entropy(x, w, targets, ignore_index, counted, loss);
}

lm_status lm_linear_cross_entropy_backward_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                               const lm_tensor_view *targets, int64_t ignore_index,
                                               const lm_tensor_view *dloss, const lm_tensor_view *dx,
                                               const lm_tensor_view *dw) {
    const char *op = "linear_cross_entropy_backward";
    int64_t counted;
    LM_TRY(check_inputs(ctx, op, x, w, targets, ignore_index, &counted));
    LM_TRY(lm__op_check_f32_scalar(ctx, op, "dloss", dloss));
    LM_TRY(lm__op_check_grad(ctx, op, "dx", dx, x));
    LM_TRY(lm__op_check_grad(ctx, op, "dw", dw, w));
    const lm_tensor_view *ins[] = {x, w, targets, dloss, dw};
    static const char *const names[] = {"x", "w", "targets", "dloss", "dw"};
    LM_TRY(lm__op_check_grad_alias(op, "dx", dx, 5, ins, names));
    LM_TRY(lm__op_check_grad_alias(op, "dw", dw, 4, ins, names));
    if (!dx && !dw) return LM_OK;
    lm__level level;
    LM_TRY(lm__op_backward_level(ctx, op, 1, 0, lm__composed_linear_ce_accepts(x, w, dx, dw), k_composed_needs,
                                 &level));
    double d = *(const float *)dloss->data;
    if (level == LM__LEVEL_CPU)
        return lm__composed_linear_ce_backward(ctx, x, w, targets, ignore_index, counted, d, dx, dw);
    return lm__ref_linear_cross_entropy_backward(x, w, targets, ignore_index, counted, d, dx, dw);
}
