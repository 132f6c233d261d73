/* runtime/blas_cuda.c — the cuBLASLt handle and matmul workspace a CUDA context
 * carries (built only with CUDA). One handle and one workspace per context, hence
 * per thread and stream: cublasLtMatmul calls on different contexts never share
 * scratch memory. They are the context's backend state (lm__ctx_backend_state),
 * made on the first matmul and released with the context. The workspace comes from
 * the caching allocator so it shows in the device memory statistics. */
#include "runtime/cuda.h"

#include <cublasLt.h>

#define LM__BLAS_WORKSPACE ((size_t)32 << 20) /* bytes; enough for split-K heuristics */

static lm_status blas_create(int index, lm__cuda_blas *out) {
    *out = (lm__cuda_blas){0};
    cublasLtHandle_t h = NULL;
    cublasStatus_t cs = cublasLtCreate(&h);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return lm__error(LM_DEVICE_ERROR, "cublasLtCreate: %s (%d)", cublasLtGetStatusString(cs), (int)cs);
    lm_status st = lm__cuda_alloc(index, LM__BLAS_WORKSPACE, &out->workspace);
    if (st != LM_OK) {
        cublasLtDestroy(h);
        return st;
    }
    out->handle = h;
    out->workspace_bytes = LM__BLAS_WORKSPACE;
    return LM_OK;
}

void lm__cuda_ctx_state_destroy(int index, void *state) {
    lm__cuda_blas *b = state;
    if (!b) return;
    if (b->handle) cublasLtDestroy((cublasLtHandle_t)b->handle);
    lm__cuda_free(index, b->workspace);
    lm__free(b);
}

lm_status lm__ctx_cuda_blas(lm_ctx *ctx, const lm__cuda_blas **out) {
    *out = NULL;
    lm_device d = lm_ctx_device(ctx);
    if (!ctx || d.type != LM_DEVICE_CUDA) return lm__error(LM_UNSUPPORTED, "cuBLASLt needs a CUDA context");
    void **state = lm__ctx_backend_state(ctx);
    if (!*state) {
        lm__cuda_blas *b = lm__calloc(1, sizeof *b);
        if (!b) return LM_OUT_OF_MEMORY;
        lm_status st = blas_create(d.index, b);
        if (st != LM_OK) {
            lm__free(b);
            return st;
        }
        *state = b;
    }
    *out = *state;
    return LM_OK;
}
