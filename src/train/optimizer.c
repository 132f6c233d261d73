/* train/optimizer.c — the AdamW optimizer object over a training model (moments in two
 * flat f32 buffers that mirror the parameters' offsets; one lm_adamw_update call per
 * step covers every tensor) and the learning-rate schedules.
 */
#include "train/internal.h"

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

static lm_status check_config(const lm_adamw_config *c) {
    if (!(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1 && c->eps > 0 && c->weight_decay >= 0))
        return lm__error(LM_INVALID_ARGUMENT, "AdamW: betas (%g, %g) must lie in [0, 1), eps %g > 0, weight decay %g >= 0",
                         c->beta1, c->beta2, c->eps, c->weight_decay);
    return LM_OK;
}

static lm_status build_views(lm_optimizer *o) {
    lm_train_model *m = o->m;
    size_t n = (size_t)m->nparams;
    o->pv = lm__calloc(n, sizeof *o->pv), o->gv = lm__calloc(n, sizeof *o->gv);
    o->mv = lm__calloc(n, sizeof *o->mv), o->vv = lm__calloc(n, sizeof *o->vv);
    o->wd = lm__calloc(n, sizeof *o->wd);
    if (!o->pv || !o->gv || !o->mv || !o->vv || !o->wd) return LM_OUT_OF_MEMORY;
    for (int i = 0; i < m->nparams; i++) {
        const lm__tparam *p = &m->params[i];
        o->pv[i] = *lm_tensor_as_view(p->value);
        o->gv[i] = *lm_tensor_as_view(p->grad);
        o->mv[i] = o->pv[i];
        o->vv[i] = o->pv[i];
        o->mv[i].data = (float *)lm_tensor_data(o->m1) + p->offset;
        o->vv[i].data = (float *)lm_tensor_data(o->m2) + p->offset;
        o->wd[i] = p->decay ? (float)o->c.weight_decay : 0.0f;
    }
    return LM_OK;
}

lm_status lm_optimizer_create(lm_train_model *m, const lm_adamw_config *c, lm_optimizer **out) {
    if (!m || !c || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_optimizer_create: NULL argument");
    *out = NULL;
    LM_TRY(check_config(c));
    lm_optimizer *o = lm__calloc(1, sizeof *o);
    if (!o) return LM_OUT_OF_MEMORY;
    o->m = m;
    o->c = *c;
    lm_status st = lm_tensor_zeros(m->device, LM_F32, 1, &m->numel, &o->m1);
    if (st == LM_OK) st = lm_tensor_zeros(m->device, LM_F32, 1, &m->numel, &o->m2);
    if (st == LM_OK) st = build_views(o);
    if (st != LM_OK) {
        lm_optimizer_destroy(o);
        return st;
    }
    *out = o;
    return LM_OK;
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
    LM_TRY(lm_adamw_update(ctx, o->m->nparams, o->pv, o->gv, o->mv, o->vv, o->wd, &hp));
    o->steps++;
    return LM_OK;
}
