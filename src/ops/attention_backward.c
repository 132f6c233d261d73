/* ops/attention_backward.c — public attention backward: validation and dispatch
 * (reference level only on the CPU; ops/cuda/attention_backward.cu on CUDA). Shapes follow lm_attention_out: q [B, Hq, Tq, D],
 * k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], dout [B, Hq, Tq, Dv], Hq % Hkv == 0, causal
 * needs Tk >= Tq; q, k, v, dout share one float dtype, any strides.
 */
#include "ops/backward_common.h"
#include "ops/ref/attention_backward.h"

static lm_status check_shapes(const char *op, const lm_tensor_view *q, const lm_tensor_view *k,
                              const lm_tensor_view *v, const lm_tensor_view *dout, int causal) {
    int64_t any4[4] = {-1, -1, -1, -1};
    LM_TRY(lm__op_check_shape(op, "q [B, Hq, Tq, D]", q, 4, any4));
    int64_t kshape[4] = {q->shape[0], -1, -1, q->shape[3]};
    LM_TRY(lm__op_check_shape(op, "k [B, Hkv, Tk, D]", k, 4, kshape));
    int64_t vshape[4] = {q->shape[0], k->shape[1], k->shape[2], -1};
    LM_TRY(lm__op_check_shape(op, "v [B, Hkv, Tk, Dv]", v, 4, vshape));
    int64_t oshape[4] = {q->shape[0], q->shape[1], q->shape[2], v->shape[3]};
    LM_TRY(lm__op_check_shape(op, "dout [B, Hq, Tq, Dv]", dout, 4, oshape));
    if (k->shape[1] == 0 ? q->shape[1] != 0 : q->shape[1] % k->shape[1] != 0)
        return lm__error(LM_SHAPE_MISMATCH, "%s: Hq = %lld is not a multiple of Hkv = %lld", op, (long long)q->shape[1],
                         (long long)k->shape[1]);
    if (causal && k->shape[2] < q->shape[2])
        return lm__error(LM_SHAPE_MISMATCH, "%s: causal attention needs Tk >= Tq, got Tq = %lld and Tk = %lld", op,
                         (long long)q->shape[2], (long long)k->shape[2]);
    return LM_OK;
}

lm_status lm_attention_backward_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                    const lm_tensor_view *v, const lm_tensor_view *dout, float scale, int causal,
                                    const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv) {
    return lm_attention_backward_window_out(ctx, q, k, v, dout, scale, causal, 0, dq, dk, dv);
}

/* The checks of the gradients: each like its operand, none overlapping the inputs or an
 * earlier gradient. */
static lm_status check_grads(lm_ctx *ctx, const char *op, const lm_tensor_view *q, const lm_tensor_view *k,
                             const lm_tensor_view *v, const lm_tensor_view *dout, const lm_tensor_view *dq,
                             const lm_tensor_view *dk, const lm_tensor_view *dv) {
    LM_TRY(lm__op_check_grad(ctx, op, "dq", dq, q));
    LM_TRY(lm__op_check_grad(ctx, op, "dk", dk, k));
    LM_TRY(lm__op_check_grad(ctx, op, "dv", dv, v));
    const lm_tensor_view *ins[] = {q, k, v, dout, dq, dk, dv};
    static const char *const in_names[] = {"q", "k", "v", "dout", "dq", "dk", "dv"};
    LM_TRY(lm__op_check_grad_alias(op, "dq", dq, 4, ins, in_names));
    LM_TRY(lm__op_check_grad_alias(op, "dk", dk, 5, ins, in_names));
    return lm__op_check_grad_alias(op, "dv", dv, 6, ins, in_names);
}

/* q, k, v, dout on the context's device, one float dtype, attention shapes, the window. */
static lm_status check_inputs(lm_ctx *ctx, const char *op, const lm_tensor_view *q, const lm_tensor_view *k,
                              const lm_tensor_view *v, const lm_tensor_view *dout, int causal, int64_t window) {
    const lm_tensor_view *vs[] = {q, k, v, dout};
    static const char *const names[] = {"q", "k", "v", "dout"};
    LM_TRY(lm__op_check_devices(ctx, op, 4, vs, names));
    LM_TRY(lm__op_check_float(op, "q", q));
    for (int i = 1; i < 4; i++) LM_TRY(lm__op_check_dtype(op, names[i], vs[i], q->dtype));
    LM_TRY(check_shapes(op, q, k, v, dout, causal));
    if (window < 0 || (window > 0 && !causal))
        return lm__error(LM_INVALID_ARGUMENT, "%s: window %lld (>= 0, and only with causal)", op, (long long)window);
    return LM_OK;
}

lm_status lm_attention_backward_window_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                           const lm_tensor_view *v, const lm_tensor_view *dout, float scale,
                                           int causal, int64_t window, const lm_tensor_view *dq,
                                           const lm_tensor_view *dk, const lm_tensor_view *dv) {
    const char *op = "attention_backward";
    LM_TRY(check_inputs(ctx, op, q, k, v, dout, causal, window));
    LM_TRY(check_grads(ctx, op, q, k, v, dout, dq, dk, dv));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA)
        return cu->attention_backward(q, k, v, dout, scale, causal, window, dq, dk, dv, lm_ctx_stream(ctx));
    return lm__ref_attention_backward(q, k, v, dout, scale, causal, window, dq, dk, dv);
}

lm_status lm_attention_backward_lse_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                        const lm_tensor_view *v, const lm_tensor_view *out, const lm_tensor_view *lse,
                                        const lm_tensor_view *dout, float scale, int causal, int64_t window,
                                        const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv) {
    const char *op = "attention_backward_lse";
    LM_TRY(check_inputs(ctx, op, q, k, v, dout, causal, window));
    const lm_tensor_view *vs[] = {out};
    static const char *const names[] = {"out"};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    LM_TRY(lm__op_check_dtype(op, "out", out, q->dtype));
    LM_TRY(lm__op_check_shape(op, "out [B, Hq, Tq, Dv]", out, 4, dout->shape));
    LM_TRY(lm__op_check_attention_lse(ctx, op, q, lse));
    LM_TRY(check_grads(ctx, op, q, k, v, dout, dq, dk, dv));
    const lm_tensor_view *saved[] = {out, lse};
    static const char *const saved_names[] = {"out", "lse"};
    for (int i = 0; i < 2; i++) {
        LM_TRY(lm__op_check_grad_alias(op, "dq", dq, 1, &saved[i], &saved_names[i]));
        LM_TRY(lm__op_check_grad_alias(op, "dk", dk, 1, &saved[i], &saved_names[i]));
        LM_TRY(lm__op_check_grad_alias(op, "dv", dv, 1, &saved[i], &saved_names[i]));
    }
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    if (!lm_attention_lse_supported(ctx, q, k, v, causal, out) || !cu->attention_lse_supported(q, k, v, causal, dout) ||
        !cu->attention_lse_supported(q, k, v, causal, dq) || !cu->attention_lse_supported(q, k, v, causal, dk) ||
        !cu->attention_lse_supported(q, k, v, causal, dv))
        return lm__attention_lse_unsupported(op);
    return cu->attention_backward_lse(q, k, v, out, lse, dout, scale, causal, window, dq, dk, dv, lm_ctx_stream(ctx));
}
