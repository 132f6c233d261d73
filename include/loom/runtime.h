/* loom/runtime.h — devices and execution contexts.
 *
 * A device is a plain value (type + index). An lm_ctx carries the device an
 * operation runs on, its stream (CUDA) or thread pool (CPU), and the operator
 * implementation policy. Contexts are not thread-safe: use one per thread.
 */
#ifndef LOOM_RUNTIME_H
#define LOOM_RUNTIME_H

#include "loom/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lm_device_type { LM_DEVICE_CPU = 0, LM_DEVICE_CUDA = 1 } lm_device_type;

typedef struct lm_device {
    lm_device_type type;
    int index; /* 0 for the CPU; CUDA ordinal otherwise */
} lm_device;

static inline lm_device lm_device_cpu(void) { return (lm_device){LM_DEVICE_CPU, 0}; }
static inline lm_device lm_device_cuda(int index) { return (lm_device){LM_DEVICE_CUDA, index}; }
static inline int lm_device_equal(lm_device a, lm_device b) { return a.type == b.type && a.index == b.index; }

/* Parses "cpu", "cuda" (= cuda:0) or "cuda:N". Unknown text is LM_INVALID_ARGUMENT. */
LM_API lm_status lm_device_parse(const char *text, lm_device *out);
/* Writes "cpu" or "cuda:N" into buf (always NUL-terminated); returns buf. */
LM_API const char *lm_device_format(lm_device d, char *buf, size_t bufsize);
/* Number of usable CUDA devices: 0 when loom was built without CUDA or no GPU exists. */
LM_API int lm_cuda_device_count(void);
/* 1 if loom was compiled with CUDA support. */
LM_API int lm_cuda_compiled(void);

/* Raw device memory. The caller owns *out and frees it with lm_device_free on the
 * same device. A zero-byte request succeeds with *out possibly NULL. */
LM_API lm_status lm_device_alloc(lm_device d, size_t nbytes, void **out);
LM_API void lm_device_free(lm_device d, void *ptr); /* accepts NULL */
/* Synchronous byte copy between any two devices (host<->device, device<->device).
 * A copy touching a CUDA device first waits for all work queued on that device. */
LM_API lm_status lm_device_copy(lm_device dst_dev, void *dst, lm_device src_dev, const void *src, size_t nbytes);
/* Waits until all work queued on device d is done, on every stream, whoever queued it
 * (loom's contexts and other libraries sharing the device): what a caller needs before
 * handing device memory to code that does not order itself after loom's streams. A
 * no-op on the CPU. */
LM_API lm_status lm_device_synchronize(lm_device d);
/* Fills nbytes with a repeated 1-, 2- or 4-byte pattern (used to poison outputs). */
LM_API lm_status lm_device_fill(lm_device d, void *dst, size_t nbytes, const void *pattern, size_t pattern_size);

/* Host memory for transfers with device d: page-locked (pinned) for a CUDA device, so
 * copies queued with lm_ctx_copy run asynchronously and without staging; ordinary
 * 64-byte aligned host memory for the CPU. The host reads and writes it directly.
 * The caller owns *out and frees it with lm_host_free on the same d. A zero-byte
 * request succeeds with *out possibly NULL. */
LM_API lm_status lm_host_alloc(lm_device d, size_t nbytes, void **out);
LM_API void lm_host_free(lm_device d, void *ptr); /* accepts NULL */

/* What a device can do, so callers can decide without asking which device it is. */
typedef struct lm_device_caps {
    int host_addressable; /* 1: the host loads and stores this memory directly (CPU) */
    int async;            /* 1: work on a context is queued and returns before it runs;
                             read results after lm_ctx_synchronize (CUDA) */
    int graph_capture;    /* 1: lm_ctx_capture_begin/end can record work for replay (CUDA) */
    int64_t memory_bytes; /* total memory: physical RAM for the CPU, the GPU's global
                             memory for CUDA; 0 when it cannot be determined */
    char name[64];        /* "cpu", or the GPU's product name (e.g. "NVIDIA H200"); NUL-terminated */
    int fast_16bit;       /* 1: 16-bit matrix units make bf16 compute the fast path (tensor cores);
                             0: loom's kernels here compute in f32 (the CPU) */
    int reserved[15];     /* zero; room for new fields without changing the struct's size */
} lm_device_caps;

/* Fills *out for d. LM_INVALID_ARGUMENT for a NULL out or an unknown device type,
 * LM_UNSUPPORTED for a device type this build lacks, LM_DEVICE_ERROR for an ordinal
 * with no device. */
LM_API lm_status lm_device_caps_get(lm_device d, lm_device_caps *out);

/* Operator implementation policy: which level of ops/ an operation dispatches to. */
typedef enum lm_impl {
    LM_IMPL_AUTO = 0, /* the proven fastest implementation for the device */
    LM_IMPL_REF = 1,  /* the readable reference (CPU only) */
    LM_IMPL_TUNED = 2 /* force the tuned implementation; LM_UNSUPPORTED if none */
} lm_impl;

typedef struct lm_ctx lm_ctx;

/* nthreads: CPU worker threads for tuned CPU ops (<= 0: one per logical CPU).
 * The caller owns *out: lm_ctx_destroy. For CUDA, the context creates its stream. */
LM_API lm_status lm_ctx_create(lm_device device, int nthreads, lm_ctx **out);
LM_API void lm_ctx_destroy(lm_ctx *ctx); /* accepts NULL */
LM_API lm_device lm_ctx_device(const lm_ctx *ctx);
LM_API lm_threadpool *lm_ctx_threadpool(const lm_ctx *ctx); /* borrowed; NULL = single thread */
LM_API void *lm_ctx_stream(const lm_ctx *ctx);              /* borrowed cudaStream_t; NULL on CPU */
LM_API void lm_ctx_set_impl(lm_ctx *ctx, lm_impl impl);
LM_API lm_impl lm_ctx_impl(const lm_ctx *ctx);
/* Waits until all work queued on the context has finished. */
LM_API lm_status lm_ctx_synchronize(lm_ctx *ctx);
/* Copies nbytes queued on ctx's stream, ordered with ctx's other work but without
 * waiting for the rest of the device (on the CPU it runs at once, as memmove). Each of
 * dst_dev and src_dev is ctx's device or host memory (a host-addressable device).
 * Host memory involved must stay valid and unchanged until the copy is done
 * (lm_ctx_synchronize); with CUDA the copy is truly asynchronous only from and to
 * lm_host_alloc memory. */
LM_API lm_status lm_ctx_copy(lm_ctx *ctx, lm_device dst_dev, void *dst, lm_device src_dev, const void *src, size_t nbytes);

/* ---- device memory statistics (CUDA caching allocator) -------------------------
 * CUDA allocations are served from a per-device cache: freed blocks are kept and
 * handed out again for requests of a similar size, so steady-state work does not
 * call cudaMalloc/cudaFree. Sizes are rounded up (512 B below 1 MiB, 2 MiB above).
 * A CPU device, or a build without CUDA, answers LM_UNSUPPORTED. */
typedef struct lm_device_memory_stats {
    int64_t current_bytes;       /* bytes in blocks handed out and not yet freed */
    int64_t peak_bytes;          /* largest current_bytes since the last reset */
    int64_t reserved_bytes;      /* bytes held from the backend: in use + cached */
    int64_t peak_reserved_bytes; /* largest reserved_bytes since the last reset */
    int64_t backend_allocs;      /* cudaMalloc calls so far */
    int64_t backend_frees;       /* cudaFree calls so far */
    int64_t cache_hits;          /* allocations served from the cache */
} lm_device_memory_stats;

LM_API lm_status lm_device_memory_stats_get(lm_device d, lm_device_memory_stats *out);
/* Peaks restart from the current values. */
LM_API lm_status lm_device_memory_reset_peak(lm_device d);
/* Returns every cached (free) block to the backend. */
LM_API lm_status lm_device_empty_cache(lm_device d);

/* ---- events: points in a context's queue of work -------------------------------
 * On CUDA an event is a cudaEvent recorded on the context's stream; on the CPU, where
 * work is synchronous, it is the host clock at record time. */
typedef struct lm_event lm_event;

LM_API lm_status lm_event_create(lm_ctx *ctx, lm_event **out); /* caller owns *out */
LM_API void lm_event_destroy(lm_event *e);                     /* accepts NULL */
/* Marks the current end of ctx's queue (ctx must be on the event's device). */
LM_API lm_status lm_event_record(lm_event *e, lm_ctx *ctx);
/* Waits on the host until the recorded work is done. */
LM_API lm_status lm_event_synchronize(lm_event *e);
/* Milliseconds between two recorded events (both done). */
LM_API lm_status lm_event_elapsed_ms(const lm_event *start, const lm_event *end, double *ms);
/* Work queued on ctx after this call waits for e on the device (host does not block). */
LM_API lm_status lm_ctx_wait_event(lm_ctx *ctx, const lm_event *e);

/* ---- graphs: capture a caller-owned region of work once, replay it many times ----
 * Between lm_ctx_capture_begin and lm_ctx_capture_end every operation queued on ctx
 * is recorded instead of run (CUDA stream capture, thread-local mode); replaying
 * runs the same kernels on the same buffers, so the caller keeps every buffer the
 * region touches alive and at the same address while the graph exists. Memory must
 * not be allocated or freed inside the region. Devices with lm_device_caps.graph_capture
 * only (CUDA); others answer LM_UNSUPPORTED. */
typedef struct lm_device_graph lm_device_graph;

LM_API lm_status lm_ctx_capture_begin(lm_ctx *ctx);
/* Ends the capture and instantiates it; on failure the capture is discarded. */
LM_API lm_status lm_ctx_capture_end(lm_ctx *ctx, lm_device_graph **out);
/* 1 between a successful lm_ctx_capture_begin and the matching lm_ctx_capture_end
 * (work queued now is recorded, not run); 0 otherwise and for NULL. */
LM_API int lm_ctx_capturing(const lm_ctx *ctx);
/* Queues one replay on ctx (asynchronous, like any other work on the context). */
LM_API lm_status lm_device_graph_launch(const lm_device_graph *g, lm_ctx *ctx);
/* Kernel launches one replay of g makes (the captured kernel nodes; memsets and copies
 * are not counted); 0 for NULL. */
LM_API int64_t lm_device_graph_kernels(const lm_device_graph *g);
LM_API void lm_device_graph_destroy(lm_device_graph *g); /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
