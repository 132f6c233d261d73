/* ops/ref/linear.h — reference of lm_linear_out (arguments validated by ops/linear.c). */
#ifndef LOOM_OPS_REF_LINEAR_H
#define LOOM_OPS_REF_LINEAR_H

#include "ops/internal.h"

/* LM_OUT_OF_MEMORY when its [K] double row cannot be had. */
lm_status lm__ref_linear(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                         const lm_linear_params *p, const lm_tensor_view *out);

#endif
