/* ops/cuda/rope.cu — rotary position embedding on CUDA.
 *
 * Readable kernel: one thread per (b, t, h, pair i). The angle pos * inv_freq[i] and
 * its cos/sin are computed in double (positions reach 1e5 and more, where a float
 * angle would be off by 1e-2 radians), scaled by attn_factor, then the pair (i, i+D/2)
 * or (2i, 2i+1) is read (plus bias) and rotated. Pairs are disjoint across threads and
 * each thread reads both members before writing, so in-place use is safe.
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

__device__ __forceinline__ int64_t ld_index(const void *p, int is64, int64_t off) {
    return is64 ? ((const int64_t *)p)[off] : (int64_t)((const int32_t *)p)[off];
}

struct rope_args {
    int style; /* LM_ROPE_SPLIT_HALF or LM_ROPE_INTERLEAVED */
    const float *inv_freq;
    int64_t inv_stride;
    float attn_factor;
    const void *pos; /* NULL: pos_offset + t */
    int pos_is64, pos_ndim;
    int64_t pos_stride[2];
    int64_t pos_offset;
    int64_t B, T, H, half;
};

template <typename T>
__global__ void rope_kernel(const T *x, lm__cuda_nd nx, const T *bias, int64_t bs0, int64_t bs1, T *out,
                            lm__cuda_nd no, rope_args a) {
    int64_t n = a.B * a.T * a.H * a.half;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = idx % a.half, h = (idx / a.half) % a.H, t = (idx / (a.half * a.H)) % a.T;
        int64_t b = idx / (a.half * a.H * a.T);
        int64_t pos = a.pos_offset + t;
        if (a.pos)
            pos = a.pos_ndim == 1 ? ld_index(a.pos, a.pos_is64, t * a.pos_stride[0])
                                  : ld_index(a.pos, a.pos_is64, b * a.pos_stride[0] + t * a.pos_stride[1]);
        double sn, cs;
        sincos((double)pos * (double)a.inv_freq[i * a.inv_stride], &sn, &cs);
        float c = (float)(cs * a.attn_factor), s = (float)(sn * a.attn_factor);
        int64_t ia = a.style == LM_ROPE_INTERLEAVED ? 2 * i : i, ib = a.style == LM_ROPE_INTERLEAVED ? 2 * i + 1 : i + a.half;
        int64_t xb = b * nx.stride[0] + t * nx.stride[1] + h * nx.stride[2];
        int64_t ob = b * no.stride[0] + t * no.stride[1] + h * no.stride[2];
        float va = ld(x + xb + ia * nx.stride[3]), vb = ld(x + xb + ib * nx.stride[3]);
        if (bias) {
            va += ld(bias + h * bs0 + ia * bs1);
            vb += ld(bias + h * bs0 + ib * bs1);
        }
        st(out + ob + ia * no.stride[3], va * c - vb * s);
        st(out + ob + ib * no.stride[3], vb * c + va * s);
    }
}

lm_status lm__cuda_rope(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(out);
    if (n == 0) return LM_OK;
    rope_args a;
    memset(&a, 0, sizeof a);
    a.style = (int)p->style;
    a.inv_freq = (const float *)p->inv_freq->data;
    a.inv_stride = p->inv_freq->stride[0];
    a.attn_factor = p->attn_factor;
    a.pos_offset = p->pos_offset;
    if (p->positions) {
        a.pos = p->positions->data;
        a.pos_is64 = p->positions->dtype == LM_I64;
        a.pos_ndim = p->positions->ndim;
        for (int i = 0; i < a.pos_ndim; i++) a.pos_stride[i] = p->positions->stride[i];
    }
    a.B = x->shape[0], a.T = x->shape[1], a.H = x->shape[2], a.half = x->shape[3] / 2;
    const void *bias = p->bias ? p->bias->data : NULL;
    int64_t bs0 = p->bias ? p->bias->stride[0] : 0, bs1 = p->bias ? p->bias->stride[1] : 0;
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         rope_kernel<T><<<lm__cuda_blocks(n / 2, 256), 256, 0, s>>>(
                             (const T *)x->data, lm__cuda_nd_of(x), (const T *)bias, bs0, bs1, (T *)out->data,
                             lm__cuda_nd_of(out), a));
    return lm__cuda_launched("rope kernel");
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
