/* ops/softmax.c — public softmax over the last dim of x * scale, optionally causal:
 * x is then [..., Tq, Tk] and row i sees columns j <= i + (Tk - Tq) (the queries are
 * the last Tq of Tk positions), so Tk >= Tq is required. out has x's dtype and shape,
 * must not overlap itself, and may be x itself (in place) but not partially overlap it.
 * On the CPU the tuned level (ops/cpu/softmax.c) takes f32 views with unit-stride
 * rows; other views run the reference.
 */
#include "ops/alias.h"
#include "ops/cpu/pointwise.h"
#include "ops/internal.h"
#include "ops/ref/softmax.h"

static lm_status check_softmax_shape(const char *op, const lm_tensor_view *x, int causal) {
    char sx[128];
    if (x->ndim < 1) return lm__error(LM_SHAPE_MISMATCH, "%s: x is a scalar; softmax needs at least one dim", op);
    if (!causal) return LM_OK;
    if (x->ndim < 2)
        return lm__error(LM_SHAPE_MISMATCH, "%s: causal softmax needs x [..., Tq, Tk], got %s", op,
                         lm__shape_str(x, sx, sizeof sx));
    int64_t tq = x->shape[x->ndim - 2], tk = x->shape[x->ndim - 1];
    if (tk < tq)
        return lm__error(LM_SHAPE_MISMATCH, "%s: causal softmax needs Tk >= Tq, but x %s has Tq = %lld, Tk = %lld", op,
                         lm__shape_str(x, sx, sizeof sx), (long long)tq, (long long)tk);
    return LM_OK;
}

lm_status lm_softmax_out(lm_ctx *ctx, const lm_tensor_view *x, float scale, int causal, const lm_tensor_view *out) {
    const char *op = "softmax";
    const lm_tensor_view *vs[] = {x, out};
    static const char *const names[] = {"x", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 2, vs, names));
    LM_TRY(lm__op_check_float(op, "x", x));
    LM_TRY(lm__op_check_dtype(op, "out", out, x->dtype));
    LM_TRY(check_softmax_shape(op, x, causal));
    LM_TRY(lm__op_check_same_shape(op, "out", out, x));
    LM_TRY(lm__op_check_out(op, "out", out));
    LM_TRY(lm__op_check_alias(op, "out", out, "x", x, 1));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->softmax(x, scale, causal, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_softmax_supported(x, out)) {
            lm__cpu_softmax(lm_ctx_threadpool(ctx), x, scale, causal, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, op, "f32 x and out with unit-stride last dims"));
    }
    lm__ref_softmax(x, scale, causal, out);
    return LM_OK;
}

lm_status lm_softmax(lm_ctx *ctx, const lm_tensor_view *x, float scale, int causal, lm_tensor **out) {
    if (!x) return lm__error(LM_INVALID_ARGUMENT, "softmax: NULL input");
    LM_TRY(check_softmax_shape("softmax", x, causal));
    LM_TRY(lm__op_alloc(ctx, x->dtype, x->ndim, x->shape, out));
    return lm__op_finish(lm_softmax_out(ctx, x, scale, causal, lm_tensor_as_view(*out)), out);
}
