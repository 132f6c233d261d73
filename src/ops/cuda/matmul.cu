/* ops/cuda/matmul.cu — readable batched matmul on CUDA:
 *   out[z, m, n] = sum_k a[z, m, k] * b[z, k, n]
 * One 16x16 block computes a 16x16 tile of out; K is walked in steps of 16 with the
 * two input tiles staged (widened to float) in shared memory. Every operand keeps its
 * own strides, broadcast batch dims included (stride 0), and b may be bf16/f16 under
 * an f32 a (weights widened on the fly). f32 accumulation, one rounding on store.
 * O(batch * M * N * K) work; the tuned path is cuBLASLt (matmul_lt_cuda.c).
 */
#include "ops/cuda/common.cuh"

#define TILE 16

/* Offset of batch index z (row-major over the leading ndim - 2 dims). */
__device__ __forceinline__ int64_t batch_offset(lm__cuda_nd v, int64_t z) {
    v.ndim -= 2;
    return nd_offset(v, z);
}

template <typename TA, typename TB>
__global__ void matmul_kernel(const TA *a, lm__cuda_nd na, const TB *b, lm__cuda_nd nb, TA *out, lm__cuda_nd no,
                              int64_t batch) {
    __shared__ float as[TILE][TILE + 1], bs[TILE][TILE + 1];
    int nd = no.ndim, tx = threadIdx.x, ty = threadIdx.y;
    int64_t M = no.shape[nd - 2], N = no.shape[nd - 1], K = na.shape[nd - 1];
    int64_t sa0 = na.stride[nd - 2], sa1 = na.stride[nd - 1], sb0 = nb.stride[nd - 2], sb1 = nb.stride[nd - 1];
    int64_t row = blockIdx.y * (int64_t)TILE + ty, col = blockIdx.x * (int64_t)TILE + tx;
    for (int64_t z = blockIdx.z; z < batch; z += gridDim.z) {
        const TA *az = a + batch_offset(na, z);
        const TB *bz = b + batch_offset(nb, z);
        float acc = 0.f;
        for (int64_t k0 = 0; k0 < K; k0 += TILE) {
            as[ty][tx] = row < M && k0 + tx < K ? ld(az + row * sa0 + (k0 + tx) * sa1) : 0.f;
            bs[ty][tx] = k0 + ty < K && col < N ? ld(bz + (k0 + ty) * sb0 + col * sb1) : 0.f;
            __syncthreads();
            for (int kk = 0; kk < TILE; kk++) acc += as[ty][kk] * bs[kk][tx];
            __syncthreads();
        }
        if (row < M && col < N) st(out + batch_offset(no, z) + row * no.stride[nd - 2] + col * no.stride[nd - 1], acc);
    }
}

template <typename TA, typename TB>
static lm_status launch(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, cudaStream_t s) {
    int nd = out->ndim;
    int64_t M = out->shape[nd - 2], N = out->shape[nd - 1], batch = lm_tensor_view_numel(out) / (M * N);
    dim3 grid((unsigned)((N + TILE - 1) / TILE), (unsigned)((M + TILE - 1) / TILE), (unsigned)LM_MIN(batch, 65535));
    if (grid.y > 65535) return lm__error(LM_UNSUPPORTED, "matmul (cuda): M = %lld rows exceed the grid", (long long)M);
    matmul_kernel<TA, TB><<<grid, dim3(TILE, TILE), 0, s>>>((const TA *)a->data, lm__cuda_nd_of(a), (const TB *)b->data,
                                                            lm__cuda_nd_of(b), (TA *)out->data, lm__cuda_nd_of(out), batch);
    return lm__cuda_launched("matmul kernel");
}

lm_status lm__cuda_matmul(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, cudaStream_t s) {
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    if (a->dtype == LM_F32 && b->dtype == LM_BF16) return launch<float, bf16>(a, b, out, s);
    if (a->dtype == LM_F32 && b->dtype == LM_F16) return launch<float, __half>(a, b, out, s);
    switch (a->dtype) {
    case LM_F32: return launch<float, float>(a, b, out, s);
    case LM_BF16: return launch<bf16, bf16>(a, b, out, s);
    case LM_F16: return launch<__half, __half>(a, b, out, s);
    default: return lm__error(LM_UNSUPPORTED, "matmul (cuda): dtype %s", lm_dtype_name(a->dtype));
    }
}
