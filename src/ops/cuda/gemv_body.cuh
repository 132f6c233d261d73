/* ops/cuda/gemv_body.cuh — the decode GEMV's device code (ops/cuda/gemv.cu describes
 * the kernel), as a function of the block's number so that a kernel running several
 * step operators in one launch can call it too. Included by .cu files only. */
#ifndef LOOM_OPS_CUDA_GEMV_BODY_CUH
#define LOOM_OPS_CUDA_GEMV_BODY_CUH

#include "ops/cuda/common.cuh"
#include "ops/cuda/qkv_rope_body.cuh"

#include <cuda_fp8.h>

#define WARPS 8
#define THREADS (32 * WARPS)
/* Shared memory a block keeps besides the staged input (the split-K partials, the
 * RMSNorm sums): the staged input gets the device's opt-in limit less this. */
#define GEMV_STATIC_SMEM (4 * 1024)

/* The shape of format F's kernel for M input rows: WPV weights per 16-byte vector, CH
 * chunks of 8 of them; a warp owns RPW output rows and each lane keeps RPW x UNROLL = 8
 * vector loads in flight. At M <= 2 the narrower formats take more rows per warp (int8/
 * fp8 4, int4 8): a row of them is 2-4x fewer vectors, and more rows keep the lane's 8
 * loads and reuse each staged input chunk more times; at larger M the row x input
 * accumulators would not fit in registers, so 2. F = format + 16 V names a shape variant
 * for one input row (gemv.cu's launch_1 picks them): V1 4 rows a warp x 2 loads, V2 2 x 4,
 * V3 8 x 1; V0 is the format's base shape above. */
template <int F, int M>
struct gemv_cfg {
    static constexpr int FB = F & 15, V = F >> 4;
    static constexpr int WPV = FB == LM__CUDA_GEMV_I4 ? 32 : FB == LM__CUDA_GEMV_BF16 ? 8 : 16;
    static constexpr int CH = WPV / 8;
    static constexpr int RPW0 = M > 2 || FB == LM__CUDA_GEMV_BF16 ? 2 : FB == LM__CUDA_GEMV_I4 ? 8 : 4;
    static constexpr int RPW = V == 0 ? RPW0 : V == 1 ? 4 : V == 2 ? 2 : 8;
    static constexpr int UNROLL = 8 / RPW;
};

/* Weights c * 8 .. c * 8 + 7 of a 16-byte vector as f32: bf16 values, int8 / int4
 * integers (the scale is applied by the caller) or e4m3 values (cvt e4m3x2 -> f16x2,
 * exact). */
template <int F>
__device__ __forceinline__ void decode8(const uint4 &raw, int c, float *w) {
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
    if (F == LM__CUDA_GEMV_BF16) {
        const __nv_bfloat162 *w2 = (const __nv_bfloat162 *)&raw;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __bfloat1622float2(w2[i]);
            w[2 * i] = f.x, w[2 * i + 1] = f.y;
        }
    } else if (F == LM__CUDA_GEMV_I4) {
        uint32_t v = u[c];
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = (float)((int32_t)(v << (28 - 4 * i)) >> 28);
    } else if (F == LM__CUDA_GEMV_I8) {
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < 4; i++) w[4 * h + i] = (float)((int32_t)(u[2 * c + h] << (24 - 8 * i)) >> 24);
    } else {
#pragma unroll
        for (int h = 0; h < 4; h++) {
            __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[2 * c + h / 2] >> (16 * (h & 1))),
                                                       __NV_E4M3);
            float2 f = __half22float2(__half2(r));
            w[2 * h] = f.x, w[2 * h + 1] = f.y;
        }
    }
}

/* in(x) of one input value: x * g (RMSNORM: g the norm weight, times 1 / rms where the
 * caller applies it here), silu(x) * g (SWIGLU: g the matching up value) or x (PLAIN).
 * The staging pass and the per-use read both compute the input through it. */
template <int IN>
__device__ __forceinline__ float in_value(float x, float g) {
    if (IN == LM__CUDA_GEMV_RMSNORM) return x * g;
    if (IN == LM__CUDA_GEMV_SWIGLU) return x / (1.f + __expf(-x)) * g;
    return x;
}
template <int IN>
__device__ __forceinline__ float4 in_value4(float4 x, float4 g) {
    return make_float4(in_value<IN>(x.x, g.x), in_value<IN>(x.y, g.y), in_value<IN>(x.z, g.z), in_value<IN>(x.w, g.w));
}
__device__ __forceinline__ float sumsq4(float4 a) { return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w; }

/* 8 consecutive inputs of row m from column k as the input form IN defines them, read
 * from global memory (the kernels whose input does not fit the staging buffer). */
template <int IN>
__device__ __forceinline__ void load_in(const lm__cuda_gemv_params &p, int m, int64_t k, float inv, const float *nw,
                                        float *v) {
    const float *xr = p.x + m * p.ldx + k;
    float4 a = *(const float4 *)xr, b = *(const float4 *)(xr + 4), g0 = make_float4(0.f, 0.f, 0.f, 0.f), g1 = g0;
    if (IN == LM__CUDA_GEMV_RMSNORM) {
        g0 = make_float4(inv * nw[0], inv * nw[1], inv * nw[2], inv * nw[3]);
        g1 = make_float4(inv * nw[4], inv * nw[5], inv * nw[6], inv * nw[7]);
    } else if (IN == LM__CUDA_GEMV_SWIGLU) {
        g0 = *(const float4 *)(xr + p.K), g1 = *(const float4 *)(xr + p.K + 4);
    }
    a = in_value4<IN>(a, g0), b = in_value4<IN>(b, g1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* The staged input: row m's 4-float chunk j lives at chunk m * smx_row_chunks(K) +
 * smx_swizzle(j). Lanes read their 16-byte weight vector's 2, 4 or 8 consecutive chunks
 * (bf16, int8/fp8, int4) one chunk per instruction; the swizzle spreads the 8 lanes of
 * each quarter-warp phase over the 8 different 16-byte bank groups for all three
 * strides, so those reads run without bank conflicts (unswizzled, or read straight from
 * L1, lanes 2-8 chunks apart touch 2-8x the cache lines per instruction — what bounded
 * this kernel before the input was staged). */
__host__ __device__ __forceinline__ int64_t smx_row_chunks(int64_t K) { return (K / 4 + 7) / 8 * 8; }
__device__ __forceinline__ int64_t smx_swizzle(int64_t j) { return j ^ ((j >> 3) & 7); }

/* What output (m, n) adds to its product: the bias, and the residual when
 * accumulating. Read at the start of a row group's iteration, by the thread that will
 * store the element, so these loads overlap the weight stream instead of adding a
 * memory round trip after it (always after the wait: the residual is the previous
 * kernel's output). */
__device__ __forceinline__ float addend(const lm__cuda_gemv_params &p, int m, int64_t n) {
    if (n >= p.N || m >= p.M) return 0.f;
    float v = p.bias ? p.bias[n] : 0.f;
    return p.accumulate ? v + __ldcg(p.out + m * p.ldo + n) : v; /* through L2: see stage_input */
}

/* The scale of output column n applied after the sum (int8/fp8 row scales; 1 otherwise). */
template <int F>
__device__ __forceinline__ float row_scale(const lm__cuda_gemv_params &p, int64_t n) {
    return (F == LM__CUDA_GEMV_I8 || F == LM__CUDA_GEMV_F8) && n < p.N ? ((const float *)p.scales)[n * p.lds] : 1.f;
}

/* Scale i of scales: bf16 when s16 (int4 group scales as loaded), else f32; s16 is the
 * same for every thread of a launch. */
__device__ __forceinline__ float load_scale(const void *scales, int s16, int64_t i) {
    return s16 ? __bfloat162float(__ldg((const bf16 *)scales + i)) : __ldg((const float *)scales + i);
}

/* The logical row that virtual row j computes. FRONT: within every head (q, k and v)
 * the rows go i, i + hd / 2 alternately, so that each RoPE pair is two neighbouring rows
 * of one warp (RPW is even; v is not rotated, but walked alike so that a range of pairs
 * means the same rows in all three sections); SWIGLU: gate row i, then up row i; a
 * plain product's rows stay in place. */
template <int EPI>
__device__ __forceinline__ int64_t pair_row(const lm__cuda_gemv_params &p, int64_t j) {
    if (EPI == LM__CUDA_GEMV_EPI_SWIGLU) return (j >> 1) + (j & 1) * (p.N >> 1);
    const int64_t hd = p.kv.head_dim;
    if (EPI != LM__CUDA_GEMV_EPI_FRONT) return j;
    int64_t h = j / hd, w = j - h * hd;
    return h * hd + (w >> 1) + (w & 1) * (hd >> 1);
}

/* front: where token m's k and v go (its cache block, -1 for a bad token, and the offset
 * in it) and its position. Read before the programmatic wait, with the first weights:
 * the positions and the block table are the step's inputs, which no kernel of a step
 * writes (common.cuh, pdl_wait), so the two dependent loads leave the epilogue's path. */
struct front_at {
    int64_t block, off, pos;
};
__device__ __forceinline__ front_at front_at_of(const lm__cuda_gemv_params &p, int m) {
    front_at a;
    a.block = front_block(p.q_front, p.kv, m, &a.off);
    a.pos = p.q_front.tok_pos[m];
    return a;
}

/* front: token m's finished values (bias added) of virtual rows j and j + 1 (j even):
 * dims i and i + hd / 2 of a head; a q or k head's RoPE pair, rotated and stored to q or
 * the k cache, or two v values stored to the v cache; as qkv_rope_item does (a bad
 * token: NaN q, no store). at: token m's front_at_of. */
__device__ __forceinline__ void front_store(const lm__cuda_gemv_params &p, const front_at &at, int m, int64_t j,
                                            float va, float vb) {
    const lm__cuda_qkv_params &f = p.q_front;
    const lm__cuda_kv &kv = p.kv;
    const int64_t hd = kv.head_dim, half = hd / 2, Hq = f.q_heads, Hkv = kv.kv_heads, h = j / hd, w = j - h * hd;
    const int i = (int)(w >> 1);
    const int64_t off = at.off, block = at.block;
    if (h >= Hq + Hkv) { /* v */
        if (block < 0) return;
        bf16 *v = (bf16 *)kv.v + ((block * Hkv + (h - Hq - Hkv)) * kv.block_tokens + off) * hd + i;
        v[0] = __float2bfloat16_rn(va), v[half] = __float2bfloat16_rn(vb);
        return;
    }
    if (block < 0) {
        va = vb = NAN;
    } else {
        front_rotate(f, at.pos, i, va, vb);
    }
    if (h < Hq) {
        const int64_t o = (m * Hq + h) * hd + i;
        if (f.q_bf16) st((bf16 *)f.q + o, va), st((bf16 *)f.q + o + half, vb);
        else st((float *)f.q + o, va), st((float *)f.q + o + half, vb);
    } else if (block >= 0) {
        bf16 *k = (bf16 *)kv.k + ((block * Hkv + (h - Hq)) * kv.block_tokens + off) * hd + i;
        k[0] = __float2bfloat16_rn(va), k[half] = __float2bfloat16_rn(vb);
    }
}

/* A pair epilogue's store of token m's finished values of virtual rows j, j + 1 (at:
 * token m's front_at_of, FRONT only). */
template <int EPI>
__device__ __forceinline__ void pair_store(const lm__cuda_gemv_params &p, const front_at &at, int m, int64_t j,
                                           float va, float vb) {
    if (EPI == LM__CUDA_GEMV_EPI_SWIGLU) p.out[m * p.ldo + (j >> 1)] = in_value<LM__CUDA_GEMV_SWIGLU>(va, vb);
    else front_store(p, at, m, j, va, vb);
}

/* Issues the UNROLL x RPW weight loads of one batch (zeros past the row's end). */
template <int RPW, int UNROLL, int KSPLIT>
__device__ __forceinline__ void load_batch(const uint4 *const *w, int64_t v0, int64_t nvec, uint4 (*raw)[UNROLL]) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        int64_t vi = v0 + (int64_t)u * KSPLIT * 32;
#pragma unroll
        for (int r = 0; r < RPW; r++) raw[r][u] = vi < nvec ? __ldg(w[r] + vi) : make_uint4(0, 0, 0, 0);
    }
}

/* Rows of row group grp (rows past N repeat the last row; never stored). */
template <int RPW, int EPI>
__device__ __forceinline__ void group_rows(const lm__cuda_gemv_params &p, int64_t grp, const uint4 **w, int64_t *rows) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        rows[r] = pair_row<EPI>(p, LM_MIN(grp * RPW + r, p.N - 1));
        w[r] = (const uint4 *)((const uint8_t *)p.w + rows[r] * p.ldw);
    }
}

/* 1 / rms of input row m by one warp (every lane gets it). */
__device__ __forceinline__ float gemv_inv_rms(const lm__cuda_gemv_params &p, int m) {
    const float4 *xr = (const float4 *)(p.x + m * p.ldx);
    float ss = 0.f;
#pragma unroll 4
    for (int64_t k4 = threadIdx.x & 31; k4 < p.K / 4; k4 += 32) {
        ss += sumsq4(xr[k4]);
    }
    return rsqrtf(warp_sum(ss) / (float)p.K + p.eps);
}

/* Stages in(x) of the M rows (rows >= p.M repeat the last) into xs, swizzled, by the
 * block's threads together: loads issued SB chunks at a time before their stores, one
 * barrier. RMSNORM stages x * norm_w and leaves each thread's partial sums of squares in
 * red; the caller applies 1 / rms per row to the finished sums (gemv_inv_rows). */
template <int IN, int M>
__device__ __forceinline__ void stage_input(const lm__cuda_gemv_params &p, float4 *xs, float (*red)[M]) {
    constexpr int SB = 4;
    const int64_t kc = p.K / 4, rc = smx_row_chunks(p.K);
#pragma unroll
    for (int m = 0; m < M; m++) {
        const float4 *xr = (const float4 *)(p.x + LM_MIN(m, p.M - 1) * p.ldx);
        float ss = 0.f;
        for (int64_t j0 = threadIdx.x; j0 < kc; j0 += SB * THREADS) {
            float4 a[SB], b[SB];
#pragma unroll
            for (int s = 0; s < SB; s++) {
                int64_t j = j0 + s * THREADS;
                b[s] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (j < kc) {
                    a[s] = __ldcg(xr + j); /* x through L2: another SM may have written it in this launch */
                    if (IN == LM__CUDA_GEMV_RMSNORM) b[s] = __ldg((const float4 *)p.norm_w + j);
                    if (IN == LM__CUDA_GEMV_SWIGLU) b[s] = __ldcg(xr + kc + j);
                }
            }
#pragma unroll
            for (int s = 0; s < SB; s++) {
                int64_t j = j0 + s * THREADS;
                if (j < kc) {
                    if (IN == LM__CUDA_GEMV_RMSNORM) ss += sumsq4(a[s]);
                    xs[m * rc + smx_swizzle(j)] = in_value4<IN>(a[s], b[s]);
                }
            }
        }
        if (IN == LM__CUDA_GEMV_RMSNORM) {
            ss = warp_sum(ss);
            if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5][m] = ss;
        }
    }
    __syncthreads();
}

/* 1 / rms of each staged row from the warps' partial sums (every thread, after the barrier). */
template <int M>
__device__ __forceinline__ void gemv_inv_rows(const lm__cuda_gemv_params &p, float (*red)[M], float *inv) {
#pragma unroll
    for (int m = 0; m < M; m++) {
        float t = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) t += red[w][m];
        inv[m] = rsqrtf(t / (float)p.K + p.eps);
    }
}

/* The kernel's body for block vb of vg (its own launch passes its block index and grid
 * size) over row groups [g_lo, g_hi) (its own launch: all of them; a persistent kernel's
 * work item: a range of them, g_hi past the last group meaning up to it). F is the weight
 * format, IN the input form, M the number of input rows it is built for (1, 2, 4 or 8;
 * rows m >= p.M read row p.M - 1 and are never stored), KSPLIT the warps sharing one
 * row's K, SMX whether in(x) is staged in xs (dynamic shared
 * memory of M * smx_row_chunks(K) * 16 bytes) or read from global memory per use, EPI
 * the output: LM__CUDA_GEMV_EPI_OUT, or a pair epilogue (FRONT, SWIGLU: a template
 * argument, so the plain products carry none of its code or registers).
 * wait() is called once, by every thread, after the first weight batch is in flight and
 * before any input is read (but the front epilogue's positions and table entries, which
 * no kernel of a step writes: front_at_of): pdl_wait in its own launch. */
template <int F, int IN, int M, int KSPLIT, int SMX, int PF2 = 0, int EPI = LM__CUDA_GEMV_EPI_OUT, typename Wait>
__device__ __forceinline__ void gemv_body(const lm__cuda_gemv_params &p, int64_t g_lo, int64_t g_hi, int vb, int vg,
                                          Wait wait, float4 *xs) {
    typedef gemv_cfg<F, M> cfg;
    constexpr int WPV = cfg::WPV, CH = cfg::CH, RPW = cfg::RPW, UNROLL = cfg::UNROLL, FB = cfg::FB;
    constexpr int GPB = WARPS / KSPLIT; /* row groups a block works on at once */
    static_assert(KSPLIT == 1 || GPB * RPW * M <= THREADS, "one thread per output of the block's groups");
    __shared__ float part[KSPLIT > 1 ? WARPS : 1][RPW][M]; /* KSPLIT > 1: each warp's partial sums */
    constexpr int E = EPI != LM__CUDA_GEMV_EPI_OUT;
    /* KSPLIT > 1 with a pair epilogue: the finished values of the block's groups */
    __shared__ float fin[E && KSPLIT > 1 ? GPB : 1][E ? RPW : 1][E ? M : 1];
    static_assert(RPW % 2 == 0 && RPW * M <= 32, "the pair epilogues pair rows within one warp");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slice = warp % KSPLIT, gw = warp / KSPLIT; /* K slice, row group within the block */
    const int groups_per_block = WARPS / KSPLIT;
    const int64_t nvec = p.K / WPV, groups = LM_MIN((p.N + RPW - 1) / RPW, g_hi), rc = smx_row_chunks(p.K);
    /* The weights do not depend on the previous kernel: start streaming this warp's first
     * batch, let the next kernel start too, and only then wait for our inputs. */
    pdl_trigger();
    uint4 raw[RPW][UNROLL]; /* the batch in flight: first that of the first group */
    uint4 raw2[PF2 ? RPW : 1][PF2 ? UNROLL : 1]; /* PF2: the first batch of the second group */
    const int64_t grp0 = g_lo + (int64_t)vb * groups_per_block + gw, gstep = (int64_t)vg * groups_per_block;
    if (grp0 < groups) {
        const uint4 *w[RPW];
        int64_t rows[RPW];
        group_rows<RPW, EPI>(p, grp0, w, rows);
        load_batch<RPW, UNROLL, KSPLIT>(w, (int64_t)slice * 32 + lane, nvec, raw);
    }
    if constexpr (PF2 != 0) {
        if (grp0 + gstep < groups) {
            const uint4 *w[RPW];
            int64_t rows[RPW];
            group_rows<RPW, EPI>(p, grp0 + gstep, w, rows);
            load_batch<RPW, UNROLL, KSPLIT>(w, (int64_t)slice * 32 + lane, nvec, raw2);
        }
    }
    /* FRONT: every store a lane makes is for token lane % M (M divides 32) */
    front_at fat = {-1, 0, 0};
    if constexpr (EPI == LM__CUDA_GEMV_EPI_FRONT)
        if (!p.q_front.late_at) fat = front_at_of(p, LM_MIN(lane % M, p.M - 1));
    wait();
    if constexpr (EPI == LM__CUDA_GEMV_EPI_FRONT)
        if (p.q_front.late_at) fat = front_at_of(p, LM_MIN(lane % M, p.M - 1));
    /* RMSNORM: 1 / rms of each input row; unstaged, computed by every warp (no block
     * barrier) and applied to the inputs; staged, from the staging pass's sums and
     * applied to the finished outputs (post_rms) */
    int mrow[M];
    float inv_rms[M], post_rms[M];
#pragma unroll
    for (int m = 0; m < M; m++) {
        mrow[m] = m < p.M ? m : p.M - 1;
        inv_rms[m] = IN == LM__CUDA_GEMV_RMSNORM && !SMX ? gemv_inv_rms(p, mrow[m]) : 1.f;
        post_rms[m] = 1.f;
    }
    if (SMX) {
        __shared__ float red[WARPS][M];
        stage_input<IN, M>(p, xs, red);
        if (IN == LM__CUDA_GEMV_RMSNORM) gemv_inv_rows<M>(p, red, post_rms);
    }
    /* one row group of the warp (g0: the block's first); buf holds its first batch when
     * prefetched, later batches are loaded into it */
    auto run_group = [&](int64_t g0, uint4 (&buf)[RPW][UNROLL], int prefetched) {
        const int64_t grp = g0 + gw, n0 = grp * RPW;
        /* KSPLIT == 1: lane 0's rows (every lane's with a pair epilogue); else thread
         * t < GPB * RPW * M's element: virtual row g0 * RPW + t / M (group t / (RPW M) of
         * the block), token t % M (in add[0][0], scl[0]) */
        float add[RPW][M], scl[RPW];
        if (KSPLIT == 1) {
            if ((lane == 0 || EPI != LM__CUDA_GEMV_EPI_OUT) && grp < groups)
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const int64_t n = pair_row<EPI>(p, n0 + r);
                    scl[r] = row_scale<FB>(p, n);
#pragma unroll
                    for (int m = 0; m < M; m++) add[r][m] = addend(p, m, n);
                }
        } else if (threadIdx.x < GPB * RPW * M) {
            const int64_t n = pair_row<EPI>(p, g0 * RPW + threadIdx.x / M);
            add[0][0] = addend(p, threadIdx.x % M, n);
            scl[0] = row_scale<FB>(p, n);
        }
        float acc[RPW][M];
#pragma unroll
        for (int r = 0; r < RPW; r++)
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = 0.f;
        if (grp < groups) {
            const uint4 *w[RPW];
            int64_t rows[RPW];
            group_rows<RPW, EPI>(p, grp, w, rows);
            for (int64_t v0 = (int64_t)slice * 32 + lane; v0 < nvec; v0 += (int64_t)KSPLIT * 32 * UNROLL) {
                if (!prefetched) load_batch<RPW, UNROLL, KSPLIT>(w, v0, nvec, buf);
                prefetched = 0;
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    int64_t vi = v0 + (int64_t)u * KSPLIT * 32;
                    if (vi >= nvec) break;
                    float t[RPW][M]; /* this vector's q . x */
#pragma unroll
                    for (int r = 0; r < RPW; r++)
#pragma unroll
                        for (int m = 0; m < M; m++) t[r][m] = 0.f;
#pragma unroll
                    for (int c = 0; c < CH; c++) {
                        const int64_t k0 = vi * WPV + c * 8;
                        float nw[8];
                        if (IN == LM__CUDA_GEMV_RMSNORM && !SMX) {
                            float4 a = *(const float4 *)(p.norm_w + k0), b = *(const float4 *)(p.norm_w + k0 + 4);
                            nw[0] = a.x, nw[1] = a.y, nw[2] = a.z, nw[3] = a.w;
                            nw[4] = b.x, nw[5] = b.y, nw[6] = b.z, nw[7] = b.w;
                        }
                        float wf[RPW][8];
#pragma unroll
                        for (int r = 0; r < RPW; r++) decode8<FB>(buf[r][u], c, wf[r]);
#pragma unroll
                        for (int m = 0; m < M; m++) {
                            float x[8];
                            if (SMX) {
                                float4 a = xs[m * rc + smx_swizzle(k0 / 4)], b = xs[m * rc + smx_swizzle(k0 / 4 + 1)];
                                x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
                                x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
                            } else {
                                load_in<IN>(p, mrow[m], k0, inv_rms[m], nw, x);
                            }
#pragma unroll
                            for (int r = 0; r < RPW; r++)
#pragma unroll
                                for (int i = 0; i < 8; i++) t[r][m] += wf[r][i] * x[i];
                        }
                    }
#pragma unroll
                    for (int r = 0; r < RPW; r++) {
                        /* int4: the vector's group scale (32 k lie in one group); the others: 1 here */
                        float s =
                            FB == LM__CUDA_GEMV_I4 ? load_scale(p.scales, p.scale16, rows[r] * p.lds + vi * WPV / p.group)
                                                  : 1.f;
#pragma unroll
                        for (int m = 0; m < M; m++) acc[r][m] += t[r][m] * s;
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < RPW; r++)
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = warp_sum(acc[r][m]);
        if (KSPLIT == 1 && EPI != LM__CUDA_GEMV_EPI_OUT) { /* lane t < RPW / 2 * M: pair t / M of token t % M */
            if (grp < groups && lane < RPW / 2 * M) {
                float va = 0.f, vb = 0.f;
#pragma unroll
                for (int q = 0; q < RPW / 2; q++)
#pragma unroll
                    for (int m = 0; m < M; m++)
                        if (q * M + m == lane) {
                            va = acc[2 * q][m] * scl[2 * q] * post_rms[m] + add[2 * q][m];
                            vb = acc[2 * q + 1][m] * scl[2 * q + 1] * post_rms[m] + add[2 * q + 1][m];
                        }
                const int64_t j = n0 + 2 * (lane / M);
                if (j < p.N && lane % M < p.M) pair_store<EPI>(p, fat, lane % M, j, va, vb);
            }
        } else if (KSPLIT == 1) {
            if (lane == 0 && grp < groups)
#pragma unroll
                for (int r = 0; r < RPW; r++)
                    if (n0 + r < p.N)
#pragma unroll
                        for (int m = 0; m < M; m++)
                            if (m < p.M) p.out[m * p.ldo + n0 + r] = acc[r][m] * scl[r] * post_rms[m] + add[r][m];
        } else {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < RPW; r++)
#pragma unroll
                    for (int m = 0; m < M; m++) part[warp][r][m] = acc[r][m]; /* warp = gw * KSPLIT + slice */
            __syncthreads();
            if (threadIdx.x < GPB * RPW * M) { /* the block's GPB groups, one output a thread */
                const int t = threadIdx.x, gi = t / (RPW * M), r = (t / M) % RPW, m = t % M;
                const int64_t n = g0 * RPW + t / M; /* virtual row (gi * RPW + r) of group g0 + gi */
                if (n < p.N && m < p.M) {
                    float v = 0.f, post = 1.f;
#pragma unroll
                    for (int s = 0; s < KSPLIT; s++) v += part[gi * KSPLIT + s][r][m];
#pragma unroll
                    for (int i = 0; i < M; i++)
                        if (i == m) post = post_rms[i];
                    v = v * scl[0] * post + add[0][0];
                    if constexpr (E) fin[gi][r][m] = v;
                    else p.out[m * p.ldo + n] = v;
                }
            }
            if constexpr (E) {
                /* the values above span warps 0-1 when GPB > 1 (block-uniform branch) */
                if (GPB > 1) __syncthreads();
                if (warp == 0) {
                    __syncwarp();
                    for (int q = lane; q < GPB * (RPW / 2) * M; q += 32) { /* pair q / M % (RPW / 2), token q % M */
                        const int gi = q / ((RPW / 2) * M), pr = (q / M) % (RPW / 2), m = q % M;
                        const int64_t j = g0 * RPW + gi * RPW + 2 * pr;
                        if (j < p.N && m < p.M) /* m = lane % M */
                            pair_store<EPI>(p, fat, m, j, fin[gi][2 * pr][m], fin[gi][2 * pr + 1][m]);
                    }
                }
            }
            __syncthreads();
        }
    };
    /* every warp of a block runs the same number of groups (shared-memory combine) */
    int64_t g0 = g_lo + (int64_t)vb * groups_per_block;
    if (g0 < groups) run_group(g0, raw, 1), g0 += gstep;
    if constexpr (PF2 != 0) {
        if (g0 < groups) run_group(g0, raw2, 1), g0 += gstep;
    }
    for (; g0 < groups; g0 += gstep) run_group(g0, raw, 0);
}

/* Whether a row's K is split over the block's warps (few row groups, and rows longer
 * than one warp's batch of batch_vecs vectors: split K to get enough busy warps) and how
 * many blocks a standalone launch uses: per_sm is the kernel's resident blocks per SM
 * (at most 4 are used), so the grid never runs a second wave. */
static inline int lm__gemv_ksplit(int64_t N, int rpw, int64_t nvec, int64_t batch_vecs, int64_t sms) {
    return (N + rpw - 1) / rpw < sms * 16 && nvec > batch_vecs ? WARPS : 1;
}

/* The split of 1, 2, 4 or 8 warps a row with the fewest dependent load rounds: a warp
 * task (a row group's K / k) takes ceil(nvec / (k batch_vecs)) batches one after another,
 * and the G k tasks run ceil(G k / (16 sms)) at a time (16 warps an SM: two resident
 * blocks); ties keep the smaller split (no combine). E.g. a 2,048 x 2,048 bf16 product
 * (Llama-3.2-1B's o): 1,024 groups; 1: 2 batches x 1 = 2 rounds, 2: 1 x 1 = 1, 8 (the
 * two-way rule above): 1 x 4 = 4. */
static inline int lm__gemv_ksplit_rounds(int64_t N, int rpw, int64_t nvec, int64_t batch_vecs, int64_t sms) {
    const int64_t groups = (N + rpw - 1) / rpw, slots = sms * 16;
    int best = 1;
    int64_t best_rounds = INT64_MAX;
    for (int k = 1; k <= WARPS; k *= 2) {
        const int64_t rounds = (groups * k + slots - 1) / slots * ((nvec + k * batch_vecs - 1) / (k * batch_vecs));
        if (rounds < best_rounds) best = k, best_rounds = rounds;
    }
    return best;
}
static inline int64_t lm__gemv_blocks(int64_t N, int rpw, int ksplit, int64_t sms, int per_sm) {
    int64_t groups = (N + rpw - 1) / rpw, per_block = WARPS / ksplit;
    return LM_MIN((groups + per_block - 1) / per_block, sms * LM_MAX(1, LM_MIN(per_sm, 4)));
}

#endif
