/* runtime/copy_cuda.cu — copies queued on a stream (built only with CUDA): byte copies
 * in any direction, and element copies between strided views of one CUDA device.
 *
 * A strided copy runs one thread per destination element (grid-stride loop): the
 * element's row-major multi-index over the shape gives one offset into each view.
 * Elements are moved as raw 1/2/4/8-byte words, so every dtype copies bit-exactly.
 * Dims of size 1 are dropped and adjacent dims that are contiguous in both views are
 * merged first, so the common "transpose two axes" case walks few dims.
 * Cost: O(numel) element moves; no synchronization.
 */
#include <cuda_runtime.h>

extern "C" {
#include "runtime/cuda.h"
}

typedef struct lm__copy_nd {
    int ndim;
    int64_t shape[LM__COPY_MAX_DIMS];
    int64_t dst_stride[LM__COPY_MAX_DIMS];
    int64_t src_stride[LM__COPY_MAX_DIMS];
} lm__copy_nd;

template <typename W>
__global__ void strided_copy_kernel(W *dst, const W *src, lm__copy_nd nd, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rest = i, od = 0, os = 0;
        for (int d = nd.ndim - 1; d >= 0; d--) {
            int64_t k = rest % nd.shape[d];
            rest /= nd.shape[d];
            od += k * nd.dst_stride[d];
            os += k * nd.src_stride[d];
        }
        dst[od] = src[os];
    }
}

/* Drops unit dims and merges dim d into d+1 when both views step over it contiguously. */
static void simplify(lm__copy_nd *nd) {
    int m = 0;
    for (int d = 0; d < nd->ndim; d++) {
        if (nd->shape[d] == 1) continue;
        if (m > 0 && nd->dst_stride[m - 1] == nd->dst_stride[d] * nd->shape[d] &&
            nd->src_stride[m - 1] == nd->src_stride[d] * nd->shape[d]) {
            nd->shape[m - 1] *= nd->shape[d];
            nd->dst_stride[m - 1] = nd->dst_stride[d];
            nd->src_stride[m - 1] = nd->src_stride[d];
            continue;
        }
        nd->shape[m] = nd->shape[d], nd->dst_stride[m] = nd->dst_stride[d], nd->src_stride[m] = nd->src_stride[d];
        m++;
    }
    nd->ndim = m;
}

template <typename W>
static cudaError_t launch(void *dst, const void *src, const lm__copy_nd *nd, int64_t n, cudaStream_t s) {
    int64_t blocks = (n + 255) / 256;
    if (blocks > 65535 * 8) blocks = 65535 * 8;
    strided_copy_kernel<W><<<(unsigned)blocks, 256, 0, s>>>((W *)dst, (const W *)src, *nd, n);
    return cudaGetLastError();
}

extern "C" lm_status lm__cuda_copy_strided(void *stream, int ndim, const int64_t *shape, void *dst,
                                           const int64_t *dst_stride, const void *src, const int64_t *src_stride,
                                           size_t elem_size) {
    if (ndim < 0 || ndim > LM__COPY_MAX_DIMS)
        return lm__error(LM_INVALID_ARGUMENT, "strided device copy: %d dims", ndim);
    lm__copy_nd nd;
    nd.ndim = ndim;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        nd.shape[d] = shape[d], nd.dst_stride[d] = dst_stride[d], nd.src_stride[d] = src_stride[d];
        n *= shape[d];
    }
    if (n == 0) return LM_OK;
    simplify(&nd);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e;
    switch (elem_size) {
    case 1: e = launch<uint8_t>(dst, src, &nd, n, s); break;
    case 2: e = launch<uint16_t>(dst, src, &nd, n, s); break;
    case 4: e = launch<uint32_t>(dst, src, &nd, n, s); break;
    case 8: e = launch<uint64_t>(dst, src, &nd, n, s); break;
    default: return lm__error(LM_INVALID_ARGUMENT, "strided device copy: element size %zu", elem_size);
    }
    return lm__cuda_check((int)e, "strided device copy kernel");
}

extern "C" lm_status lm__cuda_copy_async(void *stream, lm__copy_kind kind, void *dst, const void *src,
                                        size_t nbytes) {
    static const cudaMemcpyKind kinds[4] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                                            cudaMemcpyHostToHost};
    return lm__cuda_check((int)cudaMemcpyAsync(dst, src, nbytes, kinds[kind], (cudaStream_t)stream),
                          "cudaMemcpyAsync");
}

extern "C" lm_status lm__cuda_memset_async(void *stream, void *dst, int value, size_t nbytes) {
    return lm__cuda_check((int)cudaMemsetAsync(dst, value, nbytes, (cudaStream_t)stream), "cudaMemsetAsync");
}

static __global__ void fill32_kernel(uint32_t *dst, uint32_t word, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = word;
}

extern "C" lm_status lm__cuda_fill32_async(void *stream, void *dst, uint32_t word, size_t count) {
    size_t blocks = (count + 255) / 256;
    fill32_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, (cudaStream_t)stream>>>((uint32_t *)dst, word,
                                                                                            count);
    return lm__cuda_check((int)cudaGetLastError(), "fill kernel launch");
}
