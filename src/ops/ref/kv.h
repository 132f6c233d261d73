/* ops/ref/kv.h — reference kernels of the KV-cache step operators. Arguments are
 * already validated by src/ops/kv.c (shapes, dtypes, index values in range). */
#ifndef LOOM_OPS_REF_KV_H
#define LOOM_OPS_REF_KV_H

#include "ops/internal.h"

void lm__ref_kv_store(const lm_tensor_view *cache, const lm_tensor_view *x, const lm_tensor_view *slots,
                      const lm_tensor_view *positions);
/* The first n positions of row b of cache c [S, H, P, D] as a [1, H, n, D] view: of
 * the row's slot (slots [B]: *buf = NULL), or gathered from its blocks into *buf
 * (slots [B, NB]; the caller frees it with lm__free). */
lm_status lm__kv_gather_row(const lm_tensor_view *c, const lm_tensor_view *slots, int64_t b, int64_t n,
                            lm_tensor_view *out, void **buf);
/* LM_OUT_OF_MEMORY when its workspace (one row's keys in double) cannot be had. */
lm_status lm__ref_attention_cache(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                  const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                  const lm_tensor_view *positions, double scale, int64_t window,
                                  const lm_tensor_view *out);

/* LM_OUT_OF_MEMORY when its [D] double row cannot be had. */
lm_status lm__ref_qkv_rope_store(const lm_tensor_view *qkv, const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                 const lm_tensor_view *positions, const lm_tensor_view *k_cache,
                                 const lm_tensor_view *v_cache, const lm_tensor_view *q);

#endif
