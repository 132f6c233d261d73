/* ops/rope.c — public rotary position embedding and its inverse-frequency table:
 * validation and dispatch. x, out [B, T, H, D] in one float dtype, D even; out may be
 * x's very view (in place) but must share memory with no other operand (detectable
 * overlaps are rejected, ops/alias.h). Positions may be any integers, negative ones
 * included: the rotation is defined for all of them. On the CPU the tuned level
 * (ops/cpu/rope.c) takes f32 views with unit-stride head dims; other views run the
 * reference. The inverse-frequency table is reference-only (computed once). */
#include "ops/alias.h"
#include "ops/cpu/pointwise.h"
#include "ops/ref/rope.h"

lm_status lm__rope_check_params(lm_ctx *ctx, const char *op, const lm_tensor_view *x, const lm_rope_params *p,
                                int with_bias) {
    if (!p) return lm__error(LM_INVALID_ARGUMENT, "%s: params is NULL", op);
    if (!p->inv_freq)
        return lm__error(LM_INVALID_ARGUMENT, "%s: params.inv_freq is NULL (lm_rope_inv_freq_out fills one)", op);
    if (p->style != LM_ROPE_SPLIT_HALF && p->style != LM_ROPE_INTERLEAVED)
        return lm__error(LM_INVALID_ARGUMENT, "%s: unknown rope style %d", op, (int)p->style);
    const lm_tensor_view *vs[] = {p->inv_freq};
    static const char *const names[] = {"inv_freq"};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    LM_TRY(lm__op_check_dtype(op, "inv_freq", p->inv_freq, LM_F32));
    int64_t half = x->shape[3] / 2;
    LM_TRY(lm__op_check_shape(op, "inv_freq", p->inv_freq, 1, &half));
    if (p->positions) {
        const lm_tensor_view *pv[] = {p->positions};
        static const char *const pn[] = {"positions"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, pv, pn));
        LM_TRY(lm__op_check_index(op, "positions", p->positions));
        int64_t bt[2] = {x->shape[0], x->shape[1]};
        if (p->positions->ndim == 1) LM_TRY(lm__op_check_shape(op, "positions", p->positions, 1, &bt[1]));
        else LM_TRY(lm__op_check_shape(op, "positions", p->positions, 2, bt));
    }
    if (with_bias && p->bias) {
        const lm_tensor_view *bv[] = {p->bias};
        static const char *const bn[] = {"bias"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, bv, bn));
        LM_TRY(lm__op_check_dtype(op, "bias", p->bias, x->dtype));
        int64_t hd[2] = {x->shape[2], x->shape[3]};
        LM_TRY(lm__op_check_shape(op, "bias", p->bias, 2, hd));
    }
    return LM_OK;
}

lm_status lm_rope_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out) {
    const char *op = "rope";
    const lm_tensor_view *vs[] = {x, out};
    static const char *const names[] = {"x", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 2, vs, names));
    LM_TRY(lm__op_check_float(op, "x", x));
    LM_TRY(lm__op_check_dtype(op, "out", out, x->dtype));
    int64_t any4[4] = {-1, -1, -1, -1};
    LM_TRY(lm__op_check_shape(op, "x", x, 4, any4));
    if (x->shape[3] % 2 != 0)
        return lm__error(LM_SHAPE_MISMATCH, "%s: head dim D = %lld of x must be even", op, (long long)x->shape[3]);
    LM_TRY(lm__op_check_same_shape(op, "out", out, x));
    LM_TRY(lm__op_check_out(op, "out", out));
    LM_TRY(lm__rope_check_params(ctx, op, x, p, 1));
    LM_TRY(lm__op_check_alias(op, "out", out, "x", x, 1));
    LM_TRY(lm__op_check_alias(op, "out", out, "inv_freq", p->inv_freq, 0));
    if (p->positions) LM_TRY(lm__op_check_alias(op, "out", out, "positions", p->positions, 0));
    if (p->bias) LM_TRY(lm__op_check_alias(op, "out", out, "bias", p->bias, 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->rope(x, p, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_rope_supported(x, p, out)) {
            lm__cpu_rope(lm_ctx_threadpool(ctx), x, p, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, op,
                              "f32 x and out with unit-stride head dims, unit-stride inv_freq and bias rows"));
    }
    lm__ref_rope(x, p, out);
    return LM_OK;
}

lm_status lm_rope_inv_freq_out(lm_ctx *ctx, double theta, int64_t head_dim, const lm_tensor_view *out) {
    const char *op = "rope_inv_freq";
    const lm_tensor_view *vs[] = {out};
    static const char *const names[] = {"out"};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    if (!isfinite(theta) || theta <= 0)
        return lm__error(LM_INVALID_ARGUMENT, "%s: theta %g must be finite and > 0", op, theta);
    if (head_dim <= 0 || head_dim % 2 != 0)
        return lm__error(LM_INVALID_ARGUMENT, "%s: head_dim %lld must be positive and even", op, (long long)head_dim);
    LM_TRY(lm__op_check_dtype(op, "out", out, LM_F32));
    int64_t half = head_dim / 2;
    LM_TRY(lm__op_check_shape(op, "out", out, 1, &half));
    LM_TRY(lm__op_check_out(op, "out", out));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->rope_inv_freq(theta, head_dim, out, lm_ctx_stream(ctx));
    lm__ref_rope_inv_freq(theta, head_dim, out);
    return LM_OK;
}
