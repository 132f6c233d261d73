/* ops/optim.c — public optimizer operators: one AdamW update over a list of tensors
 * (one call; on CUDA one multi-tensor kernel launch per 512 contiguous tensors) and
 * the sum of squares over a list of tensors. Validation and dispatch (reference level
 * on the CPU, ops/cuda/optim.cu on CUDA). Every tensor of the list is checked before
 * any is touched, so a bad entry leaves all parameters and moments unchanged. Entries
 * are updated at the same time on CUDA, so the written tensors (params, m, v) of
 * different entries must not overlap each other or another entry's gradient: detected
 * for contiguous views (sorted byte ranges), the caller's duty for others.
 */
#include "ops/backward_common.h"
#include "ops/ref/optim.h"

#include <stdio.h>
#include <stdlib.h>

/* The byte range of a contiguous view, for the cross-entry overlap check. */
typedef struct span {
    uintptr_t lo, hi;
    int entry, kind; /* kind: 0 params, 1 grads, 2 m, 3 v */
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* LM_INVALID_ARGUMENT when a written view (params, m, v) of one entry overlaps any view
 * of another entry; contiguous, non-empty views only. O(n log n). */
static lm_status check_entries_disjoint(const char *op, int n, const lm_tensor_view *const lists[4]) {
    static const char *const kind_name[4] = {"params", "grads", "m", "v"};
    span *s = lm__calloc((size_t)(4 * n > 0 ? 4 * n : 1), sizeof *s);
    if (!s) return LM_OUT_OF_MEMORY;
    int ns = 0;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < n; i++) {
            const lm_tensor_view *v = &lists[k][i];
            int64_t count = lm_tensor_view_numel(v);
            if (count == 0 || !lm_tensor_view_is_contiguous(v)) continue;
            uintptr_t lo = (uintptr_t)v->data;
            s[ns++] = (span){lo, lo + (uintptr_t)count * lm_dtype_size(v->dtype), i, k};
        }
    qsort(s, (size_t)ns, sizeof *s, span_cmp);
    lm_status st = LM_OK;
    /* A sweep by start keeping the furthest-reaching range seen so far, of any kind and
     * of the written kinds: a range overlapping an earlier one overlaps the furthest of
     * them (gradients may share memory with each other: they are only read). Overlaps
     * within one entry were refused by check_entry. */
    for (int j = 0, far = -1, far_w = -1; st == LM_OK && j < ns; j++) {
        const span *b = &s[j];
        const span *a = b->kind == 1 ? (far_w >= 0 ? &s[far_w] : NULL) : (far >= 0 ? &s[far] : NULL);
        if (a && b->lo < a->hi && a->entry != b->entry)
            st = lm__error(LM_INVALID_ARGUMENT, "%s: %s[%d] and %s[%d] overlap (entries are updated at the same time)",
                           op, kind_name[a->kind], a->entry, kind_name[b->kind], b->entry);
        if (far < 0 || b->hi > s[far].hi) far = j;
        if (b->kind != 1 && (far_w < 0 || b->hi > s[far_w].hi)) far_w = j;
    }
    lm__free(s);
    return st;
}

static lm_status check_hparams(const char *op, const lm_adamw_hparams *hp) {
    if (!hp) return lm__error(LM_INVALID_ARGUMENT, "%s: hparams is NULL", op);
    if (!(hp->lr >= 0) || !isfinite(hp->lr)) return lm__error(LM_INVALID_ARGUMENT, "%s: lr %g must be finite and >= 0", op, hp->lr);
    if (!(hp->beta1 >= 0 && hp->beta1 < 1) || !(hp->beta2 >= 0 && hp->beta2 < 1))
        return lm__error(LM_INVALID_ARGUMENT, "%s: betas (%g, %g) must lie in [0, 1)", op, hp->beta1, hp->beta2);
    if (!(hp->eps > 0) || !isfinite(hp->eps)) return lm__error(LM_INVALID_ARGUMENT, "%s: eps %g must be finite and > 0", op, hp->eps);
    if (hp->step < 1) return lm__error(LM_INVALID_ARGUMENT, "%s: step %lld must be >= 1", op, (long long)hp->step);
    if (!isfinite(hp->grad_scale)) return lm__error(LM_INVALID_ARGUMENT, "%s: grad_scale %g is not finite", op, hp->grad_scale);
    return LM_OK;
}

/* Tensor i of the list: params/m/v f32 of one shape, grads float of that shape. */
static lm_status check_entry(lm_ctx *ctx, const char *op, int i, const lm_tensor_view *p, const lm_tensor_view *g,
                             const lm_tensor_view *m, const lm_tensor_view *v, float wd) {
    char names[4][32];
    snprintf(names[0], sizeof names[0], "params[%d]", i);
    snprintf(names[1], sizeof names[1], "grads[%d]", i);
    snprintf(names[2], sizeof names[2], "m[%d]", i);
    snprintf(names[3], sizeof names[3], "v[%d]", i);
    const lm_tensor_view *vs[] = {p, g, m, v};
    const char *const nm[] = {names[0], names[1], names[2], names[3]};
    LM_TRY(lm__op_check_devices(ctx, op, 4, vs, nm));
    for (int k = 0; k < 4; k++) {
        if (k == 1) LM_TRY(lm__op_check_float(op, nm[k], vs[k]));
        else LM_TRY(lm__op_check_dtype(op, nm[k], vs[k], LM_F32));
        LM_TRY(lm__op_check_same_shape(op, nm[k], vs[k], p));
        if (k != 1) LM_TRY(lm__op_check_out(op, nm[k], vs[k]));
    }
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++) LM_TRY(lm__op_check_alias(op, nm[a], vs[a], nm[b], vs[b], 0));
    if (!isfinite(wd) || wd < 0) return lm__error(LM_INVALID_ARGUMENT, "%s: weight_decay[%d] = %g must be finite and >= 0", op, i, wd);
    return LM_OK;
}

/* The checks of an AdamW call and the level it runs at. */
static lm_status check_adamw(lm_ctx *ctx, const char *op, int n, const lm_tensor_view *params,
                             const lm_tensor_view *grads, const lm_tensor_view *m, const lm_tensor_view *v,
                             const float *weight_decay, const lm_adamw_hparams *hp, lm__level *level) {
    LM_TRY(check_hparams(op, hp));
    if (n < 0 || (n > 0 && (!params || !grads || !m || !v || !weight_decay)))
        return lm__error(LM_INVALID_ARGUMENT, "%s: %d tensors with a NULL array", op, n);
    for (int i = 0; i < n; i++) LM_TRY(check_entry(ctx, op, i, &params[i], &grads[i], &m[i], &v[i], weight_decay[i]));
    const lm_tensor_view *const lists[4] = {params, grads, m, v};
    LM_TRY(check_entries_disjoint(op, n, lists));
    return lm__op_level(ctx, op, 0, lm__cuda_ops_get() != NULL, level);
}

lm_status lm_adamw_update(lm_ctx *ctx, int n, const lm_tensor_view *params, const lm_tensor_view *grads,
                          const lm_tensor_view *m, const lm_tensor_view *v, const float *weight_decay,
                          const lm_adamw_hparams *hp) {
    lm__level level;
    LM_TRY(check_adamw(ctx, "adamw_update", n, params, grads, m, v, weight_decay, hp, &level));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    if (level == LM__LEVEL_CUDA) return cu->adamw_update(n, params, grads, m, v, weight_decay, hp, NULL, lm_ctx_stream(ctx));
    lm__ref_adamw_update(n, params, grads, m, v, weight_decay, hp);
    return LM_OK;
}

/* dyn: 4 or more contiguous 8-byte elements (an i64 tensor holding doubles: there is no
 * f64 dtype) on ctx's device. */
static lm_status check_dyn(lm_ctx *ctx, const char *op, const lm_tensor_view *dyn) {
    if (!dyn) return lm__error(LM_INVALID_ARGUMENT, "%s: the device values are NULL", op);
    const lm_tensor_view *vs[] = {dyn};
    static const char *const nm[] = {"dyn"};
    LM_TRY(lm__op_check_devices(ctx, op, 1, vs, nm));
    if (dyn->dtype != LM_I64 || !lm_tensor_view_is_contiguous(dyn) || lm_tensor_view_numel(dyn) < 4)
        return lm__error(LM_INVALID_ARGUMENT, "%s: dyn must be a contiguous i64 tensor (8-byte words holding doubles) "
                         "of at least 4 elements", op);
    return LM_OK;
}

lm_status lm__adamw_update_dyn(lm_ctx *ctx, int n, const lm_tensor_view *params, const lm_tensor_view *grads,
                               const lm_tensor_view *m, const lm_tensor_view *v, const float *weight_decay,
                               const lm_adamw_hparams *hp, const lm_tensor_view *dyn) {
    const char *op = "adamw_update (device values)";
    LM_TRY(check_dyn(ctx, op, dyn));
    lm__level level;
    LM_TRY(check_adamw(ctx, op, n, params, grads, m, v, weight_decay, hp, &level));
    if (level != LM__LEVEL_CUDA) return lm__error(LM_UNSUPPORTED, "%s: CUDA contexts only", op);
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    return cu->adamw_update(n, params, grads, m, v, weight_decay, hp, (const double *)dyn->data, lm_ctx_stream(ctx));
}

lm_status lm__clip_scale_out(lm_ctx *ctx, const lm_tensor_view *sumsq, double clip, const lm_tensor_view *dyn) {
    const char *op = "clip_scale";
    LM_TRY(lm__op_check_f32_scalar(ctx, op, "sumsq", sumsq));
    LM_TRY(check_dyn(ctx, op, dyn));
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level != LM__LEVEL_CUDA) return lm__error(LM_UNSUPPORTED, "%s: CUDA contexts only", op);
    return cu->clip_scale((const float *)sumsq->data, clip, (double *)dyn->data + 3, lm_ctx_stream(ctx));
}

lm_status lm_sum_squares_out(lm_ctx *ctx, int n, const lm_tensor_view *xs, const lm_tensor_view *out) {
    const char *op = "sum_squares";
    if (n < 0 || (n > 0 && !xs)) return lm__error(LM_INVALID_ARGUMENT, "%s: %d tensors with a NULL array", op, n);
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "%s: out is NULL", op);
    LM_TRY(lm__op_check_f32_scalar(ctx, op, "out", out));
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "xs[%d]", i);
        const lm_tensor_view *vs[] = {&xs[i]};
        const char *const nm[] = {name};
        LM_TRY(lm__op_check_devices(ctx, op, 1, vs, nm));
        LM_TRY(lm__op_check_float(op, name, &xs[i]));
        LM_TRY(lm__op_check_alias(op, "out", out, name, &xs[i], 0));
    }
    const lm__cuda_ops *cu = lm__cuda_ops_get();
    lm__level level;
    LM_TRY(lm__op_level(ctx, op, 0, cu != NULL, &level));
    if (level == LM__LEVEL_CUDA) return cu->sum_squares(n, xs, out, lm_ctx_stream(ctx));
    *(float *)out->data = (float)lm__ref_sum_squares(n, xs);
    return LM_OK;
}
