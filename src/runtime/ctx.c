/* runtime/ctx.c — lm_ctx: the device an operation runs on, its CPU thread pool or
 * CUDA stream (plus a lazily created cuBLASLt handle), the operator implementation
 * policy; events marking points in a context's work and graphs captured from it.
 * One context per thread. On the CPU work is synchronous, so an event is simply the
 * host clock at record time and waiting on one is a no-op. */
#include "runtime/internal.h"


struct lm_ctx {
    lm_device device;
    lm_threadpool *pool; /* CPU contexts with > 1 thread */
    void *stream;        /* cudaStream_t for CUDA contexts */
    lm_impl impl;
#ifdef LOOM_HAVE_CUDA
    lm__cuda_blas blas; /* handle == NULL until the first matmul asks for it */
#endif
};

struct lm_event {
    lm_device device;
    void *cuda;     /* cudaEvent_t on CUDA devices */
    double host_s;  /* CPU: monotonic seconds at record time */
    int recorded;
};

struct lm_device_graph {
    lm_device device;
    void *exec; /* cudaGraphExec_t */
};

lm_status lm_ctx_create(lm_device device, int nthreads, lm_ctx **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_create: out is NULL");
    *out = NULL;
    if (device.type != LM_DEVICE_CPU && device.type != LM_DEVICE_CUDA)
        return lm__error(LM_INVALID_ARGUMENT, "unknown device type %d", (int)device.type);
    if (device.type == LM_DEVICE_CUDA && !lm_cuda_compiled())
        return lm__error(LM_UNSUPPORTED, "cuda:%d requested but loom was built without CUDA", device.index);
    lm_ctx *c = lm__calloc(1, sizeof *c);
    if (!c) return LM_OUT_OF_MEMORY;
    c->device = device;
    lm_status st = LM_OK;
    if (nthreads <= 0) nthreads = lm_cpu_get_features()->logical_cpus;
    if (nthreads > 1) st = lm_threadpool_create(nthreads, &c->pool);
#ifdef LOOM_HAVE_CUDA
    if (st == LM_OK && device.type == LM_DEVICE_CUDA) st = lm__cuda_stream_create(device.index, &c->stream);
#endif
    if (st != LM_OK) {
        lm_ctx_destroy(c);
        return st;
    }
    *out = c;
    return LM_OK;
}

void lm_ctx_destroy(lm_ctx *c) {
    if (!c) return;
#ifdef LOOM_HAVE_CUDA
    if (c->stream) lm__cuda_stream_sync(c->stream);
    lm__cuda_blas_destroy(c->device.index, &c->blas);
    if (c->stream) lm__cuda_stream_destroy(c->device.index, c->stream);
#endif
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

lm_status lm_ctx_synchronize(lm_ctx *c) {
#ifdef LOOM_HAVE_CUDA
    if (c && c->stream) return lm__cuda_stream_sync(c->stream);
#endif
    return LM_OK;
}

#ifdef LOOM_HAVE_CUDA
lm_status lm__ctx_cuda_blas(lm_ctx *c, const lm__cuda_blas **out) {
    *out = NULL;
    if (!c || !c->stream) return lm__error(LM_UNSUPPORTED, "cuBLASLt needs a CUDA context");
    if (!c->blas.handle) LM_TRY(lm__cuda_blas_create(c->device.index, &c->blas));
    *out = &c->blas;
    return LM_OK;
}
#endif

/* ---- memory statistics ------------------------------------------------------------ */
static lm_status cuda_only(lm_device d, const char *what) {
    if (d.type != LM_DEVICE_CUDA) return lm__error(LM_UNSUPPORTED, "%s: CUDA devices only", what);
    if (!lm_cuda_compiled()) return lm__error(LM_UNSUPPORTED, "%s: loom was built without CUDA", what);
    return LM_OK;
}

lm_status lm_device_memory_stats_get(lm_device d, lm_device_memory_stats *out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_device_memory_stats_get: out is NULL");
    LM_TRY(cuda_only(d, "memory statistics"));
#ifdef LOOM_HAVE_CUDA
    return lm__cuda_memory_stats(d.index, out);
#else
    return LM_UNSUPPORTED;
#endif
}

lm_status lm_device_memory_reset_peak(lm_device d) {
    LM_TRY(cuda_only(d, "memory statistics"));
#ifdef LOOM_HAVE_CUDA
    return lm__cuda_memory_reset_peak(d.index);
#else
    return LM_UNSUPPORTED;
#endif
}

lm_status lm_device_empty_cache(lm_device d) {
    LM_TRY(cuda_only(d, "empty cache"));
#ifdef LOOM_HAVE_CUDA
    return lm__cuda_empty_cache(d.index);
#else
    return LM_UNSUPPORTED;
#endif
}

/* ---- events -------------------------------------------------------------------------- */
lm_status lm_event_create(lm_ctx *ctx, lm_event **out) {
    if (!ctx || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_event_create: NULL argument");
    *out = NULL;
    lm_event *e = lm__calloc(1, sizeof *e);
    if (!e) return LM_OUT_OF_MEMORY;
    e->device = ctx->device;
#ifdef LOOM_HAVE_CUDA
    if (ctx->stream) {
        lm_status st = lm__cuda_event_create(ctx->device.index, &e->cuda);
        if (st != LM_OK) {
            lm__free(e);
            return st;
        }
    }
#endif
    *out = e;
    return LM_OK;
}

void lm_event_destroy(lm_event *e) {
    if (!e) return;
#ifdef LOOM_HAVE_CUDA
    if (e->cuda) lm__cuda_event_destroy(e->cuda);
#endif
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
#ifdef LOOM_HAVE_CUDA
    if (e->cuda) return lm__cuda_event_record(e->cuda, ctx->stream);
#endif
    e->host_s = lm__now_seconds();
    return LM_OK;
}

lm_status lm_event_synchronize(lm_event *e) {
    if (!e) return lm__error(LM_INVALID_ARGUMENT, "lm_event_synchronize: NULL event");
#ifdef LOOM_HAVE_CUDA
    if (e->cuda) return lm__cuda_event_sync(e->cuda);
#endif
    return LM_OK;
}

lm_status lm_event_elapsed_ms(const lm_event *a, const lm_event *b, double *ms) {
    if (!a || !b || !ms) return lm__error(LM_INVALID_ARGUMENT, "lm_event_elapsed_ms: NULL argument");
    if (!a->recorded || !b->recorded) return lm__error(LM_INVALID_ARGUMENT, "lm_event_elapsed_ms: an event was never recorded");
    if (!lm_device_equal(a->device, b->device))
        return lm__error(LM_INVALID_ARGUMENT, "lm_event_elapsed_ms: the events belong to different devices");
#ifdef LOOM_HAVE_CUDA
    if (a->cuda) return lm__cuda_event_elapsed(a->cuda, b->cuda, ms);
#endif
    *ms = (b->host_s - a->host_s) * 1e3;
    return LM_OK;
}

lm_status lm_ctx_wait_event(lm_ctx *ctx, const lm_event *e) {
    LM_TRY(same_device(e, ctx, "lm_ctx_wait_event"));
#ifdef LOOM_HAVE_CUDA
    if (e->cuda) return lm__cuda_stream_wait(ctx->stream, e->cuda);
#endif
    return LM_OK;
}

/* ---- graphs ------------------------------------------------------------------------------- */
lm_status lm_ctx_capture_begin(lm_ctx *ctx) {
    if (!ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_capture_begin: NULL context");
    if (!ctx->stream) return lm__error(LM_UNSUPPORTED, "graph capture needs a CUDA context");
#ifdef LOOM_HAVE_CUDA
    return lm__cuda_capture_begin(ctx->stream);
#else
    return LM_UNSUPPORTED;
#endif
}

lm_status lm_ctx_capture_end(lm_ctx *ctx, lm_device_graph **out) {
    if (!ctx || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_ctx_capture_end: NULL argument");
    *out = NULL;
    if (!ctx->stream) return lm__error(LM_UNSUPPORTED, "graph capture needs a CUDA context");
#ifdef LOOM_HAVE_CUDA
    lm_device_graph *g = lm__calloc(1, sizeof *g);
    void *exec = NULL;
    lm_status st = lm__cuda_capture_end(ctx->stream, &exec); /* always ends the capture */
    if (st == LM_OK && !g) st = LM_OUT_OF_MEMORY;
    if (st != LM_OK) {
        lm__cuda_graph_destroy(exec);
        lm__free(g);
        return st;
    }
    g->device = ctx->device;
    g->exec = exec;
    *out = g;
    return LM_OK;
#else
    return LM_UNSUPPORTED;
#endif
}

lm_status lm_device_graph_launch(const lm_device_graph *g, lm_ctx *ctx) {
    if (!g || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_device_graph_launch: NULL argument");
    if (!lm_device_equal(g->device, ctx->device))
        return lm__error(LM_INVALID_ARGUMENT, "lm_device_graph_launch: the graph was captured on another device");
#ifdef LOOM_HAVE_CUDA
    return lm__cuda_graph_launch(g->exec, ctx->stream);
#else
    return LM_UNSUPPORTED;
#endif
}

void lm_device_graph_destroy(lm_device_graph *g) {
    if (!g) return;
#ifdef LOOM_HAVE_CUDA
    lm__cuda_graph_destroy(g->exec);
#endif
    lm__free(g);
}
