/* ops/cuda/kv.cu — the KV-cache store on CUDA (lm_kv_store_out's CUDA level).
 *
 * One thread per element of x [B, T, Hkv, D]: the element of token (b, t) at position
 * p goes to cache[block, head, p % P, d] with block = slots[b, p / P] (slots [B, NB],
 * a paged cache of blocks of P positions) or slots[b] (slots [B]: NB = 1, no
 * division), rounded to the cache's dtype; any strides and float dtypes on both sides.
 * A token whose position is outside [0, NB * P) or whose block is outside the pool is
 * skipped (device indices cannot be reported; the host-side callers check them).
 * O(numel(x)).
 */
#include "ops/cuda/common.cuh"

template <typename TX, typename TC>
__global__ void kv_store_kernel(TC *cache, lm__cuda_nd nc, const TX *x, lm__cuda_nd nx, const int32_t *slots,
                                int64_t ss0, int64_t ss1, int64_t nb, const int32_t *pos, int64_t ps0, int64_t ps1,
                                int64_t n) {
    int64_t T = nx.shape[1], H = nx.shape[2], D = nx.shape[3], P = nc.shape[2];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t d = i % D, h = (i / D) % H, t = (i / (D * H)) % T, b = i / (D * H * T);
        int64_t p = pos[b * ps0 + t * ps1];
        if (p < 0 || p >= nb * P) continue; /* also every token when nb or P is 0: no table read */
        int64_t e = nb == 1 ? 0 : p / P, block = slots[b * ss0 + e * ss1];
        if (block < 0 || block >= nc.shape[0]) continue;
        float v = ld(x + b * nx.stride[0] + t * nx.stride[1] + h * nx.stride[2] + d * nx.stride[3]);
        st(cache + block * nc.stride[0] + h * nc.stride[1] + (p - e * P) * nc.stride[2] + d * nc.stride[3], v);
    }
}

lm_status lm__cuda_kv_store(const lm_tensor_view *cache, const lm_tensor_view *x, const lm_tensor_view *slots,
                            const lm_tensor_view *positions, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(x);
    if (n == 0) return LM_OK;
    lm__cuda_nd nc = lm__cuda_nd_of(cache), nx = lm__cuda_nd_of(x);
    const int32_t *sl = (const int32_t *)slots->data, *po = (const int32_t *)positions->data;
    int paged = slots->ndim == 2; /* [B, NB]; [B] is NB = 1 */
    int64_t nb = paged ? slots->shape[1] : 1, ss1 = paged ? slots->stride[1] : 0;
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM_TRY(lm__cuda_float_only(cache->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, TX,
                          LM__CUDA_FLOAT_SWITCH(cache->dtype, TC,
                                                kv_store_kernel<TX, TC><<<lm__cuda_blocks(n, 256), 256, 0, s>>>(
                                                    (TC *)cache->data, nc, (const TX *)x->data, nx, sl,
                                                    slots->stride[0], ss1, nb, po, positions->stride[0],
                                                    positions->stride[1], n)));
    return lm__cuda_launched("kv_store");
}
