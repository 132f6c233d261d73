/* ops/cuda/swiglu_backward.cu — SwiGLU backward on CUDA: for out = silu(g) * u with
 * s = sigmoid(g), one thread per element computes
 *   dup = dout * g * s,   dgate = dout * u * s * (1 + g * (1 - s))
 * in f32 and rounds each once into its gradient's dtype. Contiguous operands take a
 * 1-d descriptor. O(numel).
 */
#include "ops/cuda/backward.cuh"

template <typename T>
__global__ void swiglu_backward_kernel(const T *gate, lm_cuda_nd ng, const T *up, lm_cuda_nd nu, const T *dout,
                                       lm_cuda_nd nd, void *dgate, int dg_dt, lm_cuda_nd ndg, void *dup, int du_dt,
                                       lm_cuda_nd ndu, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = ld(gate + nd_offset(ng, i)), dy = ld(dout + nd_offset(nd, i));
        float s = 1.f / (1.f + expf(-g));
        if (dup) st_dt(dup, du_dt, nd_offset(ndu, i), dy * g * s);
        if (dgate) st_dt(dgate, dg_dt, nd_offset(ndg, i), dy * ld(up + nd_offset(nu, i)) * s * (1.f + g * (1.f - s)));
    }
}

lm_status lm_cuda_swiglu_backward(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *dout,
                                  const lm_tensor_view *dgate, const lm_tensor_view *dup, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(gate);
    if (n == 0 || (!dgate && !dup)) return LM_OK;
    lm_cuda_nd none = {0, {0}, {0}, -1};
    LM_CUDA_FLOAT_SWITCH(gate->dtype, T,
                         swiglu_backward_kernel<T><<<lm_cuda_blocks(n, 256), 256, 0, s>>>(
                             (const T *)gate->data, flat_nd(gate), (const T *)up->data, flat_nd(up),
                             (const T *)dout->data, flat_nd(dout), dgate ? dgate->data : NULL,
                             dgate ? dgate->dtype : LM_F32, dgate ? flat_nd(dgate) : none, dup ? dup->data : NULL,
                             dup ? dup->dtype : LM_F32, dup ? flat_nd(dup) : none, n));
    return lm_cuda_launched("swiglu_backward kernel");
}
