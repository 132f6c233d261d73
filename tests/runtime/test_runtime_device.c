/* Tests for the device-neutral memory API and contexts on the CPU: zero-byte and
 * aligned allocations, copies (overlapping ranges included), 1-, 2- and 4-byte fills
 * and their argument checks, and lm_ctx (device, thread pool, impl policy, sync,
 * destroy(NULL)).
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <string.h>

static void test_cpu_alloc_copy_fill(void) {
    lm_device cpu = lm_device_cpu();
    void *p = (void *)&p;
    LT_CHECK_OK(lm_device_alloc(cpu, 0, &p));
    lm_device_free(cpu, p);
    LT_CHECK_OK(lm_device_alloc(cpu, 1000, &p));
    LT_CHECK(p && ((uintptr_t)p & 63) == 0);
    unsigned char *b = p;
    for (int i = 0; i < 1000; i++) b[i] = (unsigned char)i;
    LT_CHECK_OK(lm_device_copy(cpu, b + 10, cpu, b, 100)); /* overlapping: behaves like memmove */
    LT_CHECK(b[10] == 0 && b[109] == 99);
    LT_CHECK_OK(lm_device_copy(cpu, NULL, cpu, NULL, 0));
    LT_CHECK_STATUS(lm_device_copy(cpu, NULL, cpu, b, 4), LM_INVALID_ARGUMENT);

    const uint16_t p2 = 0xBEEF;
    const uint32_t p4 = 0x01020304u;
    const uint8_t p1 = 0x5A;
    LT_CHECK_OK(lm_device_fill(cpu, b, 1000, &p2, 2));
    int bad = 0;
    for (int i = 0; i < 500; i++) bad += memcmp(b + 2 * i, &p2, 2) != 0;
    LT_CHECK_OK(lm_device_fill(cpu, b, 1000, &p4, 4));
    for (int i = 0; i < 250; i++) bad += memcmp(b + 4 * i, &p4, 4) != 0;
    LT_CHECK_OK(lm_device_fill(cpu, b, 999, &p1, 1));
    for (int i = 0; i < 999; i++) bad += b[i] != 0x5A;
    LT_CHECK(bad == 0);
    LT_CHECK_STATUS(lm_device_fill(cpu, b, 999, &p2, 2), LM_INVALID_ARGUMENT); /* not a multiple */
    LT_CHECK_STATUS(lm_device_fill(cpu, b, 24, &p4, 3), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_device_fill(cpu, b, 24, &p4, 8), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_device_fill(cpu, NULL, 0, &p4, 4));
    lm_device_free(cpu, p);
    lm_device_free(cpu, NULL);
    LT_CHECK_STATUS(lm_device_alloc(cpu, 8, NULL), LM_INVALID_ARGUMENT);
    lm_device other = {(lm_device_type)7, 0};
    LT_CHECK_STATUS(lm_device_alloc(other, 8, &p), LM_INVALID_ARGUMENT);
    LT_CHECK(p == NULL);
}

static void test_cpu_context(void) {
    lm_ctx *ctx = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 3, &ctx));
    LT_CHECK(ctx && lm_device_equal(lm_ctx_device(ctx), lm_device_cpu()));
    LT_CHECK(lm_threadpool_size(lm_ctx_threadpool(ctx)) == 3 && lm_ctx_stream(ctx) == NULL);
    LT_CHECK(lm_ctx_impl(ctx) == LM_IMPL_AUTO);
    lm_ctx_set_impl(ctx, LM_IMPL_REF);
    LT_CHECK(lm_ctx_impl(ctx) == LM_IMPL_REF);
    LT_CHECK_OK(lm_ctx_synchronize(ctx));
    lm_ctx_destroy(ctx);
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &ctx)); /* one thread: no pool at all */
    LT_CHECK(lm_ctx_threadpool(ctx) == NULL);
    lm_ctx_destroy(ctx);
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 0, &ctx)); /* one per logical CPU */
    LT_CHECK(lm_threadpool_size(lm_ctx_threadpool(ctx)) == lm_cpu_get_features()->logical_cpus);
    lm_ctx_destroy(ctx);
    lm_ctx_destroy(NULL);
    LT_CHECK_STATUS(lm_ctx_create(lm_device_cpu(), 1, NULL), LM_INVALID_ARGUMENT);
    lm_device other = {(lm_device_type)7, 0};
    ctx = (lm_ctx *)&ctx;
    LT_CHECK_STATUS(lm_ctx_create(other, 1, &ctx), LM_INVALID_ARGUMENT);
    LT_CHECK(ctx == NULL);
}

int main(void) {
    LT_RUN(test_cpu_alloc_copy_fill);
    LT_RUN(test_cpu_context);
    return lt_finish();
}
