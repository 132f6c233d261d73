/* ops/ref/optim.c — readable reference for one AdamW step over a list of tensors and
 * for the sum of squares behind global-norm clipping. Per element, in double and
 * rounded once into the f32 parameter and moments, in torch.optim.AdamW's order:
 *   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * The operands of one element are read before any is written, so the update is a
 * pure per-element map. O(total elements).
 */
#include "ops/ref/optim.h"

static void adamw_tensor(const lm_tensor_view *p, const lm_tensor_view *g, const lm_tensor_view *m,
                         const lm_tensor_view *v, double wd, const lm_adamw_hparams *hp) {
    if (lm_tensor_view_numel(p) == 0) return;
    double bc1 = 1.0 - pow(hp->beta1, (double)hp->step), bc2 = 1.0 - pow(hp->beta2, (double)hp->step);
    double step_size = hp->lr / bc1, bc2_sqrt = sqrt(bc2);
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        int64_t op = lm__offset(p, idx), om = lm__offset(m, idx), ov = lm__offset(v, idx);
        double grad = lm__ld(g->dtype, g->data, lm__offset(g, idx)) * hp->grad_scale;
        double pv = lm__ld(LM_F32, p->data, op) * (1.0 - hp->lr * wd);
        double mv = hp->beta1 * lm__ld(LM_F32, m->data, om) + (1.0 - hp->beta1) * grad;
        double vv = hp->beta2 * lm__ld(LM_F32, v->data, ov) + (1.0 - hp->beta2) * grad * grad;
        /* the moments are stored in f32; the update uses them as stored, as the
         * next step will */
        lm__st(LM_F32, m->data, om, mv);
        lm__st(LM_F32, v->data, ov, vv);
        mv = lm__ld(LM_F32, m->data, om);
        vv = lm__ld(LM_F32, v->data, ov);
        lm__st(LM_F32, p->data, op, pv - step_size * mv / (sqrt(vv) / bc2_sqrt + hp->eps));
    } while (lm__nd_next(p->ndim, p->shape, idx));
}

void lm__ref_adamw_update(int n, const lm_tensor_view *params, const lm_tensor_view *grads, const lm_tensor_view *m,
                          const lm_tensor_view *v, const float *weight_decay, const lm_adamw_hparams *hp) {
    for (int i = 0; i < n; i++) adamw_tensor(&params[i], &grads[i], &m[i], &v[i], weight_decay[i], hp);
}

double lm__ref_sum_squares(int n, const lm_tensor_view *xs) {
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        const lm_tensor_view *x = &xs[i];
        if (lm_tensor_view_numel(x) == 0) continue;
        int64_t idx[LM_MAX_DIMS] = {0};
        do {
            double a = lm__ld(x->dtype, x->data, lm__offset(x, idx));
            acc += a * a;
        } while (lm__nd_next(x->ndim, x->shape, idx));
    }
    return acc;
}
