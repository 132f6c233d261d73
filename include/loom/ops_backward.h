/* loom/ops_backward.h — backward (vector-Jacobian) operators for every forward
 * operator a decoder model trains through, the fused output projection +
 * cross-entropy, and the two operators an optimizer step needs (AdamW, sum of squares).
 *
 * Convention: for a forward y = f(x, ...) and an upstream gradient dy = dL/dy, the
 * backward operator WRITES dx = dL/dx (it never accumulates: autograd adds
 * contributions). Every gradient output may be NULL to skip it. A gradient output has
 * its operand's shape and either its operand's dtype or f32 (f32 gradients of bf16
 * compute). Otherwise the rules of ops.h hold: inputs may have any strides, outputs
 * must not overlap themselves or any input, every operand is on the context's
 * device, and the context's lm_impl picks the level (the readable reference always
 * exists; a level that cannot run is LM_UNSUPPORTED, never a silent conversion).
 */
#ifndef LOOM_OPS_BACKWARD_H
#define LOOM_OPS_BACKWARD_H

#include "loom/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- matmul: out = a @ b (lm_matmul_out) ------------------------------------------
 * da = dout @ b^T and db = a^T @ dout, each summed over the batch dims along which
 * its operand was broadcast. a [..., M, K], b [..., K, N], dout [..., M, N] (out's
 * broadcast shape, a's dtype); da has a's shape, db has b's shape. */
LM_API lm_status lm_matmul_backward_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b,
                                        const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db);
/* As lm_matmul_backward_out with the gradients added into da and db (da += ..., db +=
 * ...) instead of written. An f32 gradient of 16-bit operands is summed in f32 and
 * rounded once, into the gradient (on CUDA the GEMM adds into it: no 16-bit copy of the
 * gradient exists); the training tape uses it to put a bf16 Linear's weight gradient
 * straight into its f32 slice. */
LM_API lm_status lm_matmul_backward_acc_out(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b,
                                            const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db);

/* ---- RMSNorm: out = x * r * weight, r = 1 / sqrt(mean(x^2) + eps) -------------------
 * x, dout, dx [..., D]; weight, dweight [D] (dweight is the sum over all rows). */
LM_API lm_status lm_rmsnorm_backward_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                                         const lm_tensor_view *dout, const lm_tensor_view *dx, const lm_tensor_view *dweight);
/* Fused residual add + RMSNorm (lm_add_rmsnorm_out): sum = x + residual, out =
 * rmsnorm(sum) * weight. Given the forward's sum, dout = dL/dout and dsum = dL/dsum
 * from the other readers of sum (NULL when none), writes dx = dL/dx, which is also
 * dL/dresidual, and dweight. */
LM_API lm_status lm_add_rmsnorm_backward_out(lm_ctx *ctx, const lm_tensor_view *sum, const lm_tensor_view *weight, float eps,
                                             const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                             const lm_tensor_view *dweight);

/* ---- SwiGLU: out = silu(gate) * up ------------------------------------------------------ */
LM_API lm_status lm_swiglu_backward_out(lm_ctx *ctx, const lm_tensor_view *gate, const lm_tensor_view *up,
                                        const lm_tensor_view *dout, const lm_tensor_view *dgate, const lm_tensor_view *dup);

/* ---- RoPE: out = rotate(x + bias) (lm_rope_out) -------------------------------------------
 * dout, dx [B, T, H, D]; p as in the forward (p->bias only matters through dbias,
 * [H, D], the sum of dx over B and T). The rotation R is orthogonal and the forward
 * scales it by attn_factor, so dx = attn_factor * R^T dout. */
LM_API lm_status lm_rope_backward_out(lm_ctx *ctx, const lm_tensor_view *dout, const lm_rope_params *p,
                                      const lm_tensor_view *dx, const lm_tensor_view *dbias);

/* ---- attention (lm_attention_out) ------------------------------------------------------------
 * q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], dout [B, Hq, Tq, Dv]; dq, dk,
 * dv shaped like q, k, v. Grouped heads: dk and dv sum the contributions of all query
 * heads that read a kv head. Softmax rows are recomputed from q and k (nothing of
 * size Tq x Tk is stored or taken as input). */
LM_API lm_status lm_attention_backward_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                           const lm_tensor_view *v, const lm_tensor_view *dout, float scale, int causal,
                                           const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv);
/* The gradients of lm_attention_window_out (window 0: the above). */
LM_API lm_status lm_attention_backward_window_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                                  const lm_tensor_view *v, const lm_tensor_view *dout, float scale,
                                                  int causal, int64_t window, const lm_tensor_view *dq,
                                                  const lm_tensor_view *dk, const lm_tensor_view *dv);

/* Attention that keeps its softmax statistics for the backward, so that the backward
 * does not recompute the forward (training). As lm_attention_window_out, and lse
 * [B, Hq, Tq] f32 contiguous receives each query row's log-sum-exp of its scaled
 * scores, log sum_j exp(scale q . k_j) over the keys the row sees (+inf where it sees
 * none). Only where a kernel produces them as it goes, which
 * lm_attention_lse_supported answers without side effects: today the CUDA flash
 * kernel (bf16 q, k, v; head dim D = Dv of 64 or 128; unit last stride, 16-byte
 * aligned rows; out bf16 or f32). Elsewhere both calls return LM_UNSUPPORTED. */
LM_API int lm_attention_lse_supported(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                      const lm_tensor_view *v, int causal, const lm_tensor_view *out);
LM_API lm_status lm_attention_lse_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                      const lm_tensor_view *v, float scale, int causal, int64_t window,
                                      const lm_tensor_view *out, const lm_tensor_view *lse);
/* The gradients of lm_attention_lse_out from its out and lse, unchanged since (dout
 * bf16, each gradient bf16 or f32, all with the flash kernel's layout rules). */
LM_API lm_status lm_attention_backward_lse_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k,
                                               const lm_tensor_view *v, const lm_tensor_view *out,
                                               const lm_tensor_view *lse, const lm_tensor_view *dout, float scale,
                                               int causal, int64_t window, const lm_tensor_view *dq,
                                               const lm_tensor_view *dk, const lm_tensor_view *dv);

/* ---- embedding (lm_embedding_out) -------------------------------------------------------------
 * ids [...] (i32/i64), dout [..., D]; dtable [V, D] is written completely: row v is
 * the sum of dout over every position whose id is v (duplicates add; unused rows
 * are 0). An id outside [0, V) is LM_OUT_OF_RANGE and nothing is written. */
LM_API lm_status lm_embedding_backward_out(lm_ctx *ctx, const lm_tensor_view *ids, const lm_tensor_view *dout,
                                           const lm_tensor_view *dtable);
/* The same sums added into dtable (dtable[v] += sum of its positions' dout rows, the sum
 * formed first): rows of ids that do not occur are neither read nor written, so a
 * gradient that already holds another contribution (a tied embedding's output
 * projection) takes this one without a dense [V, D] tensor in between. */
LM_API lm_status lm_embedding_backward_acc_out(lm_ctx *ctx, const lm_tensor_view *ids, const lm_tensor_view *dout,
                                               const lm_tensor_view *dtable);

/* ---- cross-entropy (lm_cross_entropy_out: mean over counted rows) -----------------------------
 * dlogits[r, :] = dloss * (softmax(logits[r, :]) - onehot(targets[r])) / counted for
 * rows whose target is not ignore_index, 0 for ignored rows (all rows when none is
 * counted). dloss is an f32 scalar view (dL/dloss) so the whole backward stays on
 * the device. */
LM_API lm_status lm_cross_entropy_backward_out(lm_ctx *ctx, const lm_tensor_view *logits, const lm_tensor_view *targets,
                                               int64_t ignore_index, const lm_tensor_view *dloss,
                                               const lm_tensor_view *dlogits);

/* ---- fused output projection + cross-entropy --------------------------------------------------
 * loss = mean over counted rows r of CE(x[r, :] @ w^T, targets[r]) with x [N, H],
 * w [V, H] (a Linear weight, row-major as stored), targets [N]. Equal to lm_matmul_out
 * followed by lm_cross_entropy_out, but the [N, V] logits never exist: rows are taken
 * in chunks whose logits fit a small f32 scratch (O(chunk * V), chunk = 2^20 / V
 * rows, at least 1). The backward recomputes each chunk's logits (one extra
 * N*V*H multiply-add pass) instead of storing them. loss is an f32 scalar; all rows
 * ignored gives NaN, as lm_cross_entropy_out. */
LM_API lm_status lm_linear_cross_entropy_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                             const lm_tensor_view *targets, int64_t ignore_index, const lm_tensor_view *loss);
/* dx [N, H] and dw [V, H] of the loss above, scaled by the f32 scalar dloss. */
LM_API lm_status lm_linear_cross_entropy_backward_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                                      const lm_tensor_view *targets, int64_t ignore_index,
                                                      const lm_tensor_view *dloss, const lm_tensor_view *dx,
                                                      const lm_tensor_view *dw);
/* The loss and, from the same logits, its gradients at dloss = 1: loss as
 * lm_linear_cross_entropy_out writes it, dx and dw (either may be NULL) as
 * lm_linear_cross_entropy_backward_out writes them for a dloss of exactly 1. For a loss
 * that ends a training step: the backward then only scales dx and dw by dloss
 * (lm_scale_by_out), so the [N, V] logits GEMM runs once per step instead of twice.
 * When dloss is not 1, the result differs from the backward's by one more rounding
 * of dx and dw to their dtype (none for f32 gradients). */
LM_API lm_status lm_linear_cross_entropy_grads_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                                   const lm_tensor_view *targets, int64_t ignore_index,
                                                   const lm_tensor_view *loss, const lm_tensor_view *dx,
                                                   const lm_tensor_view *dw);

/* ---- optimizer operators -------------------------------------------------------------------------
 * One AdamW step (Loshchilov & Hutter; torch.optim.AdamW's arithmetic) over n tensors
 * at once, each updated in place:
 *   g = grad * grad_scale;  p -= lr * weight_decay[i] * p       (decoupled decay)
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * params, m, v are f32 (master weights and moments); grads f32, bf16 or f16 of the
 * same shapes. grad_scale folds global-norm clipping (and loss scaling) into the one
 * pass. weight_decay: [n] per-tensor coefficients (0 for norms and biases). */
typedef struct lm_adamw_hparams {
    double lr;         /* learning rate of this step, >= 0 */
    double beta1;      /* first-moment decay, [0, 1) */
    double beta2;      /* second-moment decay, [0, 1) */
    double eps;        /* > 0, added to the bias-corrected sqrt(v) */
    int64_t step;      /* 1-based number of this update (bias corrections) */
    double grad_scale; /* gradients are multiplied by this first; 1 = none */
} lm_adamw_hparams;

LM_API lm_status lm_adamw_update(lm_ctx *ctx, int n, const lm_tensor_view *params, const lm_tensor_view *grads,
                                 const lm_tensor_view *m, const lm_tensor_view *v, const float *weight_decay,
                                 const lm_adamw_hparams *hp);

/* out (an f32 scalar) = sum over the n tensors of sum(x^2), accumulated in double:
 * the squared global gradient norm for clipping. n = 0 gives 0. */
LM_API lm_status lm_sum_squares_out(lm_ctx *ctx, int n, const lm_tensor_view *xs, const lm_tensor_view *out);

#ifdef __cplusplus
}
#endif
#endif
