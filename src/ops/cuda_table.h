/* ops/cuda_table.h — the CUDA level of the public operators as one table of function
 * pointers (never installed). Plain C: no CUDA header; a stream is the context's
 * (lm_ctx_stream, a cudaStream_t) passed as void *.
 *
 * lm__cuda_ops_get() answers the table in a build with CUDA (ops/cuda/table_cuda.c)
 * and NULL without (ops/cuda/table_nocuda.c), so an operator reads
 *     const lm__cuda_ops *cu = lm__cuda_ops_get();
 *     LM_TRY(lm__op_level(ctx, op, has_cpu, cu != NULL, &level));
 *     if (level == LM__LEVEL_CUDA) return cu->rmsnorm(x, weight, eps, out, lm_ctx_stream(ctx));
 * with no #ifdef. Each entry has the contract of its launcher (ops/cuda/cuda_ops.h,
 * ops/cuda/cuda_backward.h): the views exactly as the public operator passes them
 * after validation, work queued on the stream and not waited for (except where the
 * launcher must reject bad index values first). Entries that use cuBLASLt take the
 * context instead of a stream and fetch its handle themselves.
 */
#ifndef LOOM_OPS_CUDA_TABLE_H
#define LOOM_OPS_CUDA_TABLE_H

#include "loom/ops.h"
#include "loom/ops_backward.h"

/* Whether a quantized product of `rows` rows takes the workspace path (bf16 copies and a
 * cuBLASLt GEMM, or fast precision's fp8 GEMM) instead of the decode GEMV: more than 8
 * rows, or 3-8 rows whose inputs the GEMV would not stage (stages: gemv_stages below for
 * these rows and K), where reading them per use from L2 ran decode B8 of a
 * Llama-3.2-1B shape 8-9% slower than the workspace path (bench/NOTES.md, "Quantized
 * weights on CUDA" v7); 1-2 rows keep the GEMV, reading them per use. */
static inline int lm__quant_ws_rows(int64_t rows, int stages) { return rows > 8 || (rows > 2 && !stages); }

/* The quantized linear's workspace (lm_linear_workspace_bytes, ops/cuda/gemv_quant.cu)
 * starts with in(x): rows x K values of elem bytes (bf16 for the dequantizing path, e4m3
 * at fast precision), rounded up to 256 bytes; what follows starts there. */
static inline size_t lm__quant_ws_input_bytes(int64_t rows, int64_t K, size_t elem) {
    return ((size_t)rows * (size_t)K * elem + 255) / 256 * 256;
}

typedef struct lm__cuda_ops {
    /* ---- forward operators ---- */
    lm_status (*add)(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, void *stream);
    lm_status (*mul)(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, void *stream);
    lm_status (*scale)(const lm_tensor_view *x, float scale, const lm_tensor_view *out, void *stream);
    /* s: an f32 scalar on the device */
    lm_status (*scale_by)(const lm_tensor_view *x, const float *s, const lm_tensor_view *out, void *stream);
    lm_status (*silu)(const lm_tensor_view *x, const lm_tensor_view *out, void *stream);
    lm_status (*swiglu)(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out, void *stream);
    lm_status (*cast)(const lm_tensor_view *x, const lm_tensor_view *out, void *stream);
    /* acc (f32) += x widened (lm__accumulate_out) */
    lm_status (*accumulate)(const lm_tensor_view *acc, const lm_tensor_view *x, void *stream);
    lm_status (*rmsnorm)(const lm_tensor_view *x, const lm_tensor_view *weight, float eps, const lm_tensor_view *out,
                         void *stream);
    lm_status (*add_rmsnorm)(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *weight,
                             float eps, const lm_tensor_view *sum_out, const lm_tensor_view *out, void *stream);
    lm_status (*rope)(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out, void *stream);
    lm_status (*rope_inv_freq)(double theta, int64_t head_dim, const lm_tensor_view *out, void *stream);
    lm_status (*embedding)(const lm_tensor_view *table, const lm_tensor_view *ids, const lm_tensor_view *out,
                           void *stream);
    lm_status (*softmax)(const lm_tensor_view *x, float scale, int causal, const lm_tensor_view *out, void *stream);
    lm_status (*attention)(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, float scale,
                           int causal, int64_t window, const lm_tensor_view *out, void *stream);
    /* a and b expanded to out's batch dims; cuBLASLt when it takes the layout, else
     * the readable kernel */
    lm_status (*matmul)(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out);
    lm_status (*cross_entropy)(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore_index,
                               const lm_tensor_view *out, void *stream);
    lm_status (*argmax)(const lm_tensor_view *x, const lm_tensor_view *out, void *stream);
    lm_status (*topk)(const lm_tensor_view *x, int64_t k, const lm_tensor_view *values, const lm_tensor_view *indices,
                      void *stream);
    lm_status (*sum)(const lm_tensor_view *x, int dim, const lm_tensor_view *out, void *stream);
    lm_status (*max)(const lm_tensor_view *x, int dim, const lm_tensor_view *out, void *stream);
    lm_status (*concat)(int n, const lm_tensor_view *const *inputs, int dim, const lm_tensor_view *out, void *stream);

    /* ---- backward operators and the optimizer ---- */
    lm_status (*adamw_update)(int n, const lm_tensor_view *params, const lm_tensor_view *grads,
                              const lm_tensor_view *m, const lm_tensor_view *v, const float *weight_decay,
                              const lm_adamw_hparams *hp, const double *dyn, void *stream);
    lm_status (*sum_squares)(int n, const lm_tensor_view *xs, const lm_tensor_view *out, void *stream);
    lm_status (*clip_scale)(const float *sumsq, double clip, double *out, void *stream);
    lm_status (*matmul_backward)(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b,
                                 const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db,
                                 int accumulate);
    lm_status (*attention_backward)(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                    const lm_tensor_view *dout, float scale, int causal, int64_t window,
                                    const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv,
                                    void *stream);
    /* the flash kernel's attention with its statistics (lm_attention_lse_out): whether
     * it takes these views, the forward, and the backward from out and lse */
    int (*attention_lse_supported)(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                   int causal, const lm_tensor_view *out);
    lm_status (*attention_lse)(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, float scale,
                               int causal, int64_t window, const lm_tensor_view *out, const lm_tensor_view *lse,
                               void *stream);
    lm_status (*attention_backward_lse)(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                        const lm_tensor_view *out, const lm_tensor_view *lse,
                                        const lm_tensor_view *dout, float scale, int causal, int64_t window,
                                        const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv,
                                        void *stream);
    /* dsum NULL for plain RMSNorm */
    lm_status (*rmsnorm_backward)(const lm_tensor_view *x, const lm_tensor_view *weight, float eps,
                                  const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                  const lm_tensor_view *dweight, void *stream);
    lm_status (*swiglu_backward)(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *dout,
                                 const lm_tensor_view *dgate, const lm_tensor_view *dup, void *stream);
    lm_status (*rope_backward)(const lm_tensor_view *dout, const lm_rope_params *p, const lm_tensor_view *dx,
                               const lm_tensor_view *dbias, void *stream);
    lm_status (*embedding_backward)(const lm_tensor_view *ids, const lm_tensor_view *dout,
                                    const lm_tensor_view *dtable, int accumulate, void *stream);
    lm_status (*cross_entropy_backward)(const lm_tensor_view *logits, const lm_tensor_view *targets,
                                        int64_t ignore_index, const lm_tensor_view *dloss,
                                        const lm_tensor_view *dlogits, void *stream);
    /* x [N, H] and w [V, H] contiguous in one float dtype (the operator packs them);
     * dx contiguous, dw any strides; backward: dloss NULL means 1, and a non-NULL
     * loss is written as the forward writes it (lm_linear_cross_entropy_grads_out) */
    lm_status (*linear_cross_entropy)(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                      const lm_tensor_view *targets, int64_t ignore_index, const lm_tensor_view *loss);
    lm_status (*linear_cross_entropy_backward)(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                               const lm_tensor_view *targets, int64_t ignore_index,
                                               const lm_tensor_view *dloss, const lm_tensor_view *dx,
                                               const lm_tensor_view *dw, const lm_tensor_view *loss);

    /* ---- the model step (ops/cuda/step_cuda.c, kv.cu) ---- */
    lm_status (*kv_store)(const lm_tensor_view *cache, const lm_tensor_view *x, const lm_tensor_view *slots,
                          const lm_tensor_view *positions, void *stream);
    lm_status (*attention_cache)(const lm_tensor_view *q, const lm_tensor_view *k_cache, const lm_tensor_view *v_cache,
                                 const lm_tensor_view *slots, const lm_tensor_view *positions,
                                 const lm_kv_attention_params *p, const lm_tensor_view *out, void *stream);
    size_t (*attention_cache_workspace)(int64_t tokens, int64_t q_heads, int64_t head_dim, int64_t cache_tokens);
    lm_status (*qkv_rope_store)(const lm_tensor_view *qkv, const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                const lm_tensor_view *positions, const lm_tensor_view *k_cache,
                                const lm_tensor_view *v_cache, const lm_tensor_view *q, void *stream);
    /* LM_UNSUPPORTED (nothing queued) when the views do not suit the decode GEMV */
    lm_status (*linear_qkv_rope_store)(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                       const lm_linear_params *lin, const lm_qkv_rope_params *p,
                                       const lm_tensor_view *slots, const lm_tensor_view *positions,
                                       const lm_tensor_view *k_cache, const lm_tensor_view *v_cache,
                                       const lm_tensor_view *q);
    lm_status (*linear_swiglu)(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                               const lm_tensor_view *bias, const lm_linear_params *lin, const lm_tensor_view *out);
    /* for calls lm__linear_fused_rule admits; LM_UNSUPPORTED (nothing queued) when the
     * views' layout does not suit the kernels */
    lm_status (*linear)(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                        const lm_linear_params *p, const lm_tensor_view *out);
    /* quantized weights (int8, int4, fp8: ops/cuda/gemv_quant.cu), every valid call;
     * p->workspace, when given, was checked against lm_linear_workspace_bytes;
     * precision is the calling thread's (fast: fp8 products of more than 8 rows on the
     * fp8 tensor cores, x quantized per row) */
    lm_status (*linear_quant)(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                              const lm_linear_params *p, lm_precision precision, const lm_tensor_view *out);
    lm_status (*sample)(const lm_tensor_view *logits, const lm_tensor_view *params, const lm_tensor_view *workspace,
                        const lm_tensor_view *ids, void *stream);
    size_t (*sample_workspace)(int64_t rows);
    /* 1 when the decode GEMV stages `rows` input rows of K values in shared memory on the
     * current device (lm__cuda_gemv_stages): the graph rules give the GEMV's pair
     * epilogues, and quantized weights at 3-8 rows the GEMV, only such calls */
    int (*gemv_stages)(int64_t rows, int64_t K);
    /* 1 when linear_swiglu runs bf16 x through the gate|up wgmma GEMM on the current
     * device (lm__cuda_swiglu_gemm_wg_ok) */
    int (*swiglu_gemm)(void);
} lm__cuda_ops;

/* The table, or NULL in a build without CUDA. */
const lm__cuda_ops *lm__cuda_ops_get(void);

#endif
