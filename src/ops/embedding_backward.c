/* ops/embedding_backward.c — public embedding backward: validation and dispatch
 * (reference level on the CPU, ops/cuda/embedding_backward.cu on CUDA;
 * O(numel(dout) + V * D)). ids i32/i64 of any rank below
 * LM_MAX_DIMS, dout float [..., D] = ids' shape + [D], dtable [V, D] in dout's dtype
 * or f32, written completely (or, accumulating, added into where ids occur). An
 * out-of-range id is LM_OUT_OF_RANGE (nothing written).
 */
#include "ops/backward_common.h"
#include "ops/ref/embedding_backward.h"

static lm_status embedding_backward(lm_ctx *ctx, const char *op, const lm_tensor_view *ids,
                                    const lm_tensor_view *dout, const lm_tensor_view *dtable, int accumulate) {
    const lm_tensor_view *vs[] = {ids, dout, dtable};
    static const char *const names[] = {"ids", "dout", "dtable"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_index(op, "ids", ids));
    LM_TRY(lm__op_check_float(op, "dout", dout));
    if (ids->ndim >= LM_MAX_DIMS)
        return lm__error(LM_SHAPE_MISMATCH, "%s: ids has %d dims; at most %d are supported", op, ids->ndim, LM_MAX_DIMS - 1);
    int64_t any2[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "dtable [V, D]", dtable, 2, any2));
    int64_t shape[LM_MAX_DIMS];
    for (int i = 0; i < ids->ndim; i++) shape[i] = ids->shape[i];
    shape[ids->ndim] = dtable->shape[1];
    LM_TRY(lm__op_check_shape(op, "dout", dout, ids->ndim + 1, shape));
    if (dtable->dtype != dout->dtype && dtable->dtype != LM_F32)
        return lm__error(LM_DTYPE_MISMATCH, "%s: dtable has dtype %s; expected %s (dout's) or f32", op,
                         lm_dtype_name(dtable->dtype), lm_dtype_name(dout->dtype));
    LM_TRY(lm__op_check_out(op, "dtable", dtable));
    const lm_tensor_view *ins[] = {ids, dout};
    LM_TRY(lm__op_check_grad_alias(op, "dtable", dtable, 2, ins, names));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->embedding_backward(ids, dout, dtable, accumulate, lm_ctx_stream(ctx));
    return lm__ref_embedding_backward(ids, dout, dtable, accumulate);
}

lm_status lm_embedding_backward_out(lm_ctx *ctx, const lm_tensor_view *ids, const lm_tensor_view *dout,
                                    const lm_tensor_view *dtable) {
    return embedding_backward(ctx, "embedding_backward", ids, dout, dtable, 0);
}

lm_status lm_embedding_backward_acc_out(lm_ctx *ctx, const lm_tensor_view *ids, const lm_tensor_view *dout,
                                        const lm_tensor_view *dtable) {
    return embedding_backward(ctx, "embedding_backward_acc", ids, dout, dtable, 1);
}
