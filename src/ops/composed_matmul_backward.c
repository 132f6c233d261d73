/* ops/composed_matmul_backward.c — the composed level of the matmul backward for the
 * Linear case: a [..., M, K] (rows R = numel(a) / K) times one shared b [K, N].
 *   da [R, K] = dout [R, N] @ b^T      = linear(dout, W = b as row-major [K, N])
 *   db [K, N] = a^T @ dout             = linear(a^T [K, R], W = dout^T [N, R])
 *   db^T [N, K] = dout^T @ a           = linear(dout^T [N, R], W = a^T [K, R])
 * db is computed in whichever orientation is contiguous in memory (db^T when b is the
 * transposed view of a row-major weight, the model's case), else into a scratch that
 * is then copied. Transposed operands are materialized: O(R * (K + N) + K * N) copies.
 */
#include "ops/composed.h"

#define V(t) lm_tensor_as_view(t)

int lm__composed_matmul_backward_accepts(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *dout,
                                         const lm_tensor_view *da, const lm_tensor_view *db) {
    if (a->device.type != LM_DEVICE_CPU || b->ndim != 2 || a->ndim != dout->ndim) return 0;
    if (lm_tensor_view_numel(a) == 0 || lm_tensor_view_numel(b) == 0) return 0; /* degenerate: reference */
    for (int i = 0; i < a->ndim - 2; i++)
        if (a->shape[i] != dout->shape[i]) return 0; /* a itself broadcast: reference */
    const lm_tensor_view *vs[] = {a, b, dout, da, db};
    for (int i = 0; i < 5; i++)
        if (vs[i] && vs[i]->dtype != LM_F32) return 0;
    return 1;
}

/* da = dout @ b^T, through a scratch when da is not contiguous. */
static lm_status grad_a(lm_ctx *ctx, const lm_tensor_view *d2, const lm_tensor_view *b, const lm_tensor_view *da,
                        int64_t K) {
    lm_tensor *bc = NULL, *scratch = NULL;
    lm_tensor_view w = *b, out;
    int64_t shape[2] = {d2->shape[0], K};
    lm_status st = LM_OK;
    if (!lm_tensor_view_is_contiguous(b)) st = lm__composed_copy(ctx, b, &bc);
    if (st == LM_OK && bc) w = *V(bc);
    if (st == LM_OK && lm_tensor_view_is_contiguous(da)) st = lm_tensor_view_reshape(da, 2, shape, &out);
    else if (st == LM_OK && (st = lm_tensor_create(lm_ctx_device(ctx), LM_F32, 2, shape, &scratch)) == LM_OK)
        out = *V(scratch);
    if (st == LM_OK) st = lm__composed_linear(ctx, d2, &w, &out);
    if (st == LM_OK && scratch) {
        lm_tensor_view back;
        st = lm_tensor_view_reshape(V(scratch), da->ndim, da->shape, &back);
        if (st == LM_OK) st = lm_tensor_view_copy(ctx, da, &back);
    }
    lm_tensor_destroy(bc);
    lm_tensor_destroy(scratch);
    return st;
}

/* db from the materialized transposes aT [K, R] and dT [N, R]. */
static lm_status grad_b(lm_ctx *ctx, const lm_tensor *aT, const lm_tensor *dT, const lm_tensor_view *db) {
    lm_tensor_view dbT;
    LM_TRY(lm_tensor_view_transpose(db, 0, 1, &dbT));
    if (lm_tensor_view_is_contiguous(&dbT)) return lm__composed_linear(ctx, V(dT), V(aT), &dbT);
    if (lm_tensor_view_is_contiguous(db)) return lm__composed_linear(ctx, V(aT), V(dT), db);
    lm_tensor *scratch = NULL;
    LM_TRY(lm_tensor_create(lm_ctx_device(ctx), LM_F32, 2, db->shape, &scratch));
    lm_status st = lm__composed_linear(ctx, V(aT), V(dT), V(scratch));
    if (st == LM_OK) st = lm_tensor_view_copy(ctx, db, V(scratch));
    lm_tensor_destroy(scratch);
    return st;
}

lm_status lm__composed_matmul_backward(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b,
                                       const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db) {
    int64_t K = b->shape[0], N = b->shape[1];
    lm_tensor *a_own = NULL, *d_own = NULL, *aT = NULL, *dT = NULL;
    lm_tensor_view a2, d2, t;
    lm_status st = lm__composed_rows(ctx, dout, N, &d2, &d_own);
    if (st == LM_OK && da) st = grad_a(ctx, &d2, b, da, K);
    if (st == LM_OK && db) st = lm__composed_rows(ctx, a, K, &a2, &a_own);
    if (st == LM_OK && db && (st = lm_tensor_view_transpose(&a2, 0, 1, &t)) == LM_OK) st = lm__composed_copy(ctx, &t, &aT);
    if (st == LM_OK && db && (st = lm_tensor_view_transpose(&d2, 0, 1, &t)) == LM_OK) st = lm__composed_copy(ctx, &t, &dT);
    if (st == LM_OK && db) st = grad_b(ctx, aT, dT, db);
    lm_tensor_destroy(a_own);
    lm_tensor_destroy(d_own);
    lm_tensor_destroy(aT);
    lm_tensor_destroy(dT);
    return st;
}
