/* ops/ref/rope_backward.h — reference kernel for the RoPE backward. Arguments are
 * validated by ops/rope_backward.c: dout and dx [B, T, H, D], dbias [H, D] or NULL. */
#ifndef LOOM_OPS_REF_ROPE_BACKWARD_H
#define LOOM_OPS_REF_ROPE_BACKWARD_H

#include "ops/internal.h"

lm_status lm__ref_rope_backward(const lm_tensor_view *dout, const lm_rope_params *p, const lm_tensor_view *dx,
                                const lm_tensor_view *dbias);

#endif
