/* Tests for CUDA memory and contexts on cuda:0 (skipped, exit 77, without a GPU):
 * host -> device -> host and device -> device round trips, 1-, 2- and 4-byte fills
 * (uniform patterns take the memset path, mixed ones the staged path, including a
 * fill larger than one staging chunk), tensors moved both ways with
 * lm_tensor_to_device, poisoning a device tensor, and a CUDA context with a stream.
 * LM_TEST_LABELS: cuda
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const lm_device k_cpu = {LM_DEVICE_CPU, 0};
static const lm_device k_gpu = {LM_DEVICE_CUDA, 0};

static void test_copy_round_trip(void) {
    const size_t n = (1u << 20) + 13;
    unsigned char *src = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 37 + (i >> 9));
    void *d1 = NULL, *d2 = NULL;
    LT_CHECK_OK(lm_device_alloc(k_gpu, n, &d1));
    LT_CHECK_OK(lm_device_alloc(k_gpu, n, &d2));
    LT_CHECK_OK(lm_device_copy(k_gpu, d1, k_cpu, src, n));
    LT_CHECK_OK(lm_device_copy(k_gpu, d2, k_gpu, d1, n));
    memset(back, 0, n);
    LT_CHECK_OK(lm_device_copy(k_cpu, back, k_gpu, d2, n));
    LT_CHECK(memcmp(src, back, n) == 0);
    lm_device_free(k_gpu, d1);
    lm_device_free(k_gpu, d2);
    void *z = (void *)&z;
    LT_CHECK_OK(lm_device_alloc(k_gpu, 0, &z));
    lm_device_free(k_gpu, z);
    free(src);
    free(back);
}

static int check_pattern(const unsigned char *p, size_t n, const void *pattern, size_t psize) {
    for (size_t i = 0; i < n; i += psize)
        if (memcmp(p + i, pattern, psize) != 0) return 0;
    return 1;
}

static void test_fill_patterns(void) {
    const size_t n = 3 * (1u << 20) + 6; /* more than two 1 MiB staging chunks, a multiple of 2 */
    unsigned char *back = malloc(n);
    void *d = NULL;
    LT_CHECK_OK(lm_device_alloc(k_gpu, n, &d));
    const uint16_t mixed = 0xBEEF, uniform = 0x4242;
    const uint32_t word = 0x7fc00000u;
    const uint8_t byte = 0xA5;
    LT_CHECK_OK(lm_device_fill(k_gpu, d, n, &mixed, 2));
    LT_CHECK_OK(lm_device_copy(k_cpu, back, k_gpu, d, n));
    LT_CHECK_MSG(check_pattern(back, n, &mixed, 2), "2-byte mixed pattern");
    LT_CHECK_OK(lm_device_fill(k_gpu, d, n, &uniform, 2));
    LT_CHECK_OK(lm_device_copy(k_cpu, back, k_gpu, d, n));
    LT_CHECK_MSG(check_pattern(back, n, &uniform, 2), "2-byte uniform pattern");
    LT_CHECK_OK(lm_device_fill(k_gpu, d, n - 2, &word, 4));
    LT_CHECK_OK(lm_device_copy(k_cpu, back, k_gpu, d, n));
    LT_CHECK_MSG(check_pattern(back, n - 2, &word, 4), "4-byte pattern");
    LT_CHECK(back[n - 2] == 0x42 && back[n - 1] == 0x42); /* bytes past the fill untouched */
    LT_CHECK_OK(lm_device_fill(k_gpu, d, 7, &byte, 1));
    LT_CHECK_OK(lm_device_copy(k_cpu, back, k_gpu, d, 8));
    LT_CHECK(check_pattern(back, 7, &byte, 1) && back[7] == 0x7f); /* last byte of 0x7fc00000 */
    lm_device_free(k_gpu, d);
    free(back);
}

static void test_tensor_to_device_both_ways(void) {
    lt_rng r = lt_rng_seed(3);
    int64_t s[3] = {3, 5, 7};
    lm_tensor *h = lt_random_tensor(&r, LM_BF16, 3, s, 1.0), *ht = NULL, *g = NULL, *back = NULL;
    LT_CHECK_OK(lm_tensor_transpose(h, 0, 2, &ht)); /* strided host source is packed first */
    LT_CHECK_OK(lm_tensor_to_device(NULL, ht, k_gpu, &g));
    LT_CHECK(g && lm_device_equal(lm_tensor_device(g), k_gpu) && lm_tensor_dim(g, 0) == 7);
    LT_CHECK_OK(lm_tensor_to_device(NULL, g, k_cpu, &back));
    if (back) {
        double *want = lt_view_to_f64(lm_tensor_as_view(ht)), *got = lt_view_to_f64(lm_tensor_as_view(back));
        LT_CHECK(memcmp(want, got, sizeof(double) * 105) == 0);
        free(want);
        free(got);
    }
    /* poison on the device, then read back */
    LT_CHECK_OK(lm_tensor_view_poison(NULL, lm_tensor_as_view(g)));
    uint16_t raw[105];
    LT_CHECK_OK(lm_tensor_view_read(NULL, lm_tensor_as_view(g), raw));
    int nan = 0;
    for (int i = 0; i < 105; i++) nan += isnan(lm_bf16_to_f32(raw[i]));
    LT_CHECK(nan == 105);
    /* strided device views are refused, not silently packed */
    lm_tensor *gt = NULL, *c = NULL;
    LT_CHECK_OK(lm_tensor_transpose(g, 0, 1, &gt));
    LT_CHECK_STATUS(lm_tensor_contiguous(NULL, gt, &c), LM_UNSUPPORTED);
    LT_CHECK(c == NULL);
    lm_tensor *z = NULL;
    LT_CHECK_OK(lm_tensor_zeros(k_gpu, LM_F32, 3, s, &z));
    float zf[105];
    LT_CHECK_OK(lm_tensor_view_read(NULL, lm_tensor_as_view(z), zf));
    int zeros = 0;
    for (int i = 0; i < 105; i++) zeros += zf[i] == 0.0f;
    LT_CHECK(zeros == 105);
    lm_tensor_destroy(h), lm_tensor_destroy(ht), lm_tensor_destroy(g), lm_tensor_destroy(back);
    lm_tensor_destroy(gt), lm_tensor_destroy(z);
}

static void test_cuda_context(void) {
    lm_ctx *ctx = NULL;
    LT_CHECK_OK(lm_ctx_create(k_gpu, 1, &ctx));
    LT_CHECK(ctx && lm_device_equal(lm_ctx_device(ctx), k_gpu) && lm_ctx_stream(ctx) != NULL);
    LT_CHECK_OK(lm_ctx_synchronize(ctx));

    /* lm_device_synchronize waits for work queued on a context's stream: a 64 MiB copy
     * into pinned memory queued asynchronously is complete once it returns. */
    size_t n = (size_t)64 << 20;
    void *d = NULL, *h = NULL;
    LT_CHECK_OK(lm_device_alloc(k_gpu, n, &d));
    LT_CHECK_OK(lm_host_alloc(k_gpu, n, &h));
    const uint32_t pattern = 0x5EEDF00Du;
    LT_CHECK_OK(lm_device_fill(k_gpu, d, n, &pattern, 4));
    memset(h, 0, n);
    LT_CHECK_OK(lm_ctx_copy(ctx, lm_device_cpu(), h, k_gpu, d, n));
    LT_CHECK_OK(lm_device_synchronize(k_gpu));
    const uint32_t *hw = h;
    size_t bad = 0;
    for (size_t i = 0; i < n / 4; i++) bad += hw[i] != pattern;
    LT_CHECK_MSG(bad == 0, "%zu words not yet copied after lm_device_synchronize", bad);
    lm_host_free(k_gpu, h);
    lm_device_free(k_gpu, d);
    lm_ctx_destroy(ctx);
    void *p = NULL;
    lm_device missing = lm_device_cuda(lm_cuda_device_count());
    LT_CHECK_STATUS(lm_device_alloc(missing, 16, &p), LM_DEVICE_ERROR);
    LT_CHECK(p == NULL);
    LT_CHECK_STATUS(lm_device_synchronize(missing), LM_DEVICE_ERROR);
}

int main(void) {
    if (lm_cuda_device_count() == 0) lt_skip("no CUDA device");
    LT_RUN(test_copy_round_trip);
    LT_RUN(test_fill_patterns);
    LT_RUN(test_tensor_to_device_both_ways);
    LT_RUN(test_cuda_context);
    return lt_finish();
}
