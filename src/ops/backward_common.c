/* ops/backward_common.c — argument checks shared by the backward and optimizer
 * operators (see backward_common.h). Every message names the operator and operand. */
#include "ops/backward_common.h"
#include "runtime/internal.h"

lm_status lm__op_check_grad(lm_ctx *ctx, const char *op, const char *name, const lm_tensor_view *grad,
                            const lm_tensor_view *like) {
    if (!grad) return LM_OK;
    const lm_tensor_view *vs[] = {grad};
    const char *const names[] = {name};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    if (grad->dtype != like->dtype && grad->dtype != LM_F32)
        return lm__error(LM_DTYPE_MISMATCH, "%s: gradient %s has dtype %s; expected %s (its operand's) or f32", op, name,
                         lm_dtype_name(grad->dtype), lm_dtype_name(like->dtype));
    LM_TRY(lm__op_check_same_shape(op, name, grad, like));
    return lm__op_check_out(op, name, grad);
}

lm_status lm__op_check_grad_alias(const char *op, const char *name, const lm_tensor_view *grad, int n,
                                  const lm_tensor_view *const *views, const char *const *names) {
    if (!grad) return LM_OK;
    for (int i = 0; i < n; i++)
        if (views[i]) LM_TRY(lm__op_check_alias(op, name, grad, names[i], views[i], 0));
    return LM_OK;
}

lm_status lm__op_check_f32_scalar(lm_ctx *ctx, const char *op, const char *name, const lm_tensor_view *v) {
    const lm_tensor_view *vs[] = {v};
    const char *const names[] = {name};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    LM_TRY(lm__op_check_dtype(op, name, v, LM_F32));
    return lm__op_check_shape(op, name, v, 0, NULL);
}

lm_status lm__op_check_targets(const char *op, const lm_tensor_view *targets, int64_t V, int64_t ignore_index,
                               int64_t *counted) {
    *counted = 0;
    if (!lm__device_host_addressable(targets->device)) return LM_OK; /* device kernels check their own */
    for (int64_t r = 0; r < targets->shape[0]; r++) {
        int64_t t = lm__index_at(targets, r);
        if (t == ignore_index) continue;
        if (t < 0 || t >= V)
            return lm__error(LM_OUT_OF_RANGE, "%s: targets[%lld] = %lld is outside [0, %lld) and is not ignore_index %lld",
                             op, (long long)r, (long long)t, (long long)V, (long long)ignore_index);
        (*counted)++;
    }
    return LM_OK;
}

lm_status lm__op_backward_level(lm_ctx *ctx, const char *op, int has_cpu, int has_cuda, int accepted, const char *why,
                                lm__level *out) {
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, has_cpu, has_cuda, &level));
    if (level != LM__LEVEL_CPU || accepted) {
        *out = level;
        return LM_OK;
    }
    if (lm_ctx_impl(ctx) == LM_IMPL_TUNED) return lm__error(LM_UNSUPPORTED, "%s: the composed path needs %s", op, why);
    *out = LM__LEVEL_REF;
    return LM_OK;
}

lm_status lm__op_check_attention_lse(lm_ctx *ctx, const char *op, const lm_tensor_view *q, const lm_tensor_view *lse) {
    const lm_tensor_view *vs[] = {lse};
    static const char *const names[] = {"lse"};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    LM_TRY(lm__op_check_dtype(op, "lse", lse, LM_F32));
    int64_t shape[3] = {q->shape[0], q->shape[1], q->shape[2]};
    LM_TRY(lm__op_check_shape(op, "lse [B, Hq, Tq]", lse, 3, shape));
    if (!lm_tensor_view_is_contiguous(lse)) return lm__error(LM_INVALID_ARGUMENT, "%s: lse must be contiguous", op);
    LM_TRY(lm__op_check_out(op, "lse", lse));
    return lm__op_check_alias(op, "lse", lse, "q", q, 0);
}

lm_status lm__attention_lse_unsupported(const char *op) {
    return lm__error(LM_UNSUPPORTED,
                     "%s: only the CUDA flash attention kernel keeps the softmax statistics (a CUDA context; "
                     "bf16 q, k, v and dout; head dim 64 or 128 for q and v; unit last stride and 16-byte "
                     "aligned rows)",
                     op);
}
