/* ops/ref/matmul_backward.c — readable reference for the gradients of out = a @ b:
 *   da[batch_a, m, k] = sum over out batches that read batch_a, sum_n dout[m, n] b[k, n]
 *   db[batch_b, k, n] = sum over out batches that read batch_b, sum_m a[m, k] dout[m, n]
 * Contributions are summed in double workspaces laid out row-major in the operand's
 * own shape (so broadcast batch dims fold into one slot), then each element is
 * rounded once into the gradient view. Any strides. O(batch * M * N * K) time,
 * numel(a) + numel(b) doubles of workspace.
 */
#include "ops/ref/matmul_backward.h"

/* Row-major slot of out batch index idx (nb dims) inside v's batch dims, which are
 * right-aligned to out's and map to 0 where v has size 1 (broadcast). */
static int64_t batch_slot(const lm_tensor_view *v, int nb, const int64_t *idx) {
    int nv = v->ndim - 2;
    int64_t slot = 0;
    for (int i = 0; i < nv; i++) slot = slot * v->shape[i] + (v->shape[i] == 1 ? 0 : idx[i + nb - nv]);
    return slot;
}

/* Element offset of the same batch inside the strided view v. */
static int64_t batch_offset(const lm_tensor_view *v, int nb, const int64_t *idx) {
    int nv = v->ndim - 2;
    int64_t off = 0;
    for (int i = 0; i < nv; i++) off += (v->shape[i] == 1 ? 0 : idx[i + nb - nv]) * v->stride[i];
    return off;
}

/* Element (r, c) of the trailing 2-d matrix of v at batch offset base. */
static double at(const lm_tensor_view *v, int64_t base, int64_t r, int64_t c) {
    return lm__ld(v->dtype, v->data, base + r * v->stride[v->ndim - 2] + c * v->stride[v->ndim - 1]);
}

/* One out batch: adds its contributions to the workspaces (either may be NULL). */
static void batch_grads(const lm_tensor_view *a, int64_t a0, const lm_tensor_view *b, int64_t b0,
                        const lm_tensor_view *dout, int64_t d0, double *wa /* [M, K] */, double *wb /* [K, N] */) {
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    for (int64_t m = 0; wa && m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++) acc += at(dout, d0, m, n) * at(b, b0, k, n);
            wa[m * K + k] += acc;
        }
    for (int64_t k = 0; wb && k < K; k++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (int64_t m = 0; m < M; m++) acc += at(a, a0, m, k) * at(dout, d0, m, n);
            wb[k * N + n] += acc;
        }
}

/* Rounds a row-major workspace of v's shape into v. */
static void store_all(const lm_tensor_view *v, const double *w) {
    if (lm_tensor_view_numel(v) == 0) return;
    int64_t idx[LM_MAX_DIMS] = {0}, i = 0;
    do lm__st(v->dtype, v->data, lm__offset(v, idx), w[i++]);
    while (lm__nd_next(v->ndim, v->shape, idx));
}

lm_status lm__ref_matmul_backward(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *dout,
                                  const lm_tensor_view *da, const lm_tensor_view *db) {
    int64_t na = da ? lm_tensor_view_numel(a) : 0, nbw = db ? lm_tensor_view_numel(b) : 0;
    double *ws = lm__calloc((size_t)(na + nbw + 1), sizeof(double));
    if (!ws) return lm__error_context(LM_OUT_OF_MEMORY, "matmul_backward workspace of %lld doubles", (long long)(na + nbw));
    double *wa = da ? ws : NULL, *wb = db ? ws + na : NULL;
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    int nb = dout->ndim - 2; /* out's batch dims */
    int64_t idx[LM_MAX_DIMS] = {0}, batches = 1;
    for (int i = 0; i < nb; i++) batches *= dout->shape[i];
    if (batches > 0) do {
            int64_t a0 = batch_offset(a, nb, idx), b0 = batch_offset(b, nb, idx), d0 = lm__offset(dout, idx);
            double *sa = wa ? wa + batch_slot(a, nb, idx) * M * K : NULL;
            double *sb = wb ? wb + batch_slot(b, nb, idx) * K * N : NULL;
            batch_grads(a, a0, b, b0, dout, d0, sa, sb);
        } while (lm__nd_next(nb, dout->shape, idx));
    if (da) store_all(da, wa);
    if (db) store_all(db, wb);
    lm__free(ws);
    return LM_OK;
}
