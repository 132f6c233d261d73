/* ops/ref/rope.h — reference kernels for rotary position embedding. Arguments are
 * already validated by ops/rope.c: x and out are [B, T, H, D] in one float dtype with
 * D even, p->inv_freq is f32 [D/2], p->positions (if any) i32/i64 [T] or [B, T],
 * p->bias (if any) [H, D] in x's dtype. */
#ifndef LOOM_OPS_REF_ROPE_H
#define LOOM_OPS_REF_ROPE_H

#include "ops/internal.h"

/* out may be the very same view as x. */
void lm__ref_rope(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out);
/* out[i] = theta^(-2i/head_dim), out f32 [head_dim/2]. */
void lm__ref_rope_inv_freq(double theta, int64_t head_dim, const lm_tensor_view *out);

#endif
