/* ops/cuda/gemv_quant.cu — lm_linear_out with quantized weights on CUDA: int8 (i8 [N, K],
 * f32 scales [N]), fp8 e4m3 (f8_e4m3 [N, K], f32 scales [N]) and int4 (u8 [N, K/2], two
 * nibbles per byte, low = even k, f32 or bf16 scales [N, K/G] for groups of G = 32/64/128
 * k; every kernel reads either dtype where it reads a scale, widening bf16 exactly).
 *
 * Five paths, none allocating (a captured step may hold them):
 *  - the decode GEMV (M <= 8 rows): gemv.cu's kernel, the weight format one of its
 *    template arguments (int8/fp8 apply the row scale once per output after the sum,
 *    int4 the group scale once per 16-byte vector). Bytes ~ N * K (int8/fp8),
 *    N * K / 2 + scales (int4); O(M * N * K) FMAs.
 *  - the product for more rows (prefill): a bf16 tensor-core (WMMA 16x16x16) tiled GEMM,
 *    64 x 64 outputs per block, K in steps of 32, that dequantizes each weight tile into
 *    shared memory (int8/fp8 values are exact in bf16 and their row scale is applied in
 *    the f32 epilogue; int4 tiles are stored as bf16(q * group scale)) and rounds x to bf16
 *    on the way in. Not a native int8/fp8 GEMM: the tensor cores see bf16.
 *  - with a workspace (lm_linear_workspace_bytes), for more than 8 rows instead (and for
 *    3-8 rows whose inputs the GEMV would not stage: lm__quant_ws_rows): in(x)
 *    rounded to bf16 [M, K] and the weights dequantized to bf16(q * scale) [N, K] in it,
 *    then one cuBLASLt GEMM with the bias and accumulate in its epilogue (prefill and
 *    batched decode at the bf16 GEMM's speed plus one pass over the weights).
 *  - at fast precision (lm_precision, the calling thread's), fp8 weights with a workspace,
 *    more than 8 rows and K a multiple of 16 instead: in(x) quantized to e4m3 per row
 *    (scale max |in(x)| / 448) into the workspace, then one cuBLASLt fp8 GEMM on the
 *    stored weights with both scale vectors applied to its f32 sums (no dequantizing
 *    pass; the tensor cores see e4m3 x e4m3).
 *  - a readable kernel for every other layout (any strides, any float out, any K): one
 *    warp per output, f32 accumulation.
 * Input forms (PLAIN, RMSNORM, SWIGLU), bias and accumulate as lm_linear_out defines them,
 * in every kernel. f32 x only (lm_linear_out checks it).
 */
#include "ops/cuda/gemv_body.cuh" /* decode8 */
#include "ops/cuda_table.h" /* lm__quant_ws_input_bytes */

#include <mma.h>

enum { Q_I8 = LM__CUDA_GEMV_I8, Q_F8 = LM__CUDA_GEMV_F8, Q_I4 = LM__CUDA_GEMV_I4 };

struct qparams {
    int in;         /* LM_LINEAR_IN, _RMSNORM, _SWIGLU */
    const float *x; /* [M, K] or [M, 2K] (SWIGLU), row stride ldx, column stride xs1 */
    int64_t ldx, xs1;
    const float *norm_w; /* RMSNORM: [K], stride nws */
    int64_t nws;
    float eps;
    const uint8_t *w; /* rows of ldw bytes (elements for the readable kernel: ws1 along K) */
    int64_t ldw, ws1;
    const void *scales; /* f32 [N], or [N, K/G] f32 or bf16 (scale16): row stride lds, column stride ss1 */
    int64_t lds, ss1;
    int group, scale16;
    const float *bias; /* [N] stride bs, or NULL */
    int64_t bs;
    void *out; /* [M, N]: row stride ldo, column stride os1 */
    int64_t ldo, os1;
    int accumulate;
    int M;
    int64_t N, K;
};

/* Scale i of p.scales: int4's group scales f32 or bf16 (p.scale16), int8/fp8's f32. */
__device__ __forceinline__ float qscale(const qparams &p, int64_t i) { return load_scale(p.scales, p.scale16, i); }

/* One weight (n, k) for the readable kernel: the quantized value times its scale. */
__device__ __forceinline__ float weight_at(const qparams &p, int f, int64_t n, int64_t k) {
    if (f == Q_I4) {
        int b = p.w[n * p.ldw + (k / 2) * p.ws1], v = (k & 1 ? b >> 4 : b) & 15;
        return (float)(v >= 8 ? v - 16 : v) * qscale(p, n * p.lds + (k / p.group) * p.ss1);
    }
    uint8_t b = p.w[n * p.ldw + k * p.ws1];
    float q;
    if (f == Q_I8) {
        q = (float)(int8_t)b;
    } else {
        __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
        q = __half2float(__half(h));
    }
    return q * qscale(p, n * p.lds);
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
                    float s = qscale(p, n * p.lds + k0 / p.group);
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
        if (F != Q_I4) v *= qscale(p, n * p.lds);
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
/* 1 / rms of input row xr by the whole block (unit strides; every thread gets it); 1
 * unless RMSNORM. red: >= 32 floats of shared memory. */
__device__ __forceinline__ float block_row_inv_rms(const qparams &p, const float *xr, float *red) {
    if (p.in != LM_LINEAR_IN_RMSNORM) return 1.f;
    float ss = 0.f;
    for (int64_t k = threadIdx.x; k < p.K; k += blockDim.x) ss += xr[k] * xr[k];
    return rsqrtf(block_sum(ss, red) / (float)p.K + p.eps);
}

/* in(x) row blockIdx.x rounded to bf16 into xb [M, K] (unit strides: the tuned layout). */
__global__ void __launch_bounds__(256) input_bf16_kernel(qparams p, bf16 *xb) {
    __shared__ float red[32];
    const int64_t m = blockIdx.x;
    const float *xr = p.x + m * p.ldx;
    const float inv = block_row_inv_rms(p, xr, red);
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
        const float sc = qscale(p, F == Q_I4 ? n * p.lds + v * WPV / p.group : n * p.lds);
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
    size_t xbytes = lm__quant_ws_input_bytes(p->M, p->K, 2);
    int64_t chunk = xbytes < ws_bytes ? LM_MIN(p->N, (int64_t)((ws_bytes - xbytes) / ((size_t)p->K * 2))) : 0;
    if (chunk < p->N && chunk >= 64) chunk = chunk / 64 * 64; /* 256-byte aligned column offsets */
    if (chunk < 1) return lm__error(LM_INTERNAL, "linear (cuda, quantized): a workspace of %zu bytes", ws_bytes);
    bf16 *xb = (bf16 *)ws, *wb = (bf16 *)((char *)ws + xbytes);
    input_bf16_kernel<<<(unsigned)p->M, 256, 0, s>>>(*p, xb);
    LM_TRY(lm__cuda_launched("linear_input_bf16"));
    for (int64_t n0 = 0; n0 < p->N; n0 += chunk) {
        qparams c = *p; /* rows n0 .. n0 + nc of w, its scales, its bias and out's columns */
        int64_t nc = LM_MIN(chunk, p->N - n0);
        c.N = nc, c.w = p->w + n0 * p->ldw;
        c.scales = (const char *)p->scales + n0 * p->lds * (p->scale16 ? 2 : 4);
        LM_TRY(f == Q_I8 ? run_dequant<Q_I8>(&c, wb, s) : f == Q_F8 ? run_dequant<Q_F8>(&c, wb, s)
                                                         : run_dequant<Q_I4>(&c, wb, s));
        LM_TRY(lm__cuda_linear_lt(blas, xb, p->K, wb, p->bias ? p->bias + n0 : NULL, (float *)p->out + n0, 0, p->ldo,
                                  p->M, nc, p->K, p->accumulate, s));
    }
    return LM_OK;
}

/* ---- fast precision, fp8 weights: x quantized per row, one fp8 tensor-core GEMM -------------------- */
/* in(x) row blockIdx.x quantized to e4m3 into xq [M, K] with its f32 scale in xs[m]:
 * a = max_k |in(x)[k]|, xs[m] = a / 448 (1 for an all-zero row), xq[m, k] =
 * e4m3(in(x)[k] * (448 / a)), nearest even, saturating at +-448 (NaN stays NaN). in(x)
 * is computed once into dynamic shared memory when cached (K floats, each thread reading
 * back only what it wrote), else twice (once for a, once to store); K a multiple of 4,
 * unit strides; vec: x's rows may be read as float4s. */
__global__ void __launch_bounds__(256) input_fp8_kernel(qparams p, int vec, int cached, uint8_t *xq, float *xs) {
    __shared__ float red[32];
    extern __shared__ float4 row4[]; /* [K / 4] when cached */
    const int64_t m = blockIdx.x;
    const float *xr = p.x + m * p.ldx;
    const float inv = block_row_inv_rms(p, xr, red);
    float v[4], a = 0.f;
    auto load4 = [&](int64_t k) { /* in(x)[k .. k + 3] into v */
        if (vec) {
            const float4 x4 = *(const float4 *)(xr + k);
            v[0] = x4.x, v[1] = x4.y, v[2] = x4.z, v[3] = x4.w;
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = xr[k + j];
        }
        if (p.in == LM_LINEAR_IN_RMSNORM) {
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] *= inv * p.norm_w[k + j];
        } else if (p.in == LM_LINEAR_IN_SWIGLU) {
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = v[j] / (1.f + __expf(-v[j])) * xr[p.K + k + j];
        }
    };
    for (int64_t k = 4 * (int64_t)threadIdx.x; k < p.K; k += 4 * (int64_t)blockDim.x) {
        load4(k);
        if (cached) row4[k / 4] = make_float4(v[0], v[1], v[2], v[3]);
        a = fmaxf(a, fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
    }
    a = block_max(a, red);
    const float to_q = a > 0.f ? 448.f / a : 0.f;
    if (threadIdx.x == 0) xs[m] = a > 0.f ? a / 448.f : 1.f;
    uint8_t *o = xq + m * p.K;
    for (int64_t k = 4 * (int64_t)threadIdx.x; k < p.K; k += 4 * (int64_t)blockDim.x) {
        if (cached) {
            const float4 c = row4[k / 4];
            v[0] = c.x, v[1] = c.y, v[2] = c.z, v[3] = c.w;
        } else {
            load4(k);
        }
        const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] * to_q, v[1] * to_q), __NV_SATFINITE,
                                                                 __NV_E4M3),
                                   hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] * to_q, v[3] * to_q), __NV_SATFINITE,
                                                                 __NV_E4M3);
        *(uint32_t *)(o + k) = (uint32_t)lo | (uint32_t)hi << 16;
    }
}

/* out[m, n] += bias[n] over M rows (row stride ldo). */
__global__ void __launch_bounds__(256) add_bias_kernel(float *out, int64_t ldo, const float *bias, int64_t M, int64_t N) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += (int64_t)gridDim.x * blockDim.x)
        out[(i / N) * ldo + i % N] += bias[i % N];
}

/* Fast precision with fp8 weights: in(x) quantized per row into the workspace, then
 * out = xs[m] * scales[n] * (xq @ w^T) (+ out) in one cuBLASLt fp8 GEMM, then the bias
 * (if any) by a second kernel: cuBLASLt's fp8 GEMMs take a bf16 bias only (an f32 one
 * is refused), and the graphs give a quantized prefill's q|k|v bias to the attention
 * front, so only direct callers pay it. */
static lm_status run_fp8(const lm__cuda_blas *blas, const qparams *p, void *ws, size_t ws_bytes, cudaStream_t s) {
    /* xq [M, K] e4m3, then the M row scales (lm_linear_workspace_bytes covers both) */
    const size_t xq_bytes = lm__quant_ws_input_bytes(p->M, p->K, 1);
    if (ws_bytes < xq_bytes + (size_t)p->M * sizeof(float))
        return lm__error(LM_INTERNAL, "linear (cuda, fp8 fast): a workspace of %zu bytes", ws_bytes);
    uint8_t *xq = (uint8_t *)ws;
    float *xs = (float *)((char *)ws + xq_bytes);
    const int vec = lm__cuda_aligned16(p->x) && p->ldx % 4 == 0; /* x's rows as float4s (K is a multiple of 16) */
    /* in(x) kept in shared memory between its two uses when the row fits the default
     * 48 KiB beside the kernel's static 128 bytes (K <= 12,032) */
    const int cached = p->K * (int64_t)sizeof(float) <= 47 * 1024;
    input_fp8_kernel<<<(unsigned)p->M, 256, cached ? (size_t)p->K * sizeof(float) : 0, s>>>(*p, vec, cached, xq, xs);
    LM_TRY(lm__cuda_launched("linear_input_fp8"));
    LM_TRY(lm__cuda_linear_lt_fp8(blas, xq, p->K, xs, p->w, p->ldw, (const float *)p->scales, (float *)p->out, p->ldo,
                                  p->M, p->N, p->K, p->accumulate, s));
    if (!p->bias) return LM_OK;
    add_bias_kernel<<<lm__cuda_blocks((int64_t)p->M * p->N, 256), 256, 0, s>>>((float *)p->out, p->ldo, p->bias, p->M,
                                                                              p->N);
    return lm__cuda_launched("linear_fp8_bias");
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

lm_status lm__cuda_linear_quant(const lm__cuda_blas *blas, const lm_tensor_view *x, const lm_tensor_view *w,
                                const lm_tensor_view *bias, const lm_linear_params *lp, lm_precision precision,
                                const lm_tensor_view *out, cudaStream_t s) {
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
    p.scales = sc->data, p.lds = sc->stride[0], p.ss1 = sc->ndim == 2 ? sc->stride[1] : 0;
    p.group = f == Q_I4 ? lp->w_group : 0, p.scale16 = sc->dtype == LM_BF16;
    p.bias = bias ? (const float *)bias->data : NULL, p.bs = bias ? bias->stride[0] : 0;
    p.out = out->data, p.ldo = out->stride[0], p.os1 = out->stride[1];
    p.accumulate = lp->accumulate, p.M = (int)M, p.N = N, p.K = K;
    if (M == 0 || N == 0) return LM_OK;
    if (M > INT32_MAX) return lm__error(LM_UNSUPPORTED, "linear (cuda, quantized): %lld rows", (long long)M);
    /* The tuned kernels: unit stride along K and N, 16-byte aligned weight rows, dense
     * scales along K, f32 out. */
    int tuned = K > 0 && out->dtype == LM_F32 && unit_last(x) && unit_last(w) && unit_last(out) &&
                (sc->ndim == 1 || unit_last(sc)) && lm__cuda_aligned16(w->data) && p.ldw % 16 == 0 &&
                (!bias || unit_last(bias)) && (lp->input != LM_LINEAR_IN_RMSNORM || unit_last(lp->norm_weight));
    if (tuned) p.xs1 = 1, p.os1 = 1, p.ws1 = 1, p.nws = 1, p.bs = 1, p.ss1 = 1;
    int wpv = f == Q_I4 ? 32 : 16;
    lm__cuda_gemv_params gp;
    /* LOOM_CUDA_QUANT_UNSTAGED=gemv: 3-8 unstaged rows keep the GEMV (measurements) */
    const char *unstaged = getenv("LOOM_CUDA_QUANT_UNSTAGED");
    const int keep_gemv = unstaged && strcmp(unstaged, "gemv") == 0;
    const int ws_rows = lm__quant_ws_rows(M, keep_gemv || lm__cuda_gemv_stages(M, K)) && lp->workspace;
    if (tuned && !ws_rows && lm__cuda_gemv_of(x, w, bias, lp, &gp)) { /* up to LM__CUDA_GEMV_MAX_ROWS rows */
        gp.out = (float *)p.out, gp.ldo = p.ldo, gp.accumulate = p.accumulate;
        return lm__cuda_linear_gemv(&gp, s);
    }
    void *ws = lp->workspace ? lp->workspace->data : NULL;
    size_t ws_bytes = ws ? (size_t)lm_tensor_view_numel(lp->workspace) * lm_dtype_size(lp->workspace->dtype) : 0;
    if (precision == LM_PRECISION_FAST && f == Q_F8 && M > LM__CUDA_GEMV_MAX_ROWS && tuned && ws &&
        lm__cuda_aligned16(ws) && K % 16 == 0 && p.lds == 1)
        return run_fp8(blas, &p, ws, ws_bytes, s);
    if (tuned && ws && lm__cuda_aligned16(ws) && K % wpv == 0) /* linear.c checked the workspace's size */
        return run_workspace(blas, &p, f, ws, ws_bytes, s);
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
