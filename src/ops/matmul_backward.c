/* ops/matmul_backward.c — public matmul backward: validation and dispatch.
 * For out = a @ b (lm_matmul_out): da = dout @ b^T, db = a^T @ dout, summed over the
 * batch dims along which the operand was broadcast. Operand rules are the forward's
 * (a and dout share one float dtype; b is a's dtype or bf16/f16 under an f32 a).
 * Levels: the composed path (ops/composed.h) for f32 Linear-shaped calls, otherwise
 * the reference (ops/ref/matmul_backward.c); on CUDA ops/cuda/matmul_backward.cu
 * (cuBLASLt where a gradient is one GEMM, else its readable kernel).
 * lm_matmul_backward_acc_out adds instead of writing: on CUDA inside the GEMM (beta =
 * 1) or the readable kernel; on the CPU through a scratch gradient and lm_add_out.
 */
#include "ops/backward_common.h"
#include "ops/composed.h"
#include "ops/ref/matmul_backward.h"

static lm_status check_args(lm_ctx *ctx, const char *op, const lm_tensor_view *a, const lm_tensor_view *b,
                            const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db) {
    const lm_tensor_view *vs[] = {a, b, dout};
    static const char *const names[] = {"a", "b", "dout"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, "a", a));
    LM_TRY(lm__op_check_float(op, "b", b));
    if (b->dtype != a->dtype && a->dtype != LM_F32)
        return lm__error(LM_DTYPE_MISMATCH, "%s: b has dtype %s but a is %s", op, lm_dtype_name(b->dtype),
                         lm_dtype_name(a->dtype));
    LM_TRY(lm__op_check_dtype(op, "dout", dout, a->dtype));
    int nd = 0;
    int64_t shape[LM_MAX_DIMS];
    LM_TRY(lm__matmul_shape(op, a, b, &nd, shape)); /* dout has the forward output's shape */
    LM_TRY(lm__op_check_shape(op, "dout", dout, nd, shape));
    LM_TRY(lm__op_check_grad(ctx, op, "da", da, a));
    LM_TRY(lm__op_check_grad(ctx, op, "db", db, b));
    const lm_tensor_view *ins[] = {a, b, dout, db};
    static const char *const in_names[] = {"a", "b", "dout", "db"};
    LM_TRY(lm__op_check_grad_alias(op, "da", da, 4, ins, in_names));
    return lm__op_check_grad_alias(op, "db", db, 3, ins, in_names);
}

/* The gradients written (acc 0) or added (acc 1) at the context's level: CUDA does both
 * in its kernels; on the CPU each gradient to add is written into a scratch of its dtype
 * and shape, then added. */
static lm_status run(lm_ctx *ctx, const char *op, const lm_tensor_view *a, const lm_tensor_view *b,
                     const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db, int acc) {
    if (!da && !db) return LM_OK;
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_backward_level(ctx, op, 1, cu != NULL, lm__composed_matmul_backward_accepts(a, b, dout, da, db),
                                 "f32 operands, a 2-d b and an a that is not broadcast", &level));
    if (level == LM__LEVEL_CUDA) return cu->matmul_backward(ctx, a, b, dout, da, db, acc);
    for (int which = 0; acc && which < 2; which++) {
        const lm_tensor_view *g = which ? db : da;
        if (!g) continue;
        lm_tensor *t = NULL;
        LM_TRY(lm_tensor_create(g->device, g->dtype, g->ndim, g->shape, &t));
        const lm_tensor_view *tv = lm_tensor_as_view(t);
        lm_status st = run(ctx, op, a, b, dout, which ? NULL : tv, which ? tv : NULL, 0);
        if (st == LM_OK) st = lm_add_out(ctx, g, tv, g);
        lm_tensor_destroy(t);
        LM_TRY(st);
    }
    if (acc) return LM_OK;
    if (level == LM__LEVEL_CPU) return lm__composed_matmul_backward(ctx, a, b, dout, da, db);
    return lm__ref_matmul_backward(a, b, dout, da, db);
}

lm_status lm_matmul_backward_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b,
                                 const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db) {
    const char *op = "matmul_backward";
    LM_TRY(check_args(ctx, op, a, b, dout, da, db));
    return run(ctx, op, a, b, dout, da, db, 0);
}

lm_status lm_matmul_backward_acc_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b,
                                     const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db) {
    const char *op = "matmul_backward_acc";
    LM_TRY(check_args(ctx, op, a, b, dout, da, db));
    return run(ctx, op, a, b, dout, da, db, 1);
}
