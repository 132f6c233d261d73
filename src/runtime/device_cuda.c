/* runtime/device_cuda.c — the CUDA device backend (built only with CUDA): error
 * mapping, synchronous copies and fills, streams, pinned host memory, capabilities,
 * and the backend table that wires these to pool_cuda.c (memory), copy_cuda.cu
 * (queued copies), graph_cuda.c (events, graphs) and blas_cuda.c (context state).
 *
 * Copies and fills are synchronous with respect to everything on the device: they
 * first wait for all queued work (contexts use non-blocking streams, which the legacy
 * default stream does not order against), then complete before returning. Host
 * transfers of at least LM__STAGE_MIN bytes go through two pinned staging buffers per
 * device so the host-side memcpy of one chunk overlaps the DMA of the other; smaller
 * ones use cudaMemcpy directly. CUDA errors become LM_DEVICE_ERROR (LM_OUT_OF_MEMORY
 * for allocation failures) with the CUDA message in lm_last_error().
 */
#include "runtime/cuda.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define LM__STAGE_CHUNK ((size_t)8 << 20) /* bytes per pinned staging buffer */
#define LM__STAGE_MIN ((size_t)1 << 20)   /* smaller host copies skip staging */

lm_status lm__cuda_check(int err, const char *what) {
    cudaError_t e = (cudaError_t)err;
    if (e == cudaSuccess) return LM_OK;
    lm_status st = e == cudaErrorMemoryAllocation ? LM_OUT_OF_MEMORY : LM_DEVICE_ERROR;
    return lm__error(st, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int lm__cuda_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

/* Per-device pinned staging: two buffers, a private copy stream and one event per
 * buffer saying when its last DMA finished. Guarded by mu (one staged copy at a time). */
typedef struct stage {
    pthread_mutex_t mu;
    int ready;            /* 1 once buffers, stream and events exist */
    void *host[2];        /* [LM__STAGE_CHUNK] pinned bytes each */
    cudaStream_t stream;
    cudaEvent_t done[2];
} stage;

static stage g_stage[LM__CUDA_MAX_DEVICES];
static pthread_once_t g_stage_once = PTHREAD_ONCE_INIT;

static void stage_init_all(void) {
    for (int i = 0; i < LM__CUDA_MAX_DEVICES; i++) pthread_mutex_init(&g_stage[i].mu, NULL);
}

/* Creates the device's staging resources on first use (called with mu held). */
static lm_status stage_ready(stage *s) {
    if (s->ready) return LM_OK;
    for (int i = 0; i < 2; i++) {
        if (!s->host[i]) LM_TRY(lm__cuda_check(cudaHostAlloc(&s->host[i], LM__STAGE_CHUNK, cudaHostAllocDefault),
                                               "cudaHostAlloc (pinned staging)"));
        if (!s->done[i]) LM_TRY(lm__cuda_check(cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming),
                                               "cudaEventCreate (staging)"));
    }
    if (!s->stream) LM_TRY(lm__cuda_check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                                          "cudaStreamCreate (staging)"));
    s->ready = 1;
    return LM_OK;
}

/* Host -> device through the pinned buffers: chunk i is packed into buffer i % 2
 * once that buffer's previous DMA is done, then queued. */
static lm_status staged_h2d(stage *s, uint8_t *dst, const uint8_t *src, size_t nbytes) {
    for (size_t off = 0, i = 0; off < nbytes; off += LM__STAGE_CHUNK, i++) {
        size_t n = LM_MIN(LM__STAGE_CHUNK, nbytes - off);
        int b = (int)(i & 1);
        LM_TRY(lm__cuda_check(cudaEventSynchronize(s->done[b]), "cudaEventSynchronize (staging)"));
        memcpy(s->host[b], src + off, n);
        LM_TRY(lm__cuda_check(cudaMemcpyAsync(dst + off, s->host[b], n, cudaMemcpyHostToDevice, s->stream),
                              "cudaMemcpyAsync (host to device)"));
        LM_TRY(lm__cuda_check(cudaEventRecord(s->done[b], s->stream), "cudaEventRecord (staging)"));
    }
    return lm__cuda_check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize (staging)");
}

/* Device -> host: the DMA of chunk i+1 is queued before chunk i is unpacked. */
static lm_status staged_d2h(stage *s, uint8_t *dst, const uint8_t *src, size_t nbytes) {
    size_t nchunks = (nbytes + LM__STAGE_CHUNK - 1) / LM__STAGE_CHUNK;
    for (size_t i = 0; i <= nchunks; i++) {
        if (i < nchunks) {
            size_t off = i * LM__STAGE_CHUNK, n = LM_MIN(LM__STAGE_CHUNK, nbytes - off);
            int b = (int)(i & 1);
            LM_TRY(lm__cuda_check(cudaMemcpyAsync(s->host[b], src + off, n, cudaMemcpyDeviceToHost, s->stream),
                                  "cudaMemcpyAsync (device to host)"));
            LM_TRY(lm__cuda_check(cudaEventRecord(s->done[b], s->stream), "cudaEventRecord (staging)"));
        }
        if (i > 0) { /* unpack the previous chunk */
            size_t off = (i - 1) * LM__STAGE_CHUNK, n = LM_MIN(LM__STAGE_CHUNK, nbytes - off);
            int b = (int)((i - 1) & 1);
            LM_TRY(lm__cuda_check(cudaEventSynchronize(s->done[b]), "cudaEventSynchronize (staging)"));
            memcpy(dst + off, s->host[b], n);
        }
    }
    return LM_OK;
}

lm_status lm__cuda_copy(lm__copy_kind kind, int index, void *dst, const void *src, size_t nbytes) {
    static const enum cudaMemcpyKind kinds[4] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                 cudaMemcpyDeviceToDevice, cudaMemcpyHostToHost};
    LM_TRY(lm__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    LM_TRY(lm__cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before a copy)"));
    int staged = kind == LM__COPY_HOST_TO_DEVICE || kind == LM__COPY_DEVICE_TO_HOST;
    if (!staged || nbytes < LM__STAGE_MIN || index >= LM__CUDA_MAX_DEVICES) {
        /* a pageable host -> device cudaMemcpy may return before the DMA lands */
        LM_TRY(lm__cuda_check(cudaMemcpy(dst, src, nbytes, kinds[kind]), "cudaMemcpy"));
        return lm__cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after a copy)");
    }
    pthread_once(&g_stage_once, stage_init_all);
    stage *s = &g_stage[index];
    pthread_mutex_lock(&s->mu);
    lm_status st = stage_ready(s);
    if (st == LM_OK)
        st = kind == LM__COPY_HOST_TO_DEVICE ? staged_h2d(s, dst, src, nbytes) : staged_d2h(s, dst, src, nbytes);
    pthread_mutex_unlock(&s->mu);
    return st;
}

lm_status lm__cuda_fill(int index, void *dst, size_t nbytes, const void *pattern, size_t psize) {
    LM_TRY(lm__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    LM_TRY(lm__cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before a fill)"));
    const uint8_t *p = pattern;
    int uniform = 1;
    for (size_t i = 1; i < psize; i++) uniform &= p[i] == p[0];
    if (uniform) {
        LM_TRY(lm__cuda_check(cudaMemset(dst, p[0], nbytes), "cudaMemset"));
        return lm__cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after a fill)");
    }
    /* multi-byte pattern: stage one host buffer of the pattern and copy it over */
    size_t chunk = nbytes < (1u << 20) ? nbytes : (1u << 20);
    uint8_t *host = lm__alloc(chunk, 64);
    if (!host) return LM_OUT_OF_MEMORY;
    for (size_t i = 0; i < chunk; i += psize) memcpy(host + i, pattern, psize);
    lm_status st = LM_OK;
    for (size_t off = 0; off < nbytes && st == LM_OK; off += chunk) {
        size_t n = nbytes - off < chunk ? nbytes - off : chunk;
        st = lm__cuda_check(cudaMemcpy((uint8_t *)dst + off, host, n, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    lm__free(host);
    LM_TRY(st);
    return lm__cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after a fill)");
}

/* Context streams alive per device (see lm__cuda_stream_count). */
static int g_streams[LM__CUDA_MAX_DEVICES];
static pthread_mutex_t g_streams_mu = PTHREAD_MUTEX_INITIALIZER;

lm_status lm__cuda_stream_create(int index, void **stream) {
    LM_TRY(lm__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    cudaStream_t s;
    if (index < LM__CUDA_MAX_DEVICES) {
        pthread_mutex_lock(&g_streams_mu);
        /* blocks freed while one stream was alive were not waited for: let that work
         * finish before a second stream can be handed one of them */
        cudaError_t e = g_streams[index] == 1 ? cudaDeviceSynchronize() : cudaSuccess;
        if (e == cudaSuccess) g_streams[index]++;
        pthread_mutex_unlock(&g_streams_mu);
        LM_TRY(lm__cuda_check(e, "cudaDeviceSynchronize (second stream)"));
    }
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        lm__cuda_stream_destroy(index, NULL);
        return lm__cuda_check(e, "cudaStreamCreate");
    }
    *stream = s;
    return LM_OK;
}

void lm__cuda_stream_destroy(int index, void *stream) {
    if (stream) cudaStreamDestroy((cudaStream_t)stream);
    if (index < 0 || index >= LM__CUDA_MAX_DEVICES) return;
    pthread_mutex_lock(&g_streams_mu);
    if (g_streams[index] > 0) g_streams[index]--;
    pthread_mutex_unlock(&g_streams_mu);
}

int lm__cuda_stream_count(int index) {
    if (index < 0 || index >= LM__CUDA_MAX_DEVICES) return 0;
    pthread_mutex_lock(&g_streams_mu);
    int n = g_streams[index];
    pthread_mutex_unlock(&g_streams_mu);
    return n;
}

lm_status lm__cuda_stream_sync(void *stream) {
    return lm__cuda_check(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

lm_status lm__cuda_caps(int index, lm_device_caps *out) {
    struct cudaDeviceProp prop;
    LM_TRY(lm__cuda_check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties"));
    out->memory_bytes = (int64_t)prop.totalGlobalMem;
    snprintf(out->name, sizeof out->name, "%.63s", prop.name); /* names are shorter; cut if not */
    out->fast_16bit = prop.major >= 8; /* bf16 tensor-core MMA from sm_80 on (loom builds sm_90a kernels) */
    return LM_OK;
}

lm_status lm__cuda_host_alloc(int index, size_t nbytes, void **out) {
    *out = NULL;
    if (nbytes == 0) return LM_OK;
    LM_TRY(lm__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    /* portable: pinned for every device's context, not only the current one */
    return lm__cuda_check(cudaHostAlloc(out, nbytes, cudaHostAllocPortable), "cudaHostAlloc");
}

void lm__cuda_host_free(int index, void *ptr) {
    if (ptr) cudaFreeHost(ptr);
}

static lm_status cuda_synchronize(int index) {
    LM_TRY(lm__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    return lm__cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static const lm__device_backend k_cuda = {
    .name = "cuda",
    .label = "CUDA",
    .host_addressable = 0,
    .async = 1,
    .graph_capture = 1,
    .count = lm__cuda_count,
    .caps = lm__cuda_caps,
    .alloc = lm__cuda_alloc,
    .free = lm__cuda_free,
    .copy = lm__cuda_copy,
    .fill = lm__cuda_fill,
    .synchronize = cuda_synchronize,
    .host_alloc = lm__cuda_host_alloc,
    .host_free = lm__cuda_host_free,
    .stream_create = lm__cuda_stream_create,
    .stream_destroy = lm__cuda_stream_destroy,
    .stream_sync = lm__cuda_stream_sync,
    .copy_async = lm__cuda_copy_async,
    .memset_async = lm__cuda_memset_async,
    .fill32_async = lm__cuda_fill32_async,
    .copy_strided = lm__cuda_copy_strided,
    .event_create = lm__cuda_event_create,
    .event_destroy = lm__cuda_event_destroy,
    .event_record = lm__cuda_event_record,
    .event_sync = lm__cuda_event_sync,
    .event_elapsed = lm__cuda_event_elapsed,
    .stream_wait = lm__cuda_stream_wait,
    .capture_begin = lm__cuda_capture_begin,
    .capture_end = lm__cuda_capture_end,
    .graph_launch = lm__cuda_graph_launch,
    .graph_destroy = lm__cuda_graph_destroy,
    .memory_stats = lm__cuda_memory_stats,
    .memory_reset_peak = lm__cuda_memory_reset_peak,
    .empty_cache = lm__cuda_empty_cache,
    .pool_reserve = lm__cuda_pool_reserve,
    .ctx_state_destroy = lm__cuda_ctx_state_destroy,
};

const lm__device_backend *lm__device_backend_cuda(void) { return &k_cuda; }
