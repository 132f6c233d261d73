/* ops/rope_backward.c — public RoPE backward: validation and dispatch (reference level
 * on the CPU, ops/cuda/rope_backward.cu on CUDA; O(numel)). dout [B, T, H, D] float with D even; the params follow lm_rope_out
 * (inv_freq [D/2] f32, positions i32/i64 [T] or [B, T] or NULL). dx has dout's
 * shape, dbias [H, D] (when given) is the gradient of the forward's p->bias.
 */
#include "ops/backward_common.h"
#include "ops/ref/rope_backward.h"

lm_status lm_rope_backward_out(lm_ctx *ctx, const lm_tensor_view *dout, const lm_rope_params *p,
                               const lm_tensor_view *dx, const lm_tensor_view *dbias) {
    const char *op = "rope_backward";
    const lm_tensor_view *vs[] = {dout};
    static const char *const names[] = {"dout"};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    LM_TRY(lm__op_check_float(op, "dout", dout));
    int64_t any4[4] = {-1, -1, -1, -1};
    LM_TRY(lm__op_check_shape(op, "dout", dout, 4, any4));
    if (dout->shape[3] % 2 != 0)
        return lm__error(LM_SHAPE_MISMATCH, "%s: head dim D = %lld of dout must be even", op, (long long)dout->shape[3]);
    LM_TRY(lm__rope_check_params(ctx, op, dout, p, 0));
    LM_TRY(lm__op_check_grad(ctx, op, "dx", dx, dout));
    if (dbias) {
        lm_tensor_view like = *dout;
        like.ndim = 2;
        like.shape[0] = dout->shape[2];
        like.shape[1] = dout->shape[3];
        LM_TRY(lm__op_check_grad(ctx, op, "dbias", dbias, &like));
    }
    const lm_tensor_view *ins[] = {dout, p->inv_freq, p->positions, dbias};
    static const char *const in_names[] = {"dout", "inv_freq", "positions", "dbias"};
    LM_TRY(lm__op_check_grad_alias(op, "dx", dx, 4, ins, in_names));
    LM_TRY(lm__op_check_grad_alias(op, "dbias", dbias, 3, ins, in_names));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->rope_backward(dout, p, dx, dbias, lm_ctx_stream(ctx));
    return lm__ref_rope_backward(dout, p, dx, dbias);
}
