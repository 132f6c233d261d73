/* ops/cuda/loss_backward.cu — cross-entropy backward on CUDA:
 *   dlogits[r, j] = c (softmax(row r)_j - [j == target_r]),  c = dloss / counted
 * and 0 on ignored rows (everywhere when no row is counted). Targets are checked
 * first (smallest bad row via an integer atomicMin, read back after a stream
 * synchronization) so a bad target fails with the reference's message and nothing is
 * written. counted is reduced on the device by one block (integers: exact) and dloss
 * is read there, so nothing but the check waits for the host. Then one block per row:
 * max, sum of exp in double (fixed tree), one write per element. O(N V).
 */
#include "ops/cuda/backward.cuh"

static __global__ void check_targets_bw_kernel(const void *t, int is64, int64_t ts, int64_t N, int64_t V, int64_t ignore,
                                        unsigned long long *first) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < N; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = ld_index_at(t, is64, r * ts);
        if (v != ignore && (v < 0 || v >= V)) atomicMin(first, (unsigned long long)r);
    }
}

/* *scale = dloss / counted (0 when no row is counted), one block. */
static __global__ void scale_kernel(const void *t, int is64, int64_t ts, int64_t N, int64_t ignore, const float *dloss,
                             double *scale) {
    __shared__ double red[32];
    double c = 0.0;
    for (int64_t r = threadIdx.x; r < N; r += blockDim.x) c += ld_index_at(t, is64, r * ts) != ignore ? 1.0 : 0.0;
    c = block_sum_d(c, red);
    if (threadIdx.x == 0) *scale = c > 0 ? (double)*dloss / c : 0.0;
}

template <typename T>
__global__ void ce_rows_kernel(const T *x, int64_t s0, int64_t s1, int64_t N, int64_t V, const void *t, int is64,
                               int64_t ts, int64_t ignore, const double *scale, void *dx, int dx_dt, int64_t o0,
                               int64_t o1) {
    __shared__ double red[32];
    __shared__ float redf[32];
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        int64_t target = ld_index_at(t, is64, r * ts);
        if (target == ignore) { /* uniform over the block */
            for (int64_t j = threadIdx.x; j < V; j += blockDim.x) st_dt(dx, dx_dt, r * o0 + j * o1, 0.f);
            continue;
        }
        const T *row = x + r * s0;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ld(row + j * s1));
        mx = block_max(mx, redf);
        double sum = 0.0;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += exp((double)ld(row + j * s1) - (double)mx);
        sum = block_sum_d(sum, red);
        double c = *scale;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            double p = exp((double)ld(row + j * s1) - (double)mx) / sum;
            st_dt(dx, dx_dt, r * o0 + j * o1, (float)(c * (p - (j == target ? 1.0 : 0.0))));
        }
        __syncthreads(); /* red and redf are reused by the next row */
    }
}

lm_status lm__cuda_cross_entropy_backward(const lm_tensor_view *logits, const lm_tensor_view *targets,
                                         int64_t ignore_index, const lm_tensor_view *dloss,
                                         const lm_tensor_view *dlogits, cudaStream_t s) {
    int64_t N = logits->shape[0], V = logits->shape[1], ts = targets->stride[0];
    int is64 = targets->dtype == LM_I64;
    void *work = NULL; /* first bad row, then the scale */
    LM_TRY(lm__cuda_check(cudaMallocAsync(&work, 2 * sizeof(double), s), "cudaMallocAsync (cross_entropy_backward)"));
    unsigned long long *first = (unsigned long long *)work, bad = ~0ull;
    double *scale = (double *)work + 1;
    lm_status st = lm__cuda_check(cudaMemcpyAsync(first, &bad, sizeof bad, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    if (st == LM_OK && N > 0) {
        check_targets_bw_kernel<<<lm__cuda_blocks(N, 256), 256, 0, s>>>(targets->data, is64, ts, N, V, ignore_index,
                                                                        first);
        st = lm__cuda_launched("cross_entropy_backward target check");
    }
    if (st == LM_OK) st = lm__cuda_check(cudaMemcpyAsync(&bad, first, sizeof bad, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    if (st == LM_OK) st = lm__cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (cross_entropy_backward)");
    if (st == LM_OK && bad != ~0ull) {
        int64_t r = (int64_t)bad, v = 0;
        int32_t v32 = 0;
        const char *p = (const char *)targets->data + r * ts * (int64_t)lm_dtype_size(targets->dtype);
        st = lm__cuda_check(cudaMemcpy(is64 ? (void *)&v : (void *)&v32, p, lm_dtype_size(targets->dtype),
                                       cudaMemcpyDeviceToHost), "cudaMemcpy");
        if (!is64) v = v32;
        if (st == LM_OK)
            st = lm__error(LM_OUT_OF_RANGE,
                           "cross_entropy_backward: targets[%lld] = %lld is outside [0, %lld) and is not ignore_index %lld",
                           (long long)r, (long long)v, (long long)V, (long long)ignore_index);
    }
    if (st == LM_OK && dlogits && N > 0 && V > 0) {
        scale_kernel<<<1, 256, 0, s>>>(targets->data, is64, ts, N, ignore_index, (const float *)dloss->data, scale);
        st = lm__cuda_launched("cross_entropy_backward scale kernel");
    }
    if (st == LM_OK && dlogits && N > 0 && V > 0) {
        unsigned g = (unsigned)LM_MIN(N, 65535 * 8);
        LM_TRY(lm__cuda_float_only(logits->dtype));
        LM__CUDA_FLOAT_SWITCH(logits->dtype, T,
                             ce_rows_kernel<T><<<g, 256, 0, s>>>((const T *)logits->data, logits->stride[0],
                                                                 logits->stride[1], N, V, targets->data, is64, ts,
                                                                 ignore_index, scale, dlogits->data, dlogits->dtype,
                                                                 dlogits->stride[0], dlogits->stride[1]));
        st = lm__cuda_launched("cross_entropy_backward row kernel");
    }
    cudaFreeAsync(work, s);
    return st;
}
