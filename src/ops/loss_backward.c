/* ops/loss_backward.c — public cross-entropy backward: validation and dispatch
 * (reference level on the CPU, ops/cuda/loss_backward.cu on CUDA, which checks the
 * device targets and reads dloss there; O(N * V)). logits float [N, V], targets i32/i64 [N], dloss
 * an f32 scalar, dlogits [N, V] in logits' dtype or f32. Targets are checked before
 * anything is written (LM_OUT_OF_RANGE naming the row).
 */
#include "ops/backward_common.h"
#include "ops/ref/loss_backward.h"

lm_status lm_cross_entropy_backward_out(lm_ctx *ctx, const lm_tensor_view *logits, const lm_tensor_view *targets,
                                        int64_t ignore_index, const lm_tensor_view *dloss,
                                        const lm_tensor_view *dlogits) {
    const char *op = "cross_entropy_backward";
    const lm_tensor_view *vs[] = {logits, targets, dlogits};
    static const char *const names[] = {"logits", "targets", "dlogits"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, "logits", logits));
    LM_TRY(lm__op_check_index(op, "targets", targets));
    int64_t any2[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "logits [N, V]", logits, 2, any2));
    LM_TRY(lm__op_check_shape(op, "targets [N]", targets, 1, logits->shape));
    LM_TRY(lm__op_check_f32_scalar(ctx, op, "dloss", dloss));
    LM_TRY(lm__op_check_grad(ctx, op, "dlogits", dlogits, logits));
    const lm_tensor_view *ins[] = {logits, targets, dloss};
    static const char *const in_names[] = {"logits", "targets", "dloss"};
    LM_TRY(lm__op_check_grad_alias(op, "dlogits", dlogits, 3, ins, in_names));
    int64_t counted;
    LM_TRY(lm__op_check_targets(op, targets, logits->shape[1], ignore_index, &counted));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA)
        return cu->cross_entropy_backward(logits, targets, ignore_index, dloss, dlogits, lm_ctx_stream(ctx));
    if (!dlogits) return LM_OK;
    double scale = counted ? (double)*(const float *)dloss->data / (double)counted : 0.0;
    lm__ref_cross_entropy_backward(logits, targets, ignore_index, scale, dlogits);
    return LM_OK;
}
