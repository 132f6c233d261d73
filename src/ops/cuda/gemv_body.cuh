/* ops/cuda/gemv_body.cuh — the decode GEMV's device code (ops/cuda/gemv.cu describes
 * the kernel), as a function of the block's number so that a kernel running several
 * step operators in one launch can call it too. Included by .cu files only. */
#ifndef LOOM_OPS_CUDA_GEMV_BODY_CUH
#define LOOM_OPS_CUDA_GEMV_BODY_CUH

#include "ops/cuda/common.cuh"

#define WARPS 8
#define RPW 2
#define UNROLL 4
#define THREADS (32 * WARPS)

/* 8 consecutive inputs of row m starting at column k, as the prologue defines them. */
template <int IN>
__device__ __forceinline__ void load_in(const lm__cuda_gemv_params &p, int m, int64_t k, float inv, const float *nw,
                                        float *v) {
    const float *xr = p.x + m * p.ldx + k;
    float4 a = *(const float4 *)xr, b = *(const float4 *)(xr + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    if (IN == LM__CUDA_GEMV_RMSNORM) {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] *= inv * nw[i];
    } else if (IN == LM__CUDA_GEMV_SWIGLU) {
        const float *ur = xr + p.K;
        float4 c = *(const float4 *)ur, d = *(const float4 *)(ur + 4);
        float u[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = v[i] / (1.f + __expf(-v[i])) * u[i];
    }
}

__device__ __forceinline__ float dot8(uint4 raw, const float *x) {
    const __nv_bfloat162 *w2 = (const __nv_bfloat162 *)&raw;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(w2[i]);
        s += f.x * x[2 * i] + f.y * x[2 * i + 1];
    }
    return s;
}

/* What output (m, n) adds to its product: the bias, and the residual when
 * accumulating. Read at the start of a row group's iteration, by the thread that will
 * store the element, so these loads overlap the weight stream instead of adding a
 * memory round trip after it (always after pdl_wait: the residual is the previous
 * kernel's output). */
__device__ __forceinline__ float addend(const lm__cuda_gemv_params &p, int m, int64_t n) {
    if (n >= p.N) return 0.f;
    float v = p.bias ? p.bias[n] : 0.f;
    return p.accumulate ? v + p.out[m * p.ldo + n] : v;
}

/* Issues the UNROLL x RPW weight loads of one batch (zeros past the row's end). */
template <int KSPLIT>
__device__ __forceinline__ void load_batch(const uint4 *const *w, int64_t v0, int64_t nvec, uint4 (*raw)[UNROLL]) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        int64_t vi = v0 + (int64_t)u * KSPLIT * 32;
#pragma unroll
        for (int r = 0; r < RPW; r++) raw[r][u] = vi < nvec ? __ldg(w[r] + vi) : make_uint4(0, 0, 0, 0);
    }
}

/* Row pointers of row group grp (rows past N repeat the last row; never stored). */
__device__ __forceinline__ void group_rows(const lm__cuda_gemv_params &p, int64_t grp, int64_t nvec, const uint4 **w) {
#pragma unroll
    for (int r = 0; r < RPW; r++) w[r] = (const uint4 *)p.w + LM_MIN(grp * RPW + r, p.N - 1) * nvec;
}

/* The kernel's body for block vb of vg (its own launch passes its block index and grid
 * size). wait() is called once, by every thread, after the first weight batch is in
 * flight and before any input is read: pdl_wait in its own launch. */
template <int IN, int M, int KSPLIT, typename Wait>
__device__ __forceinline__ void gemv_body(const lm__cuda_gemv_params &p, int vb, int vg, Wait wait) {
    __shared__ float part[KSPLIT > 1 ? KSPLIT : 1][RPW][M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slice = warp % KSPLIT, gw = warp / KSPLIT; /* K slice, row group within the block */
    const int groups_per_block = WARPS / KSPLIT;
    const int64_t nvec = p.K / 8, groups = (p.N + RPW - 1) / RPW;
    /* The weights do not depend on the previous kernel: start streaming this warp's first
     * batch, let the next kernel start too, and only then wait for our inputs. */
    pdl_trigger();
    uint4 first[RPW][UNROLL];
    const int64_t grp0 = (int64_t)vb * groups_per_block + gw;
    if (grp0 < groups) {
        const uint4 *w[RPW];
        group_rows(p, grp0, nvec, w);
        load_batch<KSPLIT>(w, (int64_t)slice * 32 + lane, nvec, first);
    }
    wait();
    float inv_rms[M]; /* RMSNORM: 1 / rms of each input row, per warp (no block barrier) */
#pragma unroll
    for (int m = 0; m < M; m++) {
        inv_rms[m] = 1.f;
        if (IN == LM__CUDA_GEMV_RMSNORM) {
            const float4 *xr = (const float4 *)(p.x + m * p.ldx);
            float ss = 0.f;
#pragma unroll 4
            for (int64_t k4 = lane; k4 < p.K / 4; k4 += 32) {
                float4 a = xr[k4];
                ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            }
            inv_rms[m] = rsqrtf(warp_sum(ss) / (float)p.K + p.eps);
        }
    }
    int prefetched = 1; /* `first` holds the first batch of the first group */
    /* every warp of a block runs the same number of iterations (shared-memory combine) */
    for (int64_t g0 = (int64_t)vb * groups_per_block; g0 < groups; g0 += (int64_t)vg * groups_per_block) {
        const int64_t grp = g0 + gw, n0 = grp * RPW;
        float add[RPW][M]; /* KSPLIT == 1: lane 0's rows; else thread t < RPW * M's element (in add[0][0]) */
        if (KSPLIT == 1) {
            if (lane == 0 && grp < groups)
#pragma unroll
                for (int r = 0; r < RPW; r++)
#pragma unroll
                    for (int m = 0; m < M; m++) add[r][m] = addend(p, m, n0 + r);
        } else if (threadIdx.x < RPW * M) {
            add[0][0] = addend(p, threadIdx.x % M, g0 * RPW + threadIdx.x / M);
        }
        float acc[RPW][M];
#pragma unroll
        for (int r = 0; r < RPW; r++)
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = 0.f;
        if (grp < groups) {
            const uint4 *w[RPW];
            group_rows(p, grp, nvec, w);
            for (int64_t v0 = (int64_t)slice * 32 + lane; v0 < nvec; v0 += (int64_t)KSPLIT * 32 * UNROLL) {
                uint4 raw[RPW][UNROLL];
                if (prefetched) {
#pragma unroll
                    for (int r = 0; r < RPW; r++)
#pragma unroll
                        for (int u = 0; u < UNROLL; u++) raw[r][u] = first[r][u];
                    prefetched = 0;
                } else {
                    load_batch<KSPLIT>(w, v0, nvec, raw);
                }
#pragma unroll
                for (int u = 0; u < UNROLL; u++) {
                    int64_t vi = v0 + (int64_t)u * KSPLIT * 32;
                    if (vi >= nvec) break;
                    float nw[8];
                    if (IN == LM__CUDA_GEMV_RMSNORM) {
                        float4 a = *(const float4 *)(p.norm_w + vi * 8), b = *(const float4 *)(p.norm_w + vi * 8 + 4);
                        nw[0] = a.x, nw[1] = a.y, nw[2] = a.z, nw[3] = a.w, nw[4] = b.x, nw[5] = b.y, nw[6] = b.z, nw[7] = b.w;
                    }
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        float x[8];
                        load_in<IN>(p, m, vi * 8, inv_rms[m], nw, x);
#pragma unroll
                        for (int r = 0; r < RPW; r++) acc[r][m] += dot8(raw[r][u], x);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < RPW; r++)
#pragma unroll
            for (int m = 0; m < M; m++) acc[r][m] = warp_sum(acc[r][m]);
        if (KSPLIT == 1) {
            if (lane == 0 && grp < groups)
#pragma unroll
                for (int r = 0; r < RPW; r++)
                    if (n0 + r < p.N)
#pragma unroll
                        for (int m = 0; m < M; m++) p.out[m * p.ldo + n0 + r] = acc[r][m] + add[r][m];
        } else {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < RPW; r++)
#pragma unroll
                    for (int m = 0; m < M; m++) part[slice][r][m] = acc[r][m];
            __syncthreads();
            if (threadIdx.x < RPW * M) { /* one row group per block when KSPLIT == WARPS */
                int r = threadIdx.x / M, m = threadIdx.x % M;
                int64_t n = g0 * RPW + r;
                if (n < p.N) {
                    float v = 0.f;
#pragma unroll
                    for (int s = 0; s < KSPLIT; s++) v += part[s][r][m];
                    p.out[m * p.ldo + n] = v + add[0][0];
                }
            }
            __syncthreads();
        }
    }
}

/* Whether a row's K is split over the block's warps (few rows: split K to get enough
 * warps) and how many blocks a standalone launch uses. */
static inline int lm__gemv_ksplit(int64_t N, int64_t sms) { return (N + RPW - 1) / RPW < sms * 16 ? WARPS : 1; }
static inline int64_t lm__gemv_blocks(int64_t N, int64_t sms) {
    int64_t groups = (N + RPW - 1) / RPW, per_block = WARPS / lm__gemv_ksplit(N, sms);
    return LM_MIN((groups + per_block - 1) / per_block, sms * 4);
}

#endif
