/* ops/cuda/qkv_rope_body.cuh — the device code of the step's fused attention front
 * (ops/cuda/rope.cu describes it), one warp's work item as a function so that a kernel
 * running several step operators in one launch can call it too. Included by .cu
 * files only. */
#ifndef LOOM_OPS_CUDA_QKV_ROPE_BODY_CUH
#define LOOM_OPS_CUDA_QKV_ROPE_BODY_CUH

#include "ops/cuda/common.cuh"

/* ---- the model step: fused bias + q/k norm + RoPE + KV-cache store ---------------------------- */
/* Token tok's cache block (its row's table entry for its position), -1 for a bad token
 * (a position past the row's nb * block_tokens, or a block outside the pool); *off is
 * the position's offset in the block. */
__device__ __forceinline__ int64_t front_block(const lm__cuda_qkv_params &p, const lm__cuda_kv &kv, int64_t tok,
                                               int64_t *off) {
    const int64_t P = kv.block_tokens;
    int64_t pos = p.tok_pos[tok], block = -1;
    *off = pos;
    if (pos >= 0 && pos < kv.nb * P) {
        int64_t e = kv.nb == 1 ? 0 : pos / P;
        block = p.row_table[(tok / p.T) * kv.nb + e], *off = pos - e * P;
    }
    return block >= 0 && block < kv.blocks ? block : -1;
}

/* The RoPE pair (a, b) = (x[i], x[i + hd / 2]) of a head rotated by the angle pos *
 * inv_freq[i] (computed in double, like the CPU), cos and sin scaled by attn_factor. */
__device__ __forceinline__ void front_rotate(const lm__cuda_qkv_params &p, int64_t pos, int i, float &a, float &b) {
    double sn, cs;
    sincos((double)pos * (double)p.inv_freq[i], &sn, &cs);
    float c = (float)(cs * p.attn_factor), s = (float)(sn * p.attn_factor);
    float ra = a * c - b * s, rb = b * c + a * s;
    a = ra, b = rb;
}

/* Stores head h's rotated pair (i, i + hd/2) of token tok: q to its buffer (h < Hq),
 * else k into the cache at (block, off). */
template <typename QT>
__device__ __forceinline__ void front_store_qk(const lm__cuda_qkv_params &p, const lm__cuda_kv &kv, int h, int64_t tok,
                                               int64_t block, int64_t off, int i, float ra, float rb) {
    const int Hq = p.q_heads, Hkv = kv.kv_heads, hd = kv.head_dim, half = hd / 2;
    if (h < Hq) {
        QT *q = (QT *)p.q + (tok * Hq + h) * hd;
        st(q + i, ra);
        st(q + i + half, rb);
    } else {
        bf16 *k = (bf16 *)kv.k + ((block * Hkv + (h - Hq)) * kv.block_tokens + off) * hd;
        k[i] = __float2bfloat16_rn(ra);
        k[i + half] = __float2bfloat16_rn(rb);
    }
}

/* One warp's work item (token, head) = item (warp-uniform; nothing past the last). */
template <typename QT>
__device__ __forceinline__ void qkv_rope_item(const lm__cuda_qkv_params &p, const lm__cuda_kv &kv, int64_t item) {
    int Hq = p.q_heads, Hkv = kv.kv_heads, hd = kv.head_dim, half = hd / 2, heads = Hq + 2 * Hkv;
    if (item >= p.ntok * heads) return;
    int64_t tok = item / heads;
    int h = (int)(item % heads), lane = threadIdx.x & 31;
    const float *src = p.qkv + tok * heads * hd + (int64_t)h * hd;
    const float *b = p.bias ? p.bias + (int64_t)h * hd : NULL;
    const int64_t P = kv.block_tokens, pos = p.tok_pos[tok];
    int64_t off, block = front_block(p, kv, tok, &off);
    if (block < 0) { /* a bad token: no store, NaN q */
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
        float va = src[i] + (b ? b[i] : 0.f), vb = src[i + half] + (b ? b[i + half] : 0.f);
        if (nw) {
            va *= inv * nw[i];
            vb *= inv * nw[i + half];
        }
        float ra = va, rb = vb;
        front_rotate(p, pos, i, ra, rb);
        front_store_qk<QT>(p, kv, h, tok, block, off, i, ra, rb);
    }
}

#endif
