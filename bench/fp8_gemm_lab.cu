/* bench/fp8_gemm_lab.cu — cuBLASLt's fp8 GEMM as fast precision uses it, beside the bf16
 * GEMM of the exact path, on the linear shapes of a model (what the library's fp8 path
 * runs: ops/cuda/matmul_lt_cuda.c, lm__cuda_linear_lt_fp8).
 *
 * For each (M, N, K): x bf16 [M, K] and W bf16 [N, K] filled by lab_fill.cuh, both
 * quantized to e4m3 per row on the device (scale max |row| / 448), then timed (us a call,
 * the best of the heuristic's first 8 algorithms, each the mean of R calls after one
 * warm-up; the weights stay in L2 between calls, as in a lab, not a step):
 *  - bf16:      x bf16 @ W^T bf16 -> f32 with an f32 bias epilogue (the exact path's GEMM);
 *  - fp8_f32:   e4m3 x e4m3 -> f32, outer-vector f32 scales (x's per row, W's per output;
 *               CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), no bias (fast's GEMM);
 *  - fp8_bf16:  the same with a bf16 output;
 * and whether fp8_f32 with an f32 bias is accepted (it is refused on CUDA 13 / sm_90:
 * "bias_f32": "refused"). Correctness: 64 sampled outputs of fp8_f32 against a float64
 * host sum of the same e4m3 bytes and scales (NMSE printed).
 * Build (nvcc, no GPU needed):
 *   nvcc -O3 -std=c++17 --generate-code=arch=compute_90a,code=[sm_90a] bench/fp8_gemm_lab.cu \
 *     -lcublasLt -o fp8_gemm_lab
 * Usage: fp8_gemm_lab [M ...] (default 32 512 4096), over the Qwen2.5-0.5B shapes q|k|v
 * 1152 x 896, o 896 x 896, gate|up 9728 x 896, down 896 x 4864 and the head 151936 x 896.
 * One JSON line per (M, shape).
 */
#include "lab_fill.cuh"

#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                                   \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static cublasLtHandle_t g_lt;
static void *g_ws;
static size_t g_ws_bytes = (size_t)32 << 20;

/* Row r of a [rows, K] bf16 matrix to e4m3 with scale max |row| / 448 (1 for zeros). */
__global__ void quantize_rows(const __nv_bfloat16 *a, int64_t K, uint8_t *q, float *scale) {
    __shared__ float red[32];
    const __nv_bfloat16 *row = a + blockIdx.x * K;
    float m = 0.f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, fabsf(__bfloat162float(row[k])));
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, red[w]);
    const float to_q = m > 0.f ? 448.f / m : 0.f;
    if (threadIdx.x == 0) scale[blockIdx.x] = m > 0.f ? m / 448.f : 1.f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
        q[blockIdx.x * K + k] = __nv_cvt_float_to_fp8(__bfloat162float(row[k]) * to_q, __NV_SATFINITE, __NV_E4M3);
}

struct problem {
    int fp8, out_bf16, bias;
    int64_t M, N, K;
    const void *A, *B; /* A = W [N, K], B = x [M, K], both K-major */
    const float *sa, *sb, *bias_ptr;
    void *D;
};

/* Mean us a call of the best of the heuristic's first 8 algorithms; -1 when cuBLASLt
 * refuses the problem (the status in *why). */
static double time_gemm(const problem &p, int reps, cublasStatus_t *why) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    double best = -1;
    *why = CUBLAS_STATUS_SUCCESS;
    int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N, mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cudaDataType_t tab = p.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, tc = p.out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulHeuristicResult_t res[8];
    int n = 0;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (!st && p.fp8) {
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
        if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
        if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.sa, sizeof p.sa);
        if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.sb, sizeof p.sb);
    }
    if (!st && p.bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = CUDA_R_32F;
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias_ptr, sizeof p.bias_ptr);
        if (!st) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    }
    if (!st) st = cublasLtMatrixLayoutCreate(&la, tab, p.K, p.N, p.K);
    if (!st) st = cublasLtMatrixLayoutCreate(&lb, tab, p.K, p.M, p.K);
    if (!st) st = cublasLtMatrixLayoutCreate(&lc, tc, p.N, p.M, p.N);
    if (!st) st = cublasLtMatmulPreferenceCreate(&pref);
    if (!st)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g_ws_bytes,
                                                  sizeof g_ws_bytes);
    if (!st) st = cublasLtMatmulAlgoGetHeuristic(g_lt, op, la, lb, lc, lc, pref, 8, res, &n);
    if (!st && n == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
    const float alpha = 1.f, beta = 0.f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; !st && i < n; i++) {
        if (cublasLtMatmul(g_lt, op, &alpha, p.A, la, p.B, lb, &beta, p.D, lc, p.D, lc, &res[i].algo, g_ws, g_ws_bytes,
                           0) != CUBLAS_STATUS_SUCCESS)
            continue;
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++)
            cublasLtMatmul(g_lt, op, &alpha, p.A, la, p.B, lb, &beta, p.D, lc, p.D, lc, &res[i].algo, g_ws, g_ws_bytes, 0);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (best < 0 || ms * 1e3 / reps < best) best = ms * 1e3 / reps;
    }
    if (!st && best >= 0) /* leave D as the first algorithm computes it, for the check */
        cublasLtMatmul(g_lt, op, &alpha, p.A, la, p.B, lb, &beta, p.D, lc, p.D, lc, &res[0].algo, g_ws, g_ws_bytes, 0);
    CK(cudaDeviceSynchronize());
    *why = st;
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return st ? -1 : best;
}

static float e4m3_value(uint8_t b) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}

static void run_shape(int64_t M, int64_t N, int64_t K) {
    __nv_bfloat16 *x, *w;
    uint8_t *xq, *wq;
    float *xs, *wsc, *bias, *D;
    CK(cudaMalloc(&x, M * K * 2));
    CK(cudaMalloc(&w, N * K * 2));
    CK(cudaMalloc(&xq, M * K));
    CK(cudaMalloc(&wq, N * K));
    CK(cudaMalloc(&xs, M * 4));
    CK(cudaMalloc(&wsc, N * 4));
    CK(cudaMalloc(&bias, N * 4));
    CK(cudaMalloc(&D, M * N * 4));
    lab_fill<<<1024, 256>>>(x, M * K, 1u, 2.f);
    lab_fill<<<1024, 256>>>(w, N * K, 2u, 0.1f);
    CK(cudaMemset(bias, 0, N * 4));
    quantize_rows<<<(unsigned)M, 256>>>(x, K, xq, xs);
    quantize_rows<<<(unsigned)N, 256>>>(w, K, wq, wsc);
    CK(cudaDeviceSynchronize());
    const int reps = M * N * K > ((int64_t)1 << 36) ? 10 : 100;
    cublasStatus_t why;
    problem pb = {0, 0, 1, M, N, K, w, x, NULL, NULL, bias, D};
    double t_bf16 = time_gemm(pb, reps, &why);
    problem p8 = {1, 0, 0, M, N, K, wq, xq, wsc, xs, NULL, D};
    double t_f32 = time_gemm(p8, reps, &why);
    /* the check: 64 sampled outputs of fp8_f32 against float64 sums of the same bytes */
    std::vector<uint8_t> hx((size_t)(M * K)), hw((size_t)(N * K));
    std::vector<float> hxs((size_t)M), hws((size_t)N), hd((size_t)(M * N));
    CK(cudaMemcpy(hx.data(), xq, M * K, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hw.data(), wq, N * K, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hxs.data(), xs, M * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hws.data(), wsc, N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hd.data(), D, M * N * 4, cudaMemcpyDeviceToHost));
    double se = 0, sr = 0;
    for (int s = 0; t_f32 >= 0 && s < 64; s++) {
        int64_t m = (s * 7919) % M, n = (s * 104729) % N;
        double r = 0;
        for (int64_t k = 0; k < K; k++) r += (double)e4m3_value(hx[m * K + k]) * e4m3_value(hw[n * K + k]);
        r *= (double)hxs[m] * hws[n];
        se += (hd[m * N + n] - r) * (hd[m * N + n] - r), sr += r * r;
    }
    problem p8b = p8;
    p8b.out_bf16 = 1;
    double t_b16 = time_gemm(p8b, reps, &why);
    problem p8bias = p8;
    p8bias.bias = 1, p8bias.bias_ptr = bias;
    cublasStatus_t bias_why;
    double t_bias = time_gemm(p8bias, 1, &bias_why);
    printf("{\"M\":%lld,\"N\":%lld,\"K\":%lld,\"bf16_us\":%.2f,\"fp8_f32_us\":%.2f,\"fp8_bf16_us\":%.2f,"
           "\"bf16_over_fp8\":%.2f,\"fp8_f32_nmse\":%.2e,\"bias_f32\":\"%s\"}\n",
           (long long)M, (long long)N, (long long)K, t_bf16, t_f32, t_b16, t_f32 > 0 ? t_bf16 / t_f32 : 0.0,
           sr > 0 ? se / sr : -1.0, t_bias >= 0 ? "accepted" : cublasLtGetStatusString(bias_why));
    fflush(stdout);
    cudaFree(x), cudaFree(w), cudaFree(xq), cudaFree(wq), cudaFree(xs), cudaFree(wsc), cudaFree(bias), cudaFree(D);
}

int main(int argc, char **argv) {
    if (cublasLtCreate(&g_lt) != CUBLAS_STATUS_SUCCESS) return 1;
    CK(cudaMalloc(&g_ws, g_ws_bytes));
    static const int64_t shapes[5][2] = {{1152, 896}, {896, 896}, {9728, 896}, {896, 4864}, {151936, 896}};
    std::vector<int64_t> Ms;
    for (int i = 1; i < argc; i++) Ms.push_back(atoll(argv[i]));
    if (Ms.empty()) Ms = {32, 512, 4096};
    for (int64_t M : Ms)
        for (int s = 0; s < 5; s++) run_shape(M, shapes[s][0], shapes[s][1]);
    return 0;
}
