/* autograd/ops_basic.c — elementwise operations, the full sum and the view operations
 * of the tape. Broadcasting inputs get their gradient summed back to their own shape
 * (numpy rules in reverse); views are zero-copy on the value and map the gradient to
 * the base: reshape reshapes it, transpose transposes it (zero-copy), slice scatters
 * it into zeros of the base's shape.
 */
#include "autograd/internal.h"

#include <string.h>

#define V LM__AG_V

/* g summed down to shape (the inverse of broadcasting); an alias when equal. */
static lm_status reduce_to(lm_ag *ag, const lm_tensor *g, int ndim, const int64_t *shape, lm_tensor **out) {
    lm_tensor *cur = NULL, *next = NULL;
    LM_TRY(lm__ag_alias(g, &cur));
    lm_status st = LM_OK;
    while (st == LM_OK && lm_tensor_ndim(cur) > ndim) { /* leading dims the input did not have */
        const lm_tensor_view *c = V(cur);
        st = lm__ag_tensor(ag, c->dtype, c->ndim - 1, c->shape + 1, &next);
        if (st == LM_OK) st = lm_sum_out(ag->ctx, c, 0, V(next));
        lm_tensor_destroy(cur);
        cur = next;
        next = NULL;
    }
    for (int i = 0; st == LM_OK && i < ndim; i++) {
        const lm_tensor_view *c = V(cur);
        if (shape[i] != 1 || c->shape[i] == 1) continue;
        int64_t s[LM_MAX_DIMS];
        memcpy(s, c->shape, sizeof s);
        memmove(s + i, s + i + 1, (size_t)(c->ndim - i - 1) * sizeof *s);
        lm_tensor *sum = NULL;
        st = lm__ag_tensor(ag, c->dtype, c->ndim - 1, s, &sum);
        if (st == LM_OK) st = lm_sum_out(ag->ctx, c, i, V(sum));
        memcpy(s, c->shape, sizeof s);
        s[i] = 1;
        if (st == LM_OK) st = lm_tensor_reshape(sum, ndim, s, &next);
        lm_tensor_destroy(sum);
        lm_tensor_destroy(cur);
        cur = next;
        next = NULL;
    }
    if (st != LM_OK) {
        lm_tensor_destroy(cur);
        return st;
    }
    *out = cur;
    return LM_OK;
}

static lm_status add_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    for (int i = 0; i < 2; i++)
        if (n->in[i]->requires_grad) {
            const lm_tensor_view *x = V(n->in[i]->value);
            LM_TRY(reduce_to(ag, gout[0], x->ndim, x->shape, &gin[i]));
        }
    return LM_OK;
}

static lm_status mul_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    for (int i = 0; i < 2; i++) {
        if (!n->in[i]->requires_grad) continue;
        const lm_tensor_view *x = V(n->in[i]->value);
        lm_tensor *prod = NULL;
        LM_TRY(lm_mul(ag->ctx, V(gout[0]), V(n->in[1 - i]->value), &prod));
        lm_status st = reduce_to(ag, prod, x->ndim, x->shape, &gin[i]);
        lm_tensor_destroy(prod);
        LM_TRY(st);
    }
    return LM_OK;
}

static lm_status binary(lm_ag *ag, const char *op, int mul, lm_ag_var *a, lm_ag_var *b, lm_ag_var **out) {
    lm_ag_var *in[2] = {a, b};
    LM_TRY(lm__ag_check_inputs(ag, op, 2, in));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "%s: out is NULL", op);
    lm_tensor *y = NULL;
    LM_TRY(mul ? lm_mul(ag->ctx, V(a->value), V(b->value), &y) : lm_add(ag->ctx, V(a->value), V(b->value), &y));
    lm__ag_node n = lm__ag_node_make(op, mul ? mul_backward : add_backward, 2, 1, a, b, NULL);
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 2, in), &y, out);
}

lm_status lm_ag_add(lm_ag *ag, lm_ag_var *a, lm_ag_var *b, lm_ag_var **out) { return binary(ag, "ag_add", 0, a, b, out); }
lm_status lm_ag_mul(lm_ag *ag, lm_ag_var *a, lm_ag_var *b, lm_ag_var **out) { return binary(ag, "ag_mul", 1, a, b, out); }

static lm_status scale_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    return lm_scale(ag->ctx, V(gout[0]), n->p.f, &gin[0]);
}

lm_status lm_ag_scale(lm_ag *ag, lm_ag_var *x, float s, lm_ag_var **out) {
    LM_TRY(lm__ag_check_inputs(ag, "ag_scale", 1, &x));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_scale: out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(lm_scale(ag->ctx, V(x->value), s, &y));
    lm__ag_node n = lm__ag_node_make("ag_scale", scale_backward, 1, 1, x, NULL, NULL);
    n.p.f = s;
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 1, &x), &y, out);
}

static lm_status sum_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    lm_tensor_view e;
    LM_TRY(lm_tensor_view_expand(V(gout[0]), n->p.ndim, n->p.shape, &e));
    return lm__ag_copy(ag, &e, &gin[0]);
}

lm_status lm_ag_sum(lm_ag *ag, lm_ag_var *x, lm_ag_var **out) {
    LM_TRY(lm__ag_check_inputs(ag, "ag_sum", 1, &x));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_sum: out is NULL");
    const lm_tensor_view *xv = V(x->value);
    int64_t numel = lm_tensor_view_numel(xv);
    lm_tensor *flat = NULL, *y = NULL;
    lm_status st = lm_tensor_contiguous(ag->ctx, x->value, &flat);
    lm_tensor_view fv;
    if (st == LM_OK) st = lm_tensor_view_reshape(V(flat), 1, &numel, &fv);
    if (st == LM_OK) st = lm__ag_tensor(ag, xv->dtype, 0, NULL, &y);
    if (st == LM_OK) st = lm_sum_out(ag->ctx, &fv, 0, V(y));
    lm_tensor_destroy(flat);
    if (st != LM_OK) {
        lm_tensor_destroy(y);
        return st;
    }
    lm__ag_node n = lm__ag_node_make("ag_sum", sum_backward, 1, 1, x, NULL, NULL);
    n.p.ndim = xv->ndim;
    memcpy(n.p.shape, xv->shape, sizeof n.p.shape);
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 1, &x), &y, out);
}

/* ---- views ------------------------------------------------------------------------------ */
static lm_status reshape_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    lm_tensor *c = NULL;
    LM_TRY(lm_tensor_contiguous(ag->ctx, gout[0], &c));
    lm_status st = lm_tensor_reshape(c, n->p.ndim, n->p.shape, &gin[0]);
    lm_tensor_destroy(c);
    return st;
}

lm_status lm_ag_reshape(lm_ag *ag, lm_ag_var *x, int ndim, const int64_t *shape, lm_ag_var **out) {
    LM_TRY(lm__ag_check_inputs(ag, "ag_reshape", 1, &x));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_reshape: out is NULL");
    lm_tensor *c = NULL, *y = NULL;
    LM_TRY(lm_tensor_contiguous(ag->ctx, x->value, &c)); /* zero-copy when x is contiguous */
    lm_status st = lm_tensor_reshape(c, ndim, shape, &y);
    lm_tensor_destroy(c);
    LM_TRY(st);
    lm__ag_node n = lm__ag_node_make("ag_reshape", reshape_backward, 1, 1, x, NULL, NULL);
    const lm_tensor_view *xv = V(x->value);
    n.p.ndim = xv->ndim;
    memcpy(n.p.shape, xv->shape, sizeof n.p.shape);
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 1, &x), &y, out);
}

static lm_status transpose_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    (void)ag;
    return lm_tensor_transpose(gout[0], (int)n->p.i0, (int)n->p.i1, &gin[0]);
}

lm_status lm_ag_transpose(lm_ag *ag, lm_ag_var *x, int d0, int d1, lm_ag_var **out) {
    LM_TRY(lm__ag_check_inputs(ag, "ag_transpose", 1, &x));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_transpose: out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(lm_tensor_transpose(x->value, d0, d1, &y));
    lm__ag_node n = lm__ag_node_make("ag_transpose", transpose_backward, 1, 1, x, NULL, NULL);
    n.p.i0 = d0;
    n.p.i1 = d1;
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 1, &x), &y, out);
}

static lm_status slice_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    const lm_tensor_view *xv = V(n->in[0]->value);
    lm_tensor *z = NULL;
    LM_TRY(lm__ag_zeros(ag, xv, &z));
    lm_tensor_view part;
    lm_status st = lm_tensor_view_slice(V(z), n->p.flag, n->p.i0, n->p.i1, n->p.i2, &part);
    if (st == LM_OK) st = lm_tensor_view_copy(ag->ctx, &part, V(gout[0]));
    if (st != LM_OK) {
        lm_tensor_destroy(z);
        return st;
    }
    gin[0] = z;
    return LM_OK;
}

lm_status lm_ag_slice(lm_ag *ag, lm_ag_var *x, int dim, int64_t start, int64_t stop, int64_t step, lm_ag_var **out) {
    LM_TRY(lm__ag_check_inputs(ag, "ag_slice", 1, &x));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_slice: out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(lm_tensor_slice(x->value, dim, start, stop, step, &y));
    lm__ag_node n = lm__ag_node_make("ag_slice", slice_backward, 1, 1, x, NULL, NULL);
    n.p.flag = dim;
    n.p.i0 = start;
    n.p.i1 = stop;
    n.p.i2 = step;
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 1, &x), &y, out);
}
