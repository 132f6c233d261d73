/* ops/cuda/cuda_backward.h — host launchers of the CUDA backward and optimizer kernels
 * (built only with CUDA).
 *
 * Readable kernels, one per public backward operator of loom/ops_backward.h, taking
 * the views exactly as the public operator passes them after validation (shapes,
 * dtypes, devices and aliasing checked). Any strides; inputs f32/bf16/f16; a gradient
 * output has its operand's dtype or f32 and may be NULL (skipped). Arithmetic in f32
 * with f32 or double accumulation; every gradient element is written exactly once
 * and sums run in a fixed order (no float atomics), so results are run-independent.
 * Every launcher queues work on `stream` and returns without waiting, except the two
 * that must reject bad index values before writing (they synchronize).
 */
#ifndef LOOM_OPS_CUDA_BACKWARD_H
#define LOOM_OPS_CUDA_BACKWARD_H

#include "loom/ops_backward.h"
#include "ops/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* optim.cu: one AdamW step over n tensors (f32 per element in the reference's order,
 * one multi-tensor launch per 512 contiguous tensors, a strided kernel per other
 * tensor; entries must not overlap); weight_decay is a host array [n]. dyn: NULL, or
 * f64 [4] on the device read by the kernels: {lr, lr / (1 - beta1^step) and
 * sqrt(1 - beta2^step) each as the host rounds them to f32, grad_scale}, in place of
 * hp's lr, step and grad_scale (a captured step's values). */
lm_status lm__cuda_adamw_update(int n, const lm_tensor_view *params, const lm_tensor_view *grads,
                               const lm_tensor_view *m, const lm_tensor_view *v, const float *weight_decay,
                               const lm_adamw_hparams *hp, const double *dyn, cudaStream_t s);
/* optim.cu: *out (f64 on the device) = the clipping coefficient of the f32 sum of squares
 * *sumsq: min(1, clip / (sqrt(sumsq) + 1e-6)), or 1 (clip <= 0, a norm not finite). */
lm_status lm__cuda_clip_scale(const float *sumsq, double clip, double *out, cudaStream_t s);
/* optim.cu: out (f32 scalar on the device) = sum of x^2 over the n tensors, in double,
 * per-block partials summed in a fixed order. */
lm_status lm__cuda_sum_squares(int n, const lm_tensor_view *xs, const lm_tensor_view *out, cudaStream_t s);

/* matmul_backward.cu: a [..., M, K], b [..., K, N] in their own shapes (unexpanded),
 * dout [batch..., M, N]; da, db may be NULL. cuBLASLt where a gradient is one GEMM.
 * accumulate 1 adds the gradients into da and db instead of writing them. */
lm_status lm__cuda_matmul_backward(const lm__cuda_blas *blas, const lm_tensor_view *a, const lm_tensor_view *b,
                                  const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db,
                                  int accumulate, cudaStream_t s);

/* attention_backward.cu: shapes as lm_attention_backward_out; readable kernels (no
 * atomics, nothing Tq x Tk), head dims D, Dv <= 1024. Views the flash kernels take
 * (lm__cuda_flash_attention_supports for q, k, v, dout and each gradient) go to
 * lm__cuda_flash_attention_backward (attention_flash.cu). */
lm_status lm__cuda_attention_backward(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                      const lm_tensor_view *dout, float scale, int causal, int64_t window,
                                      const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv,
                                      cudaStream_t s);

lm_status lm__cuda_flash_attention_backward(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                            const lm_tensor_view *dout, float scale, int causal, int64_t window,
                                            const lm_tensor_view *dq, const lm_tensor_view *dk,
                                            const lm_tensor_view *dv, cudaStream_t s);

/* attention_flash.cu: the forward that also writes lse [B, Hq, Tq] f32 contiguous
 * (natural-log logsumexp), and the backward from that out and lse (no recompute).
 * Views as lm__cuda_flash_attention_supports takes them (dout bf16). */
lm_status lm__cuda_flash_attention_lse(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                       float scale, int causal, int64_t window, const lm_tensor_view *out,
                                       const lm_tensor_view *lse, cudaStream_t s);
lm_status lm__cuda_flash_attention_backward_lse(const lm_tensor_view *q, const lm_tensor_view *k,
                                                const lm_tensor_view *v, const lm_tensor_view *out,
                                                const lm_tensor_view *lse, const lm_tensor_view *dout, float scale,
                                                int causal, int64_t window, const lm_tensor_view *dq,
                                                const lm_tensor_view *dk, const lm_tensor_view *dv, cudaStream_t s);

/* norm_backward.cu: x [..., D] (the forward's input, or its sum for the fused add),
 * dsum NULL for plain RMSNorm. */
lm_status lm__cuda_rmsnorm_backward(const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                                   const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                   const lm_tensor_view *dweight, cudaStream_t s);

/* swiglu_backward.cu */
lm_status lm__cuda_swiglu_backward(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *dout,
                                  const lm_tensor_view *dgate, const lm_tensor_view *dup, cudaStream_t s);

/* rope_backward.cu: p's views are on the device. */
lm_status lm__cuda_rope_backward(const lm_tensor_view *dout, const lm_rope_params *p, const lm_tensor_view *dx,
                                const lm_tensor_view *dbias, cudaStream_t s);

/* embedding_backward.cu: ids are checked first (synchronizes): LM_OUT_OF_RANGE names
 * the first bad position and nothing is written. accumulate: dtable[v] += the sum for
 * the ids that occur (other rows untouched). */
lm_status lm__cuda_embedding_backward(const lm_tensor_view *ids, const lm_tensor_view *dout,
                                     const lm_tensor_view *dtable, int accumulate, cudaStream_t s);

/* loss_backward.cu: targets are checked first (synchronizes), as in the reference;
 * dloss is an f32 scalar on the device, read there (dlogits may be NULL: check only). */
lm_status lm__cuda_cross_entropy_backward(const lm_tensor_view *logits, const lm_tensor_view *targets,
                                         int64_t ignore_index, const lm_tensor_view *dloss,
                                         const lm_tensor_view *dlogits, cudaStream_t s);

/* linear_ce.cu: the fused output projection + cross-entropy in row chunks (no [N, V]
 * logits). x [N, H], w [V, H] contiguous, one float dtype; dx, dw contiguous in x's
 * dtype or f32 (dw may also be strided), either may be NULL; loss and dloss are f32
 * scalars on the device. Targets are checked and counted first (synchronizes).
 * The backward with dloss NULL takes dloss = 1, and with loss non-NULL also writes the
 * loss (the forward and the gradients from one logits GEMM per chunk). */
lm_status lm__cuda_linear_cross_entropy(const lm__cuda_blas *blas, const lm_tensor_view *x, const lm_tensor_view *w,
                                       const lm_tensor_view *targets, int64_t ignore_index,
                                       const lm_tensor_view *loss, cudaStream_t s);
lm_status lm__cuda_linear_cross_entropy_backward(const lm__cuda_blas *blas, const lm_tensor_view *x,
                                                const lm_tensor_view *w, const lm_tensor_view *targets,
                                                int64_t ignore_index, const lm_tensor_view *dloss,
                                                const lm_tensor_view *dx, const lm_tensor_view *dw,
                                                const lm_tensor_view *loss, cudaStream_t s);
/* Test hook: logits elements per chunk (default 2^29; <= 0 restores it), so tests
 * cover many chunks with small shapes. Not thread-safe. */
void lm__cuda_linear_ce_set_chunk_elems(int64_t elems);

#ifdef __cplusplus
}
#endif
#endif
