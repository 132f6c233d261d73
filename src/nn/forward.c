/* nn/forward.c — the decoder forward pass over the public operator API.
 *
 * Per layer, for BT = B*T rows of the f32 residual stream x [BT, H]:
 *   xn = rmsnorm(x); q,k,v = xn W^T (+b); (qwen3) per-head rmsnorm of q,k;
 *   rope(q,k) at each row's positions; append k,v to the cache; attention of q over
 *   the slot's cached keys (causal, grouped kv heads); x += attn Wo^T; xn = rmsnorm(x);
 *   x += (silu(xn Wg^T) * xn Wu^T) Wd^T.
 * Residual adds are fused with the following norm (lm_add_rmsnorm_out, in place on x).
 * Scratch activations are allocated per call: O(BT * (H + I + heads * hd)) floats.
 * A model on a CUDA device takes nn/forward_cuda.c instead (same checks, same contract).
 */
#include "nn/internal.h"

#include <math.h>

typedef struct scratch {
    lm_tensor *x, *xn, *q, *k, *v, *attn, *gate, *up, *tmp, *emb, *pos;
} scratch;

static void scratch_free(scratch *s) {
    lm_tensor *all[] = {s->x, s->xn, s->q, s->k, s->v, s->attn, s->gate, s->up, s->tmp, s->emb, s->pos};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
}

static lm_status mat(int64_t rows, int64_t cols, lm_dtype dt, lm_tensor **out) {
    int64_t shape[2] = {rows, cols};
    return lm_tensor_create(lm_device_cpu(), dt, 2, shape, out);
}

static lm_status scratch_alloc(const lm_model_config *c, int64_t BT, lm_dtype emb_dt, scratch *s) {
    int64_t H = c->hidden_size, qd = c->num_attention_heads * c->head_dim, kd = c->num_key_value_heads * c->head_dim;
    LM_TRY(mat(BT, H, LM_F32, &s->x));
    LM_TRY(mat(BT, H, LM_F32, &s->xn));
    LM_TRY(mat(BT, qd, LM_F32, &s->q));
    LM_TRY(mat(BT, kd, LM_F32, &s->k));
    LM_TRY(mat(BT, kd, LM_F32, &s->v));
    LM_TRY(mat(BT, qd, LM_F32, &s->attn));
    LM_TRY(mat(BT, c->intermediate_size, LM_F32, &s->gate));
    LM_TRY(mat(BT, c->intermediate_size, LM_F32, &s->up));
    LM_TRY(mat(BT, H, LM_F32, &s->tmp));
    if (emb_dt != LM_F32) LM_TRY(mat(BT, H, emb_dt, &s->emb));
    return LM_OK;
}

#define V(t) lm_tensor_as_view(t)

/* out [rows, N] = x [rows, K] @ W[N, K]^T (+ bias [N]) */
static lm_status linear(lm_ctx *ctx, const lm_tensor_view *x, const lm_tensor *w, const lm_tensor *bias,
                        const lm_tensor_view *out) {
    lm_tensor_view wt;
    LM_TRY(lm_tensor_view_transpose(V(w), 0, 1, &wt));
    LM_TRY(lm_matmul_out(ctx, x, &wt, out));
    if (bias) LM_TRY(lm_add_out(ctx, out, V(bias), out));
    return LM_OK;
}

/* [BT, heads*hd] buffer viewed [B, T, heads, hd] */
static lm_status heads_view(const lm_tensor *t, int B, int64_t T, int64_t heads, int64_t hd, lm_tensor_view *out) {
    int64_t shape[4] = {B, T, heads, hd};
    return lm_tensor_view_reshape(V(t), 4, shape, out);
}

/* Row b of a [B, T, heads, hd] view as [1, heads, T, hd]. */
static lm_status row_heads_first(const lm_tensor_view *bthd, int b, lm_tensor_view *out) {
    lm_tensor_view r;
    LM_TRY(lm_tensor_view_select(bthd, 0, b, &r)); /* [T, heads, hd] */
    LM_TRY(lm_tensor_view_transpose(&r, 0, 1, &r)); /* [heads, T, hd] */
    int64_t f[2] = {1, r.shape[0]};
    return lm_tensor_view_split_axis(&r, 0, 2, f, out);
}

/* Cache of one layer and slot, positions [0, len): [heads, len, hd]. */
static lm_status cache_view(const lm_tensor *cache, int layer, int slot, int64_t start, int64_t stop,
                            lm_tensor_view *out) {
    lm_tensor_view r;
    LM_TRY(lm_tensor_view_select(V(cache), 0, layer, &r));
    LM_TRY(lm_tensor_view_select(&r, 0, slot, &r));
    return lm_tensor_view_slice(&r, 1, start, stop, 1, out);
}

typedef struct step {
    const lm_model *m;
    lm_ctx *ctx;
    lm_kv_cache *cache;
    const int *slots;
    int B;
    int64_t T;
    scratch s;
} step;

static lm_status attention_block(step *st, int layer) {
    const lm_model_config *c = &st->m->cfg;
    const lm__layer *ly = &st->m->layers[layer];
    lm_ctx *ctx = st->ctx;
    scratch *s = &st->s;
    int64_t hd = c->head_dim, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
    LM_TRY(linear(ctx, V(s->xn), ly->wq, ly->bq, V(s->q)));
    LM_TRY(linear(ctx, V(s->xn), ly->wk, ly->bk, V(s->k)));
    LM_TRY(linear(ctx, V(s->xn), ly->wv, ly->bv, V(s->v)));
    lm_tensor_view q4, k4, v4, a4;
    LM_TRY(heads_view(s->q, st->B, st->T, Hq, hd, &q4));
    LM_TRY(heads_view(s->k, st->B, st->T, Hkv, hd, &k4));
    LM_TRY(heads_view(s->v, st->B, st->T, Hkv, hd, &v4));
    LM_TRY(heads_view(s->attn, st->B, st->T, Hq, hd, &a4));
    if (ly->q_norm) {
        LM_TRY(lm_rmsnorm_out(ctx, &q4, V(ly->q_norm), (float)c->rms_norm_eps, &q4));
        LM_TRY(lm_rmsnorm_out(ctx, &k4, V(ly->k_norm), (float)c->rms_norm_eps, &k4));
    }
    lm_rope_params rp = {LM_ROPE_SPLIT_HALF, V(st->m->inv_freq), st->m->rope_attn_factor, V(s->pos), 0, NULL};
    LM_TRY(lm_rope_out(ctx, &q4, &rp, &q4));
    LM_TRY(lm_rope_out(ctx, &k4, &rp, &k4));
    float scale = (float)(1.0 / sqrt((double)hd));
    for (int b = 0; b < st->B; b++) {
        int slot = st->slots[b];
        int64_t start = st->cache->length[slot], stop = start + st->T;
        lm_tensor_view kd, vd, kr, vr, qr, ar;
        /* append this row's keys/values at positions [start, stop) */
        LM_TRY(cache_view(st->cache->k, layer, slot, start, stop, &kd));
        LM_TRY(cache_view(st->cache->v, layer, slot, start, stop, &vd));
        LM_TRY(row_heads_first(&k4, b, &kr));
        LM_TRY(row_heads_first(&v4, b, &vr));
        LM_TRY(lm_tensor_view_select(&kr, 0, 0, &kr));
        LM_TRY(lm_tensor_view_select(&vr, 0, 0, &vr));
        LM_TRY(lm_tensor_view_copy(ctx, &kd, &kr));
        LM_TRY(lm_tensor_view_copy(ctx, &vd, &vr));
        /* attend over everything the slot holds, [0, stop) */
        lm_tensor_view kall, vall;
        LM_TRY(cache_view(st->cache->k, layer, slot, 0, stop, &kall));
        LM_TRY(cache_view(st->cache->v, layer, slot, 0, stop, &vall));
        int64_t f[2] = {1, Hkv};
        LM_TRY(lm_tensor_view_split_axis(&kall, 0, 2, f, &kall));
        LM_TRY(lm_tensor_view_split_axis(&vall, 0, 2, f, &vall));
        LM_TRY(row_heads_first(&q4, b, &qr));
        LM_TRY(row_heads_first(&a4, b, &ar));
        LM_TRY(lm_attention_out(ctx, &qr, &kall, &vall, scale, 1, &ar));
    }
    return linear(ctx, V(s->attn), ly->wo, ly->bo, V(s->tmp));
}

static lm_status mlp_block(step *st, int layer) {
    const lm__layer *ly = &st->m->layers[layer];
    scratch *s = &st->s;
    LM_TRY(linear(st->ctx, V(s->xn), ly->wg, ly->bg, V(s->gate)));
    LM_TRY(linear(st->ctx, V(s->xn), ly->wu, ly->bu, V(s->up)));
    LM_TRY(lm_swiglu_out(st->ctx, V(s->gate), V(s->up), V(s->gate)));
    return linear(st->ctx, V(s->gate), ly->wd, ly->bd, V(s->tmp));
}

static lm_status check_request(const lm_model *m, const lm_kv_cache *cache, const int *slots, int B,
                               const int32_t *ids, int64_t T) {
    const lm_model_config *c = &m->cfg;
    if (B < 1 || T < 1 || !slots || !ids) return lm__error(LM_INVALID_ARGUMENT, "forward: %d rows x %lld tokens", B, (long long)T);
    if (cache->layers != c->num_hidden_layers || cache->kv_heads != c->num_key_value_heads || cache->head_dim != c->head_dim)
        return lm__error(LM_INVALID_ARGUMENT, "forward: the KV cache was made for a different model");
    for (int b = 0; b < B; b++) {
        int slot = slots[b];
        if (slot < 0 || slot >= cache->slots)
            return lm__error(LM_OUT_OF_RANGE, "forward: slot %d outside the cache's %d slots", slot, cache->slots);
        for (int o = 0; o < b; o++)
            if (slots[o] == slot) return lm__error(LM_INVALID_ARGUMENT, "forward: slot %d appears twice", slot);
        int64_t end = cache->length[slot] + T;
        if (end > cache->max_tokens)
            return lm__error(LM_OUT_OF_RANGE, "forward: slot %d would hold %lld tokens, cache capacity is %lld", slot,
                             (long long)end, (long long)cache->max_tokens);
        if (c->sliding_window > 0 && end > c->sliding_window)
            return lm__error(LM_UNSUPPORTED, "forward: %lld tokens exceed the model's sliding window of %lld", (long long)end,
                             (long long)c->sliding_window);
    }
    for (int64_t i = 0; i < (int64_t)B * T; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return lm__error(LM_OUT_OF_RANGE, "forward: token id %d at row %lld, position %lld is outside the vocabulary of %lld",
                             ids[i], (long long)(i / T), (long long)(i % T), (long long)c->vocab_size);
    return LM_OK;
}

static lm_status embed(step *st, const int32_t *ids) {
    scratch *s = &st->s;
    int64_t BT = (int64_t)st->B * st->T;
    lm_tensor_view idv;
    LM_TRY(lm_tensor_view_init(&idv, (void *)ids, LM_I32, lm_device_cpu(), 1, &BT, NULL));
    if (!s->emb) return lm_embedding_out(st->ctx, V(st->m->embed), &idv, V(s->x));
    LM_TRY(lm_embedding_out(st->ctx, V(st->m->embed), &idv, V(s->emb)));
    return lm_cast_out(st->ctx, V(s->emb), V(s->x));
}

static lm_status positions(step *st) {
    int64_t shape[2] = {st->B, st->T};
    LM_TRY(lm_tensor_create(lm_device_cpu(), LM_I32, 2, shape, &st->s.pos));
    int32_t *p = lm_tensor_data(st->s.pos);
    for (int b = 0; b < st->B; b++)
        for (int64_t t = 0; t < st->T; t++) p[b * st->T + t] = (int32_t)(st->cache->length[st->slots[b]] + t);
    return LM_OK;
}

static lm_status output(step *st, float *logits, int all_positions) {
    const lm_model *m = st->m;
    int64_t V = m->cfg.vocab_size, rows = all_positions ? (int64_t)st->B * st->T : st->B;
    lm_tensor_view xs = *V(st->s.xn), out;
    if (!all_positions) { /* last position of each row: rows b*T + T-1, stride T*H */
        int64_t shape[3] = {st->B, st->T, m->cfg.hidden_size};
        LM_TRY(lm_tensor_view_reshape(&xs, 3, shape, &xs));
        LM_TRY(lm_tensor_view_select(&xs, 1, st->T - 1, &xs));
    }
    int64_t oshape[2] = {rows, V};
    LM_TRY(lm_tensor_view_init(&out, logits, LM_F32, lm_device_cpu(), 2, oshape, NULL));
    return linear(st->ctx, &xs, m->lm_head ? m->lm_head : m->embed, NULL, &out);
}

static lm_status run_layers(step *st, const int32_t *ids, float *logits, int all_positions) {
    const lm_model *m = st->m;
    float eps = (float)m->cfg.rms_norm_eps;
    scratch *s = &st->s;
    LM_TRY(embed(st, ids));
    LM_TRY(positions(st));
    LM_TRY(lm_rmsnorm_out(st->ctx, V(s->x), V(m->layers[0].attn_norm), eps, V(s->xn)));
    for (int l = 0; l < (int)m->cfg.num_hidden_layers; l++) {
        LM_TRY(attention_block(st, l));
        LM_TRY(lm_add_rmsnorm_out(st->ctx, V(s->tmp), V(s->x), V(m->layers[l].mlp_norm), eps, V(s->x), V(s->xn)));
        LM_TRY(mlp_block(st, l));
        const lm_tensor *next = l + 1 < m->cfg.num_hidden_layers ? m->layers[l + 1].attn_norm : m->final_norm;
        LM_TRY(lm_add_rmsnorm_out(st->ctx, V(s->tmp), V(s->x), V(next), eps, V(s->x), V(s->xn)));
    }
    return logits ? output(st, logits, all_positions) : LM_OK;
}

/* The context must run on the model's device. */
static lm_status check_device(const char *fn, const lm_model *m, lm_ctx *ctx) {
    if (lm_device_equal(lm_ctx_device(ctx), m->device)) return LM_OK;
    char a[32], b[32];
    return lm__error(LM_INVALID_ARGUMENT, "%s: the model is on %s but the context runs on %s", fn,
                     lm_device_format(m->device, a, sizeof a), lm_device_format(lm_ctx_device(ctx), b, sizeof b));
}

lm_status lm_model_forward_sample(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                                  const int32_t *ids, int64_t T, const lm_sampler_params *params, uint64_t draw,
                                  int32_t *next_ids) {
    if (!m || !ctx || !cache || !params || !next_ids)
        return lm__error(LM_INVALID_ARGUMENT, "lm_model_forward_sample: NULL argument");
    LM_TRY(check_device("lm_model_forward_sample", m, ctx));
    if (m->device.type != LM_DEVICE_CUDA)
        return lm__error(LM_UNSUPPORTED, "lm_model_forward_sample: device-side sampling needs a CUDA model");
    if (params->repetition_penalty != 1.0f)
        return lm__error(LM_UNSUPPORTED, "lm_model_forward_sample: repetition_penalty %g needs the host sampler",
                         params->repetition_penalty);
    if (!(params->temperature >= 0) || !(params->top_p > 0 && params->top_p <= 1) ||
        !(params->min_p >= 0 && params->min_p < 1) || params->top_k < 0)
        return lm__error(LM_INVALID_ARGUMENT, "lm_model_forward_sample: temperature %g, top_k %d, top_p %g, min_p %g",
                         params->temperature, params->top_k, params->top_p, params->min_p);
    LM_TRY(check_request(m, cache, slots, B, ids, T));
#ifdef LOOM_HAVE_CUDA
    LM_TRY(lm__cuda_forward(m, ctx, cache, slots, B, ids, T, NULL, 0, params, draw, next_ids));
    for (int b = 0; b < B; b++) cache->length[slots[b]] += T;
    return LM_OK;
#else
    (void)draw;
    return LM_UNSUPPORTED;
#endif
}

lm_status lm_model_forward(const lm_model *m, lm_ctx *ctx, lm_kv_cache *cache, const int *slots, int B,
                           const int32_t *ids, int64_t T, float *logits, int all_positions) {
    if (!m || !ctx || !cache) return lm__error(LM_INVALID_ARGUMENT, "lm_model_forward: NULL argument");
    LM_TRY(check_device("lm_model_forward", m, ctx));
    LM_TRY(check_request(m, cache, slots, B, ids, T));
#ifdef LOOM_HAVE_CUDA
    if (m->device.type == LM_DEVICE_CUDA) {
        LM_TRY(lm__cuda_forward(m, ctx, cache, slots, B, ids, T, logits, all_positions, NULL, 0, NULL));
        for (int b = 0; b < B; b++) cache->length[slots[b]] += T;
        return LM_OK;
    }
#endif
    step st = {m, ctx, cache, slots, B, T, {0}};
    lm_dtype emb_dt = lm_tensor_dtype(m->embed);
    lm_status status = scratch_alloc(&m->cfg, (int64_t)B * T, emb_dt, &st.s);
    if (status == LM_OK) status = run_layers(&st, ids, logits, all_positions);
    scratch_free(&st.s);
    if (status == LM_OK)
        for (int b = 0; b < B; b++) cache->length[slots[b]] += T;
    return status;
}
