/* Tests for the device-neutral memory API and contexts on the CPU: zero-byte and
 * aligned allocations, copies (overlapping ranges included), 1-, 2- and 4-byte fills
 * and their argument checks, and lm_ctx (device, thread pool, impl policy, sync,
 * destroy(NULL)); the CPU's capabilities, host allocations, copies queued on a
 * context (lm_ctx_copy), the capturing flag (the CPU cannot capture), events on the
 * host clock, and the errors for NULL arguments, unknown device types, a CPU ordinal
 * other than 0 and, in a build without CUDA, any CUDA device.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <stdint.h>
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
    LT_CHECK_OK(lm_device_synchronize(cpu)); /* nothing is ever queued on the CPU */

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

static void test_cpu_caps(void) {
    lm_device_caps caps;
    memset(&caps, 0x5A, sizeof caps);
    LT_CHECK_OK(lm_device_caps_get(lm_device_cpu(), &caps));
    LT_CHECK(caps.host_addressable == 1 && caps.async == 0 && caps.graph_capture == 0 && caps.fast_16bit == 0);
    for (int i = 0; i < 15; i++) LT_CHECK(caps.reserved[i] == 0);
    /* physical RAM: at least 64 MiB on anything that runs this suite, and below 2^50 */
    LT_CHECK_MSG(caps.memory_bytes >= ((int64_t)64 << 20) && caps.memory_bytes < ((int64_t)1 << 50),
                 "cpu memory_bytes %lld", (long long)caps.memory_bytes);
    LT_CHECK(memchr(caps.name, '\0', sizeof caps.name) != NULL && strcmp(caps.name, "cpu") == 0);
    LT_CHECK_STATUS(lm_device_caps_get(lm_device_cpu(), NULL), LM_INVALID_ARGUMENT);
    lm_device other = {(lm_device_type)7, 0};
    LT_CHECK_STATUS(lm_device_caps_get(other, &caps), LM_INVALID_ARGUMENT);
    lm_device cpu1 = {LM_DEVICE_CPU, 1};
    LT_CHECK_STATUS(lm_device_caps_get(cpu1, &caps), LM_DEVICE_ERROR);
}

static void test_cpu_host_alloc(void) {
    lm_device cpu = lm_device_cpu();
    void *p = (void *)&p;
    LT_CHECK_OK(lm_host_alloc(cpu, 0, &p));
    lm_host_free(cpu, p);
    LT_CHECK_OK(lm_host_alloc(cpu, 4096 + 3, &p));
    LT_CHECK(p && ((uintptr_t)p & 63) == 0);
    if (p) memset(p, 0x77, 4096 + 3); /* the host writes it directly */
    lm_host_free(cpu, p);
    lm_host_free(cpu, NULL);
    LT_CHECK_STATUS(lm_host_alloc(cpu, 8, NULL), LM_INVALID_ARGUMENT);
    lm_device other = {(lm_device_type)7, 0};
    p = (void *)&p;
    LT_CHECK_STATUS(lm_host_alloc(other, 8, &p), LM_INVALID_ARGUMENT);
    LT_CHECK(p == NULL);
    lm_host_free(other, NULL);
}

static void test_cpu_ctx_copy(void) {
    lm_device cpu = lm_device_cpu();
    lm_ctx *ctx = NULL;
    LT_CHECK_OK(lm_ctx_create(cpu, 1, &ctx));
    unsigned char a[256], b[256];
    for (int i = 0; i < 256; i++) a[i] = (unsigned char)(i * 7 + 1);
    memset(b, 0, sizeof b);
    LT_CHECK_OK(lm_ctx_copy(ctx, cpu, b, cpu, a, sizeof a));
    LT_CHECK_OK(lm_ctx_synchronize(ctx));
    LT_CHECK(memcmp(a, b, sizeof a) == 0);
    LT_CHECK_OK(lm_ctx_copy(ctx, cpu, a + 1, cpu, a, 100)); /* overlapping: memmove semantics */
    LT_CHECK(a[1] == 1 && a[100] == b[99]);
    LT_CHECK_OK(lm_ctx_copy(ctx, cpu, NULL, cpu, NULL, 0));
    LT_CHECK_STATUS(lm_ctx_copy(ctx, cpu, NULL, cpu, a, 4), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_ctx_copy(NULL, cpu, b, cpu, a, 4), LM_INVALID_ARGUMENT);
    lm_device other = {(lm_device_type)7, 0};
    LT_CHECK_STATUS(lm_ctx_copy(ctx, other, b, cpu, a, 4), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_ctx_copy(ctx, cpu, b, other, a, 4), LM_INVALID_ARGUMENT);
    lm_ctx_destroy(ctx);
}

static void test_cpu_capture_and_events(void) {
    lm_ctx *ctx = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &ctx));
    LT_CHECK(lm_ctx_capturing(ctx) == 0 && lm_ctx_capturing(NULL) == 0);
    LT_CHECK_STATUS(lm_ctx_capture_begin(ctx), LM_UNSUPPORTED);
    LT_CHECK(lm_ctx_capturing(ctx) == 0);
    lm_device_graph *g = (lm_device_graph *)&g;
    LT_CHECK_STATUS(lm_ctx_capture_end(ctx, &g), LM_UNSUPPORTED);
    LT_CHECK(g == NULL && lm_ctx_capturing(ctx) == 0);
    LT_CHECK_STATUS(lm_ctx_capture_begin(NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_ctx_capture_end(ctx, NULL), LM_INVALID_ARGUMENT);
    lm_device_graph_destroy(NULL);
    /* events are the host clock: elapsed time is >= 0 and needs both recorded */
    lm_event *e0 = NULL, *e1 = NULL;
    LT_CHECK_OK(lm_event_create(ctx, &e0));
    LT_CHECK_OK(lm_event_create(ctx, &e1));
    double ms = -1;
    LT_CHECK_OK(lm_event_record(e0, ctx));
    LT_CHECK_STATUS(lm_event_elapsed_ms(e0, e1, &ms), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_event_record(e1, ctx));
    LT_CHECK_OK(lm_event_synchronize(e1));
    LT_CHECK_OK(lm_ctx_wait_event(ctx, e1));
    LT_CHECK_OK(lm_event_elapsed_ms(e0, e1, &ms));
    LT_CHECK_MSG(ms >= 0, "elapsed %g ms", ms); /* the host clock is monotonic; speed is not asserted */
    lm_event_destroy(e0);
    lm_event_destroy(e1);
    lm_event_destroy(NULL);
    /* the CPU pools nothing, so it keeps no allocator statistics */
    lm_device_memory_stats ms_;
    LT_CHECK_STATUS(lm_device_memory_stats_get(lm_device_cpu(), &ms_), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_device_memory_reset_peak(lm_device_cpu()), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_device_empty_cache(lm_device_cpu()), LM_UNSUPPORTED);
    lm_ctx_destroy(ctx);
}

/* In a build without CUDA every entry point refuses a CUDA device by saying so. */
static void test_cuda_without_cuda(void) {
    if (lm_cuda_compiled()) return; /* covered by tests/cuda/test_cuda_runtime.c */
    lm_device gpu = lm_device_cuda(1);
    LT_CHECK(lm_cuda_device_count() == 0);
    void *p = (void *)&p;
    LT_CHECK_STATUS(lm_device_alloc(gpu, 8, &p), LM_UNSUPPORTED);
    LT_CHECK(p == NULL);
    LT_CHECK_MSG(strstr(lm_last_error(), "cuda:1 requested but loom was built without CUDA") != NULL, "message: %s",
                 lm_last_error());
    lm_device_caps caps;
    LT_CHECK_STATUS(lm_device_caps_get(gpu, &caps), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_host_alloc(gpu, 8, &p), LM_UNSUPPORTED);
    unsigned char a[4] = {1, 2, 3, 4}, b[4];
    LT_CHECK_STATUS(lm_device_copy(gpu, b, lm_device_cpu(), a, 4), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_device_fill(gpu, b, 4, a, 1), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_device_synchronize(gpu), LM_UNSUPPORTED);
    lm_device_memory_stats ms;
    LT_CHECK_STATUS(lm_device_memory_stats_get(gpu, &ms), LM_UNSUPPORTED);
    lm_ctx *ctx = (lm_ctx *)&ctx;
    LT_CHECK_STATUS(lm_ctx_create(gpu, 1, &ctx), LM_UNSUPPORTED);
    LT_CHECK(ctx == NULL);
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &ctx));
    LT_CHECK_STATUS(lm_ctx_copy(ctx, gpu, b, lm_device_cpu(), a, 4), LM_UNSUPPORTED);
    lm_ctx_destroy(ctx);
    lm_device_free(gpu, NULL);
    lm_host_free(gpu, NULL);
}

int main(void) {
    LT_RUN(test_cpu_alloc_copy_fill);
    LT_RUN(test_cpu_context);
    LT_RUN(test_cpu_caps);
    LT_RUN(test_cpu_host_alloc);
    LT_RUN(test_cpu_ctx_copy);
    LT_RUN(test_cpu_capture_and_events);
    LT_RUN(test_cuda_without_cuda);
    return lt_finish();
}
