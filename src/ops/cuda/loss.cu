/* ops/cuda/loss.cu — mean cross-entropy on CUDA.
 *
 * Targets are checked first (a kernel records the smallest bad row, read back after
 * a stream synchronization) so a bad target fails with the reference's message and
 * out untouched. Then one block per row computes logsumexp(row) - row[target] in
 * double (row max subtracted first; an infinite max is returned as is, like the
 * reference) into a per-row workspace, and a single block sums the rows in order and
 * divides by the number counted (0/0 = NaN when every row is ignored). O(N * V).
 */
#include "ops/cuda/common.cuh"

__device__ __forceinline__ int64_t target_at(const void *t, int is64, int64_t off) {
    return is64 ? ((const int64_t *)t)[off] : (int64_t)((const int32_t *)t)[off];
}

static __global__ void check_targets_kernel(const void *t, int is64, int64_t ts, int64_t N, int64_t V, int64_t ignore,
                                     unsigned long long *first) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < N; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = target_at(t, is64, r * ts);
        if (v != ignore && (v < 0 || v >= V)) atomicMin(first, (unsigned long long)r);
    }
}

/* loss[r] = logsumexp(row r) - row[target], or NaN-free 0 with counted[r] = 0 when ignored. */
template <typename T>
__global__ void row_loss_kernel(const T *x, int64_t s0, int64_t s1, int64_t V, const void *t, int is64, int64_t ts,
                                int64_t ignore, double *loss, int *counted) {
    __shared__ double red[32];
    __shared__ float redf[32];
    int64_t r = blockIdx.x;
    int64_t target = target_at(t, is64, r * ts);
    if (target == ignore) { /* uniform over the block */
        if (threadIdx.x == 0) loss[r] = 0.0, counted[r] = 0;
        return;
    }
    const T *row = x + r * s0;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ld(row + j * s1));
    mx = block_max(mx, redf);
    double lse;
    if (isinf(mx)) lse = mx;
    else {
        double sum = 0.0;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += exp((double)ld(row + j * s1) - (double)mx);
        lse = (double)mx + log(block_sum_d(sum, red));
    }
    if (threadIdx.x == 0) loss[r] = lse - (double)ld(row + target * s1), counted[r] = 1;
}

static __global__ void mean_kernel(const double *loss, const int *counted, int64_t N, float *out) {
    if (threadIdx.x != 0) return;
    double total = 0.0;
    int64_t n = 0;
    for (int64_t r = 0; r < N; r++) {
        total += loss[r];
        n += counted[r];
    }
    *out = n ? (float)(total / (double)n) : NAN;
}

lm_status lm__cuda_cross_entropy(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore_index,
                                const lm_tensor_view *out, cudaStream_t s) {
    int64_t N = logits->shape[0], V = logits->shape[1], ts = targets->stride[0];
    int is64 = targets->dtype == LM_I64;
    void *work = NULL;
    size_t bytes = sizeof(unsigned long long) + (size_t)N * (sizeof(double) + sizeof(int));
    LM_TRY(lm__cuda_check(cudaMallocAsync(&work, bytes, s), "cudaMallocAsync (cross_entropy)"));
    unsigned long long *first = (unsigned long long *)work, bad = ~0ull;
    double *loss = (double *)(first + 1);
    int *counted = (int *)(loss + N);
    lm_status st = lm__cuda_check(cudaMemcpyAsync(first, &bad, sizeof bad, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    if (st == LM_OK && N > 0) {
        check_targets_kernel<<<lm__cuda_blocks(N, 256), 256, 0, s>>>(targets->data, is64, ts, N, V, ignore_index, first);
        st = lm__cuda_launched("cross_entropy target check");
    }
    if (st == LM_OK) st = lm__cuda_check(cudaMemcpyAsync(&bad, first, sizeof bad, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    if (st == LM_OK) st = lm__cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize (cross_entropy)");
    if (st == LM_OK && bad != ~0ull) {
        int64_t r = (int64_t)bad, v = 0;
        int32_t v32 = 0;
        const char *p = (const char *)targets->data + r * ts * (int64_t)lm_dtype_size(targets->dtype);
        st = lm__cuda_check(cudaMemcpy(is64 ? (void *)&v : (void *)&v32, p, lm_dtype_size(targets->dtype),
                                       cudaMemcpyDeviceToHost), "cudaMemcpy");
        if (!is64) v = v32;
        if (st == LM_OK)
            st = lm__error(LM_OUT_OF_RANGE,
                           "cross_entropy: targets[%lld] = %lld is outside [0, %lld) and is not ignore_index %lld",
                           (long long)r, (long long)v, (long long)V, (long long)ignore_index);
    }
    if (st == LM_OK && N > 0) {
        int64_t s0 = logits->stride[0], s1 = logits->stride[1];
        LM_TRY(lm__cuda_float_only(logits->dtype));
        LM__CUDA_FLOAT_SWITCH(logits->dtype, T,
                             row_loss_kernel<T><<<(unsigned)N, 256, 0, s>>>((const T *)logits->data, s0, s1, V,
                                                                           targets->data, is64, ts, ignore_index, loss,
                                                                           counted));
        st = lm__cuda_launched("cross_entropy row kernel");
    }
    if (st == LM_OK) {
        mean_kernel<<<1, 32, 0, s>>>(loss, counted, N, (float *)out->data);
        st = lm__cuda_launched("cross_entropy mean kernel");
    }
    cudaFreeAsync(work, s);
    return st;
}
