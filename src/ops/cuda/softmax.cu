/* ops/cuda/softmax.cu — softmax(x * scale) over the last dim on CUDA.
 *
 * One block per row, three passes as in the reference: the row max over the visible
 * columns, the sum of exp(v - max), the normalized write (masked causal columns are
 * exactly 0). Block reductions separate the passes, and each thread writes only the
 * elements it read itself, so out may be x's very view. A NaN in a visible entry makes
 * the sum, hence the row, NaN. O(3 * numel).
 */
#include "ops/cuda/common.cuh"

template <typename T>
__global__ void softmax_kernel(const T *x, lm__cuda_nd rx, int64_t sx, T *out, lm__cuda_nd ro, int64_t so, int64_t rows,
                               int64_t n, int64_t tq, int causal, float scale) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + nd_offset(rx, r);
        T *orow = out + nd_offset(ro, r);
        int64_t visible = causal ? (r % tq) + (n - tq) + 1 : n;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) mx = fmaxf(mx, scale * ld(xr + j * sx));
        mx = block_max(mx, red);
        float sum = 0.f;
        for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) sum += expf(scale * ld(xr + j * sx) - mx);
        sum = block_sum(sum, red);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            st(orow + j * so, j < visible ? expf(scale * ld(xr + j * sx) - mx) / sum : 0.f);
        __syncthreads();
    }
}

lm_status lm__cuda_softmax(const lm_tensor_view *x, float scale, int causal, const lm_tensor_view *out,
                          cudaStream_t s) {
    int64_t numel = lm_tensor_view_numel(x);
    if (numel == 0) return LM_OK;
    int last = x->ndim - 1;
    int64_t n = x->shape[last], rows = numel / n, tq = causal ? x->shape[last - 1] : 1;
    lm__cuda_nd rx = lm__cuda_nd_of(x), ro = lm__cuda_nd_of(out);
    rx.ndim = ro.ndim = last;
    unsigned g = (unsigned)LM_MIN(rows, 65535 * 8);
    LM_TRY(lm__cuda_float_only(x->dtype));
    LM__CUDA_FLOAT_SWITCH(x->dtype, T,
                         softmax_kernel<T><<<g, 256, 0, s>>>((const T *)x->data, rx, x->stride[last], (T *)out->data, ro,
                                                             out->stride[last], rows, n, tq, causal, scale));
    return lm__cuda_launched("softmax kernel");
}
