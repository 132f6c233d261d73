/* ops/ref/optim.h — reference kernels for the optimizer operators. Arguments are
 * validated by ops/optim.c (matching shapes; params, m, v f32). */
#ifndef LOOM_OPS_REF_OPTIM_H
#define LOOM_OPS_REF_OPTIM_H

#include "loom/ops_backward.h"
#include "ops/internal.h"

void lm__ref_adamw_update(int n, const lm_tensor_view *params, const lm_tensor_view *grads, const lm_tensor_view *m,
                          const lm_tensor_view *v, const float *weight_decay, const lm_adamw_hparams *hp);
double lm__ref_sum_squares(int n, const lm_tensor_view *xs);

#endif
