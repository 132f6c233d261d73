/* runtime/blas_cuda.c — the cuBLASLt handle and matmul workspace a CUDA context
 * carries (built only with CUDA). One handle and one workspace per context, hence
 * per thread and stream: cublasLtMatmul calls on different contexts never share
 * scratch memory. The workspace comes from the caching allocator so it shows in the
 * device memory statistics. */
#include "runtime/internal.h"

#include <cublasLt.h>

#define LM__BLAS_WORKSPACE ((size_t)32 << 20) /* bytes; enough for split-K heuristics */

lm_status lm__cuda_blas_create(int index, lm__cuda_blas *out) {
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

void lm__cuda_blas_destroy(int index, lm__cuda_blas *b) {
    if (!b) return;
    if (b->handle) cublasLtDestroy((cublasLtHandle_t)b->handle);
    lm__cuda_free(index, b->workspace);
    *b = (lm__cuda_blas){0};
}
