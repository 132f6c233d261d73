/* ops/cuda/step_cuda.c — the CUDA level of the model-step operators: for views the
 * public operators have validated, pick the tuned kernel the layout allows (the
 * fused Linear's GEMV or cuBLASLt GEMM, the split-K or flash cache attention, the
 * fused QKV front, the device sampler) or answer LM_UNSUPPORTED naming what the
 * kernels need; and the fast paths of the basic operators' mixed-dtype forms the step
 * uses (f32 rows normalized into bf16, the packed SwiGLU).
 * KV caches are pools of blocks [S, Hkv, P, D] addressed through slots, the block
 * tables [B] (NB = 1) or [B, NB]: a row holds up to NB * P positions, and that row
 * capacity (not P) sizes the split-K attention's splits and workspace.
 * Nothing here allocates or synchronizes, so a captured step may contain any of it.
 */
#include "ops/cuda/cuda_ops.h"
#include "ops/internal.h"

#include <stddef.h>
#include <string.h>

_Static_assert(sizeof(lm__cuda_sample_params) == sizeof(lm_sample_params) &&
                   offsetof(lm__cuda_sample_params, seed) == offsetof(lm_sample_params, seed) &&
                   offsetof(lm__cuda_sample_params, draw) == offsetof(lm_sample_params, draw) &&
                   offsetof(lm__cuda_sample_params, min_p) == offsetof(lm_sample_params, min_p) &&
                   offsetof(lm__cuda_sample_params, flags) == offsetof(lm_sample_params, flags),
               "the device sampler reads lm_sample_params records as they are");

static int contiguous(const lm_tensor_view *v) { return lm_tensor_view_is_contiguous(v); }
static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; } /* the GEMV's 16-byte loads */
/* rows with a unit last stride (any row stride) */
static int unit_last(const lm_tensor_view *v) { return v->ndim == 0 || v->shape[v->ndim - 1] <= 1 || v->stride[v->ndim - 1] == 1; }

/* Table entries per row: slots [B, NB] or [B] (one). */
static int64_t blocks_per_row(const lm_tensor_view *slots) { return slots->ndim == 2 ? slots->shape[1] : 1; }

static lm__cuda_kv cache_of(const lm_tensor_view *k, const lm_tensor_view *v, const lm_tensor_view *slots) {
    lm__cuda_kv kv = {k->data, v->data, k->shape[0], k->shape[2], blocks_per_row(slots), (int)k->shape[1],
                      (int)k->shape[3]};
    return kv;
}

/* ---- attention over the cache ----------------------------------------------------------------- */
size_t lm__cuda_attention_cache_workspace(int64_t tokens, int64_t q_heads, int64_t head_dim, int64_t cache_tokens) {
    int nsplit = lm__cuda_attention_rows_splits(cache_tokens);
    if (nsplit <= 1) return 0;
    return lm__cuda_attention_rows_workspace(tokens, (int)q_heads, (int)head_dim, nsplit) * sizeof(float) +
           (size_t)(tokens * q_heads) * sizeof(int);
}

lm_status lm__cuda_attention_cache_args(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                        const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                        const lm_tensor_view *positions, const lm_kv_attention_params *p,
                                        const lm_tensor_view *out, lm__cuda_attn_params *ap, lm__cuda_kv *kv) {
    if (k_cache->dtype != LM_BF16 || v_cache->dtype != LM_BF16 || !contiguous(k_cache) || !contiguous(v_cache) ||
        !contiguous(slots) || !contiguous(positions))
        return lm__error(LM_UNSUPPORTED, "attention_cache (cuda): needs contiguous bf16 caches and index tensors");
    if (!contiguous(q) || !contiguous(out) || q->dtype == LM_F16 || out->dtype == LM_F16)
        return lm__error(LM_UNSUPPORTED, "attention_cache (cuda): q and out must be contiguous f32 or bf16");
    int64_t B = q->shape[0], T = q->shape[1], Hq = q->shape[2], D = q->shape[3], ntok = B * T;
    memset(ap, 0, sizeof *ap);
    ap->q = q->data, ap->q_bf16 = q->dtype == LM_BF16;
    ap->tok_pos = (const int32_t *)positions->data, ap->row_table = (const int32_t *)slots->data;
    ap->ntok = ntok, ap->T = T, ap->q_heads = (int)Hq, ap->scale = p->scale, ap->window = p->window;
    ap->out = out->data, ap->out_bf16 = out->dtype == LM_BF16;
    ap->nsplit = 1;
    int64_t capacity = blocks_per_row(slots) * k_cache->shape[2]; /* NB * P positions a row holds */
    size_t need = lm__cuda_attention_cache_workspace(ntok, Hq, D, capacity);
    if (p->workspace && need && (size_t)lm_tensor_view_numel(p->workspace) * lm_dtype_size(p->workspace->dtype) >= need) {
        ap->nsplit = lm__cuda_attention_rows_splits(capacity);
        ap->partial = (float *)p->workspace->data;
        size_t part = lm__cuda_attention_rows_workspace(ntok, (int)Hq, (int)D, ap->nsplit) * sizeof(float);
        ap->counters = (int *)((char *)p->workspace->data + part);
    }
    *kv = cache_of(k_cache, v_cache, slots);
    return LM_OK;
}

lm_status lm__cuda_attention_cache(const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                   const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                   const lm_tensor_view *positions, const lm_kv_attention_params *p,
                                   const lm_tensor_view *out, cudaStream_t s) {
    if (q->shape[1] > 1 && k_cache->dtype == LM_BF16 && v_cache->dtype == LM_BF16 && contiguous(k_cache) &&
        contiguous(v_cache) && contiguous(slots) && contiguous(positions) &&
        lm__cuda_attention_cache_flash_supports(q, k_cache, v_cache, out))
        return lm__cuda_attention_cache_flash(q, k_cache, v_cache, slots, positions, p->scale, p->window, out, s);
    lm__cuda_attn_params ap;
    lm__cuda_kv kv;
    LM_TRY(lm__cuda_attention_cache_args(q, k_cache, v_cache, slots, positions, p, out, &ap, &kv));
    return lm__cuda_attention_rows(&ap, &kv, s);
}

/* ---- the fused front of the attention --------------------------------------------------------- */
/* The front's parameters from the views (qkv left NULL): q [B, T, Hq, D] gives the tokens. */
static lm__cuda_qkv_params front_of(const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                    const lm_tensor_view *positions, const lm_tensor_view *q) {
    lm__cuda_qkv_params kp;
    memset(&kp, 0, sizeof kp);
    kp.bias = p->bias ? (const float *)p->bias->data : NULL;
    kp.q_norm = p->q_norm ? (const float *)p->q_norm->data : NULL;
    kp.k_norm = p->k_norm ? (const float *)p->k_norm->data : NULL;
    kp.eps = p->eps, kp.inv_freq = (const float *)p->inv_freq->data, kp.attn_factor = p->attn_factor;
    kp.tok_pos = (const int32_t *)positions->data, kp.row_table = (const int32_t *)slots->data;
    kp.ntok = q->shape[0] * q->shape[1], kp.T = q->shape[1];
    kp.q_heads = (int)p->q_heads, kp.q_bf16 = q->dtype == LM_BF16, kp.q = q->data;
    return kp;
}

lm_status lm__cuda_qkv_rope_store_views(const lm_tensor_view *qkv, const lm_qkv_rope_params *p,
                                        const lm_tensor_view *slots, const lm_tensor_view *positions,
                                        const lm_tensor_view *k_cache, const lm_tensor_view *v_cache,
                                        const lm_tensor_view *q, cudaStream_t s) {
    const lm_tensor_view *vec[4] = {p->bias, p->q_norm, p->k_norm, p->inv_freq};
    int ok = qkv->dtype == LM_F32 && contiguous(qkv) && contiguous(q) && q->dtype != LM_F16 &&
             k_cache->dtype == LM_BF16 && v_cache->dtype == LM_BF16 && contiguous(k_cache) && contiguous(v_cache) &&
             contiguous(slots) && contiguous(positions);
    for (int i = 0; i < 4; i++) ok = ok && (!vec[i] || contiguous(vec[i]));
    if (!ok)
        return lm__error(LM_UNSUPPORTED, "qkv_rope_store (cuda): needs contiguous f32 qkv and vectors, f32/bf16 q, "
                                         "bf16 caches");
    lm__cuda_qkv_params kp = front_of(p, slots, positions, q);
    kp.qkv = (const float *)qkv->data;
    lm__cuda_kv kv = cache_of(k_cache, v_cache, slots);
    return lm__cuda_qkv_rope_store(&kp, &kv, s);
}

int lm__cuda_gemv_of(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                     const lm_linear_params *lin, lm__cuda_gemv_params *gp) {
    const lm_tensor_view *sc = lin->w_scales, *nw = lin->input == LM_LINEAR_IN_RMSNORM ? lin->norm_weight : NULL;
    lm__cuda_gemv_w wf = lin->w_bits == 4         ? LM__CUDA_GEMV_I4
                         : w->dtype == LM_I8       ? LM__CUDA_GEMV_I8
                         : w->dtype == LM_F8_E4M3 ? LM__CUDA_GEMV_F8
                                                   : LM__CUDA_GEMV_BF16;
    int64_t M = x->shape[0], K = wf == LM__CUDA_GEMV_I4 ? 2 * w->shape[1] : w->shape[1];
    int64_t ldw = w->stride[0] * (int64_t)lm_dtype_size(w->dtype), wpv = wf == LM__CUDA_GEMV_I4 ? 32 : wf ? 16 : 8;
    if (x->dtype != LM_F32 || (wf == LM__CUDA_GEMV_BF16 && w->dtype != LM_BF16) || x->ndim != 2 || M < 1 ||
        M > LM__CUDA_GEMV_MAX_ROWS || K % wpv || !unit_last(x) || !unit_last(w) || x->stride[0] % 4 || ldw % 16 ||
        !aligned16(x->data) || !aligned16(w->data) || (sc && sc->ndim == 2 && !unit_last(sc)) ||
        (bias && !contiguous(bias)) || (nw && (!contiguous(nw) || !aligned16(nw->data))))
        return 0;
    memset(gp, 0, sizeof *gp);
    gp->in = (lm__cuda_gemv_in)lin->input, gp->wf = wf;
    gp->x = (const float *)x->data, gp->ldx = x->stride[0];
    gp->norm_w = nw ? (const float *)nw->data : NULL, gp->eps = lin->eps;
    gp->w = w->data, gp->ldw = ldw;
    gp->scales = sc ? sc->data : NULL, gp->lds = sc ? sc->stride[0] : 0;
    gp->scale16 = sc && sc->dtype == LM_BF16;
    gp->group = wf == LM__CUDA_GEMV_I4 ? lin->w_group : 0;
    gp->bias = bias ? (const float *)bias->data : NULL;
    gp->M = (int)M, gp->N = w->shape[0], gp->K = K;
    return 1;
}

lm_status lm__cuda_linear_qkv_rope_args(const lm_tensor_view *x, const lm_tensor_view *w, const lm_linear_params *lin,
                                        const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                        const lm_tensor_view *positions, const lm_tensor_view *k_cache,
                                        const lm_tensor_view *v_cache, const lm_tensor_view *q,
                                        lm__cuda_gemv_params *gp) {
    int ok = !p->q_norm && contiguous(q) && q->dtype != LM_F16 && k_cache->dtype == LM_BF16 &&
             v_cache->dtype == LM_BF16 && contiguous(k_cache) && contiguous(v_cache) && contiguous(slots) &&
             contiguous(positions) && contiguous(p->inv_freq) && lm__cuda_gemv_of(x, w, p->bias, lin, gp);
    if (!ok)
        return lm__error(LM_UNSUPPORTED, "linear_qkv_rope_store (cuda): needs up to %d rows of f32 x over aligned "
                         "weight rows, contiguous f32/bf16 q, bf16 caches and no q/k norm", LM__CUDA_GEMV_MAX_ROWS);
    gp->epi = LM__CUDA_GEMV_EPI_FRONT;
    gp->q_front = front_of(p, slots, positions, q);
    const char *early = getenv("LOOM_CUDA_GEMV_FRONT_EARLY"); /* =0: positions and table read after the wait */
    gp->q_front.late_at = early && strcmp(early, "0") == 0;
    gp->kv = cache_of(k_cache, v_cache, slots);
    return lm__cuda_linear_gemv_check(gp);
}

lm_status lm__cuda_linear_qkv_rope_views(const lm_tensor_view *x, const lm_tensor_view *w, const lm_linear_params *lin,
                                         const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                                         const lm_tensor_view *positions, const lm_tensor_view *k_cache,
                                         const lm_tensor_view *v_cache, const lm_tensor_view *q, cudaStream_t s) {
    lm__cuda_gemv_params gp;
    LM_TRY(lm__cuda_linear_qkv_rope_args(x, w, lin, p, slots, positions, k_cache, v_cache, q, &gp));
    return lm__cuda_linear_gemv(&gp, s);
}

lm_status lm__cuda_linear_swiglu_args(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                                      const lm_linear_params *lin, const lm_tensor_view *out, lm__cuda_gemv_params *gp) {
    if (out->dtype != LM_F32 || !unit_last(out) || !lm__cuda_gemv_of(x, w, bias, lin, gp))
        return lm__error(LM_UNSUPPORTED, "linear_swiglu (cuda): needs up to %d rows of f32 x over aligned weight rows "
                         "and an f32 out with unit last stride", LM__CUDA_GEMV_MAX_ROWS);
    gp->epi = LM__CUDA_GEMV_EPI_SWIGLU;
    gp->out = (float *)out->data, gp->ldo = out->stride[0];
    return lm__cuda_linear_gemv_check(gp);
}

lm_status lm__cuda_linear_swiglu_views(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                                       const lm_linear_params *lin, const lm_tensor_view *out, cudaStream_t s) {
    if (x->dtype == LM_BF16 && w->dtype == LM_BF16 && out->dtype == LM_BF16) { /* prefill: the wgmma GEMM */
        if (bias || lin->input != LM_LINEAR_IN || lin->w_scales || !unit_last(x) || !unit_last(w) || !unit_last(out))
            return lm__error(LM_UNSUPPORTED, "linear_swiglu (cuda): bf16 x takes the plain input form without a bias, "
                                             "rows of unit stride");
        return lm__cuda_swiglu_gemm_wg(x->data, x->stride[0], w->data, w->stride[0], x->shape[0], w->shape[0] / 2,
                                       w->shape[1], out->data, out->stride[0], s);
    }
    lm__cuda_gemv_params gp;
    LM_TRY(lm__cuda_linear_swiglu_args(x, w, bias, lin, out, &gp));
    return lm__cuda_linear_gemv(&gp, s);
}

/* ---- the fused Linear --------------------------------------------------------------------------- */
static int linear_layout(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                         const lm_linear_params *p, const lm_tensor_view *out) {
    return contiguous(w) && unit_last(x) && unit_last(out) && out->dtype == LM_F32 && (!bias || contiguous(bias)) &&
           (!p->norm_weight || contiguous(p->norm_weight));
}

lm_status lm__cuda_linear_gemv_args(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *bias,
                                    const lm_linear_params *p, const lm_tensor_view *out, lm__cuda_gemv_params *gp) {
    if (!linear_layout(x, w, bias, p, out) || out->shape[0] > LM__LINEAR_GEMV_MAX_ROWS || x->dtype != LM_F32 ||
        !lm__cuda_gemv_of(x, w, bias, p, gp))
        return lm__error(LM_UNSUPPORTED, "linear (cuda): the GEMV needs up to %d rows of f32 x, 16-byte aligned rows of "
                         "x and w, K a multiple of 8 (K = %lld) and an f32 out with unit last stride",
                         LM__LINEAR_GEMV_MAX_ROWS, (long long)w->shape[1]);
    gp->out = (float *)out->data, gp->ldo = out->stride[0], gp->accumulate = p->accumulate;
    return lm__cuda_linear_gemv_check(gp);
}

/* lm__cuda_linear (lm_linear_out of bf16 x into f32) takes gemm_rows.cu's kernel for up to
 * ROWS_WG_ROWS rows and K up to ROWS_WG_MAX_K: the short products of a batched decode step.
 * Measured against cuBLASLt on an H100 (bench/NOTES.md "Decode at the memory limit"
 * v22-v24): taking every product, the Qwen2.5-0.5B-shape step (K = 896, down 4,864) gained
 * 1.04-1.09x at 4 rows, 0.98-1.04x at 8, 1.00-1.06x at 16, and lost at 32 (0.94-0.96x) and
 * 64 (0.78-0.81x); the Llama-3.2-1B shape (K = 2,048, down 8,192) lost 0.89-0.99x at 4-16
 * rows, and down alone lost there (0.91-0.97x). The products of K <= 1,024 alone, up to 16
 * rows: 1.06-1.11x at 4 rows, 1.00-1.03x at 8, 1.00-1.11x at 16 on the Qwen shape (every
 * round above every round of cuBLASLt), and the Llama shape untouched. Two shapes measured:
 * the bound on K is where they part, not a law. */
#define ROWS_WG_ROWS 16
#define ROWS_WG_MAX_K 1024

/* The bound a measurement switch sets (an integer from lo to hi), else def. */
static int64_t rows_wg_env(const char *name, int64_t lo, int64_t hi, int64_t def) {
    const char *e = getenv(name);
    long long v = e ? atoll(e) : -1;
    return e && v >= lo && v <= hi ? (int64_t)v : def;
}

/* A product of bf16 x into f32 takes gemm_rows.cu's kernel for up to ROWS_WG_ROWS rows
 * (LOOM_CUDA_ROWS_GEMM_MAX_ROWS=R: up to R, 0-64) with K from LOOM_CUDA_ROWS_GEMM_MIN_K
 * (default 0) to LOOM_CUDA_ROWS_GEMM_MAX_K (default ROWS_WG_MAX_K), on an sm_90a device,
 * for weights of up to 2^25 elements (a layer's products; not a tied head: never measured
 * against cuBLASLt's). The variables are measurement and test switches; the row count is
 * tested first, so prefill's calls read none of them. */
static int rows_wg_rule(const lm_tensor_view *x, const lm_tensor_view *w, int64_t M, int64_t N, int64_t K) {
    if (M > LM__CUDA_ROWS_WG_MAX_ROWS) return 0;
    return x->dtype == LM_BF16 && w->dtype == LM_BF16 && N * K <= ((int64_t)1 << 25) &&
           M <= rows_wg_env("LOOM_CUDA_ROWS_GEMM_MAX_ROWS", 0, LM__CUDA_ROWS_WG_MAX_ROWS, ROWS_WG_ROWS) &&
           K >= rows_wg_env("LOOM_CUDA_ROWS_GEMM_MIN_K", 0, INT64_MAX, 0) &&
           K <= rows_wg_env("LOOM_CUDA_ROWS_GEMM_MAX_K", 0, INT64_MAX, ROWS_WG_MAX_K) &&
           lm__cuda_linear_rows_wg_fits(x->data, x->stride[0], w->data, w->stride[0], M, N, K) &&
           lm__cuda_linear_rows_wg_ok();
}

lm_status lm__cuda_linear(const lm__cuda_blas *blas, const lm_tensor_view *x, const lm_tensor_view *w,
                          const lm_tensor_view *bias, const lm_linear_params *p, const lm_tensor_view *out,
                          cudaStream_t s) {
    int64_t M = out->shape[0], N = out->shape[1], K = w->shape[1];
    int layout = linear_layout(x, w, bias, p, out);
    if (layout && M <= LM__LINEAR_GEMV_MAX_ROWS && x->dtype == LM_F32) { /* lm__linear_fused_rule admitted it */
        lm__cuda_gemv_params gp;
        LM_TRY(lm__cuda_linear_gemv_args(x, w, bias, p, out, &gp));
        return lm__cuda_linear_gemv(&gp, s);
    }
    if (layout && rows_wg_rule(x, w, M, N, K))
        return lm__cuda_linear_rows_wg(x->data, x->stride[0], w->data, w->stride[0],
                                       bias ? (const float *)bias->data : NULL, M, N, K, (float *)out->data,
                                       out->stride[0], s);
    if (layout)
        return lm__cuda_linear_lt(blas, x->data, x->stride[0], w->data, bias ? (const float *)bias->data : NULL,
                                  out->data, 0, out->stride[0], M, N, K, 0, s);
    /* a bf16 product (graphs store gate|up so when only a SwiGLU reads it) */
    if (out->dtype == LM_BF16 && x->dtype == LM_BF16 && contiguous(w) && unit_last(x) && unit_last(out) && !bias &&
        p->input == LM_LINEAR_IN && !p->accumulate)
        return lm__cuda_linear_lt(blas, x->data, x->stride[0], w->data, NULL, out->data, 1, out->stride[0], M, N, K,
                                  0, s);
    return lm__error(LM_UNSUPPORTED, "linear (cuda): no fused kernel for %lld rows of %s over %s weights",
                     (long long)M, lm_dtype_name(x->dtype), lm_dtype_name(w->dtype));
}

/* ---- token selection ------------------------------------------------------------------------------ */
lm_status lm__cuda_sample_views(const lm_tensor_view *logits, const lm_tensor_view *params,
                                const lm_tensor_view *workspace, const lm_tensor_view *ids, cudaStream_t s) {
    int64_t R = logits->shape[0];
    size_t need = lm__cuda_sample_workspace(R);
    if (!contiguous(ids) || !workspace ||
        (size_t)lm_tensor_view_numel(workspace) * lm_dtype_size(workspace->dtype) < need)
        return lm__error(LM_INVALID_ARGUMENT, "sample (cuda): needs contiguous ids and a workspace of %zu bytes", need);
    return lm__cuda_sample((const float *)logits->data, R, logits->shape[1], logits->stride[0],
                           (const lm__cuda_sample_params *)params->data, params->shape[0] > LM_SAMPLE_PARAMS_BYTES,
                           (int32_t *)ids->data, workspace->data, s);
}

/* ---- fast paths of the basic operators' mixed forms ------------------------------------------------ */
/* v is a row-major [rows, D] block: contiguous, last dim D. */
static int rows_of(const lm_tensor_view *v, int64_t *rows, int64_t *D) {
    if (v->ndim < 1 || !contiguous(v)) return 0;
    *D = v->shape[v->ndim - 1];
    *rows = *D ? lm_tensor_view_numel(v) / *D : 0;
    return 1;
}

int lm__cuda_rmsnorm_fast(const lm_tensor_view *x, const lm_tensor_view *w, float eps, const lm_tensor_view *out,
                          cudaStream_t s, lm_status *st) {
    int64_t rows, D, ldx;
    if (x->dtype != LM_F32 || out->dtype != LM_BF16 || w->dtype != LM_F32 || !contiguous(w) || !contiguous(out))
        return 0;
    if (x->ndim == 2 && unit_last(x)) /* rows at any stride: e.g. the last position of each sequence */
        rows = x->shape[0], D = x->shape[1], ldx = x->stride[0];
    else if (rows_of(x, &rows, &D))
        ldx = D;
    else
        return 0;
    *st = lm__cuda_rmsnorm_to_bf16((const float *)x->data, ldx, (const float *)w->data, eps, rows, D, out->data, s);
    return 1;
}

int lm__cuda_add_rmsnorm_fast(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *w,
                              float eps, const lm_tensor_view *sum_out, const lm_tensor_view *out, cudaStream_t s,
                              lm_status *st) {
    int64_t rows, D;
    if (x->dtype != LM_F32 || residual->dtype != LM_F32 || out->dtype != LM_BF16 || w->dtype != LM_F32 ||
        !contiguous(w) || !contiguous(out) || !contiguous(x) || !rows_of(residual, &rows, &D) ||
        sum_out->data != residual->data || !contiguous(sum_out))
        return 0; /* the kernel updates the residual stream in place */
    *st = lm__cuda_add_rmsnorm_to_bf16((float *)residual->data, (const float *)x->data, (const float *)w->data, eps,
                                       rows, D, out->data, s);
    return 1;
}

int lm__cuda_swiglu_fast(const lm_tensor_view *gate, const lm_tensor_view *up, const lm_tensor_view *out,
                         cudaStream_t s, lm_status *st) {
    if (gate->ndim != 2 || (gate->dtype != LM_F32 && gate->dtype != LM_BF16) || up->dtype != gate->dtype ||
        out->dtype != LM_BF16 || !contiguous(out))
        return 0;
    int64_t M = gate->shape[0], I = gate->shape[1];
    size_t es = lm_dtype_size(gate->dtype);
    int packed = gate->stride[1] == 1 && up->stride[1] == 1 && gate->stride[0] == 2 * I && up->stride[0] == 2 * I &&
                 (const char *)up->data == (const char *)gate->data + (size_t)I * es;
    if (!packed) return 0; /* the two halves of one [M, 2I] gate|up block */
    *st = lm__cuda_swiglu_packed_to_bf16(gate->data, gate->dtype == LM_BF16, M, I, out->data, s);
    return 1;
}
