/* ops/ref/softmax.h — reference kernel for (causal) softmax over the last dim.
 * Arguments are already validated by lm_softmax_out; out may be x itself. */
#ifndef LOOM_OPS_REF_SOFTMAX_H
#define LOOM_OPS_REF_SOFTMAX_H

#include "ops/internal.h"

void lm__ref_softmax(const lm_tensor_view *x, double scale, int causal, const lm_tensor_view *out);

#endif
