/* ops/cuda/swiglu_backward.cu — SwiGLU backward on CUDA: for out = silu(g) * u with
 * s = sigmoid(g), one thread per element computes
 *   dup = dout * g * s,   dgate = dout * u * s * (1 + g * (1 - s))
 * in f32 and rounds each once into its gradient's dtype. Contiguous operands take a
 * 1-d descriptor; when all five are contiguous, 16-byte aligned bf16 and numel is a
 * multiple of 8, each thread takes 8 elements with 16-byte loads and stores. O(numel).
 */
#include "ops/cuda/backward.cuh"

template <typename T>
__global__ void swiglu_backward_kernel(const T *gate, lm__cuda_nd ng, const T *up, lm__cuda_nd nu, const T *dout,
                                       lm__cuda_nd nd, void *dgate, int dg_dt, lm__cuda_nd ndg, void *dup, int du_dt,
                                       lm__cuda_nd ndu, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = ld(gate + nd_offset(ng, i)), dy = ld(dout + nd_offset(nd, i));
        float s = 1.f / (1.f + expf(-g));
        if (dup) st_dt(dup, du_dt, nd_offset(ndu, i), dy * g * s);
        if (dgate) st_dt(dgate, dg_dt, nd_offset(ndg, i), dy * ld(up + nd_offset(nu, i)) * s * (1.f + g * (1.f - s)));
    }
}

static __global__ void swiglu_backward_vec8(const uint4 *gate, const uint4 *up, const uint4 *dout, uint4 *dgate, uint4 *dup,
                                    int64_t n8) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 vg = gate[i], vu = up[i], vd = dout[i], og, ou;
        const bf16 *g8 = (const bf16 *)&vg, *u8 = (const bf16 *)&vu, *d8 = (const bf16 *)&vd;
        bf16 *og8 = (bf16 *)&og, *ou8 = (bf16 *)&ou;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float g = __bfloat162float(g8[e]), dy = __bfloat162float(d8[e]), sg = 1.f / (1.f + expf(-g));
            ou8[e] = __float2bfloat16_rn(dy * g * sg);
            og8[e] = __float2bfloat16_rn(dy * __bfloat162float(u8[e]) * sg * (1.f + g * (1.f - sg)));
        }
        if (dup) dup[i] = ou;
        if (dgate) dgate[i] = og;
    }
}

static int vec8_ok(const lm_tensor_view *v) {
    return !v || (v->dtype == LM_BF16 && lm_tensor_view_is_contiguous(v) && ((uintptr_t)v->data % 16) == 0);
}

lm_status lm__cuda_swiglu_backward(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *dout,
                                  const lm_tensor_view *dgate, const lm_tensor_view *dup, cudaStream_t s) {
    int64_t n = lm_tensor_view_numel(gate);
    if (n == 0 || (!dgate && !dup)) return LM_OK;
    if (n % 8 == 0 && vec8_ok(gate) && vec8_ok(up) && vec8_ok(dout) && vec8_ok(dgate) && vec8_ok(dup)) {
        swiglu_backward_vec8<<<lm__cuda_blocks(n / 8, 256), 256, 0, s>>>(
            (const uint4 *)gate->data, (const uint4 *)up->data, (const uint4 *)dout->data,
            dgate ? (uint4 *)dgate->data : NULL, dup ? (uint4 *)dup->data : NULL, n / 8);
        return lm__cuda_launched("swiglu_backward kernel (vec8)");
    }
    lm__cuda_nd none = {0, {0}, {0}, -1};
    LM_TRY(lm__cuda_float_only(gate->dtype));
    LM__CUDA_FLOAT_SWITCH(gate->dtype, T,
                         swiglu_backward_kernel<T><<<lm__cuda_blocks(n, 256), 256, 0, s>>>(
                             (const T *)gate->data, flat_nd(gate), (const T *)up->data, flat_nd(up),
                             (const T *)dout->data, flat_nd(dout), dgate ? dgate->data : NULL,
                             dgate ? dgate->dtype : LM_F32, dgate ? flat_nd(dgate) : none, dup ? dup->data : NULL,
                             dup ? dup->dtype : LM_F32, dup ? flat_nd(dup) : none, n));
    return lm__cuda_launched("swiglu_backward kernel");
}
