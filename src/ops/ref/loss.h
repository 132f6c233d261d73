/* ops/ref/loss.h — reference kernel for mean cross-entropy. Arguments are already
 * validated by lm_cross_entropy_out (logits [N, V], targets [N], out an f32 scalar). */
#ifndef LOOM_OPS_REF_LOSS_H
#define LOOM_OPS_REF_LOSS_H

#include "ops/internal.h"

/* LM_OUT_OF_RANGE (out untouched) naming the first target outside [0, V) that is not
 * ignore_index. */
lm_status lm__ref_cross_entropy(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore_index,
                                const lm_tensor_view *out);

#endif
