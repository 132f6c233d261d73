/* ops/embedding.c — public embedding lookup: validation and dispatch. table [V, D]
 * float, ids i32/i64 of any rank below LM_MAX_DIMS, out [..., D] = ids' shape + [D]
 * in any float dtype (rows converted to it; the allocating form uses table's). out may share memory with neither table nor ids (detectable
 * overlaps are rejected, ops/alias.h). On the CPU the tuned level (ops/cpu/pointwise.c)
 * copies whole rows when table and out share a dtype and rows have unit stride; other views run the
 * reference, which also reports an out-of-range id (the tuned path then writes nothing). */
#include "ops/alias.h"
#include "ops/cpu/pointwise.h"
#include "ops/ref/embedding.h"

/* out's shape: ids' shape followed by D. */
static lm_status out_shape(const char *op, const lm_tensor_view *table, const lm_tensor_view *ids, int *ndim,
                           int64_t *shape) {
    if (ids->ndim >= LM_MAX_DIMS)
        return lm__error(LM_SHAPE_MISMATCH, "%s: ids has %d dims; at most %d are supported", op, ids->ndim,
                         LM_MAX_DIMS - 1);
    int64_t any2[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "table", table, 2, any2));
    for (int i = 0; i < ids->ndim; i++) shape[i] = ids->shape[i];
    shape[ids->ndim] = table->shape[1];
    *ndim = ids->ndim + 1;
    return LM_OK;
}

lm_status lm_embedding_out(lm_ctx *ctx, const lm_tensor_view *table, const lm_tensor_view *ids,
                           const lm_tensor_view *out) {
    const char *op = "embedding";
    const lm_tensor_view *vs[] = {table, ids, out};
    static const char *const names[] = {"table", "ids", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, "table", table));
    LM_TRY(lm__op_check_index(op, "ids", ids));
    LM_TRY(lm__op_check_float(op, "out", out)); /* e.g. 16-bit rows widened into f32 */
    int nd = 0;
    int64_t shape[LM_MAX_DIMS];
    LM_TRY(out_shape(op, table, ids, &nd, shape));
    LM_TRY(lm__op_check_shape(op, "out", out, nd, shape));
    LM_TRY(lm__op_check_out(op, "out", out));
    LM_TRY(lm__op_check_alias(op, "out", out, "table", table, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "ids", ids, 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->embedding(table, ids, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        if (lm__cpu_embedding_supported(table, ids, out)) {
            if (lm__cpu_embedding(lm_ctx_threadpool(ctx), table, ids, out)) return LM_OK;
            return lm__ref_embedding(table, ids, out); /* names the bad id; writes nothing */
        }
        LM_TRY(lm__cpu_reject(ctx, op, "table and out rows with unit stride"));
    }
    return lm__ref_embedding(table, ids, out);
}

lm_status lm_embedding(lm_ctx *ctx, const lm_tensor_view *table, const lm_tensor_view *ids, lm_tensor **out) {
    if (!table || !ids) return lm__error(LM_INVALID_ARGUMENT, "embedding: %s is NULL", table ? "ids" : "table");
    int nd = 0;
    int64_t shape[LM_MAX_DIMS];
    LM_TRY(out_shape("embedding", table, ids, &nd, shape));
    LM_TRY(lm__op_alloc(ctx, table->dtype, nd, shape, out));
    return lm__op_finish(lm_embedding_out(ctx, table, ids, lm_tensor_as_view(*out)), out);
}
