/* ops/quantize.c — lm_quantize_int8_rows: symmetric per-row int8 quantization of a
 * float weight matrix w [N, K] (the storage lm_linear_out takes with w_scales).
 *
 * Row n: amax = max_k |w[n, k]| (exact in f32), scale = amax / 127 as one correctly
 * rounded f32 division (1 for an all-zero row; the smallest positive f32 when amax
 * is so small that the division underflows to 0), q[n, k] = round-half-even(w / scale)
 * clamped to [-127, 127]. The quotient is formed in double: two f32 operands give a
 * quotient whose double rounding can neither create nor hide a tie at k + 1/2 (its
 * distance from one is >= 2^-25 relative, far above double's 2^-53), so rint() of it
 * is the exact round-half-even. The clamp only acts when the scale is subnormal.
 * Any strides; host memory; w is checked for NaN/Inf (naming the row) before
 * anything is written. O(N * K).
 */
#include "ops/alias.h"
#include "ops/internal.h"
#include "runtime/internal.h"

#include <float.h>

static lm_status check(lm_ctx *ctx, const char *op, const lm_tensor_view *w, const lm_tensor_view *q,
                       const lm_tensor_view *scales) {
    if (!ctx) return lm__error(LM_INVALID_ARGUMENT, "%s: ctx is NULL", op);
    const lm_tensor_view *vs[] = {w, q, scales};
    static const char *const names[] = {"w", "q", "w_scales"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    if (!lm__device_host_addressable(lm_ctx_device(ctx)))
        return lm__error(LM_UNSUPPORTED, "%s: runs on host memory only (quantize on the CPU, then copy q and w_scales)",
                         op);
    LM_TRY(lm__op_check_float(op, "w", w));
    LM_TRY(lm__op_check_dtype(op, "q", q, LM_I8));
    LM_TRY(lm__op_check_dtype(op, "w_scales", scales, LM_F32));
    int64_t any2[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "w [N, K]", w, 2, any2));
    int64_t ns[1] = {w->shape[0]};
    LM_TRY(lm__op_check_same_shape(op, "q", q, w));
    LM_TRY(lm__op_check_shape(op, "w_scales [N]", scales, 1, ns));
    LM_TRY(lm__op_check_out(op, "q", q));
    LM_TRY(lm__op_check_out(op, "w_scales", scales));
    LM_TRY(lm__op_check_alias(op, "q", q, "w", w, 0));
    LM_TRY(lm__op_check_alias(op, "w_scales", scales, "w", w, 0));
    return lm__op_check_alias(op, "w_scales", scales, "q", q, 0);
}

static double w_at(const lm_tensor_view *w, int64_t n, int64_t k) {
    return lm__ld(w->dtype, w->data, n * w->stride[0] + k * w->stride[1]);
}

lm_status lm_quantize_int8_rows(lm_ctx *ctx, const lm_tensor_view *w, const lm_tensor_view *q,
                                const lm_tensor_view *w_scales) {
    const char *op = "quantize_int8_rows";
    LM_TRY(check(ctx, op, w, q, w_scales));
    int64_t N = w->shape[0], K = w->shape[1];
    for (int64_t n = 0; n < N; n++) /* nothing is written unless every value is finite */
        for (int64_t k = 0; k < K; k++)
            if (!isfinite(w_at(w, n, k)))
                return lm__error(LM_INVALID_ARGUMENT, "%s: w row %lld holds %g at column %lld; only finite weights "
                                 "can be quantized", op, (long long)n, w_at(w, n, k), (long long)k);
    for (int64_t n = 0; n < N; n++) {
        float amax = 0.0f; /* every |w| is an f32 value, so the max is exact */
        for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf((float)w_at(w, n, k)));
        float scale = amax == 0.0f ? 1.0f : amax / 127.0f;
        if (scale == 0.0f) scale = FLT_TRUE_MIN; /* amax / 127 underflowed */
        for (int64_t k = 0; k < K; k++) {
            double v = rint(w_at(w, n, k) / (double)scale); /* the default mode: to nearest, ties to even */
            if (v > 127.0) v = 127.0;
            if (v < -127.0) v = -127.0;
            ((int8_t *)q->data)[n * q->stride[0] + k * q->stride[1]] = (int8_t)v;
        }
        ((float *)w_scales->data)[n * w_scales->stride[0]] = scale;
    }
    return LM_OK;
}
