/* ops/cuda/gemv_quant.cu — lm_linear_out with quantized weights on CUDA: int8 (i8 [N, K],
 * f32 scales [N]), fp8 e4m3 (f8_e4m3 [N, K], f32 scales [N]) and int4 (u8 [N, K/2], two
 * nibbles per byte, low = even k, f32 scales [N, K/G] for groups of G = 32/64/128 k).
 *
 * Four paths, none allocating (a captured step may hold them):
 *  - the decode GEMV (M <= 8 rows): gemv.cu's structure with quantized weights. A warp
 *    owns RPW = 2 rows and streams their bytes in 16-byte loads (16 int8/fp8 or 32 int4
 *    weights each), UNROLL = 4 loads per row in flight per lane, the first batch issued
 *    before pdl_wait; split-K over KSPLIT = 8 warps when N is small; the input form is a
 *    template argument. Weights are decoded to f32 in registers (int8: shifts; fp8: cvt
 *    e4m3x2 -> f16x2, exact; int4: shifts of the nibbles) and multiplied with f32 x. int8/fp8 apply the row scale once
 *    per output after the sum; int4 the group scale once per 16-byte vector (32 k lie in
 *    one group since G is a multiple of 32). Bytes ~ N * K (int8/fp8), N * K / 2 + scales
 *    (int4); O(M * N * K) FMAs.
 *  - the product for more rows (prefill): a bf16 tensor-core (WMMA 16x16x16) tiled GEMM,
 *    64 x 64 outputs per block, K in steps of 32, that dequantizes each weight tile into
 *    shared memory (int8/fp8 values are exact in bf16 and their row scale is applied in
 *    the f32 epilogue; int4 tiles are stored as bf16(q * group scale)) and rounds x to bf16
 *    on the way in. Not a native int8/fp8 GEMM: the tensor cores see bf16.
 *  - with a workspace (lm_linear_workspace_bytes), for more than 8 rows instead: in(x)
 *    rounded to bf16 [M, K] and the weights dequantized to bf16(q * scale) [N, K] in it,
 *    then one cuBLASLt GEMM with the bias and accumulate in its epilogue (prefill and
 *    batched decode at the bf16 GEMM's speed plus one pass over the weights).
 *  - a readable kernel for every other layout (any strides, any float out, any K): one
 *    warp per output, f32 accumulation.
 * Input forms (PLAIN, RMSNORM, SWIGLU), bias and accumulate as lm_linear_out defines them,
 * in every kernel. f32 x only (lm_linear_out checks it).
 */
#include "ops/cuda/common.cuh"

#include <cuda_fp8.h>
#include <mma.h>

#define WARPS 8
#define RPW 2
#define UNROLL 4
#define THREADS (32 * WARPS)

enum { Q_I8 = 0, Q_F8 = 1, Q_I4 = 2 };

struct qparams {
    int in;         /* LM_LINEAR_IN, _RMSNORM, _SWIGLU */
    const float *x; /* [M, K] or [M, 2K] (SWIGLU), row stride ldx, column stride xs1 */
    int64_t ldx, xs1;
    const float *norm_w; /* RMSNORM: [K], stride nws */
    int64_t nws;
    float eps;
    const uint8_t *w; /* rows of ldw bytes (elements for the readable kernel: ws1 along K) */
    int64_t ldw, ws1;
    const float *scales; /* [N] or [N, K/G]: row stride lds, column stride ss1 */
    int64_t lds, ss1;
    int group;
    const float *bias; /* [N] stride bs, or NULL */
    int64_t bs;
    void *out; /* [M, N]: row stride ldo, column stride os1 */
    int64_t ldo, os1;
    int accumulate;
    int M;
    int64_t N, K;
};

/* ---- weight decoding ------------------------------------------------------------------------- */
/* Weights c * 8 .. c * 8 + 7 of a 16-byte vector (16 for int8/fp8, 32 for int4), as f32
 * integers (int8, int4) or e4m3 values (fp8). */
template <int F>
__device__ __forceinline__ void decode8(const uint4 &raw, int c, float *w) {
    const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
    if (F == Q_I4) {
        uint32_t v = u[c];
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = (float)((int32_t)(v << (28 - 4 * i)) >> 28);
    } else if (F == Q_I8) {
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

/* One weight (n, k) for the readable kernel: the quantized value times its scale. */
__device__ __forceinline__ float weight_at(const qparams &p, int f, int64_t n, int64_t k) {
    if (f == Q_I4) {
        int b = p.w[n * p.ldw + (k / 2) * p.ws1], v = (k & 1 ? b >> 4 : b) & 15;
        return (float)(v >= 8 ? v - 16 : v) * p.scales[n * p.lds + (k / p.group) * p.ss1];
    }
    uint8_t b = p.w[n * p.ldw + k * p.ws1];
    float q;
    if (f == Q_I8) {
        q = (float)(int8_t)b;
    } else {
        __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
        q = __half2float(__half(h));
    }
    return q * p.scales[n * p.lds];
}

/* Input element (m, k) as the prologue defines it (readable and tensor-core kernels). */
__device__ __forceinline__ float input_at(const qparams &p, int64_t m, int64_t k, float inv_rms) {
    const float *xr = p.x + m * p.ldx;
    float v = xr[k * p.xs1];
    if (p.in == LM_LINEAR_IN_RMSNORM) return v * inv_rms * p.norm_w[k * p.nws];
    if (p.in == LM_LINEAR_IN_SWIGLU) return v / (1.f + __expf(-v)) * xr[(p.K + k) * p.xs1];
    return v;
}

/* 1 / rms of input row m, by one warp (every lane gets it); 1 unless RMSNORM. */
__device__ __forceinline__ float row_inv_rms(const qparams &p, int64_t m) {
    if (p.in != LM_LINEAR_IN_RMSNORM) return 1.f;
    float ss = 0.f;
    for (int64_t k = threadIdx.x & 31; k < p.K; k += 32) {
        float v = p.x[m * p.ldx + k * p.xs1];
        ss += v * v;
    }
    return rsqrtf(warp_sum(ss) / (float)p.K + p.eps);
}

/* ---- the decode GEMV ------------------------------------------------------------------------- */
/* 8 consecutive inputs of row m from column k (unit stride, 16-byte aligned rows), for
 * the input form IN (a template argument: the form's loads and math are compiled in). */
template <int IN>
__device__ __forceinline__ void load_in8(const qparams &p, int m, int64_t k, float inv, const float *nw, float *v) {
    const float *xr = p.x + m * p.ldx + k;
    float4 a = *(const float4 *)xr, b = *(const float4 *)(xr + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    if (IN == LM_LINEAR_IN_RMSNORM) {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] *= inv * nw[i];
    } else if (IN == LM_LINEAR_IN_SWIGLU) {
        const float *ur = xr + p.K;
        float4 c = *(const float4 *)ur, d = *(const float4 *)(ur + 4);
        float u[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = v[i] / (1.f + __expf(-v[i])) * u[i];
    }
}

/* Bias and residual of output (m, n), read early (after pdl_wait) by the thread that stores it. */
__device__ __forceinline__ float addend(const qparams &p, int m, int64_t n) {
    if (n >= p.N || m >= p.M) return 0.f;
    float v = p.bias ? p.bias[n] : 0.f;
    return p.accumulate ? v + ((const float *)p.out)[m * p.ldo + n] : v;
}

template <int KSPLIT>
__device__ __forceinline__ void load_batch(const uint4 *const *w, int64_t v0, int64_t nvec, uint4 (*raw)[UNROLL]) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        int64_t vi = v0 + (int64_t)u * KSPLIT * 32;
#pragma unroll
        for (int r = 0; r < RPW; r++) raw[r][u] = vi < nvec ? __ldg(w[r] + vi) : make_uint4(0, 0, 0, 0);
    }
}

/* Rows of row group grp (rows past N repeat the last one; never stored). */
__device__ __forceinline__ void group_rows(const qparams &p, int64_t grp, const uint4 **w, int64_t *rows) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        rows[r] = LM_MIN(grp * RPW + r, p.N - 1);
        w[r] = (const uint4 *)(p.w + rows[r] * p.ldw);
    }
}

/* M is the number of rows the kernel is built for (1, 2, 4 or 8): rows m >= p.M read
 * row p.M - 1 (in bounds) and are never stored. */
template <int F, int IN, int M, int KSPLIT>
__global__ void __launch_bounds__(THREADS) gemv_quant_kernel(qparams p) {
    constexpr int WPV = F == Q_I4 ? 32 : 16; /* weights per 16-byte vector */
    constexpr int CH = WPV / 8;              /* chunks of 8 weights per vector */
    __shared__ float part[KSPLIT > 1 ? KSPLIT : 1][RPW][M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slice = warp % KSPLIT, gw = warp / KSPLIT;
    const int groups_per_block = WARPS / KSPLIT;
    const int64_t nvec = p.K / WPV, groups = (p.N + RPW - 1) / RPW;
    pdl_trigger();
    uint4 first[RPW][UNROLL];
    const int64_t grp0 = (int64_t)blockIdx.x * groups_per_block + gw;
    if (grp0 < groups) {
        const uint4 *w[RPW];
        int64_t rows[RPW];
        group_rows(p, grp0, w, rows);
        load_batch<KSPLIT>(w, (int64_t)slice * 32 + lane, nvec, first);
    }
    pdl_wait();
    int mrow[M];
    float inv_rms[M];
#pragma unroll
    for (int m = 0; m < M; m++) {
        mrow[m] = m < p.M ? m : p.M - 1;
        inv_rms[m] = 1.f;
        if (IN == LM_LINEAR_IN_RMSNORM) {
            const float4 *xr = (const float4 *)(p.x + mrow[m] * p.ldx);
            float ss = 0.f;
            for (int64_t k4 = lane; k4 < p.K / 4; k4 += 32) {
                float4 a = xr[k4];
                ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            }
            inv_rms[m] = rsqrtf(warp_sum(ss) / (float)p.K + p.eps);
        }
    }
    int prefetched = 1;
    float *out = (float *)p.out;
    for (int64_t g0 = (int64_t)blockIdx.x * groups_per_block; g0 < groups; g0 += (int64_t)gridDim.x * groups_per_block) {
        const int64_t grp = g0 + gw, n0 = grp * RPW;
        float add[RPW][M];
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
            int64_t rows[RPW];
            group_rows(p, grp, w, rows);
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
                    float t[RPW][M]; /* this vector's q . x */
#pragma unroll
                    for (int r = 0; r < RPW; r++)
#pragma unroll
                        for (int m = 0; m < M; m++) t[r][m] = 0.f;
#pragma unroll
                    for (int c = 0; c < CH; c++) {
                        const int64_t k0 = vi * WPV + c * 8;
                        float nw[8];
                        if (IN == LM_LINEAR_IN_RMSNORM) {
                            float4 a = *(const float4 *)(p.norm_w + k0), b = *(const float4 *)(p.norm_w + k0 + 4);
                            nw[0] = a.x, nw[1] = a.y, nw[2] = a.z, nw[3] = a.w;
                            nw[4] = b.x, nw[5] = b.y, nw[6] = b.z, nw[7] = b.w;
                        }
                        float wf[RPW][8];
#pragma unroll
                        for (int r = 0; r < RPW; r++) decode8<F>(raw[r][u], c, wf[r]);
#pragma unroll
                        for (int m = 0; m < M; m++) {
                            float x[8];
                            load_in8<IN>(p, mrow[m], k0, inv_rms[m], nw, x);
#pragma unroll
                            for (int r = 0; r < RPW; r++)
#pragma unroll
                                for (int i = 0; i < 8; i++) t[r][m] += wf[r][i] * x[i];
                        }
                    }
#pragma unroll
                    for (int r = 0; r < RPW; r++) {
                        /* int4: the vector's group scale; int8/fp8: the row scale comes at the end */
                        float s = F == Q_I4 ? __ldg(p.scales + rows[r] * p.lds + vi * WPV / p.group) : 1.f;
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
        if (KSPLIT == 1) {
            if (lane == 0 && grp < groups)
#pragma unroll
                for (int r = 0; r < RPW; r++)
                    if (n0 + r < p.N) {
                        float s = F == Q_I4 ? 1.f : p.scales[(n0 + r) * p.lds];
#pragma unroll
                        for (int m = 0; m < M; m++)
                            if (m < p.M) out[m * p.ldo + n0 + r] = acc[r][m] * s + add[r][m];
                    }
        } else {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < RPW; r++)
#pragma unroll
                    for (int m = 0; m < M; m++) part[slice][r][m] = acc[r][m];
            __syncthreads();
            if (threadIdx.x < RPW * M) {
                int r = threadIdx.x / M, m = threadIdx.x % M;
                int64_t n = g0 * RPW + r;
                if (n < p.N && m < p.M) {
                    float v = 0.f;
#pragma unroll
                    for (int s = 0; s < KSPLIT; s++) v += part[s][r][m];
                    out[m * p.ldo + n] = v * (F == Q_I4 ? 1.f : p.scales[n * p.lds]) + add[0][0];
                }
            }
            __syncthreads();
        }
    }
}

template <int F, int IN, int M>
static lm_status launch_gemv(const qparams *p, cudaStream_t s) {
    int64_t groups = (p->N + RPW - 1) / RPW, sms = lm__cuda_sm_count();
    int ksplit = groups < sms * 16 ? WARPS : 1; /* few rows: split K to get enough warps */
    int64_t per_block = WARPS / ksplit, blocks = LM_MIN((groups + per_block - 1) / per_block, sms * 4);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {dim3((unsigned)blocks), dim3(THREADS), 0, s, &attr, 1};
    cudaError_t e = ksplit == 1 ? cudaLaunchKernelEx(&cfg, gemv_quant_kernel<F, IN, M, 1>, *p)
                                : cudaLaunchKernelEx(&cfg, gemv_quant_kernel<F, IN, M, WARPS>, *p);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "linear_gemv_quant launch");
    return lm__cuda_launched("linear_gemv_quant");
}

template <int F, int IN>
static lm_status launch_gemv_m(const qparams *p, cudaStream_t s) {
    if (p->M == 1) return launch_gemv<F, IN, 1>(p, s);
    if (p->M == 2) return launch_gemv<F, IN, 2>(p, s);
    if (p->M <= 4) return launch_gemv<F, IN, 4>(p, s);
    return launch_gemv<F, IN, 8>(p, s);
}

template <int F>
static lm_status launch_gemv_in(const qparams *p, cudaStream_t s) {
    if (p->in == LM_LINEAR_IN_RMSNORM) return launch_gemv_m<F, LM_LINEAR_IN_RMSNORM>(p, s);
    if (p->in == LM_LINEAR_IN_SWIGLU) return launch_gemv_m<F, LM_LINEAR_IN_SWIGLU>(p, s);
    return launch_gemv_m<F, LM_LINEAR_IN>(p, s);
}

/* ---- the tensor-core product for more rows, without a workspace ----------------------------------------------------- */
#define TM 64 /* output rows (of x) per block */
#define TN 64 /* outputs (rows of w) per block */
#define TK 32 /* k per step */
#define MMA_THREADS 128

template <int F>
__global__ void __launch_bounds__(MMA_THREADS) mma_quant_kernel(qparams p) {
    using namespace nvcuda;
    __shared__ __align__(32) bf16 As[TM][TK + 8]; /* in(x) tile, bf16 */
    __shared__ __align__(32) bf16 Bs[TN][TK + 8]; /* w tile dequantized: Bs[n][k] (col-major B) */
    __shared__ __align__(32) float Cs[TM][TN + 4];
    __shared__ float inv_rms[TM];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t m0 = (int64_t)blockIdx.y * TM, n0 = (int64_t)blockIdx.x * TN;
    for (int r = warp; r < TM; r += MMA_THREADS / 32) {
        float v = m0 + r < p.M ? row_inv_rms(p, m0 + r) : 1.f;
        if (lane == 0) inv_rms[r] = v;
    }
    __syncthreads();
    const int wm = warp >> 1, wn = warp & 1; /* this warp's 32 x 32 quarter */
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(c[i][j], 0.f);
    for (int64_t k0 = 0; k0 < p.K; k0 += TK) {
#pragma unroll 4
        for (int i = 0; i < TM * TK / MMA_THREADS; i++) {
            int idx = tid + i * MMA_THREADS, r = idx / TK, kk = idx % TK;
            int64_t m = m0 + r;
            As[r][kk] = __float2bfloat16_rn(m < p.M ? input_at(p, m, k0 + kk, inv_rms[r]) : 0.f);
        }
        {
            /* 128 threads, 64 rows: each thread half a row's tile bytes (16 for int8/fp8 = 16
             * weights; 8 for int4 = 16 weights) */
            int r = tid >> 1, h = tid & 1;
            int64_t n = n0 + r;
            float wv[16];
            if (n < p.N) {
                if (F == Q_I4) {
                    uint2 b = *(const uint2 *)(p.w + n * p.ldw + k0 / 2 + h * 8);
                    uint4 raw = make_uint4(b.x, b.y, 0, 0);
                    decode8<F>(raw, 0, wv);
                    decode8<F>(raw, 1, wv + 8);
                    float s = p.scales[n * p.lds + k0 / p.group];
#pragma unroll
                    for (int i = 0; i < 16; i++) wv[i] *= s;
                } else {
                    uint4 raw = __ldg((const uint4 *)(p.w + n * p.ldw + k0 + h * 16));
                    decode8<F>(raw, 0, wv);
                    decode8<F>(raw, 1, wv + 8);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 16; i++) wv[i] = 0.f;
            }
#pragma unroll
            for (int i = 0; i < 16; i++) Bs[r][h * 16 + i] = __float2bfloat16_rn(wv[i]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], &As[wm * 32 + i * 16][kk], TK + 8);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], &Bs[wn * 32 + j * 16][kk], TK + 8);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(c[i][j], a[i], b[j], c[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], c[i][j], TN + 4, wmma::mem_row_major);
    __syncthreads();
    float *out = (float *)p.out;
    for (int idx = tid; idx < TM * TN; idx += MMA_THREADS) {
        int r = idx / TN, cc = idx % TN;
        int64_t m = m0 + r, n = n0 + cc;
        if (m >= p.M || n >= p.N) continue;
        float v = Cs[r][cc];
        if (F != Q_I4) v *= p.scales[n * p.lds];
        if (p.bias) v += p.bias[n];
        float *o = out + m * p.ldo + n;
        *o = p.accumulate ? *o + v : v;
    }
}

template <int F>
static lm_status launch_mma(const qparams *p, cudaStream_t s) {
    int64_t gx = (p->N + TN - 1) / TN, gy = (p->M + TM - 1) / TM;
    if (gy > 65535) return lm__error(LM_UNSUPPORTED, "linear (cuda, quantized): %d rows", p->M);
    mma_quant_kernel<F><<<dim3((unsigned)gx, (unsigned)gy), MMA_THREADS, 0, s>>>(*p);
    return lm__cuda_launched("linear_mma_quant");
}

/* ---- the workspace path for more rows: bf16 copies and one cuBLASLt GEMM ------------------------ */
/* in(x) row blockIdx.x rounded to bf16 into xb [M, K] (unit strides: the tuned layout). */
__global__ void __launch_bounds__(256) input_bf16_kernel(qparams p, bf16 *xb) {
    __shared__ float red[32];
    const int64_t m = blockIdx.x;
    const float *xr = p.x + m * p.ldx;
    float inv = 1.f;
    if (p.in == LM_LINEAR_IN_RMSNORM) {
        float ss = 0.f;
        for (int64_t k = threadIdx.x; k < p.K; k += blockDim.x) ss += xr[k] * xr[k];
        inv = rsqrtf(block_sum(ss, red) / (float)p.K + p.eps);
    }
    bf16 *o = xb + m * p.K;
    for (int64_t k = threadIdx.x; k < p.K; k += blockDim.x) {
        float v = xr[k];
        if (p.in == LM_LINEAR_IN_RMSNORM) v *= inv * p.norm_w[k];
        else if (p.in == LM_LINEAR_IN_SWIGLU) v = v / (1.f + __expf(-v)) * xr[p.K + k];
        o[k] = __float2bfloat16_rn(v);
    }
}

/* The weights dequantized into wb [N, K] bf16: bf16(q * scale) (the row scale for
 * int8/fp8, the group's for int4), one 16-byte vector of quantized bytes per thread
 * step (K a multiple of the vector's weights; 16-byte aligned rows). */
template <int F>
__global__ void __launch_bounds__(256) dequant_bf16_kernel(qparams p, bf16 *wb) {
    constexpr int WPV = F == Q_I4 ? 32 : 16;
    const int64_t vpr = p.K / WPV, total = p.N * vpr;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / vpr, v = i % vpr;
        const uint4 raw = __ldg((const uint4 *)(p.w + n * p.ldw) + v);
        const float sc = F == Q_I4 ? __ldg(p.scales + n * p.lds + v * WPV / p.group) : __ldg(p.scales + n * p.lds);
        uint4 *o = (uint4 *)(wb + n * p.K + v * WPV);
#pragma unroll
        for (int c = 0; c < WPV / 8; c++) {
            float w[8];
            decode8<F>(raw, c, w);
            uint32_t h[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                __nv_bfloat162 b2 = __floats2bfloat162_rn(w[2 * j] * sc, w[2 * j + 1] * sc);
                h[j] = *(const uint32_t *)&b2;
            }
            o[c] = make_uint4(h[0], h[1], h[2], h[3]);
        }
    }
}

template <int F>
static lm_status run_dequant(const qparams *p, bf16 *wb, cudaStream_t s) {
    constexpr int WPV = F == Q_I4 ? 32 : 16;
    int64_t total = p->N * (p->K / WPV), blocks = LM_MIN((total + 255) / 256, (int64_t)lm__cuda_sm_count() * 8);
    dequant_bf16_kernel<F><<<(unsigned)blocks, 256, 0, s>>>(*p, wb);
    return lm__cuda_launched("linear_dequant_bf16");
}

/* in(x) and the weights as bf16 in the workspace (ws_bytes, sized by
 * lm_linear_workspace_bytes), then out = xb @ wb^T (+ bias) (+ out) through cuBLASLt, in
 * chunks of the weight rows that fit after xb (all of them unless N * K is large).
 * Bytes ~ N * K * (w bytes + 4) + M * K * 6: worth it once the GEMM's arithmetic, not
 * the weight stream, sets the time. */
static lm_status run_workspace(const lm__cuda_blas *blas, const qparams *p, int f, void *ws, size_t ws_bytes,
                               cudaStream_t s) {
    size_t xbytes = ((size_t)p->M * (size_t)p->K * 2 + 255) / 256 * 256;
    int64_t chunk = xbytes < ws_bytes ? LM_MIN(p->N, (int64_t)((ws_bytes - xbytes) / ((size_t)p->K * 2))) : 0;
    if (chunk < p->N && chunk >= 64) chunk = chunk / 64 * 64; /* 256-byte aligned column offsets */
    if (chunk < 1) return lm__error(LM_INTERNAL, "linear (cuda, quantized): a workspace of %zu bytes", ws_bytes);
    bf16 *xb = (bf16 *)ws, *wb = (bf16 *)((char *)ws + xbytes);
    input_bf16_kernel<<<(unsigned)p->M, 256, 0, s>>>(*p, xb);
    LM_TRY(lm__cuda_launched("linear_input_bf16"));
    for (int64_t n0 = 0; n0 < p->N; n0 += chunk) {
        qparams c = *p; /* rows n0 .. n0 + nc of w, its scales, its bias and out's columns */
        int64_t nc = LM_MIN(chunk, p->N - n0);
        c.N = nc, c.w = p->w + n0 * p->ldw, c.scales = p->scales + n0 * p->lds;
        LM_TRY(f == Q_I8 ? run_dequant<Q_I8>(&c, wb, s) : f == Q_F8 ? run_dequant<Q_F8>(&c, wb, s)
                                                         : run_dequant<Q_I4>(&c, wb, s));
        LM_TRY(lm__cuda_linear_lt(blas, xb, p->K, wb, p->bias ? p->bias + n0 : NULL, (float *)p->out + n0, p->ldo,
                                  p->M, nc, p->K, p->accumulate, s));
    }
    return LM_OK;
}

/* ---- the readable kernel ------------------------------------------------------------------------ */
template <typename TO>
__global__ void linear_quant_readable(qparams p, int f) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    TO *out = (TO *)p.out;
    for (int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; o < (int64_t)p.M * p.N; o += warps) {
        int64_t m = o / p.N, n = o % p.N;
        float inv = row_inv_rms(p, m), acc = 0.f;
        for (int64_t k = lane; k < p.K; k += 32) acc += input_at(p, m, k, inv) * weight_at(p, f, n, k);
        acc = warp_sum(acc);
        if (lane == 0) {
            if (p.bias) acc += p.bias[n * p.bs];
            TO *dst = out + m * p.ldo + n * p.os1;
            if (p.accumulate) acc += ld(dst);
            st(dst, acc);
        }
    }
}

/* ---- the launcher ---------------------------------------------------------------------------- */
static int unit_last(const lm_tensor_view *v) { return v->shape[v->ndim - 1] <= 1 || v->stride[v->ndim - 1] == 1; }
static int aligned16(const void *ptr) { return ((uintptr_t)ptr & 15) == 0; }

lm_status lm__cuda_linear_quant(const lm__cuda_blas *blas, const lm_tensor_view *x, const lm_tensor_view *w,
                                const lm_tensor_view *bias, const lm_linear_params *lp, const lm_tensor_view *out,
                                cudaStream_t s) {
    int f = lp->w_bits == 4 ? Q_I4 : w->dtype == LM_I8 ? Q_I8 : Q_F8;
    const lm_tensor_view *sc = lp->w_scales;
    int64_t M = out->shape[0], N = out->shape[1], K = f == Q_I4 ? 2 * w->shape[1] : w->shape[1];
    qparams p;
    memset(&p, 0, sizeof p);
    p.in = (int)lp->input;
    p.x = (const float *)x->data, p.ldx = x->stride[0], p.xs1 = x->stride[1];
    if (lp->input == LM_LINEAR_IN_RMSNORM) p.norm_w = (const float *)lp->norm_weight->data, p.nws = lp->norm_weight->stride[0];
    p.eps = lp->eps;
    p.w = (const uint8_t *)w->data, p.ldw = w->stride[0], p.ws1 = w->stride[1];
    p.scales = (const float *)sc->data, p.lds = sc->stride[0], p.ss1 = sc->ndim == 2 ? sc->stride[1] : 0;
    p.group = f == Q_I4 ? lp->w_group : 0;
    p.bias = bias ? (const float *)bias->data : NULL, p.bs = bias ? bias->stride[0] : 0;
    p.out = out->data, p.ldo = out->stride[0], p.os1 = out->stride[1];
    p.accumulate = lp->accumulate, p.M = (int)M, p.N = N, p.K = K;
    if (M == 0 || N == 0) return LM_OK;
    if (M > INT32_MAX) return lm__error(LM_UNSUPPORTED, "linear (cuda, quantized): %lld rows", (long long)M);
    /* The tuned kernels: unit stride along K and N, 16-byte aligned weight rows, dense
     * scales along K, f32 out. */
    int tuned = K > 0 && out->dtype == LM_F32 && unit_last(x) && unit_last(w) && unit_last(out) &&
                (sc->ndim == 1 || unit_last(sc)) && aligned16(w->data) && p.ldw % 16 == 0 &&
                (!bias || unit_last(bias)) && (lp->input != LM_LINEAR_IN_RMSNORM || unit_last(lp->norm_weight));
    if (tuned) p.xs1 = 1, p.os1 = 1, p.ws1 = 1, p.nws = 1, p.bs = 1, p.ss1 = 1;
    int wpv = f == Q_I4 ? 32 : 16;
    int gemv = tuned && M <= LM__CUDA_GEMV_MAX_ROWS && K % wpv == 0 && p.ldx % 4 == 0 && aligned16(x->data) &&
               (lp->input != LM_LINEAR_IN_RMSNORM || aligned16(lp->norm_weight->data));
    if (gemv) {
        if (f == Q_I8) return launch_gemv_in<Q_I8>(&p, s);
        if (f == Q_F8) return launch_gemv_in<Q_F8>(&p, s);
        return launch_gemv_in<Q_I4>(&p, s);
    }
    void *ws = lp->workspace ? lp->workspace->data : NULL;
    if (tuned && ws && aligned16(ws) && K % wpv == 0) /* linear.c checked the workspace's size */
        return run_workspace(blas, &p, f, ws, (size_t)lm_tensor_view_numel(lp->workspace) *
                                                  lm_dtype_size(lp->workspace->dtype), s);
    if (tuned && K % TK == 0) {
        if (f == Q_I8) return launch_mma<Q_I8>(&p, s);
        if (f == Q_F8) return launch_mma<Q_F8>(&p, s);
        return launch_mma<Q_I4>(&p, s);
    }
    unsigned blocks = lm__cuda_blocks(M * N * 32, 256);
    LM_TRY(lm__cuda_float_only(out->dtype));
    LM__CUDA_FLOAT_SWITCH(out->dtype, T, linear_quant_readable<T><<<blocks, 256, 0, s>>>(p, f));
    return lm__cuda_launched("linear_quant_readable");
}
