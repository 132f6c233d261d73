/* ops/ref/swiglu_backward.h — reference kernel for the SwiGLU backward. Arguments are
 * validated by ops/swiglu_backward.c: gate, up, dout (and dgate, dup when given)
 * share one shape. */
#ifndef LOOM_OPS_REF_SWIGLU_BACKWARD_H
#define LOOM_OPS_REF_SWIGLU_BACKWARD_H

#include "ops/internal.h"

void lm__ref_swiglu_backward(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *dout,
                             const lm_tensor_view *dgate, const lm_tensor_view *dup);

#endif
