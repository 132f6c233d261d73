/* ops/elementwise.c — public add, mul, scale (by a host or a device factor), cast, silu
 * and swiglu: validation, broadcasting and dispatch. On the CPU the tuned level
 * (ops/cpu/pointwise.h) takes f32 operands with unit-stride last dims (cast:
 * bf16/f16/f32 -> f32); other views, and every view under LM_IMPL_REF, run the
 * reference. */
#include "ops/alias.h"
#include "ops/backward_common.h"
#include "ops/cpu/pointwise.h"
#include "ops/internal.h"
#include "ops/ref/elementwise.h"

static lm_status binary_out(lm_ctx *ctx, const char *op, lm__binary_op kind, const lm_tensor_view *a,
                            const lm_tensor_view *b, const lm_tensor_view *out) {
    const lm_tensor_view *vs[] = {a, b, out};
    static const char *const names[] = {"a", "b", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, "a", a));
    LM_TRY(lm__op_check_dtype(op, "b", b, a->dtype));
    LM_TRY(lm__op_check_dtype(op, "out", out, a->dtype));
    int nd;
    int64_t shape[LM_MAX_DIMS];
    LM_TRY(lm__op_broadcast_shape(op, a, b, &nd, shape));
    LM_TRY(lm__op_check_shape(op, "out", out, nd, shape));
    LM_TRY(lm__op_check_out(op, "out", out));
    lm_tensor_view ea, eb;
    LM_TRY(lm_tensor_view_expand(a, nd, shape, &ea));
    LM_TRY(lm_tensor_view_expand(b, nd, shape, &eb));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return (kind == LM__BIN_ADD ? cu->add : cu->mul)(&ea, &eb, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_binary_supported(&ea, &eb, out)) {
            lm__cpu_binary(lm_ctx_threadpool(ctx), kind == LM__BIN_MUL, &ea, &eb, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, op, "f32 a, b and out with unit-stride last dims (a or b may broadcast)"));
    }
    lm__ref_binary(kind, &ea, &eb, out);
    return LM_OK;
}

static lm_status binary_alloc(lm_ctx *ctx, const char *op, lm__binary_op kind, const lm_tensor_view *a,
                              const lm_tensor_view *b, lm_tensor **out) {
    if (!a || !b) return lm__error(LM_INVALID_ARGUMENT, "%s: NULL input", op);
    int nd;
    int64_t shape[LM_MAX_DIMS];
    LM_TRY(lm__op_broadcast_shape(op, a, b, &nd, shape));
    LM_TRY(lm__op_alloc(ctx, a->dtype, nd, shape, out));
    return lm__op_finish(binary_out(ctx, op, kind, a, b, lm_tensor_as_view(*out)), out);
}

lm_status lm_add_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out) {
    return binary_out(ctx, "add", LM__BIN_ADD, a, b, out);
}
lm_status lm_add(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, lm_tensor **out) {
    return binary_alloc(ctx, "add", LM__BIN_ADD, a, b, out);
}
lm_status lm_mul_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out) {
    return binary_out(ctx, "mul", LM__BIN_MUL, a, b, out);
}
lm_status lm_mul(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, lm_tensor **out) {
    return binary_alloc(ctx, "mul", LM__BIN_MUL, a, b, out);
}

/* Shared checks for one-input operators whose output has the input's shape, and the
 * level (cu: the CUDA table or NULL). */
static lm_status unary_check(lm_ctx *ctx, const char *op, const lm_tensor_view *x, const lm_tensor_view *out,
                             int same_dtype, const lm__cuda_ops *cu, lm__level *level) {
    const lm_tensor_view *vs[] = {x, out};
    static const char *const names[] = {"x", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 2, vs, names));
    if (same_dtype) {
        LM_TRY(lm__op_check_float(op, "x", x));
        LM_TRY(lm__op_check_dtype(op, "out", out, x->dtype));
    }
    LM_TRY(lm__op_check_same_shape(op, "out", out, x));
    LM_TRY(lm__op_check_out(op, "out", out));
    return lm__op_level(ctx, op, 1, cu != NULL, level);
}

/* f32 views with unit-stride last dims, as the tuned unary paths need. */
static const char *const k_needs_f32 = "f32 x and out with unit-stride last dims";

lm_status lm_scale_out(lm_ctx *ctx, const lm_tensor_view *x, float s, const lm_tensor_view *out) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(unary_check(ctx, "scale", x, out, 1, cu, &level));
    if (level == LM__LEVEL_CUDA) return cu->scale(x, s, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_unary_supported(x, out)) {
            lm__cpu_scale(lm_ctx_threadpool(ctx), x, s, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, "scale", k_needs_f32));
    }
    lm__ref_unary(LM__UN_SCALE, x, s, out);
    return LM_OK;
}

lm_status lm_scale(lm_ctx *ctx, const lm_tensor_view *x, float s, lm_tensor **out) {
    if (!x) return lm__error(LM_INVALID_ARGUMENT, "scale: NULL input");
    LM_TRY(lm__op_alloc(ctx, x->dtype, x->ndim, x->shape, out));
    return lm__op_finish(lm_scale_out(ctx, x, s, lm_tensor_as_view(*out)), out);
}

/* The factor is read where it lives: on the CPU before the scale above runs, on CUDA by
 * the kernel itself. */
lm_status lm_scale_by_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *s, const lm_tensor_view *out) {
    const char *op = "scale_by";
    LM_TRY(lm__op_check_f32_scalar(ctx, op, "s", s));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(unary_check(ctx, op, x, out, 1, cu, &level));
    if (level == LM__LEVEL_CUDA) return cu->scale_by(x, (const float *)s->data, out, lm_ctx_stream(ctx));
    return lm_scale_out(ctx, x, *(const float *)s->data, out);
}

lm_status lm_silu_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *out) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(unary_check(ctx, "silu", x, out, 1, cu, &level));
    if (level == LM__LEVEL_CUDA) return cu->silu(x, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_unary_supported(x, out)) {
            lm__cpu_silu(lm_ctx_threadpool(ctx), x, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, "silu", k_needs_f32));
    }
    lm__ref_unary(LM__UN_SILU, x, 0, out);
    return LM_OK;
}

lm_status lm_silu(lm_ctx *ctx, const lm_tensor_view *x, lm_tensor **out) {
    if (!x) return lm__error(LM_INVALID_ARGUMENT, "silu: NULL input");
    LM_TRY(lm__op_alloc(ctx, x->dtype, x->ndim, x->shape, out));
    return lm__op_finish(lm_silu_out(ctx, x, lm_tensor_as_view(*out)), out);
}

lm_status lm_cast_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *out) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(unary_check(ctx, "cast", x, out, 0, cu, &level));
    int fin = lm_dtype_is_float(x->dtype), fout = lm_dtype_is_float(out->dtype);
    if (fin && !fout)
        return lm__error(LM_UNSUPPORTED, "cast: %s -> %s is not supported (float to integer)", lm_dtype_name(x->dtype),
                         lm_dtype_name(out->dtype));
    if (level == LM__LEVEL_CUDA) return cu->cast(x, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_cast_supported(x, out)) {
            lm__cpu_cast(lm_ctx_threadpool(ctx), x, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, "cast", "f32, bf16 or f16 x, f32 out, unit-stride last dims"));
    }
    if (!fin && !fout) return lm__ref_cast_int(x, out);
    lm__ref_unary(LM__UN_CAST, x, 0, out);
    return LM_OK;
}

lm_status lm__accumulate_out(lm_ctx *ctx, const lm_tensor_view *acc, const lm_tensor_view *x) {
    const char *op = "accumulate";
    const lm_tensor_view *vs[] = {acc, x};
    static const char *const names[] = {"acc", "x"};
    LM_TRY(lm__op_check_devices(ctx, op, 2, vs, names));
    LM_TRY(lm__op_check_float(op, "acc", acc));
    LM_TRY(lm__op_check_float(op, "x", x));
    LM_TRY(lm__op_check_same_shape(op, "x", x, acc));
    LM_TRY(lm__op_check_out(op, "acc", acc));
    LM_TRY(lm__op_check_alias(op, "acc", acc, "x", x, 1));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA && acc->dtype == LM_F32) return cu->accumulate(acc, x, lm_ctx_stream(ctx));
    if (x->dtype == acc->dtype) return lm_add_out(ctx, acc, x, acc);
    lm_tensor *tmp = NULL;
    lm_status st = lm_cast(ctx, x, acc->dtype, &tmp);
    if (st == LM_OK) st = lm_add_out(ctx, acc, lm_tensor_as_view(tmp), acc);
    lm_tensor_destroy(tmp);
    return st;
}

lm_status lm_cast(lm_ctx *ctx, const lm_tensor_view *x, lm_dtype dtype, lm_tensor **out) {
    if (!x) return lm__error(LM_INVALID_ARGUMENT, "cast: NULL input");
    LM_TRY(lm__op_alloc(ctx, dtype, x->ndim, x->shape, out));
    return lm__op_finish(lm_cast_out(ctx, x, lm_tensor_as_view(*out)), out);
}

lm_status lm_swiglu_out(lm_ctx *ctx, const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out) {
    const char *op = "swiglu";
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(unary_check(ctx, op, gate, out, 0, cu, &level));
    LM_TRY(lm__op_check_float(op, "gate", gate));
    LM_TRY(lm__op_check_float(op, "out", out)); /* may round to another float dtype */
    const lm_tensor_view *vs[] = {up};
    static const char *const names[] = {"up"};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    LM_TRY(lm__op_check_dtype(op, "up", up, gate->dtype));
    LM_TRY(lm__op_check_same_shape(op, "up", up, gate));
    if (level == LM__LEVEL_CUDA) return cu->swiglu(gate, up, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_swiglu_supported(gate, up, out)) {
            lm__cpu_swiglu(lm_ctx_threadpool(ctx), gate, up, out);
            return LM_OK;
        }
        LM_TRY(lm__cpu_reject(ctx, op, "f32 gate, up and out with unit-stride last dims"));
    }
    lm__ref_swiglu(gate, up, out);
    return LM_OK;
}

lm_status lm_swiglu(lm_ctx *ctx, const lm_tensor_view *gate, const lm_tensor_view *up, lm_tensor **out) {
    if (!gate) return lm__error(LM_INVALID_ARGUMENT, "swiglu: NULL input");
    LM_TRY(lm__op_alloc(ctx, gate->dtype, gate->ndim, gate->shape, out));
    return lm__op_finish(lm_swiglu_out(ctx, gate, up, lm_tensor_as_view(*out)), out);
}
