/* ops/matmul.c — public batched matmul: validation, batch broadcasting and dispatch.
 * out[..., M, N] = a[..., M, K] @ b[..., K, N]; both operands have ndim >= 2 and their
 * batch dims broadcast by numpy rules. a and out share one float dtype; b has a's
 * dtype, or is bf16/f16 when a is f32 (low-precision weights widened on the fly).
 * out must not overlap itself or share memory with a or b. Levels: the reference
 * (ops/ref/matmul.c); the tuned CPU GEMM (ops/cpu/matmul.c) when the views map onto
 * x [M, K] @ W[N, K]^T with unit inner strides; on CUDA, cuBLASLt when it takes the
 * layout, else the readable kernel (the operator table's matmul).
 */
#include "ops/alias.h"
#include "ops/internal.h"
#include "ops/cpu/matmul.h"
#include "ops/ref/matmul.h"

static lm_status check_b_dtype(const char *op, const lm_tensor_view *a, const lm_tensor_view *b) {
    if (b->dtype == a->dtype) return LM_OK;
    if (a->dtype == LM_F32 && (b->dtype == LM_BF16 || b->dtype == LM_F16)) return LM_OK;
    return lm__error(LM_DTYPE_MISMATCH, "%s: b has dtype %s but a is %s; b must be %s%s", op, lm_dtype_name(b->dtype),
                     lm_dtype_name(a->dtype), lm_dtype_name(a->dtype), a->dtype == LM_F32 ? ", bf16 or f16" : "");
}

/* Shape of a @ b: broadcast batch dims followed by [M, N]. */
lm_status lm__matmul_shape(const char *op, const lm_tensor_view *a, const lm_tensor_view *b, int *ndim,
                          int64_t *shape) {
    char sa[128], sb[128];
    if (a->ndim < 2 || b->ndim < 2)
        return lm__error(LM_SHAPE_MISMATCH, "%s: a %s and b %s both need at least 2 dims ([..., M, K] @ [..., K, N])",
                         op, lm__shape_str(a, sa, sizeof sa), lm__shape_str(b, sb, sizeof sb));
    if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2])
        return lm__error(LM_SHAPE_MISMATCH, "%s: a %s has K = %lld columns but b %s has %lld rows", op,
                         lm__shape_str(a, sa, sizeof sa), (long long)a->shape[a->ndim - 1],
                         lm__shape_str(b, sb, sizeof sb), (long long)b->shape[b->ndim - 2]);
    int na = a->ndim - 2, nb = b->ndim - 2, n = LM_MAX(na, nb);
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return lm__error(LM_SHAPE_MISMATCH, "%s: batch dims of a %s and b %s do not broadcast", op,
                             lm__shape_str(a, sa, sizeof sa), lm__shape_str(b, sb, sizeof sb));
        shape[i] = da == 1 ? db : da;
    }
    shape[n] = a->shape[a->ndim - 2];
    shape[n + 1] = b->shape[b->ndim - 1];
    *ndim = n + 2;
    return LM_OK;
}

lm_status lm_matmul_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out) {
    const char *op = "matmul";
    const lm_tensor_view *vs[] = {a, b, out};
    static const char *const names[] = {"a", "b", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, "a", a));
    LM_TRY(check_b_dtype(op, a, b));
    LM_TRY(lm__op_check_dtype(op, "out", out, a->dtype));
    int nd;
    int64_t shape[LM_MAX_DIMS];
    LM_TRY(lm__matmul_shape(op, a, b, &nd, shape));
    LM_TRY(lm__op_check_shape(op, "out", out, nd, shape));
    LM_TRY(lm__op_check_out(op, "out", out));
    LM_TRY(lm__op_check_alias(op, "out", out, "a", a, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "b", b, 0));
    /* Expand both operands to out's batch dims (stride 0 where broadcast). */
    int64_t sa[LM_MAX_DIMS], sb[LM_MAX_DIMS];
    memcpy(sa, shape, sizeof sa);
    memcpy(sb, shape, sizeof sb);
    sa[nd - 1] = sb[nd - 2] = a->shape[a->ndim - 1];
    lm_tensor_view ea, eb;
    LM_TRY(lm_tensor_view_expand(a, nd, sa, &ea));
    LM_TRY(lm_tensor_view_expand(b, nd, sb, &eb));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->matmul(ctx, &ea, &eb, out);
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_linear_supported(&ea, &eb, out)) return lm__cpu_linear_views(lm_ctx_threadpool(ctx), &ea, &eb, out);
        if (lm_ctx_impl(ctx) == LM_IMPL_TUNED)
            return lm__error(LM_UNSUPPORTED, "matmul: the tuned CPU path needs f32 a/out with unit inner stride and a "
                                             "weight with unit stride along K (a transposed [N, K] row-major matrix)");
    }
    lm__ref_matmul(&ea, &eb, out);
    return LM_OK;
}

lm_status lm_matmul(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, lm_tensor **out) {
    if (!a || !b) return lm__error(LM_INVALID_ARGUMENT, "matmul: NULL input");
    int nd;
    int64_t shape[LM_MAX_DIMS];
    LM_TRY(lm__matmul_shape("matmul", a, b, &nd, shape));
    LM_TRY(lm__op_alloc(ctx, a->dtype, nd, shape, out));
    return lm__op_finish(lm_matmul_out(ctx, a, b, lm_tensor_as_view(*out)), out);
}
