/* ops/ref/attention_backward.h — reference kernel for the attention backward.
 * Arguments are validated by ops/attention_backward.c (shapes as lm_attention_out,
 * dq/dk/dv shaped like q/k/v, each may be NULL). */
#ifndef LOOM_OPS_REF_ATTENTION_BACKWARD_H
#define LOOM_OPS_REF_ATTENTION_BACKWARD_H

#include "ops/internal.h"

lm_status lm__ref_attention_backward(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                     const lm_tensor_view *dout, double scale, int causal, int64_t window,
                                     const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv);

#endif
