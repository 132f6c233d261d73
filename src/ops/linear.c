/* ops/linear.c — lm_linear_out: a Linear layer with its input normalization or
 * SwiGLU and its residual add fused (the decode step's GEMVs). Validation and
 * dispatch; the composition it equals is the reference (ops/ref/linear.c).
 *
 * x [M, K] (or [M, 2K] for SwiGLU), w [N, K], bias [N] f32 or NULL, norm_weight [K]
 * f32, out [M, N]. out may not overlap x, w or the bias; with accumulate it is read
 * before it is written (element by element, the residual stream in place).
 */
#include "ops/alias.h"
#include "ops/ref/linear.h"

static const lm_linear_params k_plain = {LM_LINEAR_IN, NULL, 0.0f, 0};

static lm_status check(const char *op, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                       const lm_linear_params *p, const lm_tensor_view *out) {
    if ((unsigned)p->input > LM_LINEAR_IN_SWIGLU) return lm__error(LM_INVALID_ARGUMENT, "%s: unknown input form %d", op, (int)p->input);
    LM_TRY(lm__op_check_float(op, "w", w));
    LM_TRY(lm__op_check_float(op, "x", x));
    LM_TRY(lm__op_check_float(op, "out", out));
    if (x->dtype != LM_F32 && x->dtype != w->dtype)
        return lm__error(LM_DTYPE_MISMATCH, "%s: x is %s; expected f32 or w's %s", op, lm_dtype_name(x->dtype),
                         lm_dtype_name(w->dtype));
    int64_t any2[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "w [N, K]", w, 2, any2));
    int64_t M = x->ndim == 2 ? x->shape[0] : -1, N = w->shape[0], K = w->shape[1];
    int64_t xs[2] = {M, p->input == LM_LINEAR_IN_SWIGLU ? 2 * K : K}, os[2] = {M, N}, bs[1] = {N}, ks[1] = {K};
    LM_TRY(lm__op_check_shape(op, p->input == LM_LINEAR_IN_SWIGLU ? "x [M, 2K]" : "x [M, K]", x, 2, xs));
    LM_TRY(lm__op_check_shape(op, "out [M, N]", out, 2, os));
    if (bias) {
        LM_TRY(lm__op_check_dtype(op, "bias", bias, LM_F32));
        LM_TRY(lm__op_check_shape(op, "bias [N]", bias, 1, bs));
    }
    if (p->input == LM_LINEAR_IN_RMSNORM) {
        if (!p->norm_weight) return lm__error(LM_INVALID_ARGUMENT, "%s: RMSNORM input without a norm weight", op);
        LM_TRY(lm__op_check_dtype(op, "norm_weight", p->norm_weight, LM_F32));
        LM_TRY(lm__op_check_shape(op, "norm_weight [K]", p->norm_weight, 1, ks));
        if (!isfinite(p->eps) || p->eps < 0) return lm__error(LM_INVALID_ARGUMENT, "%s: eps %g", op, p->eps);
    }
    LM_TRY(lm__op_check_out(op, "out", out));
    LM_TRY(lm__op_check_alias(op, "out", out, "x", x, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "w", w, 0));
    return bias ? lm__op_check_alias(op, "out", out, "bias", bias, 0) : LM_OK;
}

int lm_linear_supported(lm_device d, lm_linear_input input, int64_t rows, int64_t K, lm_dtype x_dtype, lm_dtype w_dtype) {
    (void)d, (void)input, (void)rows, (void)K, (void)x_dtype, (void)w_dtype;
    return 0;
}

lm_status lm_linear_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                        const lm_linear_params *p, const lm_tensor_view *out) {
    const char *op = "linear";
    const lm_tensor_view *vs[] = {x, w, out};
    static const char *const names[] = {"x", "w", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    if (!p) p = &k_plain;
    if (bias) {
        const lm_tensor_view *bv[] = {bias};
        static const char *const bn[] = {"bias"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, bv, bn));
    }
    if (p->input == LM_LINEAR_IN_RMSNORM && p->norm_weight) {
        const lm_tensor_view *nv[] = {p->norm_weight};
        static const char *const nn[] = {"norm_weight"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, nv, nn));
    }
    LM_TRY(check(op, x, w, bias, p, out));
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, 0, &level));
    return lm__ref_linear(x, w, bias, p, out);
}
