/* ops/cpu/attention.h — the tuned CPU grouped-query attention (flash-style).
 *
 * out = softmax(q k^T * scale [causal]) v with f32 views q [B, Hq, Tq, D],
 * k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], out [B, Hq, Tq, Dv], unit stride along the
 * last dim and any other strides (permuted [B, T, H, D] buffers, KV-cache slices).
 * Keys stream in blocks through an online softmax with f32 accumulation; no
 * Tq x Tk matrix exists. Query head h reads kv head h / (Hq / Hkv) in place. The
 * work split depends only on the shapes, so results are bit-identical for any
 * thread count (they differ in the last bits between instruction sets). Under the
 * calling thread's fast precision (ops/cpu/precision.h) on AVX512_BF16, tasks of more
 * than the key-lane rows (prefill) take bf16 operands for both products
 * (attention_kernels.h lm__attn_fast_kernels).
 */
#ifndef LOOM_OPS_CPU_ATTENTION_H
#define LOOM_OPS_CPU_ATTENTION_H

#include "ops/internal.h"

/* 1 if lm__cpu_attention runs these views: all four f32 on the CPU with stride 1
 * along the last dim (or a last dim of size <= 1). Otherwise 0 and, when why is
 * non-NULL, a sentence naming the operand and the reason in why[0 .. n). */
int lm__cpu_attention_supported(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                const lm_tensor_view *out, char *why, size_t n);

/* Runs on views already validated by lm_attention_out (shapes, Hq % Hkv == 0,
 * Tk >= Tq when causal, out disjoint from the inputs) and accepted by
 * lm__cpu_attention_supported (LM_UNSUPPORTED otherwise). window > 0 (causal only)
 * keeps each query's last `window` keys. pool == NULL runs on the calling thread.
 * One workspace allocation per call (LM_OUT_OF_MEMORY, nothing leaks). Rows with no
 * keys (Tk = 0) are 0. */
lm_status lm__cpu_attention(lm_threadpool *pool, const lm_tensor_view *q, const lm_tensor_view *k,
                            const lm_tensor_view *v, float scale, int causal, int64_t window,
                            const lm_tensor_view *out);

#endif
