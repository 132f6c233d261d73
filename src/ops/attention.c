/* ops/attention.c — public grouped-query attention: validation and dispatch.
 * out = softmax(q k^T * scale [causal]) v per head with q [B, Hq, Tq, D],
 * k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], out [B, Hq, Tq, Dv]; Hq % Hkv == 0 and query
 * head h reads kv head h / (Hq / Hkv). Causal alignment is lm_softmax_out's (needs
 * Tk >= Tq); a window (causal only) keeps each query's last `window` keys. All four
 * share one float dtype; any strides are accepted (e.g. permuted
 * [B, T, H, D] buffers). out must not overlap itself or share memory with q, k or v.
 * On the CPU, views the tuned kernel accepts (f32, unit last-dim stride) run there
 * unless the context asks for the reference; others fall back to the reference, or
 * fail with LM_UNSUPPORTED when the context forces the tuned level.
 * lm_attention_lse_out (training) also writes each row's log-sum-exp; only the CUDA
 * flash kernel does that (see loom/ops_backward.h).
 */
#include "ops/alias.h"
#include "ops/backward_common.h"
#include "ops/cpu/attention.h"
#include "ops/internal.h"
#include "ops/ref/attention.h"

static lm_status check_attention_shapes(const char *op, const lm_tensor_view *q, const lm_tensor_view *k,
                                        const lm_tensor_view *v, int causal, const lm_tensor_view *out) {
    char sq[128], sk[128];
    int64_t any = -1;
    int64_t qshape[4] = {any, any, any, any};
    LM_TRY(lm__op_check_shape(op, "q [B, Hq, Tq, D]", q, 4, qshape));
    int64_t B = q->shape[0], Hq = q->shape[1], Tq = q->shape[2], D = q->shape[3];
    int64_t kshape[4] = {B, any, any, D};
    LM_TRY(lm__op_check_shape(op, "k [B, Hkv, Tk, D]", k, 4, kshape));
    int64_t Hkv = k->shape[1], Tk = k->shape[2];
    int64_t vshape[4] = {B, Hkv, Tk, any};
    LM_TRY(lm__op_check_shape(op, "v [B, Hkv, Tk, Dv]", v, 4, vshape));
    int64_t oshape[4] = {B, Hq, Tq, v->shape[3]};
    LM_TRY(lm__op_check_shape(op, "out [B, Hq, Tq, Dv]", out, 4, oshape));
    if (Hkv == 0 ? Hq != 0 : Hq % Hkv != 0)
        return lm__error(LM_SHAPE_MISMATCH, "%s: q %s has Hq = %lld heads, not a multiple of Hkv = %lld in k %s", op,
                         lm__shape_str(q, sq, sizeof sq), (long long)Hq, (long long)Hkv, lm__shape_str(k, sk, sizeof sk));
    if (causal && Tk < Tq)
        return lm__error(LM_SHAPE_MISMATCH, "%s: causal attention needs Tk >= Tq, but q %s has Tq = %lld and k %s has Tk = %lld",
                         op, lm__shape_str(q, sq, sizeof sq), (long long)Tq, lm__shape_str(k, sk, sizeof sk), (long long)Tk);
    return LM_OK;
}

lm_status lm_attention_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                           float scale, int causal, const lm_tensor_view *out) {
    return lm_attention_window_out(ctx, q, k, v, scale, causal, 0, out);
}

/* Everything lm_attention_window_out asks of its views, with out's dtype that of q. */
static lm_status check_attention(lm_ctx *ctx, const char *op, const lm_tensor_view *q, const lm_tensor_view *k,
                                 const lm_tensor_view *v, int causal, int64_t window, const lm_tensor_view *out) {
    const lm_tensor_view *vs[] = {q, k, v, out};
    static const char *const names[] = {"q", "k", "v", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 4, vs, names));
    LM_TRY(lm__op_check_float(op, "q", q));
    LM_TRY(lm__op_check_dtype(op, "k", k, q->dtype));
    LM_TRY(lm__op_check_dtype(op, "v", v, q->dtype));
    LM_TRY(lm__op_check_dtype(op, "out", out, q->dtype));
    LM_TRY(check_attention_shapes(op, q, k, v, causal, out));
    if (window < 0 || (window > 0 && !causal))
        return lm__error(LM_INVALID_ARGUMENT, "%s: window %lld (>= 0, and only with causal)", op, (long long)window);
    LM_TRY(lm__op_check_out(op, "out", out));
    LM_TRY(lm__op_check_alias(op, "out", out, "q", q, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "k", k, 0));
    return lm__op_check_alias(op, "out", out, "v", v, 0);
}

lm_status lm_attention_window_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                  const lm_tensor_view *v, float scale, int causal, int64_t window,
                                  const lm_tensor_view *out) {
    const char *op = "attention";
    LM_TRY(check_attention(ctx, op, q, k, v, causal, window, out));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->attention(q, k, v, scale, causal, window, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        char why[256];
        if (lm__cpu_attention_supported(q, k, v, out, why, sizeof why))
            return lm__cpu_attention(lm_ctx_threadpool(ctx), q, k, v, scale, causal, window, out);
        if (lm_ctx_impl(ctx) == LM_IMPL_TUNED) return lm__error(LM_UNSUPPORTED, "%s: %s", op, why);
    }
    return lm__ref_attention(q, k, v, scale, causal, window, out);
}

/* ---- with the softmax statistics ---------------------------------------------------------------- */
int lm_attention_lse_supported(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                               const lm_tensor_view *v, int causal, const lm_tensor_view *out) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    if (!ctx || !q || !k || !v || !out || !cu || lm_ctx_device(ctx).type != LM_DEVICE_CUDA) return 0;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || out->ndim != 4) return 0;
    return cu->attention_lse_supported(q, k, v, causal, out);
}

lm_status lm_attention_lse_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                               const lm_tensor_view *v, float scale, int causal, int64_t window,
                               const lm_tensor_view *out, const lm_tensor_view *lse) {
    const char *op = "attention_lse";
    LM_TRY(check_attention(ctx, op, q, k, v, causal, window, out));
    LM_TRY(lm__op_check_attention_lse(ctx, op, q, lse));
    LM_TRY(lm__op_check_alias(op, "lse", lse, "out", out, 0));
    if (!lm_attention_lse_supported(ctx, q, k, v, causal, out)) return lm__attention_lse_unsupported(op);
    return lm__cuda_ops_get()->attention_lse(q, k, v, scale, causal, window, out, lse, lm_ctx_stream(ctx));
}
