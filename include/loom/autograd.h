/* loom/autograd.h — reverse-mode automatic differentiation over the operator API.
 *
 * A tape (lm_ag) records, while gradients are enabled, one node per differentiable
 * operation whose inputs require gradients; lm_ag_backward walks the nodes in
 * reverse order and calls the backward operators of ops_backward.h. Values are
 * lm_ag_var handles owned by the tape (valid until lm_ag_reset or lm_ag_destroy).
 *
 * Gradient accumulation (DESIGN.md §7): a variable's first gradient contribution is
 * adopted as is (no copy); a later one is added into a fresh tensor, because the
 * adopted one may share memory with another variable's gradient (an add passes one
 * gradient to both inputs). It is added in place only when the single-owner rule is
 * proven: the storage of the accumulated tensor has no other reference (a tensor a
 * backward operator just produced, or a sum the accumulator made). Views (reshape,
 * transpose, slice) map gradients back to their
 * base, and a leaf read several times (tied embeddings) sums every contribution.
 *
 * Leaves: lm_ag_bind_grad binds a caller-owned gradient buffer (written or added
 * into; a Linear weight's only contribution is put there by its GEMM directly, so a
 * bf16 weight with an f32 buffer never has a bf16 gradient); lm_ag_set_hook registers a function called exactly once per backward for
 * every leaf that requires gradients, right after its last contribution (so an
 * all-reduce or optimizer update of that leaf can start while backward continues),
 * or at the end of backward for leaves the root does not depend on.
 *
 * no_grad: with gradients disabled (lm_ag_set_grad_enabled(ag, 0)), or when no input
 * requires gradients, an operation runs exactly its forward operator: no node, no
 * saved copy, no allocation beyond the operator's own output (variable records come
 * from an arena the tape keeps across resets).
 *
 * Device-neutral: tensors stay on the context's device; every step is a public
 * operator. A tape and its context belong to one thread at a time.
 */
#ifndef LOOM_AUTOGRAD_H
#define LOOM_AUTOGRAD_H

#include "loom/ops_backward.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_ag lm_ag;
typedef struct lm_ag_var lm_ag_var;

/* The tape runs every operation on ctx (borrowed: must outlive the tape). */
LM_API lm_status lm_ag_create(lm_ctx *ctx, lm_ag **out);
LM_API void lm_ag_destroy(lm_ag *ag); /* accepts NULL */
/* Forgets every node and variable (their tensors are released); keeps capacity. */
LM_API void lm_ag_reset(lm_ag *ag);
/* Gradient recording: on (1, the default) or off (0, no_grad). */
LM_API void lm_ag_set_grad_enabled(lm_ag *ag, int enabled);
LM_API int lm_ag_grad_enabled(const lm_ag *ag);

typedef struct lm_ag_stats {
    int64_t nodes;         /* nodes recorded since the last reset */
    int64_t vars;          /* variables alive */
    int64_t fresh_sums;    /* gradient contributions added into a fresh tensor */
    int64_t inplace_sums;  /* ... added in place (single owner proven) */
    int64_t hooks_fired;   /* hook calls during backward */
} lm_ag_stats;
LM_API lm_ag_stats lm_ag_get_stats(const lm_ag *ag);

/* A leaf over value (a new reference to value's storage; the caller keeps its own).
 * requires_grad = 0 makes a constant. */
LM_API lm_status lm_ag_leaf(lm_ag *ag, const lm_tensor *value, int requires_grad, lm_ag_var **out);
/* Binds a caller-owned buffer (leaf's shape, leaf's dtype or f32) that receives the
 * leaf's gradient at the end of its contributions: accumulate = 0 writes it (zeros
 * when the root does not depend on the leaf), 1 adds into it (gradient accumulation
 * over micro-batches; the caller zeroes it before the first). The buffer must stay
 * valid until backward returns. The leaf's own gradient tensor is then released. */
LM_API lm_status lm_ag_bind_grad(lm_ag_var *leaf, const lm_tensor_view *buffer, int accumulate);
/* Called once per backward for the leaf (see above). grad is the final gradient: the
 * bound buffer when one is bound, else the leaf's gradient tensor, or NULL when the
 * root does not depend on the leaf and no buffer is bound. A non-OK status aborts
 * backward and is returned by lm_ag_backward. */
typedef lm_status (*lm_ag_hook_fn)(void *user, lm_ag_var *leaf, const lm_tensor_view *grad);
LM_API lm_status lm_ag_set_hook(lm_ag_var *leaf, lm_ag_hook_fn fn, void *user);

LM_API const lm_tensor *lm_ag_value(const lm_ag_var *v);      /* borrowed */
LM_API int lm_ag_requires_grad(const lm_ag_var *v);
/* After lm_ag_backward: the gradient of an unbound leaf (NULL when it received no
 * contribution or a buffer is bound). Borrowed, valid until reset. */
LM_API const lm_tensor *lm_ag_grad(const lm_ag_var *v);

/* Backpropagates from root, which must hold one element and require gradients, with
 * d root = seed. Once per recorded graph: a second call before lm_ag_reset is
 * LM_INVALID_ARGUMENT. On failure the tape must be reset. */
LM_API lm_status lm_ag_backward(lm_ag *ag, lm_ag_var *root, float seed);

/* ---- operations (forward operator + recorded backward) -------------------------------
 * Outputs are new variables owned by the tape. Index operands (ids, targets,
 * positions) and rope tables are copied when recorded, so the caller may reuse them. */
LM_API lm_status lm_ag_add(lm_ag *ag, lm_ag_var *a, lm_ag_var *b, lm_ag_var **out); /* broadcasting */
LM_API lm_status lm_ag_mul(lm_ag *ag, lm_ag_var *a, lm_ag_var *b, lm_ag_var **out); /* broadcasting */
LM_API lm_status lm_ag_scale(lm_ag *ag, lm_ag_var *x, float s, lm_ag_var **out);
LM_API lm_status lm_ag_sum(lm_ag *ag, lm_ag_var *x, lm_ag_var **out); /* all elements -> scalar */
LM_API lm_status lm_ag_matmul(lm_ag *ag, lm_ag_var *a, lm_ag_var *b, lm_ag_var **out);
/* x [..., K] @ w[N, K]^T (+ bias [N]; NULL for none): a Hugging Face Linear. */
LM_API lm_status lm_ag_linear(lm_ag *ag, lm_ag_var *x, lm_ag_var *w, lm_ag_var *bias, lm_ag_var **out);
LM_API lm_status lm_ag_rmsnorm(lm_ag *ag, lm_ag_var *x, lm_ag_var *weight, float eps, lm_ag_var **out);
/* sum = x + residual, out = rmsnorm(sum) * weight: two outputs. */
LM_API lm_status lm_ag_add_rmsnorm(lm_ag *ag, lm_ag_var *x, lm_ag_var *residual, lm_ag_var *weight, float eps,
                                   lm_ag_var **sum, lm_ag_var **out);
LM_API lm_status lm_ag_swiglu(lm_ag *ag, lm_ag_var *gate, lm_ag_var *up, lm_ag_var **out);
/* p->bias must be NULL (add biases with lm_ag_add or lm_ag_linear). */
LM_API lm_status lm_ag_rope(lm_ag *ag, lm_ag_var *x, const lm_rope_params *p, lm_ag_var **out);
LM_API lm_status lm_ag_attention(lm_ag *ag, lm_ag_var *q, lm_ag_var *k, lm_ag_var *v, float scale, int causal,
                                 lm_ag_var **out);
/* The same with a sliding window (lm_attention_window_out; 0 = none). */
LM_API lm_status lm_ag_attention_window(lm_ag *ag, lm_ag_var *q, lm_ag_var *k, lm_ag_var *v, float scale, int causal,
                                        int64_t window, lm_ag_var **out);
LM_API lm_status lm_ag_embedding(lm_ag *ag, lm_ag_var *table, const lm_tensor_view *ids, lm_ag_var **out);
LM_API lm_status lm_ag_cross_entropy(lm_ag *ag, lm_ag_var *logits, const lm_tensor_view *targets, int64_t ignore_index,
                                     lm_ag_var **out);
/* mean cross-entropy of x @ w^T, never materializing the logits (lm_linear_cross_entropy_out).
 * While recording, the forward also computes the gradients at dloss = 1
 * (lm_linear_cross_entropy_grads_out) and keeps them until the backward scales them
 * by dloss: one logits GEMM instead of two, the gradients' memory held meanwhile. */
LM_API lm_status lm_ag_linear_cross_entropy(lm_ag *ag, lm_ag_var *x, lm_ag_var *w, const lm_tensor_view *targets,
                                            int64_t ignore_index, lm_ag_var **out);
/* Views: zero-copy on the value, gradients mapped back to the base. */
LM_API lm_status lm_ag_reshape(lm_ag *ag, lm_ag_var *x, int ndim, const int64_t *shape, lm_ag_var **out);
LM_API lm_status lm_ag_transpose(lm_ag *ag, lm_ag_var *x, int d0, int d1, lm_ag_var **out);
LM_API lm_status lm_ag_slice(lm_ag *ag, lm_ag_var *x, int dim, int64_t start, int64_t stop, int64_t step, lm_ag_var **out);

/* ---- profiling --------------------------------------------------------------------------
 * With LOOM_PROFILE=1 in the environment, each recorded forward operation and each
 * backward node marks the end of its work in its context's queue (an lm_event, no
 * waiting) and is charged the time since the previous mark ("fwd ag_linear", "bwd
 * ag_attention", ...): on a GPU the device's time between the two events, on the CPU
 * the host clock. Other phases mark themselves with lm_ag_profile_mark (name = prefix
 * + name); lm_ag_profile_report resolves the pending marks and prints the totals,
 * largest first. */
LM_API int lm_ag_profile_enabled(void);
LM_API void lm_ag_profile_mark(lm_ctx *ctx, const char *prefix, const char *name);
LM_API void lm_ag_profile_report(FILE *f);
/* Forgets the totals (e.g. after a first step that builds plans and caches); the next
 * mark is charged the time since the last one. */
LM_API void lm_ag_profile_reset(void);

#ifdef __cplusplus
}
#endif
#endif
