/* ops/sample.c — lm_sample_out: validation and dispatch of next-token selection.
 * logits f32 [R, V] with unit last stride, ids i32 [R], params one lm_sample_params
 * record (every row) or R of them (one per row) in a u8 tensor. Host-readable parameters are checked field by field; on a
 * device they cannot be read without waiting, so the caller (the model's step)
 * checks them before it writes them there (the CUDA sampler reads them as they are). */
#include "ops/ref/sample.h"
#include "runtime/internal.h"

_Static_assert(sizeof(lm_sample_params) == LM_SAMPLE_PARAMS_BYTES, "lm_sample_params is a fixed 40-byte record");

lm_status lm_sample_params_check(const lm_sample_params *p) {
    if (!p) return lm__error(LM_INVALID_ARGUMENT, "sample: NULL parameters");
    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) || !(p->min_p >= 0 && p->min_p < 1) || p->top_k < 0)
        return lm__error(LM_INVALID_ARGUMENT, "sample: temperature %g (>= 0), top_k %d (>= 0), top_p %g (0, 1], min_p %g "
                         "[0, 1)", p->temperature, p->top_k, p->top_p, p->min_p);
    if (p->flags & ~LM_SAMPLE_OWN_STREAM) return lm__error(LM_INVALID_ARGUMENT, "sample: unknown flags 0x%x", p->flags);
    return LM_OK;
}

size_t lm_sample_workspace_bytes(lm_device d, int64_t rows) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    if (rows < 1 || lm__device_host_addressable(d) || !cu) return 0; /* the reference needs none */
    return cu->sample_workspace(rows);
}

lm_status lm_sample_out(lm_ctx *ctx, const lm_tensor_view *logits, const lm_tensor_view *params,
                        const lm_tensor_view *workspace, const lm_tensor_view *ids) {
    const char *op = "sample";
    const lm_tensor_view *vs[] = {logits, params, ids};
    static const char *const names[] = {"logits", "params", "ids"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_dtype(op, "logits", logits, LM_F32));
    int64_t ls[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "logits [R, V]", logits, 2, ls));
    if (logits->shape[1] < 1 || (logits->shape[1] > 1 && logits->stride[1] != 1))
        return lm__error(LM_UNSUPPORTED, "%s: logits need V >= 1 and a unit last stride", op);
    int64_t is[1] = {logits->shape[0]}, ps[1] = {-1};
    LM_TRY(lm__op_check_dtype(op, "ids", ids, LM_I32));
    LM_TRY(lm__op_check_shape(op, "ids [R]", ids, 1, is));
    LM_TRY(lm__op_check_dtype(op, "params", params, LM_U8));
    LM_TRY(lm__op_check_shape(op, "params", params, 1, ps));
    int64_t records = params->shape[0] / LM_SAMPLE_PARAMS_BYTES;
    if (params->shape[0] % LM_SAMPLE_PARAMS_BYTES || (records != 1 && records != logits->shape[0]))
        return lm__error(LM_SHAPE_MISMATCH, "%s: params hold %lld bytes: one record (%d bytes) or one per row (%lld rows)",
                         op, (long long)params->shape[0], LM_SAMPLE_PARAMS_BYTES, (long long)logits->shape[0]);
    if (!lm_tensor_view_is_contiguous(params)) return lm__error(LM_UNSUPPORTED, "%s: params must be contiguous", op);
    LM_TRY(lm__op_check_out(op, "ids", ids));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) {
        size_t need = cu->sample_workspace(logits->shape[0]);
        if (need) {
            if (!workspace)
                return lm__error(LM_INVALID_ARGUMENT, "%s: needs a workspace of %zu bytes (lm_sample_workspace_bytes)",
                                 op, need);
            const lm_tensor_view *wv[] = {workspace};
            static const char *const wn[] = {"workspace"};
            LM_TRY(lm__op_check_devices(ctx, op, 1, wv, wn));
            if (!lm_tensor_view_is_contiguous(workspace) ||
                (size_t)lm_tensor_view_numel(workspace) * lm_dtype_size(workspace->dtype) < need)
                return lm__error(LM_INVALID_ARGUMENT, "%s: the workspace must be contiguous and hold %zu bytes", op,
                                 need);
        }
        return cu->sample(logits, params, workspace, ids, lm_ctx_stream(ctx));
    }
    lm_sample_params *p = lm__alloc(sizeof *p * (size_t)records, 64);
    if (!p) return lm__error_context(LM_OUT_OF_MEMORY, "%s: %lld parameter records", op, (long long)records);
    memcpy(p, params->data, sizeof *p * (size_t)records);
    lm_status st = LM_OK;
    for (int64_t r = 0; r < records && st == LM_OK; r++)
        if ((st = lm_sample_params_check(&p[r])) != LM_OK && records > 1)
            st = lm__error_context(st, "%s: the record of row %lld", op, (long long)r);
    if (st == LM_OK) st = lm__ref_sample(logits, p, records, ids);
    lm__free(p);
    return st;
}
