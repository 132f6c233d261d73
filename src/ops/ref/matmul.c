/* ops/ref/matmul.c — readable reference for batched matmul: for every batch index and
 * every output element, a dot product over K accumulated in double and rounded once
 * to out's dtype. Any strides (stride-0 broadcast batch dims, transposed operands);
 * operands may have different float dtypes because every load widens to double.
 * O(batch * M * N * K). K = 0 writes zeros (the empty sum).
 */
#include "ops/ref/matmul.h"

/* One [M, K] @ [K, N] product; a0, b0, o0 are the element offsets of this batch. */
static void matmul_2d(const lm_tensor_view *a, int64_t a0, const lm_tensor_view *b, int64_t b0,
                      const lm_tensor_view *out, int64_t o0) {
    int nb = out->ndim - 2;
    int64_t M = out->shape[nb], N = out->shape[nb + 1], K = a->shape[nb + 1];
    int64_t as_m = a->stride[nb], as_k = a->stride[nb + 1];
    int64_t bs_k = b->stride[nb], bs_n = b->stride[nb + 1];
    int64_t os_m = out->stride[nb], os_n = out->stride[nb + 1];
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += lm__ld(a->dtype, a->data, a0 + m * as_m + k * as_k) *
                       lm__ld(b->dtype, b->data, b0 + k * bs_k + n * bs_n);
            lm__st(out->dtype, out->data, o0 + m * os_m + n * os_n, acc);
        }
    }
}

void lm__ref_matmul(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return;
    int nb = out->ndim - 2; /* batch dims, shared by all three expanded views */
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        int64_t a0 = 0, b0 = 0, o0 = 0;
        for (int d = 0; d < nb; d++) {
            a0 += idx[d] * a->stride[d];
            b0 += idx[d] * b->stride[d];
            o0 += idx[d] * out->stride[d];
        }
        matmul_2d(a, a0, b, b0, out, o0);
    } while (lm__nd_next(nb, out->shape, idx));
}
