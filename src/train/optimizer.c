/* train/optimizer.c — the AdamW optimizer object over a training model (moments in two
 * flat f32 buffers that mirror the parameters' offsets; one lm_adamw_update call per
 * step covers every tensor) and the learning-rate schedules. Under ZeRO-1 an optimizer
 * covers one rank's slice [lo, hi) of the flat parameters: its moments hold that
 * slice alone and its pieces are the parts of the tensors inside it.
 */
#include "train/internal.h"
#include "ops/internal.h"
#include "runtime/internal.h"

#include <math.h>
#include <string.h>

double lm_lr_at(const lm_lr_schedule *s, int64_t step) {
    if (s->warmup > 0 && step < s->warmup) return s->lr * (double)(step + 1) / (double)s->warmup;
    if (s->kind == LM_LR_CONSTANT) return s->lr;
    int64_t span = s->total - s->warmup;
    double p = (double)(step - s->warmup) / (double)(span > 1 ? span : 1);
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    double shape = s->kind == LM_LR_COSINE ? 0.5 * (1.0 + cos(3.141592653589793 * p)) : 1.0 - p;
    return s->min_lr + (s->lr - s->min_lr) * shape;
}

lm_status lm_lr_schedule_parse(const char *name, lm_lr_schedule_kind *out) {
    static const char *const names[] = {"constant", "cosine", "linear"};
    for (int i = 0; name && i < 3; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (lm_lr_schedule_kind)i;
            return LM_OK;
        }
    return lm__error(LM_INVALID_ARGUMENT, "unknown learning-rate schedule '%s' (cosine, linear or constant)",
                     name ? name : "(null)");
}

lm_status lm__adamw_config_check(const lm_adamw_config *c) {
    if (!(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1 && c->eps > 0 && c->weight_decay >= 0))
        return lm__error(LM_INVALID_ARGUMENT, "AdamW: betas (%g, %g) must lie in [0, 1), eps %g > 0, weight decay %g >= 0",
                         c->beta1, c->beta2, c->eps, c->weight_decay);
    return LM_OK;
}

/* The pieces of [o->lo, o->hi): one per tensor the range meets, in flat order. A
 * tensor inside the range keeps its own view (the unsharded optimizer's views
 * exactly); a cut one becomes a 1-D view of the elements inside. AdamW is a pure
 * per-element map, so the pieces give the same bits as the whole tensors. */
static lm_status build_views(lm_optimizer *o) {
    lm_train_model *m = o->m;
    size_t n = (size_t)(m->nparams > 0 ? m->nparams : 1);
    o->pv = lm__calloc(n, sizeof *o->pv), o->gv = lm__calloc(n, sizeof *o->gv);
    o->mv = lm__calloc(n, sizeof *o->mv), o->vv = lm__calloc(n, sizeof *o->vv);
    o->wd = lm__calloc(n, sizeof *o->wd);
    if (!o->pv || !o->gv || !o->mv || !o->vv || !o->wd) return LM_OUT_OF_MEMORY;
    float *m1 = lm_tensor_data(o->m1), *m2 = lm_tensor_data(o->m2);
    for (int i = 0; i < m->nparams; i++) {
        const lm__tparam *p = &m->params[i];
        int64_t numel = lm_tensor_numel(p->value), a = LM_MAX(p->offset, o->lo), b = LM_MIN(p->offset + numel, o->hi);
        if (b <= a) continue; /* outside the range (or empty) */
        int k = o->npieces++;
        o->pv[k] = *lm_tensor_as_view(p->value);
        o->gv[k] = *lm_tensor_as_view(p->grad);
        if (b - a < numel) { /* cut by the range: the 1-D run of elements [a, b) */
            LM_TRY(lm_tensor_view_init(&o->pv[k], (float *)o->pv[k].data + (a - p->offset), LM_F32, m->device, 1,
                                       &(int64_t){b - a}, NULL));
            LM_TRY(lm_tensor_view_init(&o->gv[k], (float *)o->gv[k].data + (a - p->offset), LM_F32, m->device, 1,
                                       &(int64_t){b - a}, NULL));
        }
        o->mv[k] = o->pv[k];
        o->vv[k] = o->pv[k];
        o->mv[k].data = m1 + (a - o->lo);
        o->vv[k].data = m2 + (a - o->lo);
        o->wd[k] = p->decay ? (float)o->c.weight_decay : 0.0f;
    }
    return LM_OK;
}

lm_status lm__optimizer_create_range(lm_train_model *m, const lm_adamw_config *c, int64_t lo, int64_t hi,
                                     lm_optimizer **out) {
    if (!m || !c || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_optimizer_create: NULL argument");
    *out = NULL;
    if (lo < 0 || hi < lo || hi > m->numel)
        return lm__error(LM_INVALID_ARGUMENT, "optimizer range [%lld, %lld) outside the %lld parameters", (long long)lo,
                         (long long)hi, (long long)m->numel);
    LM_TRY(lm__adamw_config_check(c));
    lm_optimizer *o = lm__calloc(1, sizeof *o);
    if (!o) return LM_OUT_OF_MEMORY;
    o->m = m;
    o->c = *c;
    o->lo = lo, o->hi = hi;
    int64_t n = hi - lo;
    lm_status st = lm_tensor_zeros(m->device, LM_F32, 1, &n, &o->m1);
    if (st == LM_OK) st = lm_tensor_zeros(m->device, LM_F32, 1, &n, &o->m2);
    if (st == LM_OK) st = build_views(o);
    if (st != LM_OK) {
        lm_optimizer_destroy(o);
        return st;
    }
    *out = o;
    return LM_OK;
}

lm_status lm_optimizer_create(lm_train_model *m, const lm_adamw_config *c, lm_optimizer **out) {
    if (!m) return lm__error(LM_INVALID_ARGUMENT, "lm_optimizer_create: NULL argument");
    return lm__optimizer_create_range(m, c, 0, m->numel, out);
}

void lm_optimizer_destroy(lm_optimizer *o) {
    if (!o) return;
    lm_tensor_destroy(o->m1);
    lm_tensor_destroy(o->m2);
    lm__free(o->pv), lm__free(o->gv), lm__free(o->mv), lm__free(o->vv), lm__free(o->wd);
    lm__free(o);
}

int64_t lm_optimizer_steps(const lm_optimizer *o) { return o->steps; }

lm_status lm_optimizer_step(lm_optimizer *o, lm_ctx *ctx, double lr, double grad_scale) {
    if (!o || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_optimizer_step: NULL argument");
    lm_adamw_hparams hp = {lr, o->c.beta1, o->c.beta2, o->c.eps, o->steps + 1, grad_scale};
    LM_TRY(lm_adamw_update(ctx, o->npieces, o->pv, o->gv, o->mv, o->vv, o->wd, &hp));
    o->steps++;
    return LM_OK;
}

void lm__optimizer_dyn_values(const lm_optimizer *o, double lr, double out[4]) {
    const double step = (double)(o->steps + 1);
    out[0] = lr;
    out[1] = (float)(lr / (1.0 - pow(o->c.beta1, step))); /* as ops/cuda/optim.cu rounds them */
    out[2] = (float)sqrt(1.0 - pow(o->c.beta2, step));
    out[3] = 1.0;
}

lm_status lm__optimizer_step_dyn(lm_optimizer *o, lm_ctx *ctx, const lm_tensor_view *dyn) {
    if (!o || !ctx || !dyn) return lm__error(LM_INVALID_ARGUMENT, "lm__optimizer_step_dyn: NULL argument");
    lm_adamw_hparams hp = {0.0, o->c.beta1, o->c.beta2, o->c.eps, o->steps + 1, 1.0}; /* lr etc. come from dyn */
    LM_TRY(lm__adamw_update_dyn(ctx, o->npieces, o->pv, o->gv, o->mv, o->vv, o->wd, &hp, dyn));
    o->steps++;
    return LM_OK;
}

void lm__optimizer_count_step(lm_optimizer *o) { o->steps++; }

lm_status lm__optimizer_grad_sumsq(const lm_optimizer *o, lm_ctx *ctx, double *sumsq) {
    *sumsq = 0;
    if (!lm__device_host_addressable(o->m->device)) { /* the operator (its f32 result: equal up to rounding) */
        lm_tensor *out = NULL;
        float host = 0;
        LM_TRY(lm_tensor_create(o->m->device, LM_F32, 0, NULL, &out));
        lm_status st = lm_sum_squares_out(ctx, o->npieces, o->gv, lm_tensor_as_view(out));
        if (st == LM_OK) st = lm_tensor_view_read(ctx, lm_tensor_as_view(out), &host);
        lm_tensor_destroy(out);
        *sumsq = host;
        return st;
    }
    /* in host memory the range is one contiguous run of flat_grad: summed in double
     * in element order, as the reference sum_squares does over the whole buffer */
    const float *g = (const float *)lm_tensor_data(o->m->flat_grad) + o->lo;
    double acc = 0.0;
    for (int64_t i = 0; i < o->hi - o->lo; i++) acc += (double)g[i] * (double)g[i];
    *sumsq = acc;
    return LM_OK;
}
