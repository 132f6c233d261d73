/* ops/cuda/select.cu — argmax and top-k over the last dim on CUDA.
 *
 * Both rank elements by a 64-bit key: the high word orders the float value (NaN above
 * every number, -0 equal to +0), the low word is ~index so that equal values rank
 * lower indices first. A row's best element is then one block-wide max of keys.
 * argmax: one block per row, O(N). top-k: one block per row, k passes, pass r taking
 * the largest key below the previous pick: O(k * N) per row, no workspace. Rows of
 * up to 2^32 - 1 elements.
 */
#include "ops/cuda/common.cuh"

__device__ __forceinline__ unsigned long long rank_key(float v, int64_t j) {
    unsigned u;
    if (isnan(v)) u = 0xFFFFFFFFu;
    else {
        if (v == 0.f) v = 0.f; /* -0 ranks as +0 */
        u = __float_as_uint(v);
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return ((unsigned long long)u << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned)j);
}

__device__ __forceinline__ int64_t key_index(unsigned long long key) {
    return (int64_t)(0xFFFFFFFFu - (unsigned)(key & 0xFFFFFFFFull));
}

static __device__ unsigned long long block_max_u64(unsigned long long v, unsigned long long *scratch) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
        v = other > v ? other : v;
    }
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0ull;
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
        v = other > v ? other : v;
    }
    return v;
}

__device__ __forceinline__ void store_index(void *p, int is64, int64_t off, int64_t v) {
    if (is64) ((int64_t *)p)[off] = v;
    else ((int32_t *)p)[off] = (int32_t)v;
}

template <typename T>
__global__ void argmax_kernel(const T *x, lm__cuda_nd rx, int64_t sx, int64_t n, void *out, int is64, lm__cuda_nd no,
                              int64_t rows) {
    __shared__ unsigned long long scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + nd_offset(rx, r);
        unsigned long long best = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            unsigned long long key = rank_key(ld(xr + j * sx), j);
            best = key > best ? key : best;
        }
        best = block_max_u64(best, scratch);
        if (threadIdx.x == 0) store_index(out, is64, nd_offset(no, r), key_index(best));
    }
}

template <typename T>
__global__ void topk_kernel(const T *x, lm__cuda_nd rx, int64_t sx, int64_t n, int64_t k, T *values, lm__cuda_nd rv,
                            int64_t sv, void *indices, int is64, lm__cuda_nd ri, int64_t si, int64_t rows) {
    __shared__ unsigned long long scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + nd_offset(rx, r);
        unsigned long long bound = 0; /* keys must stay below bound after the first pick */
        for (int64_t pick = 0; pick < k; pick++) {
            unsigned long long best = 0;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                unsigned long long key = rank_key(ld(xr + j * sx), j);
                if ((pick == 0 || key < bound) && key > best) best = key;
            }
            best = block_max_u64(best, scratch);
            bound = best;
            if (threadIdx.x == 0) {
                int64_t j = key_index(best);
                values[nd_offset(rv, r) + pick * sv] = xr[j * sx];
                store_index(indices, is64, nd_offset(ri, r) + pick * si, j);
            }
        }
    }
}

static lm__cuda_nd lead(const lm_tensor_view *v) {
    lm__cuda_nd d = lm__cuda_nd_of(v);
    d.ndim = v->ndim - 1;
    return d;
}

lm_status lm__cuda_argmax(const lm_tensor_view *x, const lm_tensor_view *out, cudaStream_t s) {
    int64_t rows = lm_tensor_view_numel(out), n = x->shape[x->ndim - 1];
    if (rows == 0) return LM_OK;
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         argmax_kernel<T><<<g, 256, 0, s>>>((const T *)x->data, lead(x), x->stride[x->ndim - 1], n,
                                                            out->data, out->dtype == LM_I64, lm__cuda_nd_of(out), rows));
    return lm__cuda_launched("argmax kernel");
}

lm_status lm__cuda_topk(const lm_tensor_view *x, int64_t k, const lm_tensor_view *values,
                       const lm_tensor_view *indices, cudaStream_t s) {
    if (lm_tensor_view_numel(values) == 0) return LM_OK;
    int last = x->ndim - 1;
    int64_t n = x->shape[last], rows = lm_tensor_view_numel(x) / n;
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         topk_kernel<T><<<g, 256, 0, s>>>((const T *)x->data, lead(x), x->stride[last], n, k,
                                                          (T *)values->data, lead(values), values->stride[last],
                                                          indices->data, indices->dtype == LM_I64, lead(indices),
                                                          indices->stride[last], rows));
    return lm__cuda_launched("topk kernel");
}
