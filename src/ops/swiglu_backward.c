/* ops/swiglu_backward.c — public SwiGLU backward: validation and dispatch (reference
 * level on the CPU, ops/cuda/swiglu_backward.cu on CUDA; O(numel)). gate, up and dout
 * share one float dtype and one shape. */
#include "ops/backward_common.h"
#include "ops/ref/swiglu_backward.h"

lm_status lm_swiglu_backward_out(lm_ctx *ctx, const lm_tensor_view *gate, const lm_tensor_view *up,
                                 const lm_tensor_view *dout, const lm_tensor_view *dgate, const lm_tensor_view *dup) {
    const char *op = "swiglu_backward";
    const lm_tensor_view *vs[] = {gate, up, dout};
    static const char *const names[] = {"gate", "up", "dout"};
    LM_TRY(lm__op_check_devices(ctx, op, 3, vs, names));
    LM_TRY(lm__op_check_float(op, "gate", gate));
    LM_TRY(lm__op_check_dtype(op, "up", up, gate->dtype));
    LM_TRY(lm__op_check_dtype(op, "dout", dout, gate->dtype));
    LM_TRY(lm__op_check_same_shape(op, "up", up, gate));
    LM_TRY(lm__op_check_same_shape(op, "dout", dout, gate));
    LM_TRY(lm__op_check_grad(ctx, op, "dgate", dgate, gate));
    LM_TRY(lm__op_check_grad(ctx, op, "dup", dup, up));
    const lm_tensor_view *ins[] = {gate, up, dout, dup};
    static const char *const in_names[] = {"gate", "up", "dout", "dup"};
    LM_TRY(lm__op_check_grad_alias(op, "dgate", dgate, 4, ins, in_names));
    LM_TRY(lm__op_check_grad_alias(op, "dup", dup, 3, ins, in_names));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->swiglu_backward(gate, up, dout, dgate, dup, lm_ctx_stream(ctx));
    lm__ref_swiglu_backward(gate, up, dout, dgate, dup);
    return LM_OK;
}
