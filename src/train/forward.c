/* train/forward.c — the decoder forward pass on the autograd tape, and its three
 * uses: forward + backward into the gradient buffers, the no_grad loss, and logits.
 *
 * Per layer, for BT = B*T rows of the f32 residual stream x [BT, H]:
 *   h = rmsnorm(x); q, k, v = linear(h) (+bias); [B, T, heads, hd] views; (qwen3)
 *   per-head rmsnorm of q, k; rope at positions 0..T-1; attention over [B, heads, T, hd]
 *   (causal, grouped kv heads); x, h = add_rmsnorm(linear_o(attn), x);
 *   x, h = add_rmsnorm(linear_down(swiglu(linear_gate(h), linear_up(h))), x)
 * with the next layer's input norm (the final norm after the last layer) fused into
 * the second residual add, exactly as transformers computes it. The loss is the fused
 * output projection + cross-entropy, so [BT, vocab] logits never exist in training.
 * Each parameter is a leaf bound to its slice of the gradient buffer (accumulate), so
 * backward adds straight into flat_grad; a tied embedding is one leaf read twice.
 */
#include "train/internal.h"

#include <math.h>
#include <string.h>

#define V(t) lm_tensor_as_view(t)

typedef struct fwd {
    lm_train_model *m;
    lm_ctx *ctx;
    lm_ag *ag;
    lm_ag_var **p; /* [nparams] parameter leaves */
    int B;
    int64_t T;
    lm_tensor *ids, *pos; /* [B*T] i32 ids, [T] i32 positions, on the device */
} fwd;

static lm_ag_var *P(const fwd *f, int index) { return index >= 0 ? f->p[index] : NULL; }

/* Leaves over the compute-dtype weights: the f32 masters, or (bf16 compute) their
 * bf16 copies, refreshed from the masters first. Gradients always land in the f32
 * buffer (a bf16 leaf's gradient is widened when it is added there). */
static lm_status make_leaves(fwd *f, int train) {
    lm_train_model *m = f->m;
    if (m->flat_low) LM_TRY(lm_cast_out(f->ctx, V(m->flat), V(m->flat_low)));
    for (int i = 0; i < m->nparams; i++) {
        LM_TRY(lm_ag_leaf(f->ag, m->flat_low ? m->params[i].low : m->params[i].value, train, &f->p[i]));
        if (train) LM_TRY(lm_ag_bind_grad(f->p[i], V(m->params[i].grad), 1));
    }
    return LM_OK;
}

static lm_status attention_block(fwd *f, const lm__tlayer *ly, lm_ag_var *h, lm_ag_var **out) {
    const lm_model_config *c = &f->m->cfg;
    lm_ag *ag = f->ag;
    int64_t hd = c->head_dim, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, BT = (int64_t)f->B * f->T;
    float eps = (float)c->rms_norm_eps;
    lm_ag_var *q, *k, *v, *a;
    LM_TRY(lm_ag_linear(ag, h, P(f, ly->wq), P(f, ly->bq), &q));
    LM_TRY(lm_ag_linear(ag, h, P(f, ly->wk), P(f, ly->bk), &k));
    LM_TRY(lm_ag_linear(ag, h, P(f, ly->wv), P(f, ly->bv), &v));
    int64_t sq[4] = {f->B, f->T, Hq, hd}, sk[4] = {f->B, f->T, Hkv, hd}, flat[2] = {BT, Hq * hd};
    LM_TRY(lm_ag_reshape(ag, q, 4, sq, &q));
    LM_TRY(lm_ag_reshape(ag, k, 4, sk, &k));
    LM_TRY(lm_ag_reshape(ag, v, 4, sk, &v));
    if (ly->q_norm >= 0) {
        LM_TRY(lm_ag_rmsnorm(ag, q, P(f, ly->q_norm), eps, &q));
        LM_TRY(lm_ag_rmsnorm(ag, k, P(f, ly->k_norm), eps, &k));
    }
    lm_rope_params rp = {LM_ROPE_SPLIT_HALF, V(f->m->inv_freq), f->m->rope_attn_factor, V(f->pos), 0, NULL};
    LM_TRY(lm_ag_rope(ag, q, &rp, &q));
    LM_TRY(lm_ag_rope(ag, k, &rp, &k));
    LM_TRY(lm_ag_transpose(ag, q, 1, 2, &q)); /* [B, heads, T, hd] views */
    LM_TRY(lm_ag_transpose(ag, k, 1, 2, &k));
    LM_TRY(lm_ag_transpose(ag, v, 1, 2, &v));
    LM_TRY(lm_ag_attention(ag, q, k, v, (float)(1.0 / sqrt((double)hd)), 1, &a));
    LM_TRY(lm_ag_transpose(ag, a, 1, 2, &a));
    LM_TRY(lm_ag_reshape(ag, a, 2, flat, &a));
    return lm_ag_linear(ag, a, P(f, ly->wo), P(f, ly->bo), out);
}

static lm_status mlp_block(fwd *f, const lm__tlayer *ly, lm_ag_var *h, lm_ag_var **out) {
    lm_ag_var *g, *u, *s;
    LM_TRY(lm_ag_linear(f->ag, h, P(f, ly->wg), P(f, ly->bg), &g));
    LM_TRY(lm_ag_linear(f->ag, h, P(f, ly->wu), P(f, ly->bu), &u));
    LM_TRY(lm_ag_swiglu(f->ag, g, u, &s));
    return lm_ag_linear(f->ag, s, P(f, ly->wd), P(f, ly->bd), out);
}

/* The normalized final hidden state h [BT, H]. */
static lm_status trunk(fwd *f, lm_ag_var **hidden) {
    lm_train_model *m = f->m;
    float eps = (float)m->cfg.rms_norm_eps;
    lm_ag_var *x, *h, *o;
    LM_TRY(lm_ag_embedding(f->ag, P(f, m->embed), V(f->ids), &x));
    LM_TRY(lm_ag_rmsnorm(f->ag, x, P(f, m->layers[0].attn_norm), eps, &h));
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        const lm__tlayer *ly = &m->layers[l];
        int next = l + 1 < m->cfg.num_hidden_layers ? m->layers[l + 1].attn_norm : m->final_norm;
        LM_TRY(attention_block(f, ly, h, &o));
        LM_TRY(lm_ag_add_rmsnorm(f->ag, o, x, P(f, ly->mlp_norm), eps, &x, &h));
        LM_TRY(mlp_block(f, ly, h, &o));
        LM_TRY(lm_ag_add_rmsnorm(f->ag, o, x, P(f, next), eps, &x, &h));
    }
    *hidden = h;
    return LM_OK;
}

static lm_status check_batch(const lm_train_model *m, const int32_t *ids, int B, int64_t T) {
    const lm_model_config *c = &m->cfg;
    if (!ids || B < 1 || T < 1) return lm__error(LM_INVALID_ARGUMENT, "training forward: %d rows x %lld tokens", B, (long long)T);
    if (T > c->max_position_embeddings)
        return lm__error(LM_OUT_OF_RANGE, "training forward: %lld tokens exceed max_position_embeddings %lld", (long long)T,
                         (long long)c->max_position_embeddings);
    if (c->sliding_window > 0 && T > c->sliding_window)
        return lm__error(LM_UNSUPPORTED, "training forward: %lld tokens exceed the sliding window of %lld", (long long)T,
                         (long long)c->sliding_window);
    return LM_OK;
}

/* Sets up the tape, leaves and the device copies of ids and positions. */
static lm_status begin(fwd *f, lm_train_model *m, lm_ctx *ctx, const int32_t *ids, int B, int64_t T, int train) {
    memset(f, 0, sizeof *f);
    f->m = m, f->ctx = ctx, f->B = B, f->T = T;
    LM_TRY(check_batch(m, ids, B, T));
    if (!lm_device_equal(lm_ctx_device(ctx), m->device)) {
        char a[32], b[32];
        return lm__error(LM_INVALID_ARGUMENT, "training forward: the context is on %s but the model on %s",
                         lm_device_format(lm_ctx_device(ctx), a, sizeof a), lm_device_format(m->device, b, sizeof b));
    }
    int64_t BT = (int64_t)B * T;
    int32_t *pos = lm__calloc((size_t)T, sizeof *pos);
    if (!pos) return LM_OUT_OF_MEMORY;
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t;
    lm_status st = lm_tensor_from_host(m->device, LM_I32, 1, &T, pos, &f->pos);
    lm__free(pos);
    if (st == LM_OK) st = lm_tensor_from_host(m->device, LM_I32, 1, &BT, ids, &f->ids);
    if (st == LM_OK && !(f->p = lm__calloc((size_t)m->nparams, sizeof *f->p))) st = LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = lm_ag_create(ctx, &f->ag);
    if (st == LM_OK) lm_ag_set_grad_enabled(f->ag, train);
    if (st == LM_OK) st = make_leaves(f, train);
    return st;
}

static void end(fwd *f) {
    lm_ag_destroy(f->ag);
    lm__free(f->p);
    lm_tensor_destroy(f->ids);
    lm_tensor_destroy(f->pos);
}

static lm_status loss_of(fwd *f, const int32_t *targets, lm_ag_var **loss) {
    int64_t BT = (int64_t)f->B * f->T;
    lm_tensor *tg = NULL;
    lm_ag_var *h;
    LM_TRY(lm_tensor_from_host(f->m->device, LM_I32, 1, &BT, targets, &tg));
    lm_status st = trunk(f, &h);
    if (st == LM_OK) st = lm_ag_linear_cross_entropy(f->ag, h, P(f, f->m->head), V(tg), -100, loss);
    lm_tensor_destroy(tg); /* the tape keeps its own copy */
    return st;
}

static lm_status read_scalar(lm_ctx *ctx, const lm_ag_var *v, float *out) {
    return lm_tensor_view_read(ctx, V(lm_ag_value(v)), out);
}

lm_status lm_train_model_forward_backward(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, const int32_t *targets,
                                          int B, int64_t T, float grad_scale, float *loss) {
    if (!m || !ctx || !targets || !loss) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_forward_backward: NULL argument");
    fwd f;
    lm_ag_var *L = NULL;
    lm_status st = begin(&f, m, ctx, ids, B, T, 1);
    lm_ag_profile_mark(ctx, "fwd ", "(setup, weight copies)");
    if (st == LM_OK) st = loss_of(&f, targets, &L);
    if (st == LM_OK) st = read_scalar(ctx, L, loss);
    lm_ag_profile_mark(ctx, "fwd ", "(loss read)");
    if (st == LM_OK) st = lm_ag_backward(f.ag, L, grad_scale);
    lm_ag_profile_mark(ctx, "bwd ", "(leaves without nodes)");
    end(&f);
    lm_ag_profile_mark(ctx, "step ", "(tape release)");
    return st;
}

lm_status lm_train_model_loss(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, const int32_t *targets, int B,
                              int64_t T, float *loss) {
    if (!m || !ctx || !targets || !loss) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_loss: NULL argument");
    fwd f;
    lm_ag_var *L = NULL;
    lm_status st = begin(&f, m, ctx, ids, B, T, 0);
    if (st == LM_OK) st = loss_of(&f, targets, &L);
    if (st == LM_OK) st = read_scalar(ctx, L, loss);
    end(&f);
    return st;
}

lm_status lm_train_model_logits(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, int64_t T, float *logits) {
    if (!m || !ctx || !logits) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_logits: NULL argument");
    fwd f;
    lm_ag_var *h = NULL, *z = NULL;
    lm_status st = begin(&f, m, ctx, ids, 1, T, 0);
    if (st == LM_OK) st = trunk(&f, &h);
    if (st == LM_OK) st = lm_ag_linear(f.ag, h, P(&f, m->head), NULL, &z);
    lm_tensor *wide = NULL;
    if (st == LM_OK && lm_tensor_dtype(lm_ag_value(z)) != LM_F32) st = lm_cast(ctx, V(lm_ag_value(z)), LM_F32, &wide);
    if (st == LM_OK) st = lm_tensor_view_read(ctx, wide ? V(wide) : V(lm_ag_value(z)), logits);
    lm_tensor_destroy(wide);
    end(&f);
    return st;
}
