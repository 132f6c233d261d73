/* autograd/ops_linear.c — the tape's matrix operations and losses: matmul, Linear
 * (x @ w^T + bias), embedding lookup, cross-entropy and the fused output projection +
 * cross-entropy. Forwards are the public operators; backwards the operators of
 * ops_backward.h. Index operands are copied into the node when recorded.
 */
#include "autograd/internal.h"

#define V LM__AG_V


/* ---- matmul ----------------------------------------------------------------------------- */
static lm_status matmul_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    LM_TRY(lm__ag_grads_like(ag, n, gin));
    return lm_matmul_backward_out(ag->ctx, V(n->in[0]->value), V(n->in[1]->value), V(gout[0]), lm__ag_opt(gin[0]), lm__ag_opt(gin[1]));
}

lm_status lm_ag_matmul(lm_ag *ag, lm_ag_var *a, lm_ag_var *b, lm_ag_var **out) {
    lm_ag_var *in[2] = {a, b};
    LM_TRY(lm__ag_check_inputs(ag, "ag_matmul", 2, in));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_matmul: out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(lm_matmul(ag->ctx, V(a->value), V(b->value), &y));
    lm__ag_node n = lm__ag_node_make("ag_matmul", matmul_backward, 2, 1, a, b, NULL);
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 2, in), &y, out);
}

/* ---- linear: x [..., K] @ w [N, K]^T + bias [N] ---------------------------------------- */
static lm_status bias_grad(lm_ag *ag, const lm_tensor *g, lm_tensor **out) {
    const lm_tensor_view *gv = V(g);
    int64_t N = gv->shape[gv->ndim - 1], rows[2] = {N ? lm_tensor_view_numel(gv) / N : 0, N};
    lm_tensor *c = NULL;
    lm_tensor_view g2;
    lm_status st = lm_tensor_contiguous(ag->ctx, g, &c);
    if (st == LM_OK) st = lm_tensor_view_reshape(V(c), 2, rows, &g2);
    if (st == LM_OK) st = lm__ag_tensor(ag, gv->dtype, 1, &N, out);
    if (st == LM_OK) st = lm_sum_out(ag->ctx, &g2, 0, V(*out));
    lm_tensor_destroy(c);
    return st;
}

/* Where the GEMMs may put a gradient without a tensor in between:
 * - the weight's, straight into its bound buffer when it is the weight's only
 *   contribution (a training step's parameter): written or added there, in f32 for a
 *   bf16 weight with an f32 buffer;
 * - the input's, added into the input's gradient so far when it may be summed in place
 *   (x read by several Linears, e.g. q, k and v: one GEMM with beta = 1 instead of a
 *   new tensor and an add). */
static lm_status linear_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    lm_ag_var *x = n->in[0], *w = n->in[1], *b = n->in[2];
    int acc = 0;
    const lm_tensor_view *bound = w->requires_grad ? lm__ag_claim_bound(w, &acc) : NULL;
    lm_tensor *xsum = x->requires_grad ? lm__ag_summable_grad(x) : NULL;
    if (x->requires_grad && !xsum) LM_TRY(lm__ag_new_like(ag, x->value, &gin[0]));
    if (w->requires_grad && !bound) LM_TRY(lm__ag_new_like(ag, w->value, &gin[1]));
    if (b && b->requires_grad) LM_TRY(bias_grad(ag, gout[0], &gin[2]));
    lm_tensor_view wt, dwt;
    LM_TRY(lm_tensor_view_transpose(V(w->value), 0, 1, &wt));
    if (bound) LM_TRY(lm_tensor_view_transpose(bound, 0, 1, &dwt));
    else if (gin[1]) LM_TRY(lm_tensor_view_transpose(V(gin[1]), 0, 1, &dwt));
    const lm_tensor_view *dw = bound || gin[1] ? &dwt : NULL, *dw_add = bound && acc ? dw : NULL;
    /* written: gin[0] and the weight gradient unless it is added; added: the rest */
    LM_TRY(lm_matmul_backward_out(ag->ctx, V(x->value), &wt, V(gout[0]), lm__ag_opt(gin[0]), dw_add ? NULL : dw));
    return lm_matmul_backward_acc_out(ag->ctx, V(x->value), &wt, V(gout[0]), xsum ? V(xsum) : NULL, dw_add);
}

lm_status lm_ag_linear(lm_ag *ag, lm_ag_var *x, lm_ag_var *w, lm_ag_var *bias, lm_ag_var **out) {
    lm_ag_var *in[3] = {x, w, bias};
    LM_TRY(lm__ag_check_inputs(ag, "ag_linear", 2, in));
    if (bias) LM_TRY(lm__ag_check_inputs(ag, "ag_linear (bias)", 1, &in[2]));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_linear: out is NULL");
    const lm_tensor_view *xv = V(x->value), *wv = V(w->value);
    if (xv->ndim < 1 || wv->ndim != 2)
        return lm__error(LM_SHAPE_MISMATCH, "ag_linear: x must be [..., K] and w [N, K]");
    int64_t shape[LM_MAX_DIMS];
    for (int i = 0; i < xv->ndim; i++) shape[i] = xv->shape[i];
    shape[xv->ndim - 1] = wv->shape[0];
    lm_tensor *y = NULL;
    lm_tensor_view wt;
    LM_TRY(lm_tensor_view_transpose(wv, 0, 1, &wt));
    LM_TRY(lm__ag_tensor(ag, xv->dtype, xv->ndim, shape, &y));
    lm_status st = lm_matmul_out(ag->ctx, xv, &wt, V(y));
    if (st == LM_OK && bias) st = lm_add_out(ag->ctx, V(y), V(bias->value), V(y));
    if (st != LM_OK) {
        lm_tensor_destroy(y);
        return st;
    }
    lm__ag_node n = lm__ag_node_make("ag_linear", linear_backward, 3, 1, x, w, bias);
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 3, in), &y, out);
}

/* ---- embedding -------------------------------------------------------------------------- */
/* A table whose gradient so far may be summed in place (a tied embedding, after the
 * output projection's contribution) takes this one added into the rows of the ids
 * only; otherwise the whole [V, D] gradient is written. */
static lm_status embedding_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    lm_tensor *sum = lm__ag_summable_grad(n->in[0]);
    if (sum) return lm_embedding_backward_acc_out(ag->ctx, V(n->saved[0]), V(gout[0]), V(sum));
    LM_TRY(lm__ag_new_like(ag, n->in[0]->value, &gin[0]));
    return lm_embedding_backward_out(ag->ctx, V(n->saved[0]), V(gout[0]), V(gin[0]));
}

lm_status lm_ag_embedding(lm_ag *ag, lm_ag_var *table, const lm_tensor_view *ids, lm_ag_var **out) {
    LM_TRY(lm__ag_check_inputs(ag, "ag_embedding", 1, &table));
    if (!ids || !out) return lm__error(LM_INVALID_ARGUMENT, "ag_embedding: ids or out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(lm_embedding(ag->ctx, V(table->value), ids, &y));
    lm__ag_node n = lm__ag_node_make("ag_embedding", embedding_backward, 1, 1, table, NULL, NULL);
    int record = lm__ag_recording(ag, 1, &table);
    lm_status st = record ? lm__ag_copy(ag, ids, &n.saved[0]) : LM_OK;
    if (st != LM_OK) {
        lm_tensor_destroy(y);
        return st;
    }
    return lm__ag_finish(ag, &n, record, &y, out);
}

/* ---- losses ------------------------------------------------------------------------------ */
static lm_status ce_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    LM_TRY(lm__ag_new_like(ag, n->in[0]->value, &gin[0]));
    return lm_cross_entropy_backward_out(ag->ctx, V(n->in[0]->value), V(n->saved[0]), n->p.i0, V(gout[0]), V(gin[0]));
}

static lm_status loss_scalar(lm_ag *ag, lm_tensor **out) { return lm__ag_tensor(ag, LM_F32, 0, NULL, out); }

lm_status lm_ag_cross_entropy(lm_ag *ag, lm_ag_var *logits, const lm_tensor_view *targets, int64_t ignore_index,
                              lm_ag_var **out) {
    LM_TRY(lm__ag_check_inputs(ag, "ag_cross_entropy", 1, &logits));
    if (!targets || !out) return lm__error(LM_INVALID_ARGUMENT, "ag_cross_entropy: targets or out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(loss_scalar(ag, &y));
    lm__ag_node n = lm__ag_node_make("ag_cross_entropy", ce_backward, 1, 1, logits, NULL, NULL);
    n.p.i0 = ignore_index;
    int record = lm__ag_recording(ag, 1, &logits);
    lm_status st = lm_cross_entropy_out(ag->ctx, V(logits->value), targets, ignore_index, V(y));
    if (st == LM_OK && record) st = lm__ag_copy(ag, targets, &n.saved[0]);
    if (st != LM_OK) {
        lm_tensor_destroy(y);
        return st;
    }
    return lm__ag_finish(ag, &n, record, &y, out);
}

/* The forward already computed the gradients at dloss = 1 (saved[1] for x, saved[2] for
 * w): they are taken from the node, scaled in place by dloss (on the device) and handed
 * on, so the logits GEMM is not run again and no gradient buffer is allocated here. */
static lm_status lce_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    for (int i = 0; i < 2; i++) {
        if (!n->in[i]->requires_grad) continue;
        gin[i] = lm__ag_take_saved(ag, n, 1 + i);
        if (!gin[i]) return lm__error(LM_INTERNAL, "ag_linear_cross_entropy: gradient %d was not kept by the forward", i);
        LM_TRY(lm_scale_by_out(ag->ctx, V(gin[i]), V(gout[0]), V(gin[i])));
    }
    return LM_OK;
}

lm_status lm_ag_linear_cross_entropy(lm_ag *ag, lm_ag_var *x, lm_ag_var *w, const lm_tensor_view *targets,
                                     int64_t ignore_index, lm_ag_var **out) {
    lm_ag_var *in[2] = {x, w};
    LM_TRY(lm__ag_check_inputs(ag, "ag_linear_cross_entropy", 2, in));
    if (!targets || !out) return lm__error(LM_INVALID_ARGUMENT, "ag_linear_cross_entropy: targets or out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(loss_scalar(ag, &y));
    lm__ag_node n = lm__ag_node_make("ag_linear_cross_entropy", lce_backward, 2, 1, x, w, NULL);
    n.p.i0 = ignore_index;
    int record = lm__ag_recording(ag, 2, in);
    lm_status st = LM_OK;
    if (record) { /* the loss and its gradients from one pass over the logits */
        for (int i = 0; i < 2 && st == LM_OK; i++)
            if (in[i]->requires_grad) st = lm__ag_new_like(ag, in[i]->value, &n.saved[1 + i]);
        if (st == LM_OK)
            st = lm_linear_cross_entropy_grads_out(ag->ctx, V(x->value), V(w->value), targets, ignore_index, V(y),
                                                   lm__ag_opt(n.saved[1]), lm__ag_opt(n.saved[2]));
    } else {
        st = lm_linear_cross_entropy_out(ag->ctx, V(x->value), V(w->value), targets, ignore_index, V(y));
    }
    if (st == LM_OK && record) st = lm__ag_copy(ag, targets, &n.saved[0]);
    if (st != LM_OK) {
        for (int s = 0; s < LM__AG_MAX_SAVED; s++) lm_tensor_destroy(n.saved[s]);
        lm_tensor_destroy(y);
        return st;
    }
    return lm__ag_finish(ag, &n, record, &y, out);
}
