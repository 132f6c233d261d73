/* ops/ref/select.h — reference kernels for argmax and top-k over the last dim.
 * Arguments are already validated by lm_argmax_out / lm_topk_out. */
#ifndef LOOM_OPS_REF_SELECT_H
#define LOOM_OPS_REF_SELECT_H

#include "ops/internal.h"

/* x [..., N] with N > 0, out i32/i64 [...]. */
void lm__ref_argmax(const lm_tensor_view *x, const lm_tensor_view *out);
/* x [..., N], values [..., k] (x's dtype), indices i32/i64 [..., k], 0 <= k <= N.
 * LM_OUT_OF_MEMORY when its [k] workspace cannot be allocated. */
lm_status lm__ref_topk(const lm_tensor_view *x, int64_t k, const lm_tensor_view *values, const lm_tensor_view *indices);

#endif
