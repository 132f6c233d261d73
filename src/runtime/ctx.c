/* runtime/ctx.c — lm_ctx: the device an operation runs on, its CPU thread pool or
 * CUDA stream, and the operator implementation policy. One context per thread. */
#include "runtime/internal.h"

struct lm_ctx {
    lm_device device;
    lm_threadpool *pool; /* CPU contexts with > 1 thread */
    void *stream;        /* cudaStream_t for CUDA contexts */
    lm_impl impl;
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
    if (c->stream) lm__cuda_stream_destroy(c->stream);
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
