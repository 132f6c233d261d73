/* bench/flash_attention_lab.cu — times the flash attention kernels of this source tree
 * on their own: the training forward (keeping the log-sum-exp) and the backward from the
 * kept out + lse, on token-major bf16 views [B, T, H, D] (D 64, causal), 3 warm-up runs
 * then the mean of 20 timed with events; prints one JSON line with TFLOP/s (FLOPs as in
 * bench/NOTES.md v7: 4 B Hq T^2 D / 2 forward, 2.5x that backward) and a weighted
 * checksum of O, dQ, dK, dV so that two builds (e.g. a kernel change against the one
 * before it) can be compared for equal outputs on the same inputs. It includes
 * src/ops/cuda/attention_flash.cu itself, so a kernel edit is measured without
 * rebuilding the library; the helpers come from the shared test library. Built where
 * nvcc is (no GPU needed), after scripts/pack_cuda_tests.sh:
 *   nvcc -O3 -Iinclude -Isrc -DLOOM_HAVE_CUDA=1 -D_POSIX_C_SOURCE=200809L \
 *     --generate-code=arch=compute_90a,code=[sm_90a] -x cu bench/flash_attention_lab.cu \
 *     -L/tmp/loom-packed -lloomall -lcudart -o fa_lab
 * Usage: fa_lab B T Hq Hkv TAG (e.g. fa_lab 8 1024 14 2 new). Correctness lives in
 * tests/cuda/test_cuda_attention.c and test_cuda_backward.c; this only times.
 */
#include "ops/cuda/attention_flash.cu"
#include "lab_fill.cuh"
#include <vector>
/* A [B, H, T, D] view of a token-major [B, T, Ht, D] buffer (Ht heads a token). */
static lm_tensor_view tv(void *p, int64_t B, int64_t H, int64_t T, int64_t D, int64_t Ht) {
    int64_t shape[4] = {B, H, T, D}, stride[4] = {T * Ht * D, D, Ht * D, 1};
    lm_tensor_view v;
    if (lm_tensor_view_init(&v, p, LM_BF16, lm_device_cuda(0), 4, shape, stride) != LM_OK) {
        fprintf(stderr, "fa_lab: %s\n", lm_last_error());
        exit(2);
    }
    return v;
}
int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s B T Hq Hkv TAG\n", argv[0]);
        return 2;
    }
    int64_t B = atoll(argv[1]), T = atoll(argv[2]), Hq = atoll(argv[3]), Hk = atoll(argv[4]), D = 64;
    const char *tag = argv[5];
    if (B < 1 || T < 1 || Hq < 1 || Hk < 1 || Hq % Hk != 0) {
        fprintf(stderr, "%s: need B, T, Hq, Hkv >= 1 with Hq a multiple of Hkv\n", argv[0]);
        return 2;
    }
    int64_t nq = B * T * Hq * D, nk = B * T * Hk * D;
    bf16 *q = NULL, *k = NULL, *v = NULL, *o = NULL, *dO = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    float *lse = NULL;
    cudaMalloc(&q, nq * 2);
    cudaMalloc(&k, nk * 2);
    cudaMalloc(&v, nk * 2);
    cudaMalloc(&o, nq * 2);
    cudaMalloc(&dO, nq * 2);
    cudaMalloc(&dq, nq * 2);
    cudaMalloc(&dk, nk * 2);
    cudaMalloc(&dv, nk * 2);
    cudaMalloc(&lse, B * Hq * T * 4);
    if (cudaGetLastError() != cudaSuccess || !q || !lse) {
        fprintf(stderr, "%s: no device memory (is there a GPU?)\n", argv[0]);
        return 1;
    }
    lab_fill<<<1024, 256>>>(q, nq, 1, 2.f);
    lab_fill<<<1024, 256>>>(k, nk, 2, 2.f);
    lab_fill<<<1024, 256>>>(v, nk, 3, 1.f);
    lab_fill<<<1024, 256>>>(dO, nq, 4, 1.f);
    lm_tensor_view Q = tv(q, B, Hq, T, D, Hq), K = tv(k, B, Hk, T, D, Hk), V_ = tv(v, B, Hk, T, D, Hk);
    lm_tensor_view O = tv(o, B, Hq, T, D, Hq), DO = tv(dO, B, Hq, T, D, Hq);
    lm_tensor_view DQ = tv(dq, B, Hq, T, D, Hq), DK = tv(dk, B, Hk, T, D, Hk), DV = tv(dv, B, Hk, T, D, Hk);
    int64_t lshape[3] = {B, Hq, T};
    lm_tensor_view L;
    if (lm_tensor_view_init(&L, lse, LM_F32, lm_device_cuda(0), 3, lshape, NULL) != LM_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], lm_last_error());
        return 2;
    }
    float scale = 0.125f;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double fl = 4.0 * B * Hq * (double)T * T * D / 2;
    float ms;
    if (lm__cuda_flash_attention_lse(&Q, &K, &V_, scale, 1, 0, &O, &L, 0) != LM_OK ||
        lm__cuda_flash_attention_backward_lse(&Q, &K, &V_, &O, &L, &DO, scale, 1, 0, &DQ, &DK, &DV, 0) != LM_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], lm_last_error());
        return 1;
    }
    for (int i = 0; i < 3; i++)
        lm__cuda_flash_attention_lse(&Q, &K, &V_, scale, 1, 0, &O, &L, 0);
    cudaEventRecord(e0);
    for (int i = 0; i < 20; i++)
        lm__cuda_flash_attention_lse(&Q, &K, &V_, scale, 1, 0, &O, &L, 0);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    double fwd = ms / 20 * 1e3;
    for (int i = 0; i < 3; i++)
        lm__cuda_flash_attention_backward_lse(&Q, &K, &V_, &O, &L, &DO, scale, 1, 0, &DQ, &DK, &DV, 0);
    cudaEventRecord(e0);
    for (int i = 0; i < 20; i++)
        lm__cuda_flash_attention_backward_lse(&Q, &K, &V_, &O, &L, &DO, scale, 1, 0, &DQ, &DK, &DV, 0);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    double bwd = ms / 20 * 1e3;
    cudaError_t err = cudaDeviceSynchronize();
    /* checksums for comparison across variants */
    std::vector<uint16_t> h(nq);
    double cs[4] = {0, 0, 0, 0};
    bf16 *bufs[4] = {o, dq, dk, dv};
    int64_t ns[4] = {nq, nq, nk, nk};
    for (int j = 0; j < 4; j++) {
        h.resize(ns[j]);
        cudaMemcpy(h.data(), bufs[j], ns[j] * 2, cudaMemcpyDeviceToHost);
        for (int64_t i = 0; i < ns[j]; i++) {
            uint32_t u = (uint32_t)h[i] << 16;
            float f;
            memcpy(&f, &u, 4);
            cs[j] += fabs(f) * (1 + (i % 7));
        }
    }
    printf("{\"variant\":\"%s\",\"shape\":\"B%lld T%lld "
           "H%lld/%lld\",\"fwd_us\":%.1f,\"fwd_tflops\":%.1f,\"bwd_us\":%.1f,\"bwd_tflops\":%.1f,"
           "\"cs\":[%.6e,%.6e,%.6e,%.6e],\"err\":\"%s\"}\n",
           tag, (long long)B, (long long)T, (long long)Hq, (long long)Hk, fwd, fl / fwd * 1e-6, bwd,
           2.5 * fl / bwd * 1e-6, cs[0], cs[1], cs[2], cs[3], cudaGetErrorString(err));
    return 0;
}
