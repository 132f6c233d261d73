/* runtime/internal.h — the device back-end table behind lm_device_*, lm_ctx, events
 * and graphs (never installed).
 *
 * Each device type has one lm__device_backend: a table of functions that allocate,
 * copy, fill, queue and capture work for the devices of that type. device_cpu.c is
 * the host's (synchronous everything); device_cuda.c is CUDA's, in builds with CUDA.
 * A build without CUDA links device_nocuda.c, whose lookup answers NULL, so generic
 * code (device.c, ctx.c, core, ops) never needs #ifdef LOOM_HAVE_CUDA: it looks the
 * backend up and either calls it or reports that the build lacks it. Every entry is
 * set in every table; an operation a backend cannot do returns LM_UNSUPPORTED.
 */
#ifndef LOOM_RUNTIME_INTERNAL_H
#define LOOM_RUNTIME_INTERNAL_H

#include "base/internal.h"
#include "loom/runtime.h"

/* Direction of a byte copy, seen from the backend doing it: "host" is memory the
 * host addresses (the CPU's), "device" is the backend's own memory. */
typedef enum lm__copy_kind {
    LM__COPY_HOST_TO_DEVICE = 0,
    LM__COPY_DEVICE_TO_HOST = 1,
    LM__COPY_DEVICE_TO_DEVICE = 2,
    LM__COPY_HOST_TO_HOST = 3
} lm__copy_kind;

/* Most dimensions a strided copy (copy_strided, lm__host_copy_strided) walks: the
 * copies keep per-dimension arrays of this size. Runtime sits below core, so it has
 * its own bound; core/copy.c asserts that LM_MAX_DIMS does not exceed it. */
#define LM__COPY_MAX_DIMS 8

/* The phases of a captured step's reservation of a device allocator (pool_reserve). */
typedef enum lm__reserve_phase {
    LM__RESERVE_BEGIN = 0,    /* a capture begins: the blocks it allocates join the reservation */
    LM__RESERVE_CAPTURED = 1, /* the capture ended: the reservation stays for the graph's replays */
    LM__RESERVE_RELEASE = 2   /* the graph is gone: the reserved blocks return to the allocator */
} lm__reserve_phase;

/* index: the device ordinal; stream, event, graph: the backend's opaque handles (NULL
 * stream = the backend runs work as it is issued). Statuses carry the detail in
 * lm_last_error(). Destroy/free entries accept NULL. */
typedef struct lm__device_backend {
    const char *name;  /* "cpu", "cuda": the prefix of lm_device_format */
    const char *label; /* "CPU", "CUDA": how messages name the device type */
    /* Static capabilities (lm_device_caps): host_addressable = the host may load and
     * store this memory directly; async = work is queued and returns before it runs;
     * graph_capture = capture_begin/end record work for replay. */
    int host_addressable, async, graph_capture;

    int (*count)(void); /* usable devices of this type */
    /* memory_bytes and name of device index (lm_device_caps_get sets the flags). */
    lm_status (*caps)(int index, lm_device_caps *out);

    /* device memory (zero bytes may give *out == NULL) */
    lm_status (*alloc)(int index, size_t nbytes, void **out);
    void (*free)(int index, void *ptr);
    /* synchronous with respect to all work on the device; index is the device side
     * (the destination's for device-to-device) */
    lm_status (*copy)(lm__copy_kind kind, int index, void *dst, const void *src, size_t nbytes);
    lm_status (*fill)(int index, void *dst, size_t nbytes, const void *pattern, size_t pattern_size);
    /* Waits for all work queued on the device, on every stream (NULL: nothing is ever queued). */
    lm_status (*synchronize)(int index);
    /* host memory the backend transfers from without staging (pinned for CUDA) */
    lm_status (*host_alloc)(int index, size_t nbytes, void **out);
    void (*host_free)(int index, void *ptr);

    /* streams: one per context */
    lm_status (*stream_create)(int index, void **stream);
    void (*stream_destroy)(int index, void *stream);
    lm_status (*stream_sync)(void *stream);
    /* queued on stream, without waiting for the rest of the device */
    lm_status (*copy_async)(void *stream, lm__copy_kind kind, void *dst, const void *src, size_t nbytes);
    /* queued on stream: nbytes of dst (this backend's memory) set to the byte value;
     * count 32-bit words of dst (4-byte aligned) set to word */
    lm_status (*memset_async)(void *stream, void *dst, int value, size_t nbytes);
    lm_status (*fill32_async)(void *stream, void *dst, uint32_t word, size_t count);
    /* queued on stream: dst[i] = src[i] over the row-major index space of shape, both
     * views in this backend's memory, strides in elements of elem_size (1, 2, 4 or 8)
     * bytes; the views must not overlap */
    lm_status (*copy_strided)(void *stream, int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride,
                              const void *src, const int64_t *src_stride, size_t elem_size);

    /* events: points in a stream's queue */
    lm_status (*event_create)(int index, void **event);
    void (*event_destroy)(void *event);
    lm_status (*event_record)(void *event, void *stream);
    lm_status (*event_sync)(void *event);
    lm_status (*event_elapsed)(void *start, void *end, double *ms);
    lm_status (*stream_wait)(void *stream, void *event);

    /* graphs: capture_end always ends the capture; on failure *graph is NULL; *kernels
     * receives the kernel launches one replay makes */
    lm_status (*capture_begin)(void *stream);
    lm_status (*capture_end)(void *stream, void **graph, int64_t *kernels);
    lm_status (*graph_launch)(void *graph, void *stream);
    void (*graph_destroy)(void *graph);

    /* the caching allocator's statistics */
    lm_status (*memory_stats)(int index, lm_device_memory_stats *out);
    lm_status (*memory_reset_peak)(int index);
    lm_status (*empty_cache)(int index);
    /* a captured step's reservation of the allocator (lm__ctx_capture_begin_reserved);
     * NULL: the backend has none */
    lm_status (*pool_reserve)(int index, lm__reserve_phase phase, int64_t *foreign);

    /* Releases the per-context state the backend made on demand (lm__ctx_backend_state;
     * CUDA: the cuBLASLt handle and workspace). Called before stream_destroy. */
    void (*ctx_state_destroy)(int index, void *state);
} lm__device_backend;

/* Registrations: device_cpu.c; device_cuda.c (with CUDA) or device_nocuda.c (NULL). */
const lm__device_backend *lm__device_backend_cpu(void);
const lm__device_backend *lm__device_backend_cuda(void);

/* runtime/device.c: the backend of a device type (NULL for an unknown type or one
 * this build lacks), and the checked lookup every public entry point uses: an
 * unknown type is LM_INVALID_ARGUMENT, a type the build lacks LM_UNSUPPORTED
 * ("cuda:1 requested but loom was built without CUDA"), an ordinal past the
 * backend's count LM_DEVICE_ERROR. */
const lm__device_backend *lm__device_backend_get(lm_device_type type);
lm_status lm__device_backend_of(lm_device d, const lm__device_backend **out);
/* 1 when the host may read and write d's memory directly (the CPU); 0 otherwise,
 * unknown or missing device types included. Costs one table lookup. */
int lm__device_host_addressable(lm_device d);

/* runtime/device_cpu.c: the host strided copy (the CPU backend's copy_strided):
 * innermost axis as the fast loop, one memcpy per row when both inner strides are 1.
 * O(numel) element moves. */
void lm__host_copy_strided(int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride, const void *src,
                           const int64_t *src_stride, size_t elem_size);

/* runtime/ctx.c */
/* The slot where ctx's backend keeps per-context state it makes on first use
 * (NULL until then); the backend's ctx_state_destroy releases it with ctx. */
void **lm__ctx_backend_state(lm_ctx *ctx);
/* ctx's backend copy_strided on ctx's stream (views on ctx's device). */
/* A capture whose allocations the device's allocator reserves for the graph: blocks
 * the captured work allocates stay the graph's after the capture (later allocations
 * never share them) until lm__device_reserve_release. One per device at a time.
 * *foreign: blocks allocated before the capture and freed during it (the graph may
 * still use them, so a caller must not replay it when this is not 0). LM_UNSUPPORTED
 * on a device without graphs. */
lm_status lm__ctx_capture_begin_reserved(lm_ctx *ctx);
lm_status lm__ctx_capture_end_reserved(lm_ctx *ctx, lm_device_graph **out, int64_t *foreign);
void lm__device_reserve_release(lm_device d);
/* nbytes at dst (memory of ctx's device) set to the byte value, in ctx's stream order
 * (nothing waits; a capture records it). */
lm_status lm__ctx_memset(lm_ctx *ctx, void *dst, int value, size_t nbytes);
/* count 32-bit words at dst (4-byte aligned, ctx's device) set to word, likewise. */
lm_status lm__ctx_fill32(lm_ctx *ctx, void *dst, uint32_t word, size_t count);
lm_status lm__ctx_copy_strided(lm_ctx *ctx, int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride,
                               const void *src, const int64_t *src_stride, size_t elem_size);

#endif
