/* ops/ref/matmul.h — reference kernel for batched matmul. Arguments are already
 * validated by lm_matmul_out: a is expanded to [batch..., M, K] and b to
 * [batch..., K, N] where out is [batch..., M, N]. */
#ifndef LOOM_OPS_REF_MATMUL_H
#define LOOM_OPS_REF_MATMUL_H

#include "ops/internal.h"

void lm__ref_matmul(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out);

#endif
