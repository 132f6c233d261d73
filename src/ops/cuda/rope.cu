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
 * block is outside the pool stores nothing and gets a NaN q.
 * O(ntok * (Hq + 2 Hkv) * hd).
 */
#include "ops/cuda/common.cuh"

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

/* ---- the model step: fused bias + q/k norm + RoPE + KV-cache store ---------------------------- */
template <typename QT>
__global__ void qkv_rope_store_kernel(lm__cuda_qkv_params p, lm__cuda_kv kv) {
    int Hq = p.q_heads, Hkv = kv.kv_heads, hd = kv.head_dim, half = hd / 2, heads = Hq + 2 * Hkv;
    int64_t item = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; /* (token, head), warp-uniform */
    if (item >= p.ntok * heads) return;
    int64_t tok = item / heads;
    int h = (int)(item % heads), lane = threadIdx.x & 31;
    const float *src = p.qkv + tok * heads * hd + (int64_t)h * hd;
    const float *b = p.bias ? p.bias + (int64_t)h * hd : NULL;
    const int64_t P = kv.block_tokens;
    int64_t pos = p.tok_pos[tok], block = -1, off = pos; /* the token's block and offset in it */
    if (pos >= 0 && pos < kv.nb * P) {
        int64_t e = kv.nb == 1 ? 0 : pos / P;
        block = p.row_table[(tok / p.T) * kv.nb + e], off = pos - e * P;
    }
    if (block < 0 || block >= kv.blocks) { /* a bad token: no store, NaN q */
        QT *q = (QT *)p.q + (tok * Hq + h) * hd;
        for (int d = lane; h < Hq && d < hd; d += 32) st(q + d, NAN);
        return;
    }
    if (h >= Hq + Hkv) { /* v head: bias and store */
        bf16 *dst = (bf16 *)kv.v + ((block * Hkv + (h - Hq - Hkv)) * P + off) * hd;
        for (int d = lane; d < hd; d += 32) dst[d] = __float2bfloat16_rn(src[d] + (b ? b[d] : 0.f));
        return;
    }
    const float *nw = h < Hq ? p.q_norm : p.k_norm;
    float inv = 1.f;
    if (nw) {
        float ss = 0.f;
        for (int d = lane; d < hd; d += 32) {
            float v = src[d] + (b ? b[d] : 0.f);
            ss += v * v;
        }
        inv = rsqrtf(warp_sum(ss) / (float)hd + p.eps);
    }
    for (int i = lane; i < half; i += 32) {
        double sn, cs;
        sincos((double)pos * (double)p.inv_freq[i], &sn, &cs);
        float c = (float)(cs * p.attn_factor), s = (float)(sn * p.attn_factor);
        float va = src[i] + (b ? b[i] : 0.f), vb = src[i + half] + (b ? b[i + half] : 0.f);
        if (nw) {
            va *= inv * nw[i];
            vb *= inv * nw[i + half];
        }
        float ra = va * c - vb * s, rb = vb * c + va * s;
        if (h < Hq) {
            QT *q = (QT *)p.q + (tok * Hq + h) * hd;
            st(q + i, ra);
            st(q + i + half, rb);
        } else {
            bf16 *k = (bf16 *)kv.k + ((block * Hkv + (h - Hq)) * P + off) * hd;
            k[i] = __float2bfloat16_rn(ra);
            k[i + half] = __float2bfloat16_rn(rb);
        }
    }
}

lm_status lm__cuda_qkv_rope_store(const lm__cuda_qkv_params *p, const lm__cuda_kv *kv, cudaStream_t s) {
    int64_t items = p->ntok * (p->q_heads + 2 * kv->kv_heads);
    if (items == 0) return LM_OK;
    unsigned blocks = (unsigned)((items + 3) / 4); /* 4 warps per block */
    if (p->q_bf16) qkv_rope_store_kernel<bf16><<<blocks, 128, 0, s>>>(*p, *kv);
    else qkv_rope_store_kernel<float><<<blocks, 128, 0, s>>>(*p, *kv);
    return lm__cuda_launched("qkv_rope_store");
}
