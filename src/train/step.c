/* train/step.c — the training model's forward (and backward) as the decoder graph
 * (graph/decoder.c, train mode) recorded on the autograd tape by the autograd
 * executor (exec/autograd.c): forward + backward into the gradient buffers, the
 * no_grad loss, and the logits.
 *
 * The graph is the same description the inference executors run; its passes give
 * the tape the operations a training step is made of (linear, fused add + RMSNorm,
 * the fused output projection + cross-entropy, so [BT, vocab] logits never exist).
 * Each parameter is a leaf over its compute-dtype weights, bound to its slice of the
 * f32 gradient buffer (accumulate), so backward adds straight into flat_grad; a tied
 * embedding is one leaf read twice. Activations take the compute dtype.
 */
#include "train/internal.h"

#include "exec/autograd.h"
#include "loom/trace.h"

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
    lm_tensor *ids, *targets;       /* [B, T] i32 ids, [B*T] targets, on the device */
    int borrowed;                   /* ids and targets are the caller's (not destroyed by end) */
    const lm_tensor *pos;           /* [B, T] i32 positions (the model's, kept between steps) */
    const lm_graph *g;              /* the prepared training graph (the model's, kept between steps) */
    struct param_hook *hooks;       /* [nparams] when the caller wants to hear of finished gradients */
} fwd;

typedef struct param_hook {
    lm__param_done_fn done;
    void *user;
    int param;
} param_hook;

static lm_status leaf_done(void *user, lm_ag_var *leaf, const lm_tensor_view *grad) {
    (void)leaf, (void)grad;
    const param_hook *h = user;
    return h->done(h->user, h->param);
}

/* Leaves over the compute-dtype weights: the f32 masters, or (bf16 compute) their
 * bf16 copies, refreshed from the masters first unless the caller knows they are
 * current (fresh 0). Gradients always land in the f32 buffer (a bf16 leaf's gradient
 * is widened when it is added there). */
static lm_status make_leaves(fwd *f, int train, int fresh) {
    lm_train_model *m = f->m;
    if (m->flat_low && fresh) LM_TRY(lm_cast_out(f->ctx, V(m->flat), V(m->flat_low)));
    for (int i = 0; i < m->nparams; i++) {
        LM_TRY(lm_ag_leaf(f->ag, m->flat_low ? m->params[i].low : m->params[i].value, train, &f->p[i]));
        if (train) LM_TRY(lm_ag_bind_grad(f->p[i], V(m->params[i].grad), 1));
        if (train && f->hooks) LM_TRY(lm_ag_set_hook(f->p[i], leaf_done, &f->hooks[i]));
    }
    return LM_OK;
}

static lm_status bind_param(void *user, const char *name, lm_ag_var **var, lm_tensor_view *view) {
    fwd *f = user;
    if (strcmp(name, "rope.inv_freq") == 0) {
        *var = NULL;
        *view = *V(f->m->inv_freq);
        return LM_OK;
    }
    int i = lm__train_find(f->m, name);
    if (i < 0) return lm__error(LM_NOT_FOUND, "training model: no parameter '%s'", name);
    *var = f->p[i];
    return LM_OK;
}

static lm_status bind_input(void *user, const char *name, lm_tensor_view *view) {
    fwd *f = user;
    const lm_tensor *t = strcmp(name, "ids") == 0         ? f->ids
                         : strcmp(name, "positions") == 0 ? f->pos
                         : strcmp(name, "targets") == 0   ? f->targets
                                                          : NULL;
    if (!t) return lm__error(LM_NOT_FOUND, "training step: no input '%s'", name);
    *view = *V(t);
    return LM_OK;
}

/* have_ids: the batch's ids exist (host array or device tensor). */
static lm_status check_batch(const lm_train_model *m, int have_ids, int B, int64_t T) {
    const lm_model_config *c = &m->cfg;
    if (!have_ids || B < 1 || T < 1) return lm__error(LM_INVALID_ARGUMENT, "training forward: %d rows x %lld tokens", B, (long long)T);
    if (T > c->max_position_embeddings)
        return lm__error(LM_OUT_OF_RANGE, "training forward: %lld tokens exceed max_position_embeddings %lld", (long long)T,
                         (long long)c->max_position_embeddings);
    return LM_OK;
}

/* The training graph of B x T tokens with `output` (loss or logits), prepared: the
 * model keeps the last one of each output, so a step of the same shape reuses it
 * (building and preparing the graph of a 24-layer model costs ~2 ms of host time a
 * micro-batch on a 2-core machine; on the H200 host it did not show in the step time,
 * which the device bounds). */
static lm_status build_graph(fwd *f, lm_decoder_output output) {
    struct lm__train_cached_graph *c = &f->m->graphs[output == LM_DECODER_OUT_LOSS ? 0 : 1];
    lm_dtype dt = lm_train_model_compute_dtype(f->m);
    if (c->g && c->B == f->B && c->T == f->T && c->dt == dt) {
        f->g = c->g;
        return LM_OK;
    }
    lm_graph_destroy(c->g);
    c->g = NULL;
    lm_decoder_options o;
    lm_decoder_options_default(&o);
    o.mode = LM_DECODER_TRAIN;
    o.output = output;
    o.batch = f->B, o.tokens = f->T;
    o.act_dtype = o.matrix_dtype = o.vector_dtype = dt;
    lm_graph *g = NULL, *prepared = NULL;
    LM_TRY(lm_graph_build_decoder(&f->m->cfg, &o, &g));
    lm_status st = lm__exec_autograd_prepare(g, &prepared);
    lm_graph_destroy(g);
    if (st == LM_OK) *c = (struct lm__train_cached_graph){prepared, f->B, f->T, dt}, f->g = prepared;
    return st;
}

/* The [B, T] positions 0..T-1 of every row on the device (kept by the model). */
static lm_status positions(fwd *f) {
    lm_train_model *m = f->m;
    int64_t shape[2] = {f->B, f->T}, BT = (int64_t)f->B * f->T;
    const lm_tensor_view *pv = m->positions ? lm_tensor_as_view(m->positions) : NULL;
    if (pv && pv->shape[0] == f->B && pv->shape[1] == f->T) {
        f->pos = m->positions;
        return LM_OK;
    }
    lm_tensor_destroy(m->positions);
    m->positions = NULL;
    m->layout_gen++;
    int32_t *pos = lm__calloc((size_t)BT, sizeof *pos);
    if (!pos) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < BT; i++) pos[i] = (int32_t)(i % f->T);
    lm_status st = lm_tensor_from_host(m->device, LM_I32, 2, shape, pos, &m->positions);
    lm__free(pos);
    f->pos = m->positions;
    return st;
}

/* A device tensor of host i32 data, copied in ctx's stream order (no wait for the
 * device); the host data must stay unchanged until the step reads its loss. */
static lm_status upload(fwd *f, int ndim, const int64_t *shape, const int32_t *host, lm_tensor **out) {
    LM_TRY(lm_tensor_create(f->m->device, LM_I32, ndim, shape, out));
    return lm_ctx_copy(f->ctx, f->m->device, lm_tensor_data(*out), lm_device_cpu(), host,
                       (size_t)lm_tensor_numel(*out) * sizeof(int32_t));
}

/* Sets up the tape, leaves, the graph and the device copies of ids and positions; or,
 * given dev (ids [B, T] and targets [B * T] already on the device, the caller's), those. */
static lm_status begin(fwd *f, lm_train_model *m, lm_ctx *ctx, const int32_t *ids, const int32_t *targets, int B,
                       int64_t T, int train, lm_decoder_output output, lm__param_done_fn done, void *user,
                       int refresh, lm_tensor *const *dev) {
    memset(f, 0, sizeof *f);
    f->m = m, f->ctx = ctx, f->B = B, f->T = T;
    if (dev) f->ids = dev[0], f->targets = dev[1], f->borrowed = 1;
    if (done) {
        if (!(f->hooks = lm__calloc((size_t)(m->nparams > 0 ? m->nparams : 1), sizeof *f->hooks))) return LM_OUT_OF_MEMORY;
        for (int i = 0; i < m->nparams; i++) f->hooks[i] = (param_hook){done, user, i};
    }
    LM_TRY(check_batch(m, ids != NULL || dev != NULL, B, T));
    if (!lm_device_equal(lm_ctx_device(ctx), m->device)) {
        char a[32], b[32];
        return lm__error(LM_INVALID_ARGUMENT, "training forward: the context is on %s but the model on %s",
                         lm_device_format(lm_ctx_device(ctx), a, sizeof a), lm_device_format(m->device, b, sizeof b));
    }
    int64_t BT = (int64_t)B * T, shape[2] = {B, T};
    lm_status st = positions(f);
    if (st == LM_OK && !dev) st = upload(f, 2, shape, ids, &f->ids);
    if (st == LM_OK && !dev && targets) st = upload(f, 1, &BT, targets, &f->targets);
    if (st == LM_OK && !(f->p = lm__calloc((size_t)m->nparams, sizeof *f->p))) st = LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = build_graph(f, output);
    if (st == LM_OK) st = lm_ag_create(ctx, &f->ag);
    if (st == LM_OK) lm_ag_set_grad_enabled(f->ag, train);
    if (st == LM_OK) st = make_leaves(f, train, refresh);
    return st;
}

/* Releases what begin made. After a failure nothing has read a result back yet, so
 * the ids and targets copies may still be reading the caller's host arrays: wait for
 * them before the caller may reuse those. */
static void end(fwd *f, lm_status st) {
    if (st != LM_OK && f->ctx) (void)lm_ctx_synchronize(f->ctx);
    lm_ag_destroy(f->ag);
    lm__free(f->p);
    lm__free(f->hooks);
    if (!f->borrowed) {
        lm_tensor_destroy(f->ids);
        lm_tensor_destroy(f->targets); /* the tape keeps its own copies */
    }
}

static lm_status run(fwd *f, lm_ag_var **out) {
    lm__ag_bindings b = {bind_param, bind_input, f};
    return lm__exec_autograd(f->ag, f->g, &b, out);
}

static lm_status read_scalar(lm_ctx *ctx, const lm_ag_var *v, float *out) {
    return lm_tensor_view_read(ctx, V(lm_ag_value(v)), out);
}

/* The training pass after begin() (st: its status): forward, the loss (read into the
 * host float host_loss, or copied into the device float dev_loss without waiting),
 * backward, release; each phase marked for the profile and traced. */
static lm_status train_pass(fwd *f, lm_status st, float grad_scale, float *host_loss, void *dev_loss) {
    lm_ctx *ctx = f->ctx;
    lm_ag_var *L = NULL;
    lm_ag_profile_mark(ctx, "fwd ", "(setup, weight copies)");
    int64_t tr = lm_trace_begin();
    if (st == LM_OK) st = run(f, &L);
    if (st == LM_OK && host_loss) st = read_scalar(ctx, L, host_loss);
    if (st == LM_OK && !host_loss) {
        const lm_tensor *lv = lm_ag_value(L);
        if (lm_tensor_dtype(lv) != LM_F32 || lm_tensor_numel(lv) != 1)
            st = lm__error(LM_INTERNAL, "training forward: the loss is not an f32 scalar");
        else
            st = lm_ctx_copy(ctx, f->m->device, dev_loss, f->m->device, lm_tensor_data(lv), sizeof(float));
    }
    lm_ag_profile_mark(ctx, "fwd ", host_loss ? "(loss read)" : "(loss copy)");
    lm_trace_end(tr, "train", "forward", NULL);
    tr = lm_trace_begin();
    if (st == LM_OK) st = lm_ag_backward(f->ag, L, grad_scale);
    lm_ag_profile_mark(ctx, "bwd ", "(leaves without nodes)");
    lm_trace_end(tr, "train", "backward", NULL);
    end(f, st);
    lm_ag_profile_mark(ctx, "step ", "(tape release)");
    return st;
}

lm_status lm__train_model_forward_backward_notify(lm_train_model *m, lm_ctx *ctx, const int32_t *ids,
                                                  const int32_t *targets, int B, int64_t T, float grad_scale,
                                                  float *loss, lm__param_done_fn done, void *user,
                                                  int refresh_low) {
    if (!m || !ctx || !targets || !loss) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_forward_backward: NULL argument");
    fwd f;
    lm_status st = begin(&f, m, ctx, ids, targets, B, T, 1, LM_DECODER_OUT_LOSS, done, user, refresh_low, NULL);
    return train_pass(&f, st, grad_scale, loss, NULL);
}

lm_status lm__train_model_forward_backward_dev(lm_train_model *m, lm_ctx *ctx, lm_tensor *ids, lm_tensor *targets,
                                               int B, int64_t T, float grad_scale, void *loss, int refresh_low) {
    if (!m || !ctx || !ids || !targets || !loss)
        return lm__error(LM_INVALID_ARGUMENT, "lm__train_model_forward_backward_dev: NULL argument");
    fwd f;
    lm_tensor *dev[2] = {ids, targets};
    lm_status st = begin(&f, m, ctx, NULL, NULL, B, T, 1, LM_DECODER_OUT_LOSS, NULL, NULL, refresh_low, dev);
    return train_pass(&f, st, grad_scale, NULL, loss);
}

lm_status lm_train_model_forward_backward(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, const int32_t *targets,
                                          int B, int64_t T, float grad_scale, float *loss) {
    return lm__train_model_forward_backward_notify(m, ctx, ids, targets, B, T, grad_scale, loss, NULL, NULL, 1);
}

lm_status lm_train_model_loss(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, const int32_t *targets, int B,
                              int64_t T, float *loss) {
    if (!m || !ctx || !targets || !loss) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_loss: NULL argument");
    fwd f;
    lm_ag_var *L = NULL;
    lm_status st = begin(&f, m, ctx, ids, targets, B, T, 0, LM_DECODER_OUT_LOSS, NULL, NULL, 1, NULL);
    if (st == LM_OK) st = run(&f, &L);
    if (st == LM_OK) st = read_scalar(ctx, L, loss);
    end(&f, st);
    return st;
}

lm_status lm_train_model_logits(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, int64_t T, float *logits) {
    if (!m || !ctx || !logits) return lm__error(LM_INVALID_ARGUMENT, "lm_train_model_logits: NULL argument");
    fwd f;
    lm_ag_var *z = NULL;
    lm_status st = begin(&f, m, ctx, ids, NULL, 1, T, 0, LM_DECODER_OUT_ALL_LOGITS, NULL, NULL, 1, NULL);
    if (st == LM_OK) st = run(&f, &z);
    lm_tensor *wide = NULL;
    if (st == LM_OK && lm_tensor_dtype(lm_ag_value(z)) != LM_F32) st = lm_cast(ctx, V(lm_ag_value(z)), LM_F32, &wide);
    if (st == LM_OK) st = lm_tensor_view_read(ctx, wide ? V(wide) : V(lm_ag_value(z)), logits);
    lm_tensor_destroy(wide);
    end(&f, st);
    return st;
}
