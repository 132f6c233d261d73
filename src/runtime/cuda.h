/* runtime/cuda.h — the CUDA back end's functions (never installed). They exist only
 * in builds with CUDA (files *_cuda.c and *.cu), so only those files include this
 * header; generic code reaches them through the backend table (runtime/internal.h).
 * Every one of them maps a CUDA error to LM_DEVICE_ERROR (LM_OUT_OF_MEMORY for
 * allocation failures) with the CUDA message in lm_last_error().
 */
#ifndef LOOM_RUNTIME_CUDA_H
#define LOOM_RUNTIME_CUDA_H

#include "runtime/internal.h"

/* Largest CUDA ordinal the caching allocator keeps state for, plus one. */
#define LM__CUDA_MAX_DEVICES 64

/* runtime/device_cuda.c: error mapping, copies, fills, streams, pinned memory, caps */
/* Maps a cudaError_t (passed as int so C callers need no CUDA header) to a status;
 * what names the failing call. */
lm_status lm__cuda_check(int cuda_error, const char *what);
int lm__cuda_count(void);
lm_status lm__cuda_caps(int index, lm_device_caps *out);
/* Waits for all work on the device first, then copies; large host transfers go
 * through pinned double-buffered staging. */
lm_status lm__cuda_copy(lm__copy_kind kind, int index, void *dst, const void *src, size_t nbytes);
lm_status lm__cuda_fill(int index, void *dst, size_t nbytes, const void *pattern, size_t psize);
/* Page-locked host memory (cudaHostAlloc, portable to every device's context). */
lm_status lm__cuda_host_alloc(int index, size_t nbytes, void **out);
void lm__cuda_host_free(int index, void *ptr);
/* Context streams: created and destroyed through these so the allocator knows how
 * many streams can touch the device's memory (lm__cuda_stream_count). Creating a
 * device's second stream first waits for the device to be idle. */
lm_status lm__cuda_stream_create(int index, void **stream);
void lm__cuda_stream_destroy(int index, void *stream);
int lm__cuda_stream_count(int index);
lm_status lm__cuda_stream_sync(void *stream);

/* runtime/copy_cuda.cu: copies queued on stream (no waiting). Strided: within one
 * device, as lm__device_backend.copy_strided. */
lm_status lm__cuda_copy_strided(void *stream, int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride,
                                const void *src, const int64_t *src_stride, size_t elem_size);
lm_status lm__cuda_copy_async(void *stream, lm__copy_kind kind, void *dst, const void *src, size_t nbytes);
lm_status lm__cuda_memset_async(void *stream, void *dst, int value, size_t nbytes);
lm_status lm__cuda_fill32_async(void *stream, void *dst, uint32_t word, size_t count);

/* runtime/pool_cuda.c: the caching allocator */
lm_status lm__cuda_alloc(int index, size_t nbytes, void **out);
void lm__cuda_free(int index, void *ptr);
lm_status lm__cuda_memory_stats(int index, lm_device_memory_stats *out);
lm_status lm__cuda_memory_reset_peak(int index);
lm_status lm__cuda_empty_cache(int index);
/* The captured step's reservation (pool_cuda.c): LM__RESERVE_BEGIN begins it (the
 * capture's allocations join it), LM__RESERVE_CAPTURED ends the capture (*foreign:
 * blocks from outside it freed meanwhile), LM__RESERVE_RELEASE releases it. */
lm_status lm__cuda_pool_reserve(int index, lm__reserve_phase phase, int64_t *foreign);

/* runtime/graph_cuda.c: events and graphs on a stream */
lm_status lm__cuda_event_create(int index, void **event);
void lm__cuda_event_destroy(void *event);
lm_status lm__cuda_event_record(void *event, void *stream);
lm_status lm__cuda_event_sync(void *event);
lm_status lm__cuda_event_elapsed(void *start, void *end, double *ms);
lm_status lm__cuda_stream_wait(void *stream, void *event);
lm_status lm__cuda_capture_begin(void *stream);
/* *exec receives a cudaGraphExec_t, *kernels its kernel nodes. */
lm_status lm__cuda_capture_end(void *stream, void **exec, int64_t *kernels);
lm_status lm__cuda_graph_launch(void *exec, void *stream);
void lm__cuda_graph_destroy(void *exec);

/* runtime/blas_cuda.c: one cuBLASLt handle and workspace per context */
typedef struct lm__cuda_blas {
    void *handle;           /* cublasLtHandle_t */
    void *workspace;        /* [workspace_bytes] device scratch for cublasLtMatmul */
    size_t workspace_bytes;
} lm__cuda_blas;
/* ctx's cuBLASLt handle and workspace, made on first use (LM_UNSUPPORTED with *out
 * NULL for a context that is not CUDA's). Borrowed; lives as long as ctx. */
lm_status lm__ctx_cuda_blas(lm_ctx *ctx, const lm__cuda_blas **out);
/* The backend's ctx_state_destroy: releases what lm__ctx_cuda_blas made (NULL ok). */
void lm__cuda_ctx_state_destroy(int index, void *state);

#endif
