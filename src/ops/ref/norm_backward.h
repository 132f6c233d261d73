/* ops/ref/norm_backward.h — reference kernels for the RMSNorm backward. Arguments are
 * validated by ops/norm_backward.c: x (or the fused sum), dout, dsum, dx share the
 * shape [..., D]; weight and dweight are [D]. dsum, dx and dweight may be NULL. */
#ifndef LOOM_OPS_REF_NORM_BACKWARD_H
#define LOOM_OPS_REF_NORM_BACKWARD_H

#include "ops/internal.h"

/* dx = d rmsnorm(x) * weight / dx applied to dout, plus dsum when given. */
lm_status lm__ref_rmsnorm_backward(const lm_tensor_view *x, const lm_tensor_view *weight, double eps,
                                   const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                   const lm_tensor_view *dweight);

#endif
