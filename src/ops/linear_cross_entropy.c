/* ops/linear_cross_entropy.c — public fused output projection + cross-entropy, forward
 * and backward: validation and dispatch. x [N, H] float, w [V, H] in x's dtype (or
 * bf16/f16 under an f32 x, as matmul's b), targets i32/i64 [N], loss and dloss f32
 * scalars; dx, dw shaped like x, w. Targets are checked first (LM_OUT_OF_RANGE naming
 * the row), so nothing is written for a bad one. Levels: on CUDA the chunked kernels
 * of ops/cuda/linear_ce.cu (any float dtype; x and w are packed first when strided,
 * dx goes through a scratch when strided); on the CPU the composed, chunked path
 * (ops/composed_linear_ce.c) for f32 operands, otherwise the per-row reference.
 * The grads form (loss and gradients at dloss = 1) is the backward's pass with the
 * loss written too: one logits GEMM per chunk on CUDA and in the composed path; the
 * reference runs its forward, then its backward.
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

/* Contiguous x and w of one dtype for the CUDA kernels (copies in *xo, *wo when
 * packed; a bf16/f16 w under an f32 x is widened). */
static lm_status packed(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, lm_tensor_view *xp,
                        lm_tensor_view *wp, lm_tensor **xo, lm_tensor **wo) {
    LM_TRY(lm__composed_rows(ctx, x, x->shape[1], xp, xo));
    if (w->dtype == x->dtype) return lm__composed_rows(ctx, w, w->shape[1], wp, wo);
    LM_TRY(lm_cast(ctx, w, x->dtype, wo));
    *wp = *lm_tensor_as_view(*wo);
    return LM_OK;
}

static lm_status cuda_forward(const lm__cuda_ops *cu, lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                              const lm_tensor_view *targets, int64_t ignore_index, const lm_tensor_view *loss) {
    lm_tensor *xo = NULL, *wo = NULL;
    lm_tensor_view xp, wp;
    lm_status st = packed(ctx, x, w, &xp, &wp, &xo, &wo);
    if (st == LM_OK) st = cu->linear_cross_entropy(ctx, &xp, &wp, targets, ignore_index, loss);
    lm_tensor_destroy(xo);
    lm_tensor_destroy(wo);
    return st;
}

static lm_status cuda_backward(const lm__cuda_ops *cu, lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                               const lm_tensor_view *targets, int64_t ignore_index, const lm_tensor_view *dloss,
                               const lm_tensor_view *dx, const lm_tensor_view *dw, const lm_tensor_view *loss) {
    lm_tensor *xo = NULL, *wo = NULL, *dxo = NULL;
    lm_tensor_view xp, wp, dxv;
    lm_status st = packed(ctx, x, w, &xp, &wp, &xo, &wo);
    if (st == LM_OK && dx) {
        dxv = *dx;
        if (!lm_tensor_view_is_contiguous(dx) && (st = lm_tensor_create(dx->device, dx->dtype, 2, dx->shape, &dxo)) == LM_OK)
            dxv = *lm_tensor_as_view(dxo);
    }
    if (st == LM_OK)
        st = cu->linear_cross_entropy_backward(ctx, &xp, &wp, targets, ignore_index, dloss, dx ? &dxv : NULL, dw, loss);
    if (st == LM_OK && dxo) st = lm_tensor_view_copy(ctx, dx, &dxv);
    lm_tensor_destroy(xo);
    lm_tensor_destroy(wo);
    lm_tensor_destroy(dxo);
    return st;
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
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_backward_level(ctx, op, 1, cu != NULL, lm__composed_linear_ce_accepts(x, w, NULL, NULL),
                                 k_composed_needs, &level));
    if (level == LM__LEVEL_CUDA) return cuda_forward(cu, ctx, x, w, targets, ignore_index, loss);
    if (level == LM__LEVEL_CPU) return lm__composed_linear_ce(ctx, x, w, targets, ignore_index, counted, loss);
    return lm__ref_linear_cross_entropy(x, w, targets, ignore_index, counted, loss);
}

/* The checks the backward and the grads form share: the f32 scalar (dloss read, or the
 * loss written when scalar_out), dx and dw against x and w, no output overlapping an
 * operand; then the level. */
static lm_status check_grads(lm_ctx *ctx, const char *op, const lm_tensor_view *x, const lm_tensor_view *w,
                             const lm_tensor_view *targets, const char *sname, const lm_tensor_view *scalar,
                             int scalar_out, const lm_tensor_view *dx, const lm_tensor_view *dw, lm__level *level) {
    LM_TRY(lm__op_check_f32_scalar(ctx, op, sname, scalar));
    LM_TRY(lm__op_check_grad(ctx, op, "dx", dx, x));
    LM_TRY(lm__op_check_grad(ctx, op, "dw", dw, w));
    const lm_tensor_view *ins[] = {x, w, targets, scalar, dw};
    const char *const names[] = {"x", "w", "targets", sname, "dw"};
    if (scalar_out) LM_TRY(lm__op_check_grad_alias(op, sname, scalar, 3, ins, names));
    LM_TRY(lm__op_check_grad_alias(op, "dx", dx, 5, ins, names));
    LM_TRY(lm__op_check_grad_alias(op, "dw", dw, 4, ins, names));
    return lm__op_backward_level(ctx, op, 1, lm__cuda_ops_get() != NULL, lm__composed_linear_ce_accepts(x, w, dx, dw),
                                 k_composed_needs, level);
}

lm_status lm_linear_cross_entropy_backward_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                               const lm_tensor_view *targets, int64_t ignore_index,
                                               const lm_tensor_view *dloss, const lm_tensor_view *dx,
                                               const lm_tensor_view *dw) {
    const char *op = "linear_cross_entropy_backward";
    int64_t counted;
    LM_TRY(check_inputs(ctx, op, x, w, targets, ignore_index, &counted));
    if (!dx && !dw) return lm__op_check_f32_scalar(ctx, op, "dloss", dloss);
    lm__level level;
    LM_TRY(check_grads(ctx, op, x, w, targets, "dloss", dloss, 0, dx, dw, &level));
    if (level == LM__LEVEL_CUDA)
        return cuda_backward(lm__cuda_ops_get(), ctx, x, w, targets, ignore_index, dloss, dx, dw, NULL);
    double d = *(const float *)dloss->data;
    if (level == LM__LEVEL_CPU)
        return lm__composed_linear_ce_backward(ctx, x, w, targets, ignore_index, counted, d, dx, dw, NULL);
    return lm__ref_linear_cross_entropy_backward(x, w, targets, ignore_index, counted, d, dx, dw);
}

lm_status lm_linear_cross_entropy_grads_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                            const lm_tensor_view *targets, int64_t ignore_index,
                                            const lm_tensor_view *loss, const lm_tensor_view *dx,
                                            const lm_tensor_view *dw) {
    const char *op = "linear_cross_entropy_grads";
    int64_t counted;
    if (!loss) return lm__error(LM_INVALID_ARGUMENT, "%s: loss is NULL", op);
    LM_TRY(check_inputs(ctx, op, x, w, targets, ignore_index, &counted));
    lm__level level;
    LM_TRY(check_grads(ctx, op, x, w, targets, "loss", loss, 1, dx, dw, &level));
    if (level == LM__LEVEL_CUDA)
        return cuda_backward(lm__cuda_ops_get(), ctx, x, w, targets, ignore_index, NULL, dx, dw, loss);
    if (level == LM__LEVEL_CPU)
        return lm__composed_linear_ce_backward(ctx, x, w, targets, ignore_index, counted, 1.0, dx, dw, loss);
    LM_TRY(lm__ref_linear_cross_entropy(x, w, targets, ignore_index, counted, loss));
    return dx || dw ? lm__ref_linear_cross_entropy_backward(x, w, targets, ignore_index, counted, 1.0, dx, dw) : LM_OK;
}
