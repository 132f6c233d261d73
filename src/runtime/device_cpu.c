/* runtime/device_cpu.c — the CPU's device backend: host memory from lm__alloc, every
 * copy a memmove, and no streams.
 *
 * Work on the CPU runs as it is issued, so a CPU context has no stream (NULL), waiting
 * is a no-op, and a "queued" copy has finished when the call returns. An event is the
 * monotonic host clock at record time (one heap double). Nothing can be captured for
 * replay and memory is not pooled: those entries answer LM_UNSUPPORTED.
 */
#include "runtime/internal.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void lm__host_copy_strided(int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride, const void *src,
                           const int64_t *src_stride, size_t elem_size) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return;
    int64_t es = (int64_t)elem_size;
    int64_t inner = ndim ? shape[ndim - 1] : 1;
    int64_t ds = ndim ? dst_stride[ndim - 1] : 1, ss = ndim ? src_stride[ndim - 1] : 1;
    int64_t rows = n / inner, idx[LM__COPY_MAX_DIMS] = {0};
    for (int64_t r = 0; r < rows; r++) {
        int64_t doff = 0, soff = 0;
        for (int d = 0; d < ndim - 1; d++) {
            doff += idx[d] * dst_stride[d];
            soff += idx[d] * src_stride[d];
        }
        char *dp = (char *)dst + doff * es;
        const char *sp = (const char *)src + soff * es;
        if (ds == 1 && ss == 1) {
            memcpy(dp, sp, (size_t)(inner * es));
        } else {
            for (int64_t i = 0; i < inner; i++) memcpy(dp + i * ds * es, sp + i * ss * es, elem_size);
        }
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
}

static int cpu_count(void) { return 1; }

static lm_status cpu_caps(int index, lm_device_caps *out) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    out->memory_bytes = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
    snprintf(out->name, sizeof out->name, "cpu");
    return LM_OK;
}

static lm_status cpu_alloc(int index, size_t nbytes, void **out) {
    *out = lm__alloc(nbytes, 64);
    return *out ? LM_OK : LM_OUT_OF_MEMORY;
}

static void cpu_free(int index, void *ptr) { lm__free(ptr); }

static lm_status cpu_copy(lm__copy_kind kind, int index, void *dst, const void *src, size_t nbytes) {
    memmove(dst, src, nbytes);
    return LM_OK;
}

static lm_status cpu_fill(int index, void *dst, size_t nbytes, const void *pattern, size_t psize) {
    char *p = dst;
    if (psize == 1) memset(p, *(const uint8_t *)pattern, nbytes);
    else
        for (size_t i = 0; i < nbytes; i += psize) memcpy(p + i, pattern, psize);
    return LM_OK;
}

static lm_status cpu_stream_create(int index, void **stream) {
    *stream = NULL;
    return LM_OK;
}

static void cpu_stream_destroy(int index, void *stream) {}

static lm_status cpu_stream_sync(void *stream) { return LM_OK; }

static lm_status cpu_copy_async(void *stream, lm__copy_kind kind, void *dst, const void *src, size_t nbytes) {
    memmove(dst, src, nbytes);
    return LM_OK;
}

static lm_status cpu_memset_async(void *stream, void *dst, int value, size_t nbytes) {
    (void)stream;
    memset(dst, value, nbytes);
    return LM_OK;
}

static lm_status cpu_fill32_async(void *stream, void *dst, uint32_t word, size_t count) {
    (void)stream;
    for (size_t i = 0; i < count; i++) memcpy((char *)dst + 4 * i, &word, 4);
    return LM_OK;
}

static lm_status cpu_copy_strided(void *stream, int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride,
                                  const void *src, const int64_t *src_stride, size_t elem_size) {
    lm__host_copy_strided(ndim, shape, dst, dst_stride, src, src_stride, elem_size);
    return LM_OK;
}

static lm_status cpu_event_create(int index, void **event) {
    double *t = lm__calloc(1, sizeof *t); /* monotonic seconds at record time */
    *event = t;
    return t ? LM_OK : LM_OUT_OF_MEMORY;
}

static void cpu_event_destroy(void *event) { lm__free(event); }

static lm_status cpu_event_record(void *event, void *stream) {
    *(double *)event = lm__now_seconds();
    return LM_OK;
}

static lm_status cpu_event_sync(void *event) { return LM_OK; }

static lm_status cpu_event_elapsed(void *start, void *end, double *ms) {
    *ms = (*(const double *)end - *(const double *)start) * 1e3;
    return LM_OK;
}

static lm_status cpu_stream_wait(void *stream, void *event) { return LM_OK; }

static lm_status cpu_no_capture(void) {
    return lm__error(LM_UNSUPPORTED, "graph capture: the cpu runs work as it is issued and cannot record it "
                                     "(a CUDA context can)");
}

static lm_status cpu_capture_begin(void *stream) { return cpu_no_capture(); }

static lm_status cpu_capture_end(void *stream, void **graph, int64_t *kernels) {
    *graph = NULL;
    return cpu_no_capture();
}

static lm_status cpu_graph_launch(void *graph, void *stream) { return cpu_no_capture(); }

static void cpu_graph_destroy(void *graph) {}

static lm_status cpu_no_pool(void) {
    return lm__error(LM_UNSUPPORTED, "memory statistics and the allocation cache exist for CUDA devices only "
                                     "(cpu memory comes straight from the host allocator)");
}

static lm_status cpu_memory_stats(int index, lm_device_memory_stats *out) { return cpu_no_pool(); }

static lm_status cpu_memory_reset_peak(int index) { return cpu_no_pool(); }

static lm_status cpu_empty_cache(int index) { return cpu_no_pool(); }

static void cpu_ctx_state_destroy(int index, void *state) {}

static const lm__device_backend k_cpu = {
    .name = "cpu",
    .label = "CPU",
    .host_addressable = 1,
    .async = 0,
    .graph_capture = 0,
    .count = cpu_count,
    .caps = cpu_caps,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .copy_async = cpu_copy_async,
    .memset_async = cpu_memset_async,
    .fill32_async = cpu_fill32_async,
    .copy_strided = cpu_copy_strided,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_sync = cpu_event_sync,
    .event_elapsed = cpu_event_elapsed,
    .stream_wait = cpu_stream_wait,
    .capture_begin = cpu_capture_begin,
    .capture_end = cpu_capture_end,
    .graph_launch = cpu_graph_launch,
    .graph_destroy = cpu_graph_destroy,
    .memory_stats = cpu_memory_stats,
    .memory_reset_peak = cpu_memory_reset_peak,
    .empty_cache = cpu_empty_cache,
    .ctx_state_destroy = cpu_ctx_state_destroy,
};

const lm__device_backend *lm__device_backend_cpu(void) { return &k_cpu; }
