/* bench/gemv_sm_lab.cu — the decode GEMV's streaming rate per SM in the persistent
 * kernel's setting: one block of 8 warps on each of S SMs, each block computing its own
 * contiguous share of the rows of y = W x (bf16 W [N, K], f32 x, one row), item after
 * item, over C copies of W (C "layers", so the copies together exceed L2 and every item
 * reads its weights from memory). The bodies, timed in one process on the same inputs:
 *  - fma: the decode GEMV's body (ops/cuda/gemv_body.cuh, bf16, plain input, staged,
 *    K not split), as the persistent kernel's GEMV items call it: each warp 2 rows a group,
 *    8 weights a lane-vector decoded to f32, one FMA a weight;
 *  - mma: tensor-core products (mma.sync m16n8k16, bf16 in, f32 accumulate). The weights
 *    are the A operand, 16 rows a tile; a lane loads 16 bytes of its row g and of row
 *    g + 8 at k0 + 8t, and, since a dot product may take its k in any order, those 8 k are
 *    the lane's four A slots of two products. x is the B operand's column 0 (columns
 *    1-7 zero), split into bf16 hi + lo (x = hi + lo to ~2^-17 relative), so the sums carry
 *    f32-like input precision for two products each. The block's (tile, 32-k step) pairs are
 *    dealt to its warps in equal runs, each warp's per-tile sums land in shared memory and
 *    are added in a fixed warp order (deterministic).
 *  - mma_cp: the same products with each warp's weights staged through its own
 *    shared-memory ring by cp.async (P stages of SU 1-KiB units), so the bytes in flight
 *    are not bounded by registers.
 * mma_u8_hi_only drops the lo products (x rounded to bf16): for the rate only.
 * Prints one JSON line per body: us an item (the launch's time / C), GB/s an SM, and the
 * outputs' NMSE and max |d| / max |y| against a float64 reference computed on the host
 * for the first copy. Timing: 3 warm-up launches, then the median of 9 (events).
 * Built where nvcc is (no GPU needed), after scripts/pack_cuda_tests.sh (the reference
 * reads bf16 through the library's lm_bf16_to_f32):
 *   nvcc -O3 -std=c++17 -Iinclude -Isrc -DLOOM_HAVE_CUDA=1 -D_POSIX_C_SOURCE=200809L \
 *     --generate-code=arch=compute_90a,code=[sm_90a] -x cu bench/gemv_sm_lab.cu \
 *     -L/tmp/loom-packed -lloomall -lcudart -o gemv_lab
 * Usage: gemv_lab N K C S (e.g. gemv_lab 9728 896 8 132: Qwen2.5-0.5B's gate|up on 132
 * SMs; gemv_lab 9728 896 8 8: the rate of 8 SMs, far from the chip's bandwidth).
 * A lab, not a test: it measures; the kernels' own tests live in tests/cuda.
 */
#include "ops/cuda/gemv_body.cuh"
#include "ops/cuda/mma.cuh"
#include "lab_fill.cuh"

#include <algorithm>
#include <vector>

#define CK(e)                                                                                                      \
    do {                                                                                                           \
        cudaError_t err_ = (e);                                                                                    \
        if (err_ != cudaSuccess) {                                                                                 \
            fprintf(stderr, "gemv_lab: %s: %s\n", #e, cudaGetErrorString(err_));                                   \
            exit(2);                                                                                               \
        }                                                                                                          \
    } while (0)

struct lab_args {
    const bf16 *w; /* C copies of [N, K] */
    const float *x;
    float *y; /* C x [N] */
    int64_t N, K;
    int C;
};

/* Block b's share [lo, hi) of n units over nb blocks (sizes differ by at most one). */
__host__ __device__ static inline void share(int64_t n, int nb, int b, int64_t *lo, int64_t *hi) {
    *lo = n * b / nb, *hi = n * (b + 1) / nb;
}

__global__ void __launch_bounds__(THREADS, 1) fma_kernel(lab_args a) {
    extern __shared__ float4 xs[];
    constexpr int RPW = gemv_cfg<LM__CUDA_GEMV_BF16, 1>::RPW;
    int64_t g0, g1;
    share((a.N + RPW - 1) / RPW, gridDim.x, blockIdx.x, &g0, &g1);
    lm__cuda_gemv_params p;
    memset(&p, 0, sizeof p);
    p.in = LM__CUDA_GEMV_PLAIN, p.wf = LM__CUDA_GEMV_BF16, p.x = a.x, p.ldx = a.K, p.ldw = a.K * 2, p.ldo = a.N;
    p.M = 1, p.N = a.N, p.K = a.K, p.epi = LM__CUDA_GEMV_EPI_OUT;
    for (int c = 0; c < a.C; c++) {
        p.w = a.w + (int64_t)c * a.N * a.K, p.out = a.y + (int64_t)c * a.N;
        gemv_body<LM__CUDA_GEMV_BF16, LM__CUDA_GEMV_PLAIN, 1, 1, 1>(p, g0, g1, 0, 1, [] {}, xs);
        __syncthreads(); /* the next item restages xs */
    }
}

/* x staged as bf16 hi / lo, 8 k a thread step, then a barrier (each item restages, as
 * GEMV items do). */
__device__ __forceinline__ void stage_hi_lo(const lab_args &a, uint4 *xh, uint4 *xl) {
    for (int64_t j = threadIdx.x; j < a.K / 8; j += THREADS) {
        float4 v0 = __ldcg((const float4 *)a.x + 2 * j), v1 = __ldcg((const float4 *)a.x + 2 * j + 1);
        float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        __nv_bfloat162 h[4], l[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
            float2 hf = __bfloat1622float2(h[i]);
            l[i] = __floats2bfloat162_rn(v[2 * i] - hf.x, v[2 * i + 1] - hf.y);
        }
        xh[j] = *(uint4 *)h, xl[j] = *(uint4 *)l;
    }
    __syncthreads();
}

/* part zeroed, and this warp's run [u0, u1) of the block's (16-row tile, 32-k step) units,
 * dealt in equal runs. */
__device__ __forceinline__ void begin_rows(int64_t r0, int64_t r1, int64_t steps, float *part, int64_t *u0,
                                           int64_t *u1) {
    const int64_t tiles = (r1 - r0 + 15) / 16;
    for (int64_t i = threadIdx.x; i < tiles * WARPS * 16; i += THREADS) part[i] = 0.f;
    __syncthreads();
    share(tiles * steps, WARPS, threadIdx.x >> 5, u0, u1);
}

/* After the warps' sums are in part [tiles][WARPS][16]: row r's output, the warps added in
 * a fixed order. */
__device__ __forceinline__ void finish_rows(const float *part, int64_t r0, int64_t r1, float *y) {
    __syncthreads();
    for (int64_t r = threadIdx.x; r < r1 - r0; r += THREADS) {
        float v = 0.f;
        for (int ww = 0; ww < WARPS; ww++) v += part[((r / 16) * WARPS + ww) * 16 + r % 16];
        y[r0 + r] = v;
    }
}

/* The mma body over rows [r0, r1) of one copy: x staged as bf16 hi / lo (xh, xl: K each),
 * part [tiles][WARPS][16] the warps' per-tile sums. */
template <int U, int LO>
__device__ __forceinline__ void mma_rows(const bf16 *w, int64_t K, int64_t N, int64_t r0, int64_t r1,
                                         const uint4 *xh, const uint4 *xl, float *part, float *y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t steps = K / 32;
    int64_t u0, u1;
    begin_rows(r0, r1, steps, part, &u0, &u1);
    while (u0 < u1) {
        const int64_t tile = u0 / steps, s0 = u0 - tile * steps, s1 = LM_MIN(steps, s0 + (u1 - u0));
        const int64_t ra = LM_MIN(r0 + tile * 16 + g, N - 1), rb = LM_MIN(ra + 8, N - 1);
        const uint4 *wa = (const uint4 *)(w + ra * K) + t, *wb = (const uint4 *)(w + rb * K) + t;
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        for (int64_t s = s0; s < s1; s += U) {
            uint4 A[U], B[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const bool ok = s + u < s1;
                A[u] = ok ? __ldg(wa + (s + u) * 4) : make_uint4(0, 0, 0, 0);
                B[u] = ok ? __ldg(wb + (s + u) * 4) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                uint4 h = make_uint4(0, 0, 0, 0), l = h;
                if (g == 0 && s + u < s1) h = xh[(s + u) * 4 + t], l = xl[(s + u) * 4 + t];
                const uint32_t a1[4] = {A[u].x, B[u].x, A[u].y, B[u].y}, a2[4] = {A[u].z, B[u].z, A[u].w, B[u].w};
                mma16816(d, a1, h.x, h.y);
                mma16816(d, a2, h.z, h.w);
                if (LO) {
                    mma16816(d, a1, l.x, l.y);
                    mma16816(d, a2, l.z, l.w);
                }
            }
        }
        if (t == 0) { /* column 0: rows g and g + 8 */
            part[(tile * WARPS + warp) * 16 + g] = d[0];
            part[(tile * WARPS + warp) * 16 + g + 8] = d[2];
        }
        u0 += s1 - s0;
    }
    finish_rows(part, r0, r1, y);
}


/* The mma body with each warp's weights staged through its own shared-memory ring by
 * cp.async (16 bytes a lane, no registers held by loads in flight): P stages of SU
 * (tile, step) units, 1 KiB a unit; each lane copies exactly the 32 bytes it will read
 * (rows g and g + 8 at k0 + 8t), so a lane's own cp.async.wait_group is all the
 * synchronization the ring needs. */
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <int P, int SU>
__device__ __forceinline__ void mma_cp_rows(const bf16 *w, int64_t K, int64_t N, int64_t r0, int64_t r1,
                                            const uint4 *xh, const uint4 *xl, float *part, uint4 *ring, float *y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t steps = K / 32;
    int64_t u0, u1;
    begin_rows(r0, r1, steps, part, &u0, &u1);
    uint4 *my = ring + (int64_t)warp * P * SU * 64; /* [P][SU][2][32] uint4 */
    const int64_t nst = (u1 - u0 + SU - 1) / SU;
    auto issue = [&](int64_t st) {
        if (st < nst) {
#pragma unroll
            for (int j = 0; j < SU; j++) {
                const int64_t u = u0 + st * SU + j;
                const bool ok = u < u1;
                const int64_t uu = ok ? u : u0, tile = uu / steps, s = uu - tile * steps;
                const int64_t ra = LM_MIN(r0 + tile * 16 + g, N - 1), rb = LM_MIN(ra + 8, N - 1);
                uint4 *d = my + ((st % P) * SU + j) * 64;
                cp_async16(d + lane, (const uint4 *)(w + ra * K) + s * 4 + t, ok);
                cp_async16(d + 32 + lane, (const uint4 *)(w + rb * K) + s * 4 + t, ok);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int st = 0; st < P - 1; st++) issue(st);
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    int64_t cur = u0 < u1 ? u0 / steps : -1;
    for (int64_t st = 0; st < nst; st++) {
        issue(st + P - 1);
        cp_wait<P - 1>();
#pragma unroll
        for (int j = 0; j < SU; j++) {
            const int64_t u = u0 + st * SU + j;
            if (u >= u1) break;
            const int64_t tile = u / steps, s = u - tile * steps;
            if (tile != cur) {
                if (t == 0) {
                    part[(cur * WARPS + warp) * 16 + g] = d[0];
                    part[(cur * WARPS + warp) * 16 + g + 8] = d[2];
                }
                d[0] = d[1] = d[2] = d[3] = 0.f;
                cur = tile;
            }
            const uint4 *src = my + ((st % P) * SU + j) * 64;
            const uint4 A = src[lane], B = src[32 + lane];
            uint4 h = make_uint4(0, 0, 0, 0), l = h;
            if (g == 0) h = xh[s * 4 + t], l = xl[s * 4 + t];
            const uint32_t a1[4] = {A.x, B.x, A.y, B.y}, a2[4] = {A.z, B.z, A.w, B.w};
            mma16816(d, a1, h.x, h.y);
            mma16816(d, a2, h.z, h.w);
            mma16816(d, a1, l.x, l.y);
            mma16816(d, a2, l.z, l.w);
        }
    }
    cp_wait<0>();
    if (cur >= 0 && t == 0) {
        part[(cur * WARPS + warp) * 16 + g] = d[0];
        part[(cur * WARPS + warp) * 16 + g + 8] = d[2];
    }
    finish_rows(part, r0, r1, y);
}


/* The tensor-core bodies' kernel: P = 0 the register body (U steps of loads in flight a
 * lane, LO: x's lo half too), else the cp.async ring of P stages of SU units. */
template <int U, int LO, int P, int SU>
__global__ void __launch_bounds__(THREADS, 1) mma_kernel(lab_args a) {
    extern __shared__ uint4 sm[];
    uint4 *xh = sm, *xl = sm + a.K / 8, *ring = xl + a.K / 8;
    float *part = (float *)(ring + WARPS * P * SU * 64);
    const int64_t tiles = (a.N + 15) / 16;
    int64_t t0, t1;
    share(tiles, gridDim.x, blockIdx.x, &t0, &t1);
    const int64_t r0 = t0 * 16, r1 = LM_MIN(a.N, t1 * 16);
    for (int c = 0; c < a.C; c++) {
        stage_hi_lo(a, xh, xl);
        const bf16 *w = a.w + (int64_t)c * a.N * a.K;
        float *y = a.y + (int64_t)c * a.N;
        if (r0 < r1) {
            if constexpr (P == 0) mma_rows<U, LO>(w, a.K, a.N, r0, r1, xh, xl, part, y);
            else mma_cp_rows<P, SU>(w, a.K, a.N, r0, r1, xh, xl, part, ring, y);
        }
        __syncthreads();
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s N K C S\n", argv[0]);
        return 2;
    }
    lab_args a;
    a.N = atoll(argv[1]), a.K = atoll(argv[2]), a.C = atoi(argv[3]);
    const int S = atoi(argv[4]);
    if (a.N < 16 || a.K % 32 || a.C < 1 || S < 1) {
        fprintf(stderr, "gemv_lab: N >= 16, K a multiple of 32, C >= 1, S >= 1\n");
        return 2;
    }
    const int64_t nw = a.N * a.K * a.C;
    bf16 *w;
    float *x, *y;
    CK(cudaMalloc(&w, nw * 2));
    CK(cudaMalloc(&x, a.K * 4));
    CK(cudaMalloc(&y, a.N * a.C * 4));
    lab_fill<<<1024, 256>>>(w, nw, 7, 0.1f);
    std::vector<float> hx(a.K);
    for (int64_t k = 0; k < a.K; k++) hx[k] = sinf(0.37f * (float)k) * (1.f + 0.001f * (float)k);
    CK(cudaMemcpy(x, hx.data(), a.K * 4, cudaMemcpyHostToDevice));
    a.w = w, a.x = x, a.y = y;
    int64_t t0, t1, mt = 0;
    for (int b = 0; b < S; b++) share((a.N + 15) / 16, S, b, &t0, &t1), mt = std::max(mt, t1 - t0);
    /* the reference: copy 0 in float64 */
    std::vector<uint16_t> hw(a.N * a.K);
    CK(cudaMemcpy(hw.data(), w, a.N * a.K * 2, cudaMemcpyDeviceToHost));
    std::vector<double> ref(a.N);
    double rmax = 0, rss = 0;
    for (int64_t n = 0; n < a.N; n++) {
        double s = 0;
        for (int64_t k = 0; k < a.K; k++) s += (double)lm_bf16_to_f32(hw[n * a.K + k]) * hx[k];
        ref[n] = s, rmax = std::max(rmax, fabs(s)), rss += s * s;
    }
    const size_t fma_smem = (size_t)smx_row_chunks(a.K) * 16;
    const size_t mma_smem = (size_t)a.K / 8 * 32 + (size_t)mt * WARPS * 16 * 4;
    CK(cudaFuncSetAttribute(fma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fma_smem));
    int smem_max = 0;
    CK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    auto ring = [&](int P, int SU) { return mma_smem + (size_t)WARPS * P * SU * 64 * 16; };
    auto allow = [&](const void *f, size_t bytes) {
        if (bytes <= (size_t)smem_max) CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    };
    allow((const void *)mma_kernel<4, 1, 0, 1>, mma_smem);
    allow((const void *)mma_kernel<8, 1, 0, 1>, mma_smem);
    allow((const void *)mma_kernel<8, 0, 0, 1>, mma_smem);
    allow((const void *)mma_kernel<1, 1, 4, 2>, ring(4, 2));
    allow((const void *)mma_kernel<1, 1, 4, 4>, ring(4, 4));
    allow((const void *)mma_kernel<1, 1, 6, 4>, ring(6, 4));
    struct body {
        const char *name;
        void (*run)(const lab_args &, int, size_t);
        size_t smem;
    } bodies[] = {
        {"fma", [](const lab_args &aa, int s, size_t sm) { fma_kernel<<<s, THREADS, sm>>>(aa); }, fma_smem},
        {"mma_u4", [](const lab_args &aa, int s, size_t sm) { mma_kernel<4, 1, 0, 1><<<s, THREADS, sm>>>(aa); }, mma_smem},
        {"mma_u8", [](const lab_args &aa, int s, size_t sm) { mma_kernel<8, 1, 0, 1><<<s, THREADS, sm>>>(aa); }, mma_smem},
        /* x as bf16 alone (hi): half the products, bf16 input precision; for the rate only */
        {"mma_u8_hi_only", [](const lab_args &aa, int s, size_t sm) { mma_kernel<8, 0, 0, 1><<<s, THREADS, sm>>>(aa); },
         mma_smem},
        /* cp.async rings of P stages of SU KiB a warp: 64, 128 and 192 KiB an SM */
        {"mma_cp_p4_su2", [](const lab_args &aa, int s, size_t sm) { mma_kernel<1, 1, 4, 2><<<s, THREADS, sm>>>(aa); },
         ring(4, 2)},
        {"mma_cp_p4_su4", [](const lab_args &aa, int s, size_t sm) { mma_kernel<1, 1, 4, 4><<<s, THREADS, sm>>>(aa); },
         ring(4, 4)},
        {"mma_cp_p6_su4", [](const lab_args &aa, int s, size_t sm) { mma_kernel<1, 1, 6, 4><<<s, THREADS, sm>>>(aa); },
         ring(6, 4)},
    };
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> hy(a.N);
    for (auto &b : bodies) {
        if (b.smem > (size_t)smem_max) {
            printf("{\"lab\":\"gemv_sm\",\"body\":\"%s\",\"skipped\":\"%zu bytes of shared memory\"}\n", b.name, b.smem);
            continue;
        }
        CK(cudaMemset(y, 0xff, a.N * a.C * 4)); /* poisoned: NaN */
        for (int i = 0; i < 3; i++) b.run(a, S, b.smem);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> ms;
        for (int i = 0; i < 9; i++) {
            CK(cudaEventRecord(e0));
            b.run(a, S, b.smem);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float m;
            CK(cudaEventElapsedTime(&m, e0, e1));
            ms.push_back(m);
        }
        std::sort(ms.begin(), ms.end());
        CK(cudaMemcpy(hy.data(), y, a.N * 4, cudaMemcpyDeviceToHost));
        double es = 0, emax = 0;
        for (int64_t n = 0; n < a.N; n++) {
            double d = (double)hy[n] - ref[n];
            es += d * d, emax = std::max(emax, fabs(d));
            if (hy[n] != hy[n]) es = emax = INFINITY;
        }
        const double us = ms[4] * 1e3 / a.C, bytes = (double)a.N * a.K * 2;
        printf("{\"lab\":\"gemv_sm\",\"body\":\"%s\",\"N\":%lld,\"K\":%lld,\"copies\":%d,\"sms\":%d,\"us_an_item\":%.3f,"
               "\"gb_s\":%.1f,\"gb_s_an_sm\":%.2f,\"nmse\":%.3e,\"max_rel\":%.3e}\n",
               b.name, (long long)a.N, (long long)a.K, a.C, S, us, bytes / us * 1e-3, bytes / us * 1e-3 / S,
               es / rss, emax / rmax);
    }
    return 0;
}
