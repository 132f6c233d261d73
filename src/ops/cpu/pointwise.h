/* ops/cpu/pointwise.h — the tuned CPU level of the O(n) operators a forward pass runs
 * every layer: add/mul (with broadcasting), scale, silu, swiglu, cast, embedding,
 * RMSNorm (+ fused residual add), RoPE and softmax.
 *
 * Each operator has a predicate, 1 when the tuned path takes these (already
 * validated) views, and a runner. The tuned paths take f32 operands (bf16/f16 inputs
 * for cast, any float table for embedding) whose last dim has unit stride, with any
 * outer strides; add/mul also take an operand broadcast along rows or within them.
 * Everything else stays with the reference. The public operator (ops/<family>.c)
 * calls the runner when the predicate accepts, otherwise lm__cpu_reject, then the
 * reference. Runners pick the vector path of the active ISA (ops/cpu/isa.h) and use
 * the pool only for large calls; results do not depend on the thread count.
 */
#ifndef LOOM_OPS_CPU_POINTWISE_H
#define LOOM_OPS_CPU_POINTWISE_H

#include "ops/internal.h"

/* The tuned path does not take the views: LM_OK (run the reference) unless ctx
 * forces LM_IMPL_TUNED, then LM_UNSUPPORTED naming op and what the path needs. */
lm_status lm__cpu_reject(lm_ctx *ctx, const char *op, const char *needs);

/* add (mul != 0: mul); a and b already expanded to out's shape. */
int lm__cpu_binary_supported(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out);
void lm__cpu_binary(lm_threadpool *pool, int mul, const lm_tensor_view *a, const lm_tensor_view *b,
                    const lm_tensor_view *out);
/* scale and silu: x and out f32 of one shape. */
int lm__cpu_unary_supported(const lm_tensor_view *x, const lm_tensor_view *out);
void lm__cpu_scale(lm_threadpool *pool, const lm_tensor_view *x, float s, const lm_tensor_view *out);
void lm__cpu_silu(lm_threadpool *pool, const lm_tensor_view *x, const lm_tensor_view *out);
int lm__cpu_swiglu_supported(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out);
void lm__cpu_swiglu(lm_threadpool *pool, const lm_tensor_view *gate, const lm_tensor_view *up,
                    const lm_tensor_view *out);
/* cast: f32, bf16 or f16 x to f32 out (exact). */
int lm__cpu_cast_supported(const lm_tensor_view *x, const lm_tensor_view *out);
void lm__cpu_cast(lm_threadpool *pool, const lm_tensor_view *x, const lm_tensor_view *out);

/* embedding: rows of table [V, D] copied to out [..., D]. Returns 0, with out
 * untouched, when an id is outside [0, V): the reference then reports which. */
int lm__cpu_embedding_supported(const lm_tensor_view *table, const lm_tensor_view *ids, const lm_tensor_view *out);
int lm__cpu_embedding(lm_threadpool *pool, const lm_tensor_view *table, const lm_tensor_view *ids,
                      const lm_tensor_view *out);

/* RMSNorm over the last dim, sum of squares in f32 lanes, 1/rms in double (norm.c). */
int lm__cpu_rmsnorm_supported(const lm_tensor_view *x, const lm_tensor_view *weight, const lm_tensor_view *out);
void lm__cpu_rmsnorm(lm_threadpool *pool, const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                     const lm_tensor_view *out);
int lm__cpu_add_rmsnorm_supported(const lm_tensor_view *x, const lm_tensor_view *residual,
                                  const lm_tensor_view *weight, const lm_tensor_view *sum_out,
                                  const lm_tensor_view *out);
void lm__cpu_add_rmsnorm(lm_threadpool *pool, const lm_tensor_view *x, const lm_tensor_view *residual,
                         const lm_tensor_view *weight, float eps, const lm_tensor_view *sum_out,
                         const lm_tensor_view *out);

/* RoPE, split-half and interleaved (rope.c). */
int lm__cpu_rope_supported(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out);
void lm__cpu_rope(lm_threadpool *pool, const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out);

/* softmax(x * scale) over the last dim, optionally causal (softmax.c). */
int lm__cpu_softmax_supported(const lm_tensor_view *x, const lm_tensor_view *out);
void lm__cpu_softmax(lm_threadpool *pool, const lm_tensor_view *x, float scale, int causal, const lm_tensor_view *out);

#endif
