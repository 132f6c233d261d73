/* ops/loss.c — public mean cross-entropy: validation and dispatch.
 * logits [N, V] (float, any strides), targets [N] (i32/i64), out an f32 scalar (shape
 * {}). Rows whose target equals ignore_index are skipped; any other target outside
 * [0, V) is LM_OUT_OF_RANGE naming the row and value. All rows ignored (or N = 0)
 * gives NaN, as PyTorch. out must not share memory with the inputs. Only the
 * reference level exists on the CPU so far.
 */
#include "ops/alias.h"
#include "ops/internal.h"
#include "ops/ref/loss.h"

lm_status lm_cross_entropy_out(lm_ctx *ctx, const lm_tensor_view *logits, const lm_tensor_view *targets,
                               int64_t ignore_index, const lm_tensor_view *out) {
    const char *op = "cross_entropy";
    const lm_tensor_view *vs[] = {logits, targets, out};
    static const char *const names[] = {"logits", "targets", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, "logits", logits));
    LM_TRY(lm__op_check_index(op, "targets", targets));
    LM_TRY(lm__op_check_dtype(op, "out", out, LM_F32));
    int64_t lshape[2] = {-1, -1};
    LM_TRY(lm__op_check_shape(op, "logits [N, V]", logits, 2, lshape));
    int64_t tshape[1] = {logits->shape[0]};
    LM_TRY(lm__op_check_shape(op, "targets [N]", targets, 1, tshape));
    LM_TRY(lm__op_check_shape(op, "out (an f32 scalar)", out, 0, NULL));
    LM_TRY(lm__op_check_alias(op, "out", out, "logits", logits, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "targets", targets, 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->cross_entropy(logits, targets, ignore_index, out, lm_ctx_stream(ctx));
    return lm__ref_cross_entropy(logits, targets, ignore_index, out);
}
