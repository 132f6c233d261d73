/* ops/composed.h — the composed level of the matmul-heavy backward operators (never
 * installed).
 *
 * These paths are built from public operators, so they run on whatever level
 * lm_matmul_out dispatches to (the tuned CPU GEMM once it is wired there, a device
 * GEMM later). Every product is issued in the forward Linear pattern y = x @ W^T with
 * x [rows, K] and W [N, K] both contiguous, the layout a tuned GEMM takes; operands
 * in other layouts are first materialized (transposed copies cost O(size), the
 * products O(size * depth)). The paths take f32 operands on the CPU (accepts = 1);
 * the public operators send everything else to the reference.
 */
#ifndef LOOM_OPS_COMPOSED_H
#define LOOM_OPS_COMPOSED_H

#include "ops/internal.h"

/* ---- shared helpers (ops/composed_util.c) ---- */
/* A new contiguous tensor on ctx's device holding v's elements in logical order. */
lm_status lm__composed_copy(lm_ctx *ctx, const lm_tensor_view *v, lm_tensor **out);
/* A contiguous [rows, cols] view of v (numel = rows * cols): v itself when contiguous,
 * otherwise a copy whose tensor is returned in *owned (else *owned = NULL). */
lm_status lm__composed_rows(lm_ctx *ctx, const lm_tensor_view *v, int64_t cols, lm_tensor_view *out,
                            lm_tensor **owned);
/* y [R, N] = x [R, K] @ w [N, K]^T: lm_matmul_out with the transposed view of w. */
lm_status lm__composed_linear(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *y);

/* ---- matmul backward (ops/composed_matmul_backward.c) ---- */
/* a [..., M, K] whose batch dims equal dout's, b [K, N], all given operands f32. */
int lm__composed_matmul_backward_accepts(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *dout,
                                         const lm_tensor_view *da, const lm_tensor_view *db);
lm_status lm__composed_matmul_backward(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b,
                                       const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db);

/* ---- fused output projection + cross-entropy (ops/composed_linear_ce.c) ---- */
/* x [N, H] and w [V, H] f32, dx/dw (when given) f32. */
int lm__composed_linear_ce_accepts(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *dx,
                                   const lm_tensor_view *dw);
/* Targets are already validated; counted = rows not ignored. */
lm_status lm__composed_linear_ce(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                 const lm_tensor_view *targets, int64_t ignore_index, int64_t counted,
                                 const lm_tensor_view *loss);
lm_status lm__composed_linear_ce_backward(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                          const lm_tensor_view *targets, int64_t ignore_index, int64_t counted,
                                          double dloss, const lm_tensor_view *dx, const lm_tensor_view *dw,
                                          const lm_tensor_view *loss);
/* (the backward also writes the forward's loss when loss is not NULL: one logits pass
 * for both, lm_linear_cross_entropy_grads_out) */

#endif
