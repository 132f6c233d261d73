/* ops/composed_util.c — materialization and the Linear-pattern product shared by the
 * composed backward paths (see composed.h). Copies are O(numel). */
#include "ops/composed.h"

lm_status lm__composed_copy(lm_ctx *ctx, const lm_tensor_view *v, lm_tensor **out) {
    LM_TRY(lm_tensor_create(lm_ctx_device(ctx), v->dtype, v->ndim, v->shape, out));
    lm_status st = lm_tensor_view_copy(ctx, lm_tensor_as_view(*out), v);
    if (st != LM_OK) {
        lm_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

lm_status lm__composed_rows(lm_ctx *ctx, const lm_tensor_view *v, int64_t cols, lm_tensor_view *out,
                            lm_tensor **owned) {
    int64_t shape[2] = {cols ? lm_tensor_view_numel(v) / cols : 0, cols};
    *owned = NULL;
    if (lm_tensor_view_is_contiguous(v)) return lm_tensor_view_reshape(v, 2, shape, out);
    LM_TRY(lm__composed_copy(ctx, v, owned));
    return lm_tensor_view_reshape(lm_tensor_as_view(*owned), 2, shape, out);
}

lm_status lm__composed_linear(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *y) {
    lm_tensor_view wt;
    LM_TRY(lm_tensor_view_transpose(w, 0, 1, &wt));
    return lm_matmul_out(ctx, x, &wt, y);
}
