/* ops/ref/norm.h — reference kernels for RMSNorm and fused add + RMSNorm. Arguments
 * are already validated by ops/norm.c: x, residual, sum_out, out share one shape
 * [..., D] and one float dtype, weight is [D]. */
#ifndef LOOM_OPS_REF_NORM_H
#define LOOM_OPS_REF_NORM_H

#include "ops/internal.h"

void lm__ref_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *weight, double eps, const lm_tensor_view *out);
/* sum_out = x + residual (rounded to dtype); out = rmsnorm(sum_out as stored) * weight.
 * sum_out may be the very same view as x or residual. */
void lm__ref_add_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *weight,
                         double eps, const lm_tensor_view *sum_out, const lm_tensor_view *out);

#endif
