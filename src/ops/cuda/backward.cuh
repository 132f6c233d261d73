/* ops/cuda/backward.cuh — device helpers shared by the backward and optimizer kernels
 * (never installed).
 *
 * Gradient outputs have their operand's dtype or f32, so kernels are templated on
 * the input dtype only and store gradients through st_dt, which rounds an f32 value
 * to the output's runtime dtype (round to nearest even; ld_dt is the matching load).
 * flat_nd gives a contiguous
 * view a 1-d descriptor so nd_offset costs one multiply. block_sum_d (common.cuh) is the double
 * twin of block_sum (fixed reduction tree: results do not depend on timing).
 */
#ifndef LOOM_OPS_CUDA_BACKWARD_CUH
#define LOOM_OPS_CUDA_BACKWARD_CUH

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_backward.h"

__device__ __forceinline__ void st_dt(void *base, int dt, int64_t off, float v) {
    if (dt == LM_F32) ((float *)base)[off] = v;
    else if (dt == LM_BF16) ((bf16 *)base)[off] = __float2bfloat16_rn(v);
    else ((__half *)base)[off] = __float2half_rn(v);
}

/* Element off of base read as f32 from its runtime float dtype (kernels whose operands
 * may each have a different float dtype). */
__device__ __forceinline__ float ld_dt(const void *base, int dt, int64_t off) {
    if (dt == LM_F32) return ((const float *)base)[off];
    if (dt == LM_BF16) return __bfloat162float(((const bf16 *)base)[off]);
    return __half2float(((const __half *)base)[off]);
}

__device__ __forceinline__ int64_t ld_index_at(const void *p, int is64, int64_t off) {
    return is64 ? ((const int64_t *)p)[off] : (int64_t)((const int32_t *)p)[off];
}

/* Descriptor of v; a contiguous view becomes 1-d (numel, stride 1). */
static inline lm__cuda_nd flat_nd(const lm_tensor_view *v) {
    lm__cuda_nd d = lm__cuda_nd_of(v);
    if (lm_tensor_view_is_contiguous(v)) {
        d.ndim = 1;
        d.shape[0] = lm_tensor_view_numel(v);
        d.stride[0] = 1;
    }
    return d;
}

/* The leading dims of v (all but the last): the row index space of a [..., D] view. */
static inline lm__cuda_nd rows_nd(const lm_tensor_view *v) {
    lm__cuda_nd d = lm__cuda_nd_of(v);
    d.ndim = v->ndim - 1;
    return d;
}

#endif
