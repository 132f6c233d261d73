/* ops/ref/loss_backward.h — reference kernels for the cross-entropy backward and the
 * fused output projection + cross-entropy. Arguments are validated by
 * ops/loss_backward.c and ops/linear_cross_entropy.c, targets included
 * (counted = rows not ignored). */
#ifndef LOOM_OPS_REF_LOSS_BACKWARD_H
#define LOOM_OPS_REF_LOSS_BACKWARD_H

#include "ops/internal.h"

/* logits [N, V], targets [N], dlogits [N, V]; scale = dloss / counted (0 if none). */
void lm__ref_cross_entropy_backward(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore_index,
                                    double scale, const lm_tensor_view *dlogits);
/* x [N, H], w [V, H]: loss = mean over counted rows of CE(x w^T). */
lm_status lm__ref_linear_cross_entropy(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *targets,
                                       int64_t ignore_index, int64_t counted, const lm_tensor_view *loss);
/* dx [N, H], dw [V, H] (either may be NULL) of that loss times dloss. */
lm_status lm__ref_linear_cross_entropy_backward(const lm_tensor_view *x, const lm_tensor_view *w,
                                                const lm_tensor_view *targets, int64_t ignore_index, int64_t counted,
                                                double dloss, const lm_tensor_view *dx, const lm_tensor_view *dw);

#endif
