/* ops/cuda/attention_flash.cu — v3: flash-style causal prefill attention on tensor
 * cores (mma.sync m16n8k16, bf16 in, f32 accumulate), grouped kv heads read in place.
 *
 * Grid (query tiles of BR = 64, Hq, B); 4 warps per block, 16 query rows per warp.
 * Row b's T tokens sit at positions start_b + t and attend cache keys [0, start_b + t].
 * Per key tile of BC = 64: K is staged row-major and V transposed in shared memory
 * (rows padded by 16 bytes so fragment loads hit 32 distinct banks); S = Q K^T is 8
 * n-tiles of 16x8 per warp; causal masking, the running row max (shared by the 4
 * lanes of a row through two shuffles), exp2 with scale * log2(e) folded in, the
 * accumulator rescale, then O += P V with P re-packed from the S accumulators as the
 * A operand (the m16n8k16 C layout of two adjacent n-tiles is the A layout). Neither
 * K/V expansion nor a T x T matrix ever exists in memory. Keys at or past start_b + T
 * are staged as zeros (masked anyway; this keeps garbage out of P V).
 * Fragment layouts (PTX ISA, m16n8k16, g = lane / 4, c = lane % 4): A regs {(g, 2c),
 * (g+8, 2c), (g, 2c+8), (g+8, 2c+8)} pairs; B regs {(k 2c, n g), (k 2c+8, n g)} pairs;
 * C {(g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)}.
 * Work O(B * Hq * T * (start + T) * hd) on tensor cores.
 */
#include "ops/cuda/common.cuh"

#define BR 64
#define BC 64
#define WARPS 4
#define PAD 8 /* bf16 of padding per shared row */

int lm__cuda_attention_prefill_v3_supports(int head_dim) { return head_dim == 64 || head_dim == 128; }

__device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ void store2(float *p, float a, float b) { *(float2 *)p = make_float2(a, b); }
__device__ __forceinline__ void store2(bf16 *p, float a, float b) { *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b); }

template <int HD, typename OT>
__global__ void __launch_bounds__(WARPS * 32) flash_kernel(lm__cuda_attn_params p, lm__cuda_kv kv, int64_t T) {
    constexpr int CHUNKS = BC * HD / 8 / (WARPS * 32); /* 16-byte chunks of a K (or V) tile per thread */
    static_assert(BC * HD / 8 % (WARPS * 32) == 0, "tile chunks must divide evenly among the threads");
    __shared__ __align__(16) bf16 ks[BC][HD + PAD];  /* K tile, row-major [key][dim] */
    __shared__ __align__(16) bf16 vt[HD][BC + PAD];  /* V tile, transposed [dim][key] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int h = blockIdx.y, Hq = p.q_heads, Hkv = kv.kv_heads, kvh = h / (Hq / Hkv);
    const int64_t b = blockIdx.z, tok0 = b * T, start = p.tok_pos[tok0], slot = p.tok_slot[tok0];
    const int64_t q0 = (int64_t)blockIdx.x * BR + warp * 16; /* first query row (t) of this warp */
    const int64_t kend = start + T;                          /* keys [0, kend) exist after this call */
    const bf16 *K = (const bf16 *)kv.k + (slot * Hkv + kvh) * kv.max_tokens * HD;
    const bf16 *V = (const bf16 *)kv.v + (slot * Hkv + kvh) * kv.max_tokens * HD;

    uint32_t qa[HD / 16][4]; /* Q fragments of rows q0 + g and q0 + g + 8 */
    const bf16 *Q = (const bf16 *)p.q;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int64_t t = q0 + g + (r & 1) * 8;
            int col = kk * 16 + 2 * c + (r >> 1) * 8;
            qa[kk][r] = t < T ? *(const uint32_t *)(Q + ((tok0 + t) * Hq + h) * HD + col) : 0u;
        }
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const float scale_log2 = p.scale * 1.4426950408889634f;
    const int64_t last_q = LM_MIN(T, (int64_t)(blockIdx.x + 1) * BR) - 1; /* last row t of the block */
    const int64_t ntiles = (start + last_q) / BC + 1;

    for (int64_t kt = 0; kt < ntiles; kt++) {
        __syncthreads(); /* the previous tile is no longer read */
        uint4 reg[CHUNKS]; /* a thread's share of the tile: all loads in flight together */
#pragma unroll
        for (int r = 0; r < CHUNKS; r++) {
            int i = threadIdx.x + r * WARPS * 32, row = i / (HD / 8), ch = i % (HD / 8); /* K: coalesced */
            int64_t key = kt * BC + row;
            reg[r] = key < kend ? *(const uint4 *)(K + key * HD + ch * 8) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int r = 0; r < CHUNKS; r++) {
            int i = threadIdx.x + r * WARPS * 32;
            *(uint4 *)&ks[i / (HD / 8)][(i % (HD / 8)) * 8] = reg[r];
        }
#pragma unroll
        for (int r = 0; r < CHUNKS; r++) {
            int i = threadIdx.x + r * WARPS * 32, vrow = i % BC, vch = i / BC; /* V: consecutive keys */
            int64_t vkey = kt * BC + vrow;
            reg[r] = vkey < kend ? *(const uint4 *)(V + vkey * HD + vch * 8) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int r = 0; r < CHUNKS; r++) {
            int i = threadIdx.x + r * WARPS * 32, vrow = i % BC, vch = i / BC;
            const bf16 *we = (const bf16 *)&reg[r];
#pragma unroll
            for (int e = 0; e < 8; e++) vt[vch * 8 + e][vrow] = we[e];
        }
        __syncthreads();
        float s[BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t b0 = *(const uint32_t *)&ks[nt * 8 + g][kk * 16 + 2 * c];
                uint32_t b1 = *(const uint32_t *)&ks[nt * 8 + g][kk * 16 + 8 + 2 * c];
                mma_bf16(s[nt], qa[kk], b0, b1);
            }
        }
        float mloc[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int64_t qpos = start + q0 + g + (r >> 1) * 8, kpos = kt * BC + nt * 8 + 2 * c + (r & 1);
                s[nt][r] = kpos > qpos ? -INFINITY : s[nt][r] * scale_log2;
                mloc[r >> 1] = fmaxf(mloc[r >> 1], s[nt][r]);
            }
        float alpha[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 1));
            mloc[i] = fmaxf(mloc[i], __shfl_xor_sync(0xffffffffu, mloc[i], 2));
            float m_new = fmaxf(m_run[i], mloc[i]);
            alpha[i] = m_new == -INFINITY ? 1.f : exp2f(m_run[i] - m_new);
            m_run[i] = m_new;
            l_run[i] *= alpha[i];
        }
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float e = m_run[r >> 1] == -INFINITY ? 0.f : exp2f(s[nt][r] - m_run[r >> 1]);
                s[nt][r] = e;
                l_run[r >> 1] += e;
            }
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dt = 0; dt < HD / 8; dt++) {
                uint32_t b0 = *(const uint32_t *)&vt[dt * 8 + g][kk * 16 + 2 * c];
                uint32_t b1 = *(const uint32_t *)&vt[dt * 8 + g][kk * 16 + 8 + 2 * c];
                mma_bf16(o[dt], a, b0, b1);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    }
    OT *out = (OT *)p.out;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int64_t t = q0 + g + i * 8;
        if (t >= T) continue;
        float inv = 1.f / l_run[i];
        OT *orow = out + ((tok0 + t) * Hq + h) * HD;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) store2(orow + dt * 8 + 2 * c, o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
    }
}

template <int HD>
static lm_status launch(const lm__cuda_attn_params *p, int B, int64_t T, const lm__cuda_kv *kv, cudaStream_t s) {
    dim3 grid((unsigned)((T + BR - 1) / BR), (unsigned)p->q_heads, (unsigned)B);
    if (p->out_bf16) flash_kernel<HD, bf16><<<grid, WARPS * 32, 0, s>>>(*p, *kv, T);
    else flash_kernel<HD, float><<<grid, WARPS * 32, 0, s>>>(*p, *kv, T);
    return lm__cuda_launched("attention_prefill_v3");
}

lm_status lm__cuda_attention_prefill_v3(const lm__cuda_attn_params *p, int B, int64_t T, const lm__cuda_kv *kv,
                                       cudaStream_t s) {
    if (!p->q_bf16 || !lm__cuda_attention_prefill_v3_supports(kv->head_dim))
        return lm__error(LM_UNSUPPORTED, "attention_prefill_v3: needs bf16 q and head dim 64 or 128 (got %d)",
                         kv->head_dim);
    if (B == 0 || T == 0) return LM_OK;
    return kv->head_dim == 64 ? launch<64>(p, B, T, kv, s) : launch<128>(p, B, T, kv, s);
}
