/* ops/ref/attention.h — reference kernel for grouped-query attention. Arguments are
 * already validated by lm_attention_out (4-d shapes, Hq % Hkv == 0, Tk >= Tq when
 * causal, out disjoint from the inputs). */
#ifndef LOOM_OPS_REF_ATTENTION_H
#define LOOM_OPS_REF_ATTENTION_H

#include "ops/internal.h"

/* window > 0 (causal only): each query also drops keys more than window - 1
 * positions before its own. LM_OUT_OF_MEMORY when its [Tk + Dv] double workspace
 * cannot be allocated. */
lm_status lm__ref_attention(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, double scale,
                            int causal, int64_t window, const lm_tensor_view *out);

#endif
