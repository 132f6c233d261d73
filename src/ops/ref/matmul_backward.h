/* ops/ref/matmul_backward.h — reference kernel for the matmul backward. Arguments are
 * validated by ops/matmul_backward.c: a [..., M, K], b [..., K, N] in their own
 * (unexpanded) shapes, dout [batch..., M, N] with the broadcast batch dims. */
#ifndef LOOM_OPS_REF_MATMUL_BACKWARD_H
#define LOOM_OPS_REF_MATMUL_BACKWARD_H

#include "ops/internal.h"

/* da, db may be NULL. LM_OUT_OF_MEMORY when the double workspace cannot be had. */
lm_status lm__ref_matmul_backward(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *dout,
                                  const lm_tensor_view *da, const lm_tensor_view *db);

#endif
