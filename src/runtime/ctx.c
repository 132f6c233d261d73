/* runtime/ctx.c — lm_ctx: the device an operation runs on, its backend and stream
 * (NULL where work runs as it is issued), the CPU thread pool, the operator
 * implementation policy, per-context backend state made on first use (CUDA: the
 * cuBLASLt handle); events marking points in a context's work and graphs captured
 * from it. One context per thread. Everything device-specific goes through the
 * context's backend table (runtime/internal.h), resolved once at creation.
 */
#include "runtime/internal.h"

struct lm_ctx {
    lm_device device;
    const lm__device_backend *be;
    lm_threadpool *pool;  /* CPU worker threads for tuned CPU ops; NULL = one thread */
    void *stream;         /* the backend's stream (cudaStream_t); NULL on the CPU */
    void *backend_state;  /* made by the backend on first use, released with the context */
    lm_impl impl;
    int capturing;        /* 1 between capture_begin and capture_end */
};

struct lm_event {
    lm_device device;
    const lm__device_backend *be;
    void *handle; /* the backend's event (cudaEvent_t; a host timestamp on the CPU) */
    int recorded;
};

struct lm_device_graph {
    lm_device device;
    const lm__device_backend *be;
    void *exec; /* the backend's executable graph (cudaGraphExec_t) */
    int64_t kernels; /* kernel launches one replay makes */
};

lm_status lm_ctx_create(lm_device device, int nthreads, lm_ctx **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_create: out is NULL");
    *out = NULL;
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(device, &be));
    lm_ctx *c = lm__calloc(1, sizeof *c);
    if (!c) return LM_OUT_OF_MEMORY;
    c->device = device;
    c->be = be;
    lm_status st = LM_OK;
    if (nthreads <= 0) nthreads = lm_cpu_get_features()->logical_cpus;
    if (nthreads > 1) st = lm_threadpool_create(nthreads, &c->pool);
    if (st == LM_OK) st = be->stream_create(device.index, &c->stream);
    if (st != LM_OK) {
        lm_ctx_destroy(c);
        return st;
    }
    *out = c;
    return LM_OK;
}

void lm_ctx_destroy(lm_ctx *c) {
    if (!c) return;
    if (c->stream) c->be->stream_sync(c->stream);
    c->be->ctx_state_destroy(c->device.index, c->backend_state);
    if (c->stream) c->be->stream_destroy(c->device.index, c->stream);
    lm_threadpool_destroy(c->pool);
    lm__free(c);
}

lm_device lm_ctx_device(const lm_ctx *c) { return c ? c->device : lm_device_cpu(); }
lm_threadpool *lm_ctx_threadpool(const lm_ctx *c) { return c ? c->pool : NULL; }
void *lm_ctx_stream(const lm_ctx *c) { return c ? c->stream : NULL; }
void lm_ctx_set_impl(lm_ctx *c, lm_impl impl) {
    if (c) c->impl = impl;
}
lm_impl lm_ctx_impl(const lm_ctx *c) { return c ? c->impl : LM_IMPL_AUTO; }
int lm_ctx_capturing(const lm_ctx *c) { return c ? c->capturing : 0; }

lm_status lm_ctx_synchronize(lm_ctx *c) { return c ? c->be->stream_sync(c->stream) : LM_OK; }

void **lm__ctx_backend_state(lm_ctx *c) { return &c->backend_state; }

/* ---- copies on the context's stream ------------------------------------------------- */
/* d is ctx's device or host memory; which says which end it is in messages. */
static lm_status reachable(const lm_ctx *c, lm_device d, const char *which, const lm__device_backend **be) {
    LM_TRY(lm__device_backend_of(d, be));
    if (lm_device_equal(d, c->device) || (*be)->host_addressable) return LM_OK;
    char a[32], b[32];
    return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_copy: the %s is on %s, which is neither the context's device (%s) "
                                          "nor host memory", which, lm_device_format(d, a, sizeof a),
                     lm_device_format(c->device, b, sizeof b));
}

lm_status lm_ctx_copy(lm_ctx *c, lm_device dst_dev, void *dst, lm_device src_dev, const void *src, size_t nbytes) {
    if (!c) return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_copy: NULL context");
    if (nbytes == 0) return LM_OK;
    if (!dst || !src) return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_copy: NULL pointer for %zu bytes", nbytes);
    const lm__device_backend *bd, *bs;
    LM_TRY(reachable(c, dst_dev, "destination", &bd));
    LM_TRY(reachable(c, src_dev, "source", &bs));
    lm__copy_kind kind = bs->host_addressable
                             ? (bd->host_addressable ? LM__COPY_HOST_TO_HOST : LM__COPY_HOST_TO_DEVICE)
                             : (bd->host_addressable ? LM__COPY_DEVICE_TO_HOST : LM__COPY_DEVICE_TO_DEVICE);
    return c->be->copy_async(c->stream, kind, dst, src, nbytes);
}

lm_status lm__ctx_memset(lm_ctx *c, void *dst, int value, size_t nbytes) {
    if (!c) return lm__error(LM_INVALID_ARGUMENT, "lm__ctx_memset: NULL context");
    if (nbytes == 0) return LM_OK;
    if (!dst) return lm__error(LM_INVALID_ARGUMENT, "lm__ctx_memset: NULL pointer for %zu bytes", nbytes);
    return c->be->memset_async(c->stream, dst, value, nbytes);
}

lm_status lm__ctx_fill32(lm_ctx *c, void *dst, uint32_t word, size_t count) {
    if (!c) return lm__error(LM_INVALID_ARGUMENT, "lm__ctx_fill32: NULL context");
    if (count == 0) return LM_OK;
    if (!dst || ((uintptr_t)dst & 3))
        return lm__error(LM_INVALID_ARGUMENT, "lm__ctx_fill32: %p is not a 4-byte aligned pointer", dst);
    return c->be->fill32_async(c->stream, dst, word, count);
}

lm_status lm__ctx_copy_strided(lm_ctx *c, int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride,
                               const void *src, const int64_t *src_stride, size_t elem_size) {
    return c->be->copy_strided(c->stream, ndim, shape, dst, dst_stride, src, src_stride, elem_size);
}

/* ---- events -------------------------------------------------------------------------- */
lm_status lm_event_create(lm_ctx *ctx, lm_event **out) {
    if (!ctx || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_event_create: NULL argument");
    *out = NULL;
    lm_event *e = lm__calloc(1, sizeof *e);
    if (!e) return LM_OUT_OF_MEMORY;
    e->device = ctx->device;
    e->be = ctx->be;
    lm_status st = ctx->be->event_create(ctx->device.index, &e->handle);
    if (st != LM_OK) {
        lm__free(e);
        return st;
    }
    *out = e;
    return LM_OK;
}

void lm_event_destroy(lm_event *e) {
    if (!e) return;
    e->be->event_destroy(e->handle);
    lm__free(e);
}

static lm_status same_device(const lm_event *e, const lm_ctx *ctx, const char *what) {
    if (!e || !ctx) return lm__error(LM_INVALID_ARGUMENT, "%s: NULL argument", what);
    if (!lm_device_equal(e->device, ctx->device)) {
        char a[32], b[32];
        return lm__error(LM_INVALID_ARGUMENT, "%s: the event belongs to %s but the context runs on %s", what,
                         lm_device_format(e->device, a, sizeof a), lm_device_format(ctx->device, b, sizeof b));
    }
    return LM_OK;
}

lm_status lm_event_record(lm_event *e, lm_ctx *ctx) {
    LM_TRY(same_device(e, ctx, "lm_event_record"));
    e->recorded = 1;
    return e->be->event_record(e->handle, ctx->stream);
}

lm_status lm_event_synchronize(lm_event *e) {
    if (!e) return lm__error(LM_INVALID_ARGUMENT, "lm_event_synchronize: NULL event");
    return e->be->event_sync(e->handle);
}

lm_status lm_event_elapsed_ms(const lm_event *a, const lm_event *b, double *ms) {
    if (!a || !b || !ms) return lm__error(LM_INVALID_ARGUMENT, "lm_event_elapsed_ms: NULL argument");
    if (!a->recorded || !b->recorded) return lm__error(LM_INVALID_ARGUMENT, "lm_event_elapsed_ms: an event was never recorded");
    if (!lm_device_equal(a->device, b->device))
        return lm__error(LM_INVALID_ARGUMENT, "lm_event_elapsed_ms: the events belong to different devices");
    return a->be->event_elapsed(a->handle, b->handle, ms);
}

lm_status lm_ctx_wait_event(lm_ctx *ctx, const lm_event *e) {
    LM_TRY(same_device(e, ctx, "lm_ctx_wait_event"));
    return ctx->be->stream_wait(ctx->stream, e->handle);
}

/* ---- graphs ------------------------------------------------------------------------------- */
lm_status lm_ctx_capture_begin(lm_ctx *ctx) {
    if (!ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_capture_begin: NULL context");
    LM_TRY(ctx->be->capture_begin(ctx->stream));
    ctx->capturing = 1;
    return LM_OK;
}

lm_status lm_ctx_capture_end(lm_ctx *ctx, lm_device_graph **out) {
    if (!ctx || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_capture_end: NULL argument");
    *out = NULL;
    void *exec = NULL;
    int64_t kernels = 0;
    lm_status st = ctx->be->capture_end(ctx->stream, &exec, &kernels); /* always ends the capture */
    ctx->capturing = 0;
    LM_TRY(st);
    lm_device_graph *g = lm__calloc(1, sizeof *g);
    if (!g) {
        ctx->be->graph_destroy(exec);
        return LM_OUT_OF_MEMORY;
    }
    g->device = ctx->device;
    g->be = ctx->be;
    g->exec = exec;
    g->kernels = kernels;
    *out = g;
    return LM_OK;
}

lm_status lm__ctx_capture_begin_reserved(lm_ctx *ctx) {
    if (!ctx) return lm__error(LM_INVALID_ARGUMENT, "lm__ctx_capture_begin_reserved: NULL context");
    if (!ctx->be->pool_reserve)
        return lm__error(LM_UNSUPPORTED, "%s contexts cannot capture work", ctx->be->label);
    LM_TRY(ctx->be->pool_reserve(ctx->device.index, LM__RESERVE_BEGIN, NULL));
    lm_status st = lm_ctx_capture_begin(ctx);
    if (st != LM_OK) {
        ctx->be->pool_reserve(ctx->device.index, LM__RESERVE_CAPTURED, NULL);
        ctx->be->pool_reserve(ctx->device.index, LM__RESERVE_RELEASE, NULL);
    }
    return st;
}

lm_status lm__ctx_capture_end_reserved(lm_ctx *ctx, lm_device_graph **out, int64_t *foreign) {
    if (!ctx || !out || !foreign) return lm__error(LM_INVALID_ARGUMENT, "lm__ctx_capture_end_reserved: NULL argument");
    lm_status st = lm_ctx_capture_end(ctx, out); /* always ends the capture */
    ctx->be->pool_reserve(ctx->device.index, LM__RESERVE_CAPTURED, foreign);
    return st;
}

void lm__device_reserve_release(lm_device d) {
    const lm__device_backend *be = NULL;
    if (lm__device_backend_of(d, &be) == LM_OK && be->pool_reserve) be->pool_reserve(d.index, LM__RESERVE_RELEASE, NULL);
    lm_clear_error();
}

int64_t lm_device_graph_kernels(const lm_device_graph *g) { return g ? g->kernels : 0; }

lm_status lm_device_graph_launch(const lm_device_graph *g, lm_ctx *ctx) {
    if (!g || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_device_graph_launch: NULL argument");
    if (!lm_device_equal(g->device, ctx->device))
        return lm__error(LM_INVALID_ARGUMENT, "lm_device_graph_launch: the graph was captured on another device");
    return g->be->graph_launch(g->exec, ctx->stream);
}

void lm_device_graph_destroy(lm_device_graph *g) {
    if (!g) return;
    g->be->graph_destroy(g->exec);
    lm__free(g);
}
