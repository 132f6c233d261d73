/* ops/cuda/rope.cu — rotary position embedding on CUDA.
 *
 * lm__cuda_rope: rope_rows_kernel (rope_rows.cuh) with the bias and sgn = +1: a tile of
 * tokens per block, each token's angles computed once (double) for all its heads.
 * qkv_rope_store (the model step): one warp per (token, head) of the fused q/k/v
 * projection: bias, qwen3's per-head RMSNorm (a warp reduction), RoPE, and the stores:
 * q to its attention buffer, k and v (bf16) into the cache at the token's position p:
 * block table[row, p / P], offset p % P (with one entry per row, the row's slot and p
 * itself, no division); a token whose position is past the row's NB * P or whose
 * block is outside the pool stores nothing and gets a NaN q. It is launched with
 * programmatic dependent launch (it may start while the q|k|v GEMV finishes and waits
 * for it before reading) and lets the attention after it start the same way.
 * O(ntok * (Hq + 2 Hkv) * hd).
 */
#include "ops/cuda/qkv_rope_body.cuh"
#include "ops/cuda/rope_rows.cuh"

lm_status lm__cuda_rope(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out, cudaStream_t s) {
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    const void *bias = p->bias ? p->bias->data : NULL;
    int64_t bs0 = p->bias ? p->bias->stride[0] : 0, bs1 = p->bias ? p->bias->stride[1] : 0;
    return lm__cuda_rope_rows(x, bias, bs0, bs1, out, lm__cuda_rope_args_of(p, x), 1.f, "rope kernel", s);
}

static __global__ void inv_freq_kernel(double theta, int64_t head_dim, float *out, int64_t stride) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < head_dim / 2) out[i * stride] = (float)pow(theta, -2.0 * (double)i / (double)head_dim);
}

lm_status lm__cuda_rope_inv_freq(double theta, int64_t head_dim, const lm_tensor_view *out, cudaStream_t s) {
    if (head_dim < 2) return LM_OK;
    inv_freq_kernel<<<lm__cuda_blocks(head_dim / 2, 128), 128, 0, s>>>(theta, head_dim, (float *)out->data,
                                                                       out->stride[0]);
    return lm__cuda_launched("rope_inv_freq kernel");
}

/* ---- the model step: fused bias + q/k norm + RoPE + KV-cache store (qkv_rope_body.cuh) ---------- */
template <typename QT>
__global__ void qkv_rope_store_kernel(lm__cuda_qkv_params p, lm__cuda_kv kv) {
    pdl_wait(); /* launched with programmatic launch: qkv is the previous kernel's output */
    pdl_trigger();
    qkv_rope_item<QT>(p, kv, blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32);
}

lm_status lm__cuda_qkv_rope_store(const lm__cuda_qkv_params *p, const lm__cuda_kv *kv, cudaStream_t s) {
    int64_t items = p->ntok * (p->q_heads + 2 * kv->kv_heads);
    if (items == 0) return LM_OK;
    unsigned blocks = (unsigned)((items + 3) / 4); /* 4 warps per block */
    cudaError_t e = p->q_bf16 ? lm__cuda_launch_pdl(qkv_rope_store_kernel<bf16>, dim3(blocks), dim3(128), 0, s, *p, *kv)
                              : lm__cuda_launch_pdl(qkv_rope_store_kernel<float>, dim3(blocks), dim3(128), 0, s, *p, *kv);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "qkv_rope_store launch");
    return lm__cuda_launched("qkv_rope_store");
}
