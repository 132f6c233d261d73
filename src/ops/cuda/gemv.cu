/* ops/cuda/gemv.cu — the Linear of a few rows: matrix-vector products for decode (M <= 8 rows), with the
 * preceding elementwise step fused into the input read and the residual add into
 * the output write.
 *
 * Decode reads every weight byte once per step, so this kernel is about keeping
 * enough 16-byte weight loads in flight to stream W (bf16 [N, K]) at full bandwidth:
 *  - a warp owns RPW = 2 output rows and a slice of K; each lane issues UNROLL = 4
 *    16-byte loads per row (8 independent loads) before using any of them;
 *  - when N is small (o and down projections, N ~ H) a row's K is split over KSPLIT =
 *    8 warps of one block, combined through shared memory, so there are enough warps
 *    to cover the GPU; when N is large (q|k|v, gate|up, lm_head) KSPLIT = 1 and each
 *    warp owns whole rows;
 *  - the grid is at most 4 blocks per SM and walks the row groups in a stride loop,
 *    so per-block work (the RMSNorm prologue) is paid a few hundred times, not once
 *    per pair of rows (the lm_head has 150k rows).
 *  - launched with programmatic dependent launch: each warp issues its first batch of
 *    weight loads before waiting for the previous kernel (pdl_wait), so the weight
 *    stream of this projection overlaps the tail of the kernel before it.
 * Inputs: PLAIN x; RMSNORM x / rms(x) * norm_w (1/rms of each row computed by every
 * warp from L1/L2: no block barrier on the critical path); SWIGLU silu(gate) * up from
 * x = [gate | up]. The M input rows are tiny and
 * served from L1/L2. Work O(M * N * K); bytes ~ 2 * N * K.
 */
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

template <int IN, int M, int KSPLIT>
__global__ void __launch_bounds__(THREADS) gemv_kernel(lm__cuda_gemv_params p) {
    __shared__ float part[KSPLIT > 1 ? KSPLIT : 1][RPW][M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slice = warp % KSPLIT, gw = warp / KSPLIT; /* K slice, row group within the block */
    const int groups_per_block = WARPS / KSPLIT;
    const int64_t nvec = p.K / 8, groups = (p.N + RPW - 1) / RPW;
    /* The weights do not depend on the previous kernel: start streaming this warp's first
     * batch, let the next kernel start too, and only then wait for our inputs. */
    pdl_trigger();
    uint4 first[RPW][UNROLL];
    const int64_t grp0 = (int64_t)blockIdx.x * groups_per_block + gw;
    if (grp0 < groups) {
        const uint4 *w[RPW];
        group_rows(p, grp0, nvec, w);
        load_batch<KSPLIT>(w, (int64_t)slice * 32 + lane, nvec, first);
    }
    pdl_wait();
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
    for (int64_t g0 = (int64_t)blockIdx.x * groups_per_block; g0 < groups; g0 += (int64_t)gridDim.x * groups_per_block) {
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

static int sm_count(void) {
    static int cached[LM__CUDA_MAX_DEVICES];
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev < 0 || dev >= LM__CUDA_MAX_DEVICES) return 132;
    if (!cached[dev]) {
        int n = 0;
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        cached[dev] = n > 0 ? n : 132;
    }
    return cached[dev];
}

template <int IN, int M>
static lm_status launch(const lm__cuda_gemv_params *p, cudaStream_t s) {
    int64_t groups = (p->N + RPW - 1) / RPW, sms = sm_count();
    int ksplit = groups < sms * 16 ? WARPS : 1; /* few rows: split K to get enough warps */
    int64_t per_block = WARPS / ksplit, blocks = LM_MIN((groups + per_block - 1) / per_block, sms * 4);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {dim3((unsigned)blocks), dim3(THREADS), 0, s, &attr, 1};
    cudaError_t e = ksplit == 1 ? cudaLaunchKernelEx(&cfg, gemv_kernel<IN, M, 1>, *p)
                                : cudaLaunchKernelEx(&cfg, gemv_kernel<IN, M, WARPS>, *p);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "linear_gemv launch");
    return lm__cuda_launched("linear_gemv");
}

template <int IN>
static lm_status launch_m(const lm__cuda_gemv_params *p, cudaStream_t s) {
    switch (p->M) {
    case 1: return launch<IN, 1>(p, s);
    case 2: return launch<IN, 2>(p, s);
    case 3: return launch<IN, 3>(p, s);
    case 4: return launch<IN, 4>(p, s);
    case 5: return launch<IN, 5>(p, s);
    case 6: return launch<IN, 6>(p, s);
    case 7: return launch<IN, 7>(p, s);
    default: return launch<IN, 8>(p, s);
    }
}

lm_status lm__cuda_linear_gemv(const lm__cuda_gemv_params *p, cudaStream_t s) {
    if (p->M < 1 || p->M > LM__CUDA_GEMV_MAX_ROWS || p->K % 8 != 0 || p->ldx % 4 != 0 || ((uintptr_t)p->w & 15) ||
        ((uintptr_t)p->x & 15))
        return lm__error(LM_UNSUPPORTED, "linear_gemv: M = %d (1..%d), K = %lld (multiple of 8) or alignment not supported",
                         p->M, LM__CUDA_GEMV_MAX_ROWS, (long long)p->K);
    if (p->N == 0) return LM_OK;
    switch (p->in) {
    case LM__CUDA_GEMV_PLAIN: return launch_m<LM__CUDA_GEMV_PLAIN>(p, s);
    case LM__CUDA_GEMV_RMSNORM: return launch_m<LM__CUDA_GEMV_RMSNORM>(p, s);
    default: return launch_m<LM__CUDA_GEMV_SWIGLU>(p, s);
    }
}
