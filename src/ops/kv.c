/* ops/kv.c — the KV-cache step operators: storing a step's keys/values and attending
 * over a slot's cached positions. Validation and dispatch.
 *
 * Shapes: cache [S, Hkv, P, D] (S blocks of P positions); x, q, out [B, T, heads, D];
 * slots (the block table) [B] or [B, NB] i32; positions [B, T] i32, consecutive within
 * a row. Host-readable index tensors are checked value by value here (positions in
 * [0, NB * P) and consecutive, blocks in [0, S), no block written by two rows), so
 * the kernels below may trust them. The tuned CPU level of attention_cache runs the
 * tuned attention per row over the row's keys [0, last position] (a view of its slot,
 * or gathered from its blocks), causal, the window: exactly the reference's
 * decomposition; other layouts run the reference. qkv_rope_store is the fused front
 * of a step (bias, q/k norms, RoPE, the K/V stores and q), whose composition is the
 * reference. On CUDA (ops/cuda/step_cuda.c) the caches must be contiguous bf16 (the
 * model's device caches); other forms are LM_UNSUPPORTED naming what is needed.
 */
#include "ops/alias.h"
#include "runtime/internal.h"
#include "ops/cpu/attention.h"
#include "ops/ref/kv.h"

/* The block table (slots [B] or [B, NB]) and positions [B, T] of a step over caches of
 * S blocks of P positions; host-readable values are checked (ops.h): positions in
 * [0, NB * P) and consecutive, every block a row reads in [0, S), and no block written
 * by two rows. */
lm_status lm__kv_check_indices(const char *op, int64_t B, int64_t T, int64_t S, int64_t P, const lm_tensor_view *slots,
                               const lm_tensor_view *positions) {
    int64_t bs[2] = {B, -1}, ps[2] = {B, T};
    LM_TRY(lm__op_check_dtype(op, "slots", slots, LM_I32));
    if (slots->ndim == 2) LM_TRY(lm__op_check_shape(op, "slots [B, NB]", slots, 2, bs));
    else LM_TRY(lm__op_check_shape(op, "slots [B]", slots, 1, bs));
    LM_TRY(lm__op_check_dtype(op, "positions", positions, LM_I32));
    LM_TRY(lm__op_check_shape(op, "positions [B, T]", positions, 2, ps));
    int64_t NB = lm__kv_blocks_per_row(slots);
    if (NB < 1) return lm__error(LM_SHAPE_MISMATCH, "%s: the block table has no column", op);
    if (!lm__device_host_addressable(slots->device)) return LM_OK; /* device kernels skip bad rows (ops.h) */
    for (int64_t b = 0; b < B; b++) {
        int64_t p0 = lm__ld_index(LM_I32, positions->data, b * positions->stride[0]);
        for (int64_t t = 0; t < T; t++) {
            int64_t p = lm__ld_index(LM_I32, positions->data, b * positions->stride[0] + t * positions->stride[1]);
            if (p < 0 || p >= NB * P)
                return lm__error(LM_OUT_OF_RANGE, "%s: row %lld token %lld at position %lld, outside the row's [0, %lld)",
                                 op, (long long)b, (long long)t, (long long)p, (long long)(NB * P));
            if (p != p0 + t)
                return lm__error(LM_INVALID_ARGUMENT, "%s: row %lld positions are not consecutive (token %lld at %lld "
                                 "after %lld)", op, (long long)b, (long long)t, (long long)p, (long long)p0);
        }
        int64_t last = p0 + T - 1;
        for (int64_t k = 0; k <= last / P; k++) { /* the blocks the row reads */
            int64_t s = lm__kv_block(slots, b, k * P, P);
            if (s < 0 || s >= S)
                return lm__error(LM_OUT_OF_RANGE, "%s: row %lld names %s %lld (entry %lld), outside [0, %lld)", op,
                                 (long long)b, NB == 1 ? "slot" : "block", (long long)s, (long long)k, (long long)S);
        }
        for (int64_t k = p0 / P; k <= last / P; k++) { /* the blocks it writes: no other row writes them */
            int64_t s = lm__kv_block(slots, b, k * P, P);
            for (int64_t o = 0; o < b; o++) {
                int64_t q0 = lm__ld_index(LM_I32, positions->data, o * positions->stride[0]), ql = q0 + T - 1;
                for (int64_t m = q0 / P; m <= ql / P; m++)
                    if (lm__kv_block(slots, o, m * P, P) == s)
                        return lm__error(LM_INVALID_ARGUMENT, "%s: rows %lld and %lld both write %s %lld", op,
                                         (long long)o, (long long)b, NB == 1 ? "slot" : "block", (long long)s);
            }
        }
    }
    return LM_OK;
}

/* cache [S, Hkv, P, D] whose head and dim counts match `heads` and D (heads < 0: any). */
static lm_status check_cache(const char *op, const char *name, const lm_tensor_view *c, int64_t heads, int64_t D) {
    LM_TRY(lm__op_check_float(op, name, c));
    int64_t cs[4] = {-1, heads, -1, D};
    return lm__op_check_shape(op, name, c, 4, cs);
}

lm_status lm_kv_store_out(lm_ctx *ctx, const lm_tensor_view *cache, const lm_tensor_view *x,
                          const lm_tensor_view *slots, const lm_tensor_view *positions) {
    const char *op = "kv_store";
    const lm_tensor_view *vs[] = {cache, x, slots, positions};
    static const char *const names[] = {"cache", "x", "slots", "positions"};
    LM_TRY(lm__op_check_devices(ctx, op, 4, vs, names));
    LM_TRY(lm__op_check_float(op, "x", x));
    int64_t any4[4] = {-1, -1, -1, -1};
    LM_TRY(lm__op_check_shape(op, "x [B, T, Hkv, D]", x, 4, any4));
    LM_TRY(check_cache(op, "cache [S, Hkv, P, D]", cache, x->shape[2], x->shape[3]));
    LM_TRY(lm__op_check_out(op, "cache", cache));
    LM_TRY(lm__op_check_alias(op, "cache", cache, "x", x, 0));
    LM_TRY(lm__kv_check_indices(op, x->shape[0], x->shape[1], cache->shape[0], cache->shape[2], slots, positions));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->kv_store(cache, x, slots, positions, lm_ctx_stream(ctx));
    lm__ref_kv_store(cache, x, slots, positions);
    return LM_OK;
}

/* Row b of a [B, T, H, D] view as [1, H, T, D]. */
static void row_heads(const lm_tensor_view *v, int64_t b, lm_tensor_view *out) {
    lm_tensor_view r;
    lm_tensor_view_select(v, 0, b, &r);      /* [T, H, D] */
    lm_tensor_view_transpose(&r, 0, 1, &r);  /* [H, T, D] */
    int64_t f[2] = {1, r.shape[0]};
    lm_tensor_view_split_axis(&r, 0, 2, f, out);
}

static lm_status cpu_attention_cache(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *kc,
                                     const lm_tensor_view *vc, const lm_tensor_view *slots,
                                     const lm_tensor_view *positions, const lm_kv_attention_params *p,
                                     const lm_tensor_view *out) {
    int64_t B = q->shape[0], T = q->shape[1];
    for (int64_t b = 0; b < B; b++) {
        int64_t last = lm__ld_index(LM_I32, positions->data, b * positions->stride[0] + (T - 1) * positions->stride[1]);
        lm_tensor_view qr, orow, kr, vr;
        row_heads(q, b, &qr);
        row_heads(out, b, &orow);
        void *kb = NULL, *vb = NULL; /* a paged row's positions gathered from its blocks */
        lm_status st = lm__kv_gather_row(kc, slots, b, last + 1, &kr, &kb);
        if (st == LM_OK) st = lm__kv_gather_row(vc, slots, b, last + 1, &vr, &vb);
        if (st == LM_OK) st = lm__cpu_attention(lm_ctx_threadpool(ctx), &qr, &kr, &vr, p->scale, 1, p->window, &orow);
        lm__free(kb);
        lm__free(vb);
        LM_TRY(st);
    }
    return LM_OK;
}

size_t lm_attention_cache_workspace_bytes(lm_device d, int64_t tokens, int64_t q_heads, int64_t head_dim,
                                          int64_t cache_tokens) {
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    if (tokens < 1 || q_heads < 1 || head_dim < 1 || cache_tokens < 1 || lm__device_host_addressable(d) || !cu)
        return 0; /* the CPU levels split no keys */
    return cu->attention_cache_workspace(tokens, q_heads, head_dim, cache_tokens);
}

lm_status lm_attention_cache_out(lm_ctx *ctx, const lm_tensor_view *q, const lm_tensor_view *k_cache,
                                 const lm_tensor_view *v_cache, const lm_tensor_view *slots,
                                 const lm_tensor_view *positions, const lm_kv_attention_params *p,
                                 const lm_tensor_view *out) {
    const char *op = "attention_cache";
    const lm_tensor_view *vs[] = {q, k_cache, v_cache, slots, positions, out};
    static const char *const names[] = {"q", "k_cache", "v_cache", "slots", "positions", "out"};
    LM_TRY(lm__op_check_devices(ctx, op, 6, vs, names));
    if (!p) return lm__error(LM_INVALID_ARGUMENT, "%s: NULL parameters", op);
    LM_TRY(lm__op_check_float(op, "q", q));
    int64_t any4[4] = {-1, -1, -1, -1};
    LM_TRY(lm__op_check_shape(op, "q [B, T, Hq, D]", q, 4, any4));
    LM_TRY(check_cache(op, "k_cache [S, Hkv, P, D]", k_cache, -1, q->shape[3]));
    LM_TRY(check_cache(op, "v_cache [S, Hkv, P, D]", v_cache, k_cache->shape[1], q->shape[3]));
    LM_TRY(lm__op_check_same_shape(op, "v_cache", v_cache, k_cache));
    LM_TRY(lm__op_check_float(op, "out", out)); /* may round to another float dtype */
    LM_TRY(lm__op_check_same_shape(op, "out", out, q));
    if (q->shape[2] % k_cache->shape[1])
        return lm__error(LM_SHAPE_MISMATCH, "%s: %lld query heads are not a multiple of %lld kv heads", op,
                         (long long)q->shape[2], (long long)k_cache->shape[1]);
    if (!(p->scale > 0 && isfinite(p->scale)) || p->window < 0)
        return lm__error(LM_INVALID_ARGUMENT, "%s: scale %g (> 0), window %lld (>= 0)", op, p->scale, (long long)p->window);
    LM_TRY(lm__op_check_out(op, "out", out));
    LM_TRY(lm__op_check_alias(op, "out", out, "q", q, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "k_cache", k_cache, 0));
    LM_TRY(lm__op_check_alias(op, "out", out, "v_cache", v_cache, 0));
    LM_TRY(lm__kv_check_indices(op, q->shape[0], q->shape[1], k_cache->shape[0], k_cache->shape[2], slots, positions));
    if (p->workspace) {
        const lm_tensor_view *wv[] = {p->workspace};
        static const char *const wn[] = {"workspace"};
        LM_TRY(lm__op_check_devices(ctx, op, 1, wv, wn));
    }
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 1, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->attention_cache(q, k_cache, v_cache, slots, positions, p, out, lm_ctx_stream(ctx));
    if (level == LM__LEVEL_CPU) {
        char why[256];
        if (lm__cpu_attention_supported(q, k_cache, v_cache, out, why, sizeof why))
            return cpu_attention_cache(ctx, q, k_cache, v_cache, slots, positions, p, out);
        if (lm_ctx_impl(ctx) == LM_IMPL_TUNED) return lm__error(LM_UNSUPPORTED, "%s: %s", op, why);
    }
    return lm__ref_attention_cache(q, k_cache, v_cache, slots, positions, p->scale, p->window, out);
}

/* A [D] f32 vector parameter of qkv_rope_store (optional ones may be NULL). */
static lm_status check_vector(const char *op, const char *name, const lm_tensor_view *v, int64_t n) {
    LM_TRY(lm__op_check_dtype(op, name, v, LM_F32));
    return lm__op_check_shape(op, name, v, 1, &n);
}

/* The checks of the attention front's parameters, caches, indices and q (all but its
 * qkv input); *width is the qkv rows' (Hq + 2 Hkv) D. */
static lm_status check_front(lm_ctx *ctx, const char *op, const lm_qkv_rope_params *p, const lm_tensor_view *slots,
                             const lm_tensor_view *positions, const lm_tensor_view *k_cache,
                             const lm_tensor_view *v_cache, const lm_tensor_view *q, int64_t *width) {
    const lm_tensor_view *vs[] = {slots, positions, k_cache, v_cache, q};
    static const char *const names[] = {"slots", "positions", "k_cache", "v_cache", "q"};
    LM_TRY(lm__op_check_devices(ctx, op, 5, vs, names));
    if (!p || !p->inv_freq || (!p->q_norm) != (!p->k_norm))
        return lm__error(LM_INVALID_ARGUMENT, "%s: parameters need inv_freq, and q_norm and k_norm together", op);
    const lm_tensor_view *pv[] = {p->inv_freq, p->bias ? p->bias : p->inv_freq, p->q_norm ? p->q_norm : p->inv_freq,
                                  p->k_norm ? p->k_norm : p->inv_freq};
    static const char *const pn[] = {"inv_freq", "bias", "q_norm", "k_norm"};
    LM_TRY(lm__op_check_devices(ctx, op, 4, pv, pn));
    LM_TRY(lm__op_check_float(op, "q", q));
    int64_t any4[4] = {-1, -1, -1, -1};
    LM_TRY(check_cache(op, "k_cache [S, Hkv, P, D]", k_cache, -1, -1));
    LM_TRY(lm__op_check_same_shape(op, "v_cache", v_cache, k_cache));
    LM_TRY(lm__op_check_float(op, "v_cache", v_cache));
    int64_t Hq = p->q_heads, Hkv = k_cache->shape[1], D = k_cache->shape[3];
    if (Hq < 1 || Hq % Hkv || D % 2)
        return lm__error(LM_SHAPE_MISMATCH, "%s: %lld query heads over %lld kv heads of %lld dims (a multiple, even dims)",
                         op, (long long)Hq, (long long)Hkv, (long long)D);
    LM_TRY(lm__op_check_shape(op, "q [B, T, Hq, D]", q, 4, any4));
    int64_t qs[4] = {q->shape[0], q->shape[1], Hq, D};
    LM_TRY(lm__op_check_shape(op, "q [B, T, Hq, D]", q, 4, qs));
    *width = (Hq + 2 * Hkv) * D;
    LM_TRY(check_vector(op, "inv_freq", p->inv_freq, D / 2));
    if (p->bias) LM_TRY(check_vector(op, "bias", p->bias, (Hq + 2 * Hkv) * D));
    if (p->q_norm) LM_TRY(check_vector(op, "q_norm", p->q_norm, D));
    if (p->k_norm) LM_TRY(check_vector(op, "k_norm", p->k_norm, D));
    if (!isfinite(p->eps) || p->eps < 0 || !(p->attn_factor > 0 && isfinite(p->attn_factor)))
        return lm__error(LM_INVALID_ARGUMENT, "%s: eps %g, attention factor %g", op, p->eps, p->attn_factor);
    LM_TRY(lm__op_check_out(op, "q", q));
    LM_TRY(lm__op_check_out(op, "k_cache", k_cache));
    LM_TRY(lm__op_check_out(op, "v_cache", v_cache));
    return lm__kv_check_indices(op, q->shape[0], q->shape[1], k_cache->shape[0], k_cache->shape[2], slots, positions);
}

lm_status lm_qkv_rope_store_out(lm_ctx *ctx, const lm_tensor_view *qkv, const lm_qkv_rope_params *p,
                                const lm_tensor_view *slots, const lm_tensor_view *positions,
                                const lm_tensor_view *k_cache, const lm_tensor_view *v_cache,
                                const lm_tensor_view *q) {
    const char *op = "qkv_rope_store";
    const lm_tensor_view *vs[] = {qkv};
    static const char *const names[] = {"qkv"};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, names));
    int64_t width = 0;
    LM_TRY(check_front(ctx, op, p, slots, positions, k_cache, v_cache, q, &width));
    LM_TRY(lm__op_check_float(op, "qkv", qkv));
    int64_t xs[3] = {q->shape[0], q->shape[1], width};
    LM_TRY(lm__op_check_shape(op, "qkv [B, T, (Hq + 2 Hkv) D]", qkv, 3, xs));
    LM_TRY(lm__op_check_alias(op, "q", q, "qkv", qkv, 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->qkv_rope_store(qkv, p, slots, positions, k_cache, v_cache, q, lm_ctx_stream(ctx));
    return lm__ref_qkv_rope_store(qkv, p, slots, positions, k_cache, v_cache, q);
}

lm_status lm_linear_qkv_rope_store_out(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor_view *w,
                                       const lm_linear_params *lin, const lm_qkv_rope_params *p,
                                       const lm_tensor_view *slots, const lm_tensor_view *positions,
                                       const lm_tensor_view *k_cache, const lm_tensor_view *v_cache,
                                       const lm_tensor_view *q) {
    const char *op = "linear_qkv_rope_store";
    if (!lin) return lm__error(LM_INVALID_ARGUMENT, "%s: NULL linear parameters", op);
    const lm_tensor_view *vs[] = {x, w, lin->norm_weight ? lin->norm_weight : x, lin->w_scales ? lin->w_scales : x};
    static const char *const names[] = {"x", "w", "norm_weight", "w_scales"};
    LM_TRY(lm__op_check_devices(ctx, op, 4, vs, names));
    if (lin->accumulate) return lm__error(LM_INVALID_ARGUMENT, "%s: the projection cannot accumulate", op);
    LM_TRY(lm__linear_check_inputs(op, x, w, NULL, lin));
    int64_t width = 0;
    LM_TRY(check_front(ctx, op, p, slots, positions, k_cache, v_cache, q, &width));
    const int64_t rows = q->shape[0] * q->shape[1];
    if (x->shape[0] != rows || w->shape[0] != width)
        return lm__error(LM_SHAPE_MISMATCH, "%s: x has %lld rows and w %lld outputs; q [B, T, Hq, D] needs B*T = %lld "
                         "rows and (Hq + 2 Hkv) D = %lld outputs", op, (long long)x->shape[0], (long long)w->shape[0],
                         (long long)rows, (long long)width);
    const lm_tensor_view *ins[] = {x, w, lin->norm_weight, lin->w_scales};
    const lm_tensor_view *outs[] = {q, k_cache, v_cache};
    static const char *const out_names[] = {"q", "k_cache", "v_cache"};
    for (int o = 0; o < 3; o++)
        for (int i = 0; i < 4; i++)
            if (ins[i]) LM_TRY(lm__op_check_alias(op, out_names[o], outs[o], names[i], ins[i], 0));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) {
        lm_status st = cu->linear_qkv_rope_store(ctx, x, w, lin, p, slots, positions, k_cache, v_cache, q);
        if (st != LM_UNSUPPORTED) return st; /* queued, or a real failure */
        lm_clear_error();                    /* a layout the kernel refuses: the composition runs it */
    }
    /* the composition: the projection into a temporary, then the front over it */
    LM_TRY(lm__op_composition_allowed(ctx, op, "lm_linear_qkv_rope_fused"));
    lm_tensor *qkv = NULL;
    int64_t shape[2] = {rows, width}, s3[3] = {q->shape[0], q->shape[1], width};
    lm_linear_params lp = *lin;
    lp.workspace = NULL;
    lm_status st = lm_tensor_create(lm_ctx_device(ctx), LM_F32, 2, shape, &qkv);
    if (st == LM_OK) st = lm_linear_out(ctx, x, w, NULL, &lp, lm_tensor_as_view(qkv));
    lm_tensor_view v3;
    if (st == LM_OK) st = lm_tensor_view_reshape(lm_tensor_as_view(qkv), 3, s3, &v3);
    if (st == LM_OK) st = lm_qkv_rope_store_out(ctx, &v3, p, slots, positions, k_cache, v_cache, q);
    lm_tensor_destroy(qkv); /* the device allocator keeps queued work's blocks safe (runtime/pool_cuda.c) */
    return st;
}
