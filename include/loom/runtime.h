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
lm_status lm_device_parse(const char *text, lm_device *out);
/* Writes "cpu" or "cuda:N" into buf (always NUL-terminated); returns buf. */
const char *lm_device_format(lm_device d, char *buf, size_t bufsize);
/* Number of usable CUDA devices: 0 when loom was built without CUDA or no GPU exists. */
int lm_cuda_device_count(void);
/* 1 if loom was compiled with CUDA support. */
int lm_cuda_compiled(void);

/* Raw device memory. The caller owns *out and frees it with lm_device_free on the
 * same device. A zero-byte request succeeds with *out possibly NULL. */
lm_status lm_device_alloc(lm_device d, size_t nbytes, void **out);
void lm_device_free(lm_device d, void *ptr); /* accepts NULL */
/* Synchronous byte copy between any two devices (host<->device, device<->device). */
lm_status lm_device_copy(lm_device dst_dev, void *dst, lm_device src_dev, const void *src, size_t nbytes);
/* Fills nbytes with a repeated 1-, 2- or 4-byte pattern (used to poison outputs). */
lm_status lm_device_fill(lm_device d, void *dst, size_t nbytes, const void *pattern, size_t pattern_size);

/* Operator implementation policy: which level of ops/ an operation dispatches to. */
typedef enum lm_impl {
    LM_IMPL_AUTO = 0, /* the proven fastest implementation for the device */
    LM_IMPL_REF = 1,  /* the readable reference (CPU only) */
    LM_IMPL_TUNED = 2 /* force the tuned implementation; LM_UNSUPPORTED if none */
} lm_impl;

typedef struct lm_ctx lm_ctx;

/* nthreads: CPU worker threads for tuned CPU ops (<= 0: one per logical CPU).
 * The caller owns *out: lm_ctx_destroy. For CUDA, the context creates its stream. */
lm_status lm_ctx_create(lm_device device, int nthreads, lm_ctx **out);
void lm_ctx_destroy(lm_ctx *ctx); /* accepts NULL */
lm_device lm_ctx_device(const lm_ctx *ctx);
lm_threadpool *lm_ctx_threadpool(const lm_ctx *ctx); /* borrowed; NULL = single thread */
void *lm_ctx_stream(const lm_ctx *ctx);              /* borrowed cudaStream_t; NULL on CPU */
void lm_ctx_set_impl(lm_ctx *ctx, lm_impl impl);
lm_impl lm_ctx_impl(const lm_ctx *ctx);
/* Waits until all work queued on the context has finished. */
lm_status lm_ctx_synchronize(lm_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
