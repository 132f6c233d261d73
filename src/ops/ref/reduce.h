/* ops/ref/reduce.h — reference kernels for sum, max and concat. Arguments are already
 * validated by ops/reduce.c: dim is normalized to [0, ndim), out has x's shape
 * without dim (sum, max) or the inputs' shapes joined along dim (concat). */
#ifndef LOOM_OPS_REF_REDUCE_H
#define LOOM_OPS_REF_REDUCE_H

#include "ops/internal.h"

typedef enum lm__reduce_op { LM__RED_SUM, LM__RED_MAX } lm__reduce_op;

/* max needs x->shape[dim] > 0; sum over an empty dim is 0. */
void lm__ref_reduce(lm__reduce_op op, const lm_tensor_view *x, int dim, const lm_tensor_view *out);
void lm__ref_concat(int n, const lm_tensor_view *const *inputs, int dim, const lm_tensor_view *out);

#endif
