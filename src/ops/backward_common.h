/* ops/backward_common.h — validation shared by the backward and optimizer operators
 * (never installed).
 *
 * A gradient output is optional (NULL skips it); when given it lies on the context's
 * device, has exactly the shape of the operand it differentiates, that operand's
 * dtype or f32, and does not overlap itself or (detectably) any input. The
 * composed level (ops/composed.h) builds on the public operators; these checks run
 * before either level is chosen.
 */
#ifndef LOOM_OPS_BACKWARD_COMMON_H
#define LOOM_OPS_BACKWARD_COMMON_H

#include "loom/ops_backward.h"
#include "ops/alias.h"
#include "ops/internal.h"

/* grad (may be NULL) against the operand like, named name in messages. */
lm_status lm__op_check_grad(lm_ctx *ctx, const char *op, const char *name, const lm_tensor_view *grad,
                            const lm_tensor_view *like);
/* grad (may be NULL) must not overlap any of the n views (NULL entries skipped). */
lm_status lm__op_check_grad_alias(const char *op, const char *name, const lm_tensor_view *grad, int n,
                                  const lm_tensor_view *const *views, const char *const *names);
/* An f32 scalar (shape {}) on the context's device, e.g. dloss. */
lm_status lm__op_check_f32_scalar(lm_ctx *ctx, const char *op, const char *name, const lm_tensor_view *v);
/* Every target is ignore_index or in [0, V): LM_OUT_OF_RANGE naming the row otherwise.
 * *counted receives the number of rows that are not ignored. */
lm_status lm__op_check_targets(const char *op, const lm_tensor_view *targets, int64_t V, int64_t ignore_index,
                               int64_t *counted);
/* lse [B, Hq, Tq] f32 contiguous on the context's device for attention q [B, Hq, Tq, D]
 * (lm_attention_lse_out), not overlapping q. */
lm_status lm__op_check_attention_lse(lm_ctx *ctx, const char *op, const lm_tensor_view *q, const lm_tensor_view *lse);
/* The LM_UNSUPPORTED error of the attention operators with statistics on views or a
 * device the flash kernel does not take. */
lm_status lm__attention_lse_unsupported(const char *op);
/* The level for an operator with a composed CPU path (has_cpu) and possibly a CUDA
 * implementation (has_cuda) when accepted says whether these views suit the composed
 * path: LM__LEVEL_CUDA on a cuda context with an implementation, LM__LEVEL_CPU when the
 * views suit it and the policy allows, LM__LEVEL_REF otherwise, LM_UNSUPPORTED when
 * LM_IMPL_TUNED was forced but the views do not suit it (why names what the path
 * needs) or on a device without a level. */
lm_status lm__op_backward_level(lm_ctx *ctx, const char *op, int has_cpu, int has_cuda, int accepted, const char *why,
                                lm__level *out);

#endif
