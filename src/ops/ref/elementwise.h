/* ops/ref/elementwise.h — reference kernels for elementwise operators. Arguments are
 * already validated by the public operator; inputs are expanded to out's shape. */
#ifndef LOOM_OPS_REF_ELEMENTWISE_H
#define LOOM_OPS_REF_ELEMENTWISE_H

#include "ops/internal.h"

typedef enum lm__binary_op { LM__BIN_ADD, LM__BIN_MUL } lm__binary_op;
typedef enum lm__unary_op { LM__UN_SCALE, LM__UN_CAST, LM__UN_SILU } lm__unary_op;

void lm__ref_binary(lm__binary_op op, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out);
void lm__ref_unary(lm__unary_op op, const lm_tensor_view *x, double s, const lm_tensor_view *out);
void lm__ref_swiglu(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out);
/* Integer cast with range check; LM_OUT_OF_RANGE names the first value that does not fit. */
lm_status lm__ref_cast_int(const lm_tensor_view *x, const lm_tensor_view *out);

#endif
