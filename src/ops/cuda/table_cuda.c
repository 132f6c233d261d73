/* ops/cuda/table_cuda.c — the CUDA operator table (ops/cuda_table.h) in a build with
 * CUDA: each entry hands its arguments to the launcher of ops/cuda/cuda_ops.h or
 * cuda_backward.h, turning the table's void * stream back into the cudaStream_t it
 * is. The entries that use cuBLASLt fetch the context's handle here
 * (lm__ctx_cuda_blas), so the operators never see it. Builds without CUDA compile
 * table_nocuda.c instead.
 */
#include "ops/cuda/cuda_backward.h"
#include "ops/cuda_table.h"

#define S(stream) ((cudaStream_t)(stream))

/* ---- forward operators ---- */
static lm_status add(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, void *s) {
    return lm__cuda_add(a, b, out, S(s));
}

static lm_status mul(const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out, void *s) {
    return lm__cuda_mul(a, b, out, S(s));
}

static lm_status scale(const lm_tensor_view *x, float k, const lm_tensor_view *out, void *s) {
    return lm__cuda_scale(x, k, out, S(s));
}

static lm_status scale_by(const lm_tensor_view *x, const float *k, const lm_tensor_view *out, void *s) {
    return lm__cuda_scale_by(x, k, out, S(s));
}

static lm_status silu(const lm_tensor_view *x, const lm_tensor_view *out, void *s) {
    return lm__cuda_silu(x, out, S(s));
}

/* The basic operators' mixed-dtype forms (f32 in, bf16 out) run only on the model
 * step's fast paths; the readable kernels take one dtype. */
static lm_status mixed_unsupported(const char *op) {
    return lm__error(LM_UNSUPPORTED, "%s (cuda): mixed dtypes run only on f32 rows (unit last stride) into contiguous bf16", op);
}

static lm_status swiglu(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out, void *s) {
    lm_status st;
    if (lm__cuda_swiglu_fast(gate, up, out, S(s), &st)) return st;
    if (out->dtype != gate->dtype) return mixed_unsupported("swiglu");
    return lm__cuda_swiglu(gate, up, out, S(s));
}

static lm_status cast(const lm_tensor_view *x, const lm_tensor_view *out, void *s) {
    return lm__cuda_cast(x, out, S(s));
}
static lm_status accumulate(const lm_tensor_view *acc, const lm_tensor_view *x, void *s) {
    return lm__cuda_accumulate(acc, x, S(s));
}

static lm_status rmsnorm(const lm_tensor_view *x, const lm_tensor_view *w, float eps, const lm_tensor_view *out,
                         void *s) {
    lm_status st;
    if (lm__cuda_rmsnorm_fast(x, w, eps, out, S(s), &st)) return st;
    if (out->dtype != x->dtype) return mixed_unsupported("rmsnorm");
    return lm__cuda_rmsnorm(x, w, eps, out, S(s));
}

static lm_status add_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *w,
                             float eps, const lm_tensor_view *sum_out, const lm_tensor_view *out, void *s) {
    lm_status st;
    if (lm__cuda_add_rmsnorm_fast(x, residual, w, eps, sum_out, out, S(s), &st)) return st;
    if (out->dtype != x->dtype) return mixed_unsupported("add_rmsnorm");
    return lm__cuda_add_rmsnorm(x, residual, w, eps, sum_out, out, S(s));
}

static lm_status rope(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out, void *s) {
    return lm__cuda_rope(x, p, out, S(s));
}

static lm_status rope_inv_freq(double theta, int64_t head_dim, const lm_tensor_view *out, void *s) {
    return lm__cuda_rope_inv_freq(theta, head_dim, out, S(s));
}

static lm_status embedding(const lm_tensor_view *table, const lm_tensor_view *ids, const lm_tensor_view *out,
                           void *s) {
    return lm__cuda_embedding(table, ids, out, S(s));
}

static lm_status softmax(const lm_tensor_view *x, float k, int causal, const lm_tensor_view *out, void *s) {
    return lm__cuda_softmax(x, k, causal, out, S(s));
}

static lm_status attention(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, float scale_,
                           int causal, int64_t window, const lm_tensor_view *out, void *s) {
    return lm__cuda_attention(q, k, v, scale_, causal, window, out, S(s));
}

/* cuBLASLt when it takes the layout (LM_UNSUPPORTED queues nothing), else the
 * readable kernel. */
static lm_status matmul(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *out) {
    const lm__cuda_blas *blas;
    LM_TRY(lm__ctx_cuda_blas(ctx, &blas));
    lm_status st = lm__cuda_matmul_lt(blas, a, b, out, S(lm_ctx_stream(ctx)));
    if (st != LM_UNSUPPORTED) return st;
    lm_clear_error();
    return lm__cuda_matmul(a, b, out, S(lm_ctx_stream(ctx)));
}

static lm_status cross_entropy(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore_index,
                               const lm_tensor_view *out, void *s) {
    return lm__cuda_cross_entropy(logits, targets, ignore_index, out, S(s));
}

static lm_status argmax(const lm_tensor_view *x, const lm_tensor_view *out, void *s) {
    return lm__cuda_argmax(x, out, S(s));
}

static lm_status topk(const lm_tensor_view *x, int64_t k, const lm_tensor_view *values, const lm_tensor_view *indices,
                      void *s) {
    return lm__cuda_topk(x, k, values, indices, S(s));
}

static lm_status sum(const lm_tensor_view *x, int dim, const lm_tensor_view *out, void *s) {
    return lm__cuda_sum(x, dim, out, S(s));
}

static lm_status max(const lm_tensor_view *x, int dim, const lm_tensor_view *out, void *s) {
    return lm__cuda_max(x, dim, out, S(s));
}

static lm_status concat(int n, const lm_tensor_view *const *inputs, int dim, const lm_tensor_view *out, void *s) {
    return lm__cuda_concat(n, inputs, dim, out, S(s));
}

/* ---- backward operators and the optimizer ---- */
static lm_status adamw_update(int n, const lm_tensor_view *params, const lm_tensor_view *grads, const lm_tensor_view *m,
                              const lm_tensor_view *v, const float *weight_decay, const lm_adamw_hparams *hp,
                              const double *dyn, void *s) {
    return lm__cuda_adamw_update(n, params, grads, m, v, weight_decay, hp, dyn, S(s));
}

static lm_status clip_scale(const float *sumsq, double clip, double *out, void *s) {
    return lm__cuda_clip_scale(sumsq, clip, out, S(s));
}

static lm_status sum_squares(int n, const lm_tensor_view *xs, const lm_tensor_view *out, void *s) {
    return lm__cuda_sum_squares(n, xs, out, S(s));
}

static lm_status matmul_backward(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b,
                                 const lm_tensor_view *dout, const lm_tensor_view *da, const lm_tensor_view *db,
                                 int accumulate) {
    const lm__cuda_blas *blas;
    LM_TRY(lm__ctx_cuda_blas(ctx, &blas));
    return lm__cuda_matmul_backward(blas, a, b, dout, da, db, accumulate, S(lm_ctx_stream(ctx)));
}

static lm_status attention_backward(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                    const lm_tensor_view *dout, float scale_, int causal, int64_t window,
                                    const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv,
                                    void *s) {
    return lm__cuda_attention_backward(q, k, v, dout, scale_, causal, window, dq, dk, dv, S(s));
}

static lm_status attention_lse(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v, float scale_,
                               int causal, int64_t window, const lm_tensor_view *out, const lm_tensor_view *lse,
                               void *s) {
    return lm__cuda_flash_attention_lse(q, k, v, scale_, causal, window, out, lse, S(s));
}

static lm_status attention_backward_lse(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                        const lm_tensor_view *out, const lm_tensor_view *lse,
                                        const lm_tensor_view *dout, float scale_, int causal, int64_t window,
                                        const lm_tensor_view *dq, const lm_tensor_view *dk, const lm_tensor_view *dv,
                                        void *s) {
    return lm__cuda_flash_attention_backward_lse(q, k, v, out, lse, dout, scale_, causal, window, dq, dk, dv, S(s));
}

static lm_status rmsnorm_backward(const lm_tensor_view *x, const lm_tensor_view *w, float eps,
                                  const lm_tensor_view *dout, const lm_tensor_view *dsum, const lm_tensor_view *dx,
                                  const lm_tensor_view *dw, void *s) {
    return lm__cuda_rmsnorm_backward(x, w, eps, dout, dsum, dx, dw, S(s));
}

static lm_status swiglu_backward(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *dout,
                                 const lm_tensor_view *dgate, const lm_tensor_view *dup, void *s) {
    return lm__cuda_swiglu_backward(gate, up, dout, dgate, dup, S(s));
}

static lm_status rope_backward(const lm_tensor_view *dout, const lm_rope_params *p, const lm_tensor_view *dx,
                               const lm_tensor_view *dbias, void *s) {
    return lm__cuda_rope_backward(dout, p, dx, dbias, S(s));
}

static lm_status embedding_backward(const lm_tensor_view *ids, const lm_tensor_view *dout,
                                    const lm_tensor_view *dtable, int accumulate, void *s) {
    return lm__cuda_embedding_backward(ids, dout, dtable, accumulate, S(s));
}

static lm_status cross_entropy_backward(const lm_tensor_view *logits, const lm_tensor_view *targets,
                                        int64_t ignore_index, const lm_tensor_view *dloss,
                                        const lm_tensor_view *dlogits, void *s) {
    return lm__cuda_cross_entropy_backward(logits, targets, ignore_index, dloss, dlogits, S(s));
}

static lm_status linear_cross_entropy(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                      const lm_tensor_view *targets, int64_t ignore_index, const lm_tensor_view *loss) {
    const lm__cuda_blas *blas;
    LM_TRY(lm__ctx_cuda_blas(ctx, &blas));
    return lm__cuda_linear_cross_entropy(blas, x, w, targets, ignore_index, loss, S(lm_ctx_stream(ctx)));
}

static lm_status linear_cross_entropy_backward(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                               const lm_tensor_view *targets, int64_t ignore_index,
                                               const lm_tensor_view *dloss, const lm_tensor_view *dx,
                                               const lm_tensor_view *dw, const lm_tensor_view *loss) {
    const lm__cuda_blas *blas;
    LM_TRY(lm__ctx_cuda_blas(ctx, &blas));
    return lm__cuda_linear_cross_entropy_backward(blas, x, w, targets, ignore_index, dloss, dx, dw, loss,
                                                  S(lm_ctx_stream(ctx)));
}

/* ---- the model step ---- */
static lm_status kv_store(const lm_tensor_view *cache, const lm_tensor_view *x, const lm_tensor_view *slots,
                          const lm_tensor_view *positions, void *s) {
    return lm__cuda_kv_store(cache, x, slots, positions, S(s));
}

static lm_status attention_cache(const lm_tensor_view *q, const lm_tensor_view *kc, const lm_tensor_view *vc,
                                 const lm_tensor_view *slots, const lm_tensor_view *positions,
                                 const lm_kv_attention_params *p, const lm_tensor_view *out, void *s) {
    return lm__cuda_attention_cache(q, kc, vc, slots, positions, p, out, S(s));
}

static lm_status qkv_rope_store(const lm_tensor_view *qkv, const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                const lm_tensor_view *positions, const lm_tensor_view *kc, const lm_tensor_view *vc,
                                const lm_tensor_view *q, void *s) {
    return lm__cuda_qkv_rope_store_views(qkv, p, slots, positions, kc, vc, q, S(s));
}

static lm_status linear_qkv_rope_store(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                       const lm_linear_params *lin, const lm_qkv_rope_params *p,
                                       const lm_tensor_view *slots, const lm_tensor_view *positions,
                                       const lm_tensor_view *kc, const lm_tensor_view *vc, const lm_tensor_view *q) {
    return lm__cuda_linear_qkv_rope_views(x, w, lin, p, slots, positions, kc, vc, q, S(lm_ctx_stream(ctx)));
}

static lm_status linear_swiglu(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                               const lm_tensor_view *bias, const lm_linear_params *lin, const lm_tensor_view *out) {
    return lm__cuda_linear_swiglu_views(x, w, bias, lin, out, S(lm_ctx_stream(ctx)));
}

static lm_status linear(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                        const lm_linear_params *p, const lm_tensor_view *out) {
    const lm__cuda_blas *blas;
    LM_TRY(lm__ctx_cuda_blas(ctx, &blas));
    return lm__cuda_linear(blas, x, w, bias, p, out, S(lm_ctx_stream(ctx)));
}

static lm_status linear_quant(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                              const lm_linear_params *p, lm_precision precision, const lm_tensor_view *out) {
    const lm__cuda_blas *blas;
    LM_TRY(lm__ctx_cuda_blas(ctx, &blas));
    return lm__cuda_linear_quant(blas, x, w, bias, p, precision, out, S(lm_ctx_stream(ctx)));
}

static lm_status sample(const lm_tensor_view *logits, const lm_tensor_view *params, const lm_tensor_view *workspace,
                        const lm_tensor_view *ids, void *s) {
    return lm__cuda_sample_views(logits, params, workspace, ids, S(s));
}

static const lm__cuda_ops k_table = {
    .add = add,
    .mul = mul,
    .scale = scale,
    .scale_by = scale_by,
    .silu = silu,
    .swiglu = swiglu,
    .cast = cast,
    .accumulate = accumulate,
    .rmsnorm = rmsnorm,
    .add_rmsnorm = add_rmsnorm,
    .rope = rope,
    .rope_inv_freq = rope_inv_freq,
    .embedding = embedding,
    .softmax = softmax,
    .attention = attention,
    .matmul = matmul,
    .cross_entropy = cross_entropy,
    .argmax = argmax,
    .topk = topk,
    .sum = sum,
    .max = max,
    .concat = concat,
    .adamw_update = adamw_update,
    .sum_squares = sum_squares,
    .clip_scale = clip_scale,
    .matmul_backward = matmul_backward,
    .attention_backward = attention_backward,
    .attention_lse_supported = lm__cuda_flash_attention_supports,
    .attention_lse = attention_lse,
    .attention_backward_lse = attention_backward_lse,
    .rmsnorm_backward = rmsnorm_backward,
    .swiglu_backward = swiglu_backward,
    .rope_backward = rope_backward,
    .embedding_backward = embedding_backward,
    .cross_entropy_backward = cross_entropy_backward,
    .linear_cross_entropy = linear_cross_entropy,
    .linear_cross_entropy_backward = linear_cross_entropy_backward,
    .kv_store = kv_store,
    .attention_cache = attention_cache,
    .attention_cache_workspace = lm__cuda_attention_cache_workspace,
    .qkv_rope_store = qkv_rope_store,
    .linear_qkv_rope_store = linear_qkv_rope_store,
    .linear_swiglu = linear_swiglu,
    .linear = linear,
    .linear_quant = linear_quant,
    .gemv_stages = lm__cuda_gemv_stages,
    .swiglu_gemm = lm__cuda_swiglu_gemm_wg_ok,
    .sample = sample,
    .sample_workspace = lm__cuda_sample_workspace,
};

const lm__cuda_ops *lm__cuda_ops_get(void) { return &k_table; }
