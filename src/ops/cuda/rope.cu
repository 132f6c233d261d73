/* ops/cuda/rope.cu — rotary position embedding on CUDA.
 *
 * lm__cuda_rope: rope_rows_kernel (rope_rows.cuh) with the bias and sgn = +1: a tile of
 * tokens per block, each token's angles computed once (double) for all its heads.
 * qkv_rope_store (the model step): per (token, head) of the fused q/k/v projection:
 * bias, qwen3's per-head RMSNorm (a warp reduction), RoPE, and the stores: q to its
 * attention buffer, k and v (bf16) into the cache at the token's position p: block
 * table[row, p / P], offset p % P (with one entry per row, the row's slot and p itself,
 * no division); a token whose position is past the row's NB * P or whose block is
 * outside the pool stores nothing and gets a NaN q. Two kernels, the same arithmetic per
 * head (only qwen3's q/k norm adds its squares in another order, so with norms the two
 * may differ in the last bits):
 *  - token-major (head_dim <= 256): a warp takes G consecutive heads of one token, lane
 *    l the RoPE pairs (i, i + hd/2) for i = l, l + 32, ...: the token's position, cache
 *    block and angles are found once per warp, not once per head, and the heads' loads
 *    are issued four heads at a time before any is used. G is chosen so that the grid
 *    is about one wave of 64 warps an SM (T4096 prefill of Qwen2.5-0.5B: 2 warps a
 *    token of 9 heads each; decode: one head a warp).
 *  - per (token, head) warp (qkv_rope_body.cuh; any head_dim; also the persistent
 *    step kernel's work item): `LOOM_CUDA_FRONT_TOKENS=0` takes it for every shape.
 * Both are launched with programmatic dependent launch (they may start while the q|k|v
 * product finishes and wait for it before reading) and let the attention after them
 * start the same way. O(ntok * (Hq + 2 Hkv) * hd).
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

/* ---- token-major form: G heads of one token a warp ------------------------------------------ */
#define FRONT_CHUNK 4 /* heads whose loads are in flight together */

/* One head's lane values (pairs j: i = lane + 32 j) after bias, norm and rotation,
 * stored. a, b: x[i] and x[i + half] with the bias added. */
template <typename QT, int NP>
__device__ __forceinline__ void front_head(const lm__cuda_qkv_params &p, const lm__cuda_kv &kv, int h, int64_t tok,
                                           int64_t block, int64_t off, const float (&c)[NP], const float (&sn)[NP],
                                           float (&a)[NP], float (&b)[NP]) {
    const int Hq = p.q_heads, Hkv = kv.kv_heads, hd = kv.head_dim, half = hd / 2, lane = threadIdx.x & 31;
    const int64_t P = kv.block_tokens;
    if (h >= Hq + Hkv) { /* v head: bias and store */
        bf16 *dst = (bf16 *)kv.v + ((block * Hkv + (h - Hq - Hkv)) * P + off) * hd;
#pragma unroll
        for (int j = 0; j < NP; j++) {
            int i = lane + 32 * j;
            if (i < half) dst[i] = __float2bfloat16_rn(a[j]), dst[i + half] = __float2bfloat16_rn(b[j]);
        }
        return;
    }
    const float *nw = h < Hq ? p.q_norm : p.k_norm;
    if (nw) { /* the head's sum of squares over all hd elements */
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < NP; j++)
            if (lane + 32 * j < half) ss += a[j] * a[j] + b[j] * b[j];
        float inv = rsqrtf(warp_sum(ss) / (float)hd + p.eps);
#pragma unroll
        for (int j = 0; j < NP; j++) {
            int i = lane + 32 * j;
            if (i < half) a[j] *= inv * nw[i], b[j] *= inv * nw[i + half];
        }
    }
#pragma unroll
    for (int j = 0; j < NP; j++) {
        int i = lane + 32 * j;
        if (i >= half) continue;
        front_store_qk<QT>(p, kv, h, tok, block, off, i, a[j] * c[j] - b[j] * sn[j], b[j] * c[j] + a[j] * sn[j]);
    }
}

/* Warp w: token w / groups, heads [g G, min((g + 1) G, heads)) for g = w % groups. NP:
 * pairs a lane holds (hd / 2 <= 32 NP). */
template <typename QT, int NP>
__global__ void qkv_front_tokens_kernel(lm__cuda_qkv_params p, lm__cuda_kv kv, int G, int groups) {
    pdl_wait(); /* launched with programmatic launch: qkv is the previous kernel's output */
    pdl_trigger();
    const int Hq = p.q_heads, Hkv = kv.kv_heads, hd = kv.head_dim, half = hd / 2, heads = Hq + 2 * Hkv;
    const int lane = threadIdx.x & 31;
    int64_t w = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    if (w >= p.ntok * groups) return;
    int64_t tok = w / groups;
    int h0 = (int)(w - tok * groups) * G, h1 = min(h0 + G, heads);
    int64_t off, block = front_block(p, kv, tok, &off);
    if (block < 0) { /* a bad token: no store, NaN q */
        for (int h = h0; h < h1 && h < Hq; h++) {
            QT *q = (QT *)p.q + (tok * Hq + h) * hd;
            for (int d = lane; d < hd; d += 32) st(q + d, NAN);
        }
        return;
    }
    float c[NP], sn[NP];
#pragma unroll
    for (int j = 0; j < NP; j++) c[j] = 1.f, sn[j] = 0.f; /* v heads only: no rotation */
    if (h0 < Hq + Hkv) { /* the token's angles (double, like the CPU), once for its q and k heads */
        const double pos = (double)p.tok_pos[tok];
#pragma unroll
        for (int j = 0; j < NP; j++) {
            int i = min(lane + 32 * j, half - 1);
            double s, cs;
            sincos(pos * (double)p.inv_freq[i], &s, &cs);
            c[j] = (float)(cs * p.attn_factor), sn[j] = (float)(s * p.attn_factor);
        }
    }
    const float *row = p.qkv + tok * heads * hd;
    for (int h = h0; h < h1; h += FRONT_CHUNK) {
        float a[FRONT_CHUNK][NP], b[FRONT_CHUNK][NP];
#pragma unroll
        for (int u = 0; u < FRONT_CHUNK; u++) /* every load of the chunk before any use */
#pragma unroll
            for (int j = 0; j < NP; j++) {
                int i = lane + 32 * j, hh = h + u;
                a[u][j] = b[u][j] = 0.f;
                if (hh < h1 && i < half) {
                    const float *src = row + (int64_t)hh * hd;
                    a[u][j] = src[i], b[u][j] = src[i + half];
                    if (p.bias) a[u][j] += p.bias[(int64_t)hh * hd + i], b[u][j] += p.bias[(int64_t)hh * hd + i + half];
                }
            }
#pragma unroll
        for (int u = 0; u < FRONT_CHUNK; u++)
            if (h + u < h1) front_head<QT, NP>(p, kv, h + u, tok, block, off, c, sn, a[u], b[u]);
    }
}

/* Heads a warp takes: about one wave of 64 warps an SM, at least one head a warp. */
static int front_group(const lm__cuda_qkv_params *p, int heads) {
    const char *e = getenv("LOOM_CUDA_FRONT_GROUP"); /* a fixed G, for tests and measurements */
    int fixed = e ? atoi(e) : 0;
    if (fixed > 0) return fixed < heads ? fixed : heads;
    int64_t slots = (int64_t)lm__cuda_sm_count() * 64, items = p->ntok * heads;
    int64_t g = (items + slots - 1) / slots;
    return (int)(g < 1 ? 1 : g > heads ? heads : g);
}

template <typename QT>
static cudaError_t launch_front_tokens(const lm__cuda_qkv_params *p, const lm__cuda_kv *kv, int np, cudaStream_t s) {
    int heads = p->q_heads + 2 * kv->kv_heads, G = front_group(p, heads), groups = (heads + G - 1) / G;
    unsigned blocks = (unsigned)((p->ntok * groups + 3) / 4); /* 4 warps per block */
    switch (np) {
    case 1: return lm__cuda_launch_pdl(qkv_front_tokens_kernel<QT, 1>, dim3(blocks), dim3(128), 0, s, *p, *kv, G, groups);
    case 2: return lm__cuda_launch_pdl(qkv_front_tokens_kernel<QT, 2>, dim3(blocks), dim3(128), 0, s, *p, *kv, G, groups);
    default: return lm__cuda_launch_pdl(qkv_front_tokens_kernel<QT, 4>, dim3(blocks), dim3(128), 0, s, *p, *kv, G, groups);
    }
}

lm_status lm__cuda_qkv_rope_store(const lm__cuda_qkv_params *p, const lm__cuda_kv *kv, cudaStream_t s) {
    int64_t items = p->ntok * (p->q_heads + 2 * kv->kv_heads);
    if (items == 0) return LM_OK;
    int half = (int)(kv->head_dim / 2), np = half <= 32 ? 1 : half <= 64 ? 2 : half <= 128 ? 4 : 0;
    const char *e = getenv("LOOM_CUDA_FRONT_TOKENS");
    cudaError_t err;
    if (np && !(e && strcmp(e, "0") == 0)) {
        err = p->q_bf16 ? launch_front_tokens<bf16>(p, kv, np, s) : launch_front_tokens<float>(p, kv, np, s);
    } else {
        unsigned blocks = (unsigned)((items + 3) / 4); /* 4 warps per block */
        err = p->q_bf16 ? lm__cuda_launch_pdl(qkv_rope_store_kernel<bf16>, dim3(blocks), dim3(128), 0, s, *p, *kv)
                        : lm__cuda_launch_pdl(qkv_rope_store_kernel<float>, dim3(blocks), dim3(128), 0, s, *p, *kv);
    }
    if (err != cudaSuccess) return lm__cuda_check((int)err, "qkv_rope_store launch");
    return lm__cuda_launched("qkv_rope_store");
}
