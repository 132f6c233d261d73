/* runtime/device_cuda.c — the CUDA memory back end (built only with CUDA).
 *
 * Plain cudaMalloc/cudaMemcpy for now; the caching allocator, pinned staging and
 * graphs belong to the CUDA back end proper. CUDA errors become LM_DEVICE_ERROR (or
 * LM_OUT_OF_MEMORY) with the CUDA message in lm_last_error().
 */
#include "runtime/internal.h"

#include <cuda_runtime_api.h>
#include <string.h>

static lm_status cuda_status(cudaError_t e, const char *what) {
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

lm_status lm__cuda_alloc(int index, size_t nbytes, void **out) {
    *out = NULL;
    if (nbytes == 0) return LM_OK;
    LM_TRY(cuda_status(cudaSetDevice(index), "cudaSetDevice"));
    return cuda_status(cudaMalloc(out, nbytes), "cudaMalloc");
}

void lm__cuda_free(int index, void *ptr) {
    if (cudaSetDevice(index) == cudaSuccess) cudaFree(ptr);
}

lm_status lm__cuda_copy(int kind, int index, void *dst, const void *src, size_t nbytes) {
    static const enum cudaMemcpyKind kinds[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                 cudaMemcpyDeviceToDevice};
    LM_TRY(cuda_status(cudaSetDevice(index), "cudaSetDevice"));
    return cuda_status(cudaMemcpy(dst, src, nbytes, kinds[kind]), "cudaMemcpy");
}

lm_status lm__cuda_fill(int index, void *dst, size_t nbytes, const void *pattern, size_t psize) {
    LM_TRY(cuda_status(cudaSetDevice(index), "cudaSetDevice"));
    const uint8_t *p = pattern;
    int uniform = 1;
    for (size_t i = 1; i < psize; i++) uniform &= p[i] == p[0];
    if (uniform) return cuda_status(cudaMemset(dst, p[0], nbytes), "cudaMemset");
    /* multi-byte pattern: stage one host buffer of the pattern and copy it over */
    size_t chunk = nbytes < (1u << 20) ? nbytes : (1u << 20);
    uint8_t *host = lm__alloc(chunk, 64);
    if (!host) return LM_OUT_OF_MEMORY;
    for (size_t i = 0; i < chunk; i += psize) memcpy(host + i, pattern, psize);
    lm_status st = LM_OK;
    for (size_t off = 0; off < nbytes && st == LM_OK; off += chunk) {
        size_t n = nbytes - off < chunk ? nbytes - off : chunk;
        st = cuda_status(cudaMemcpy((uint8_t *)dst + off, host, n, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    lm__free(host);
    return st;
}

lm_status lm__cuda_stream_create(int index, void **stream) {
    LM_TRY(cuda_status(cudaSetDevice(index), "cudaSetDevice"));
    cudaStream_t s;
    LM_TRY(cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    *stream = s;
    return LM_OK;
}

void lm__cuda_stream_destroy(void *stream) { cudaStreamDestroy((cudaStream_t)stream); }

lm_status lm__cuda_stream_sync(void *stream) {
    return cuda_status(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}
