/* ops/cuda/matmul_backward.cu — gradients of out = a @ b on CUDA:
 *   da[batch_a, m, k] = sum over out batches reading batch_a, sum_n dout[m, n] b[k, n]
 *   db[batch_b, k, n] = sum over out batches reading batch_b, sum_m a[m, k] dout[m, n]
 * Vendor path (per gradient): when the gradient's operand is not broadcast (no sum over
 * batches) and a, b, dout and the gradient share one dtype, the gradient is one GEMM
 * over transposed views, through lm__cuda_matmul_lt (cuBLASLt, f32 compute) or, when
 * it declines the layout, the readable lm__cuda_matmul. A 2-d b under a batched a
 * (the Linear case) folds the batch into rows: db = a2^T @ dout2 with a2 [R, K],
 * dout2 [R, N], or db^T = dout2^T @ a2 when db is the transposed view of a row-major
 * weight gradient; an f32 gradient of 16-bit operands is the same GEMM with an f32
 * output (one rounding per element). Everything else (broadcast sums, mixed operand
 * dtypes) takes the readable kernel: one thread per gradient element, looping over the
 * out batches that read its batch and over the contracted dim, f32 accumulation, one
 * rounding on store. O(batch * M * N * K) either way; no atomics. With accumulate the
 * gradient is added into (cuBLASLt beta = 1; the readable kernel starts its sum from
 * the stored value).
 */
#include "ops/cuda/backward.cuh"

/* Row-major multi-index of i over the first nd dims of v's shape. */
__device__ __forceinline__ void unravel(const lm__cuda_nd &v, int nd, int64_t i, int64_t *idx) {
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = i % v.shape[d];
        i /= v.shape[d];
    }
}

/* One gradient element of g = da (which = 0) or db (which = 1). x is the gradient's
 * operand (a or b), y the other one. For da: sum_n dout[z, m, n] y[z, k, n]; for db:
 * sum_m y[z, m, k] dout[z, m, n], over out batches z that read x's batch. */
static __global__ void matmul_grad_kernel(int which, lm__cuda_nd nx, const void *y, int ydt, lm__cuda_nd ny, const void *dout,
                                   int ddt, lm__cuda_nd nd_, void *g, int gdt, lm__cuda_nd ng, int64_t count,
                                   int accumulate) {
    int nx_b = nx.ndim - 2, ny_b = ny.ndim - 2, no_b = nd_.ndim - 2;
    int64_t M = nd_.shape[no_b], N = nd_.shape[no_b + 1], batches = 1;
    for (int d = 0; d < no_b; d++) batches *= nd_.shape[d];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t ix[LM_MAX_DIMS], iz[LM_MAX_DIMS];
        unravel(nx, nx.ndim, i, ix);
        int64_t r0 = ix[nx_b], r1 = ix[nx_b + 1]; /* (m, k) for da, (k, n) for db */
        int64_t og = 0;
        for (int d = 0; d < ng.ndim; d++) og += ix[d] * ng.stride[d];
        float acc = accumulate ? ld_dt(g, gdt, og) : 0.f;
        for (int64_t z = 0; z < batches; z++) {
            unravel(nd_, no_b, z, iz);
            int reads = 1;
            for (int d = 0; d < nx_b; d++) {
                int64_t o = iz[d + no_b - nx_b];
                if (nx.shape[d] != 1 && o != ix[d]) reads = 0;
            }
            if (!reads) continue;
            int64_t oy = 0, od = 0;
            for (int d = 0; d < ny_b; d++) oy += (ny.shape[d] == 1 ? 0 : iz[d + no_b - ny_b]) * ny.stride[d];
            for (int d = 0; d < no_b; d++) od += iz[d] * nd_.stride[d];
            int64_t ys0 = ny.stride[ny_b], ys1 = ny.stride[ny_b + 1], ds0 = nd_.stride[no_b], ds1 = nd_.stride[no_b + 1];
            if (which == 0)
                for (int64_t n = 0; n < N; n++)
                    acc += ld_dt(dout, ddt, od + r0 * ds0 + n * ds1) * ld_dt(y, ydt, oy + r1 * ys0 + n * ys1);
            else
                for (int64_t m = 0; m < M; m++)
                    acc += ld_dt(y, ydt, oy + m * ys0 + r0 * ys1) * ld_dt(dout, ddt, od + m * ds0 + r1 * ds1);
        }
        st_dt(g, gdt, og, acc);
    }
}

static lm_status readable(int which, const lm_tensor_view *x, const lm_tensor_view *y, const lm_tensor_view *dout,
                          const lm_tensor_view *g, int accumulate, cudaStream_t s) {
    int64_t count = lm_tensor_view_numel(g);
    if (count == 0) return LM_OK;
    matmul_grad_kernel<<<lm__cuda_blocks(count, 128), 128, 0, s>>>(which, lm__cuda_nd_of(x), y->data, y->dtype,
                                                                  lm__cuda_nd_of(y), dout->data, dout->dtype,
                                                                  lm__cuda_nd_of(dout), g->data, g->dtype,
                                                                  lm__cuda_nd_of(g), count, accumulate);
    return lm__cuda_launched("matmul_backward kernel");
}

/* out (+)= l @ r through cuBLASLt; when it declines the layout, the readable matmul
 * (same contract) for a write in the operands' dtype, else LM_UNSUPPORTED (error
 * cleared). */
static lm_status gemm(const lm__cuda_blas *blas, const lm_tensor_view *l, const lm_tensor_view *r,
                      const lm_tensor_view *out, int accumulate, cudaStream_t s) {
    lm_status st = lm__cuda_matmul_lt_ex(blas, l, r, out, accumulate, s);
    if (st != LM_UNSUPPORTED) return st;
    lm_clear_error();
    return accumulate || out->dtype != l->dtype ? LM_UNSUPPORTED : lm__cuda_matmul(l, r, out, s);
}

/* Whether v's batch dims equal dout's (same rank, no broadcast). */
static int unbroadcast(const lm_tensor_view *v, const lm_tensor_view *dout) {
    if (v->ndim != dout->ndim) return 0;
    for (int d = 0; d < v->ndim - 2; d++)
        if (v->shape[d] != dout->shape[d]) return 0;
    return 1;
}

/* v transposed in its last two dims and expanded to dout's batch dims. */
static lm_status transposed(const lm_tensor_view *v, const lm_tensor_view *dout, lm_tensor_view *out) {
    lm_tensor_view t;
    int nd = dout->ndim;
    int64_t shape[LM_MAX_DIMS];
    LM_TRY(lm_tensor_view_transpose(v, v->ndim - 2, v->ndim - 1, &t));
    for (int d = 0; d < nd - 2; d++) shape[d] = dout->shape[d];
    shape[nd - 2] = t.shape[t.ndim - 2];
    shape[nd - 1] = t.shape[t.ndim - 1];
    return lm_tensor_view_expand(&t, nd, shape, out);
}

/* 1 when v views as [rows, cols] (its leading dims folded); clears the reshape error otherwise. */
static int as_rows(const lm_tensor_view *v, int64_t cols, lm_tensor_view *out) {
    int64_t shape[2] = {cols ? lm_tensor_view_numel(v) / cols : 0, cols};
    if (lm_tensor_view_reshape(v, 2, shape, out) == LM_OK) return 1;
    lm_clear_error();
    return 0;
}

static lm_status grad_a_gemm(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                             const lm_tensor_view *dout, const lm_tensor_view *da, int acc, cudaStream_t s) {
    lm_tensor_view bt, d2, g2, b2;
    int64_t K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    if (b->ndim == 2 && as_rows(dout, N, &d2) && as_rows(da, K, &g2)) {
        LM_TRY(lm_tensor_view_transpose(b, 0, 1, &b2));
        return gemm(blas, &d2, &b2, &g2, acc, s);
    }
    LM_TRY(transposed(b, dout, &bt));
    return gemm(blas, dout, &bt, da, acc, s);
}

/* A gradient goes to cuBLASLt when a, b and dout share one dtype and the gradient has
 * it or is f32 (the GEMM's output type). */
static int gemm_dtypes(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *g) {
    return b->dtype == a->dtype && (g->dtype == a->dtype || g->dtype == LM_F32);
}

static lm_status grad_a(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                        const lm_tensor_view *dout, const lm_tensor_view *da, int acc, cudaStream_t s) {
    if (!gemm_dtypes(a, b, da) || !unbroadcast(a, dout) || lm_tensor_view_numel(dout) == 0)
        return readable(0, a, b, dout, da, acc, s);
    lm_status st = grad_a_gemm(blas, a, b, dout, da, acc, s);
    return st == LM_UNSUPPORTED ? readable(0, a, b, dout, da, acc, s) : st;
}

/* LM_UNSUPPORTED when no GEMM form fits (the caller takes the readable kernel). */
static lm_status grad_b_gemm(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                             const lm_tensor_view *dout, const lm_tensor_view *db, int acc, cudaStream_t s) {
    lm_tensor_view a2, d2, at, dt, dbt, e;
    int64_t K = b->shape[b->ndim - 2], N = b->shape[b->ndim - 1];
    if (b->ndim == 2 && unbroadcast(a, dout) && as_rows(a, K, &a2) && as_rows(dout, N, &d2)) {
        LM_TRY(lm_tensor_view_transpose(db, 0, 1, &dbt));
        if (db->stride[1] != 1 && dbt.stride[1] == 1) { /* db^T [N, K] = dout2^T @ a2 */
            LM_TRY(lm_tensor_view_transpose(&d2, 0, 1, &dt));
            return gemm(blas, &dt, &a2, &dbt, acc, s);
        }
        LM_TRY(lm_tensor_view_transpose(&a2, 0, 1, &at));
        return gemm(blas, &at, &d2, db, acc, s);
    }
    if (!unbroadcast(b, dout)) return LM_UNSUPPORTED;
    LM_TRY(transposed(a, dout, &e));
    return gemm(blas, &e, dout, db, acc, s);
}

static lm_status grad_b(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                        const lm_tensor_view *dout, const lm_tensor_view *db, int acc, cudaStream_t s) {
    if (!gemm_dtypes(a, b, db) || lm_tensor_view_numel(dout) == 0) return readable(1, b, a, dout, db, acc, s);
    lm_status st = grad_b_gemm(blas, a, b, dout, db, acc, s);
    return st == LM_UNSUPPORTED ? readable(1, b, a, dout, db, acc, s) : st;
}

lm_status lm__cuda_matmul_backward(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                                  const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db,
                                  int accumulate, cudaStream_t s) {
    if (da) LM_TRY(grad_a(blas, a, b, dout, da, accumulate != 0, s));
    if (db) LM_TRY(grad_b(blas, a, b, dout, db, accumulate != 0, s));
    return LM_OK;
}
