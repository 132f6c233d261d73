/* ops/cuda/kv.cu — the KV-cache store on CUDA (lm_kv_store_out's CUDA level).
 *
 * One thread per element of x [B, T, Hkv, D]: the element goes to cache[slot of its
 * row, head, position of its token, d], rounded to the cache's dtype; any strides and
 * float dtypes on both sides. A row whose slot or position is outside the cache is
 * skipped (device indices cannot be reported; the host-side callers check them).
 * O(numel(x)).
 */
#include "ops/cuda/common.cuh"

template <typename TX, typename TC>
__global__ void kv_store_kernel(TC *cache, lm__cuda_nd nc, const TX *x, lm__cuda_nd nx, const int32_t *slots,
                                int64_t ss, const int32_t *pos, int64_t ps0, int64_t ps1, int64_t n) {
    int64_t T = nx.shape[1], H = nx.shape[2], D = nx.shape[3];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t d = i % D, h = (i / D) % H, t = (i / (D * H)) % T, b = i / (D * H * T);
        int64_t slot = slots[b * ss], p = pos[b * ps0 + t * ps1];
        if (slot < 0 || slot >= nc.shape[0] || p < 0 || p >= nc.shape[2]) continue;
        float v = ld(x + b * nx.stride[0] + t * nx.stride[1] + h * nx.stride[2] + d * nx.stride[3]);
        st(cache + slot * nc.stride[0] + h * nc.stride[1] + p * nc.stride[2] + d * nc.stride[3], v);
    }
}

lm_status lm__cuda_kv_store(const lm_tensor_view *cache, const lm_tensor_view *x, const lm_tensor_view *slots,
                            const lm_tensor_view *positions, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(x);
    if (n == 0) return LM_OK;
    lm__cuda_nd nc = lm__cuda_nd_of(cache), nx = lm__cuda_nd_of(x);
    const int32_t *sl = (const int32_t *)slots->data, *po = (const int32_t *)positions->data;
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM_TRY(lm__cuda_float_only(cache->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, TX,
                          LM__CUDA_FLOAT_SWITCH(cache->dtype, TC,
                                                kv_store_kernel<TX, TC><<<lm__cuda_blocks(n, 256), 256, 0, s>>>(
                                                    (TC *)cache->data, nc, (const TX *)x->data, nx, sl,
                                                    slots->stride[0], po, positions->stride[0], positions->stride[1],
                                                    n)));
    return lm__cuda_launched("kv_store");
}
