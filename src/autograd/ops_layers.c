/* autograd/ops_layers.c — the tape's transformer-layer operations: RMSNorm, fused
 * residual add + RMSNorm (two outputs: the sum and the normalized sum), SwiGLU, RoPE
 * and attention. Forwards are the public operators; backwards the operators of
 * ops_backward.h. RoPE copies its frequency table and positions into the node.
 */
#include "autograd/internal.h"

#define V LM__AG_V


/* ---- RMSNorm ------------------------------------------------------------------------------ */
static lm_status rmsnorm_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    LM_TRY(lm__ag_grads_like(ag, n, gin));
    return lm_rmsnorm_backward_out(ag->ctx, V(n->in[0]->value), V(n->in[1]->value), n->p.f, V(gout[0]), lm__ag_opt(gin[0]),
                                   lm__ag_opt(gin[1]));
}

lm_status lm_ag_rmsnorm(lm_ag *ag, lm_ag_var *x, lm_ag_var *weight, float eps, lm_ag_var **out) {
    lm_ag_var *in[2] = {x, weight};
    LM_TRY(lm__ag_check_inputs(ag, "ag_rmsnorm", 2, in));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_rmsnorm: out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(lm_rmsnorm(ag->ctx, V(x->value), V(weight->value), eps, &y));
    lm__ag_node n = lm__ag_node_make("ag_rmsnorm", rmsnorm_backward, 2, 1, x, weight, NULL);
    n.p.f = eps;
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 2, in), &y, out);
}

/* ---- fused residual add + RMSNorm: out[0] = sum, out[1] = normalized ------------------------- */
static lm_status add_rmsnorm_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    lm_ag_var *x = n->in[0], *r = n->in[1], *w = n->in[2];
    lm_tensor *dx = NULL;
    if (!gout[1]) { /* only the sum is read downstream: it passes straight through */
        if (x->requires_grad || r->requires_grad) LM_TRY(lm__ag_alias(gout[0], &dx));
    } else {
        if (x->requires_grad || r->requires_grad) LM_TRY(lm__ag_new_like(ag, x->value, &dx));
        if (w->requires_grad) {
            lm_status st = lm__ag_new_like(ag, w->value, &gin[2]);
            if (st != LM_OK) {
                lm_tensor_destroy(dx);
                return st;
            }
        }
        lm_status st = lm_add_rmsnorm_backward_out(ag->ctx, V(n->out[0]->value), V(w->value), n->p.f, V(gout[1]),
                                                   lm__ag_opt(gout[0]), lm__ag_opt(dx), lm__ag_opt(gin[2]));
        if (st != LM_OK) {
            lm_tensor_destroy(dx);
            return st;
        }
    }
    if (x->requires_grad && r->requires_grad) { /* both get the same gradient: share it */
        gin[0] = dx;
        return lm__ag_alias(dx, &gin[1]);
    }
    gin[x->requires_grad ? 0 : 1] = dx;
    return LM_OK;
}

lm_status lm_ag_add_rmsnorm(lm_ag *ag, lm_ag_var *x, lm_ag_var *residual, lm_ag_var *weight, float eps,
                            lm_ag_var **sum, lm_ag_var **out) {
    lm_ag_var *in[3] = {x, residual, weight};
    LM_TRY(lm__ag_check_inputs(ag, "ag_add_rmsnorm", 3, in));
    if (!sum || !out) return lm__error(LM_INVALID_ARGUMENT, "ag_add_rmsnorm: sum or out is NULL");
    lm_tensor *y[2] = {NULL, NULL};
    lm_status st = lm__ag_new_like(ag, x->value, &y[0]);
    if (st == LM_OK) st = lm__ag_new_like(ag, x->value, &y[1]);
    if (st == LM_OK)
        st = lm_add_rmsnorm_out(ag->ctx, V(x->value), V(residual->value), V(weight->value), eps, V(y[0]), V(y[1]));
    if (st != LM_OK) {
        lm_tensor_destroy(y[0]);
        lm_tensor_destroy(y[1]);
        return st;
    }
    lm__ag_node n = lm__ag_node_make("ag_add_rmsnorm", add_rmsnorm_backward, 3, 2, x, residual, weight);
    n.p.f = eps;
    lm_ag_var *outs[2];
    LM_TRY(lm__ag_finish(ag, &n, lm__ag_recording(ag, 3, in), y, outs));
    *sum = outs[0];
    *out = outs[1];
    return LM_OK;
}

/* ---- SwiGLU ------------------------------------------------------------------------------------ */
static lm_status swiglu_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    LM_TRY(lm__ag_grads_like(ag, n, gin));
    return lm_swiglu_backward_out(ag->ctx, V(n->in[0]->value), V(n->in[1]->value), V(gout[0]), lm__ag_opt(gin[0]), lm__ag_opt(gin[1]));
}

lm_status lm_ag_swiglu(lm_ag *ag, lm_ag_var *gate, lm_ag_var *up, lm_ag_var **out) {
    lm_ag_var *in[2] = {gate, up};
    LM_TRY(lm__ag_check_inputs(ag, "ag_swiglu", 2, in));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_swiglu: out is NULL");
    lm_tensor *y = NULL;
    LM_TRY(lm_swiglu(ag->ctx, V(gate->value), V(up->value), &y));
    lm__ag_node n = lm__ag_node_make("ag_swiglu", swiglu_backward, 2, 1, gate, up, NULL);
    return lm__ag_finish(ag, &n, lm__ag_recording(ag, 2, in), &y, out);
}

/* ---- RoPE: saved[0] = inv_freq copy, saved[1] = positions copy (or NULL) -------------------------- */
static lm_status rope_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    lm_rope_params p = {(lm_rope_style)n->p.flag, V(n->saved[0]), n->p.attn_factor, lm__ag_opt(n->saved[1]), n->p.pos_offset,
                        NULL};
    LM_TRY(lm__ag_new_like(ag, n->in[0]->value, &gin[0]));
    return lm_rope_backward_out(ag->ctx, V(gout[0]), &p, V(gin[0]), NULL);
}

lm_status lm_ag_rope(lm_ag *ag, lm_ag_var *x, const lm_rope_params *p, lm_ag_var **out) {
    LM_TRY(lm__ag_check_inputs(ag, "ag_rope", 1, &x));
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "ag_rope: params or out is NULL");
    if (p->bias) return lm__error(LM_INVALID_ARGUMENT, "ag_rope: params.bias must be NULL (add biases with lm_ag_add)");
    lm_tensor *y = NULL;
    LM_TRY(lm__ag_new_like(ag, x->value, &y));
    lm__ag_node n = lm__ag_node_make("ag_rope", rope_backward, 1, 1, x, NULL, NULL);
    n.p.flag = (int)p->style;
    n.p.attn_factor = p->attn_factor;
    n.p.pos_offset = p->pos_offset;
    int record = lm__ag_recording(ag, 1, &x);
    lm_status st = lm_rope_out(ag->ctx, V(x->value), p, V(y));
    if (st == LM_OK && record) st = lm__ag_copy(ag, p->inv_freq, &n.saved[0]);
    if (st == LM_OK && record && p->positions) st = lm__ag_copy(ag, p->positions, &n.saved[1]);
    if (st != LM_OK) {
        lm_tensor_destroy(y);
        lm_tensor_destroy(n.saved[0]);
        return st;
    }
    return lm__ag_finish(ag, &n, record, &y, out);
}

/* ---- attention: saved[0] = the forward's log-sum-exp [B, Hq, Tq] where the forward kept
 * it (lm_attention_lse_out), or NULL (the backward recomputes the forward) ----------------------- */
static lm_status attention_backward(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin) {
    for (int i = 0; i < 3; i++) /* each gradient in its operand's storage order: no copy when viewed back */
        if (n->in[i]->requires_grad) {
            const lm_tensor_view *x = V(n->in[i]->value);
            LM_TRY(lm__ag_new_ordered(ag, x, x->dtype, x->ndim, x->shape, &gin[i]));
        }
    const lm_tensor_view *q = V(n->in[0]->value), *k = V(n->in[1]->value), *v = V(n->in[2]->value);
    /* the statistics serve when dout has the layout the kernel takes as an output */
    if (n->saved[0] && lm_attention_lse_supported(ag->ctx, q, k, v, n->p.flag, V(gout[0])))
        return lm_attention_backward_lse_out(ag->ctx, q, k, v, V(n->out[0]->value), V(n->saved[0]), V(gout[0]), n->p.f,
                                             n->p.flag, n->p.i0, lm__ag_opt(gin[0]), lm__ag_opt(gin[1]),
                                             lm__ag_opt(gin[2]));
    return lm_attention_backward_window_out(ag->ctx, q, k, v, V(gout[0]), n->p.f, n->p.flag, n->p.i0,
                                            lm__ag_opt(gin[0]), lm__ag_opt(gin[1]), lm__ag_opt(gin[2]));
}

lm_status lm_ag_attention(lm_ag *ag, lm_ag_var *q, lm_ag_var *k, lm_ag_var *v, float scale, int causal,
                          lm_ag_var **out) {
    return lm_ag_attention_window(ag, q, k, v, scale, causal, 0, out);
}

lm_status lm_ag_attention_window(lm_ag *ag, lm_ag_var *q, lm_ag_var *k, lm_ag_var *v, float scale, int causal,
                                 int64_t window, lm_ag_var **out) {
    lm_ag_var *in[3] = {q, k, v};
    LM_TRY(lm__ag_check_inputs(ag, "ag_attention", 3, in));
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "ag_attention: out is NULL");
    const lm_tensor_view *qv = V(q->value), *vv = V(v->value);
    if (qv->ndim != 4 || vv->ndim != 4)
        return lm__error(LM_SHAPE_MISMATCH, "ag_attention: q and v must be [B, H, T, D]");
    int64_t shape[4] = {qv->shape[0], qv->shape[1], qv->shape[2], vv->shape[3]};
    lm_tensor *y = NULL, *lse = NULL;
    LM_TRY(lm__ag_new_ordered(ag, qv, qv->dtype, 4, shape, &y)); /* q's storage order ([B, T, H, D] buffers) */
    int record = lm__ag_recording(ag, 3, in);
    lm_status st;
    if (record && lm_attention_lse_supported(ag->ctx, qv, V(k->value), vv, causal, V(y))) {
        st = lm__ag_tensor(ag, LM_F32, 3, shape, &lse); /* [B, Hq, Tq] */
        if (st == LM_OK) st = lm_attention_lse_out(ag->ctx, qv, V(k->value), vv, scale, causal, window, V(y), V(lse));
    } else {
        st = lm_attention_window_out(ag->ctx, qv, V(k->value), vv, scale, causal, window, V(y));
    }
    if (st != LM_OK) {
        lm_tensor_destroy(y);
        lm_tensor_destroy(lse);
        return st;
    }
    lm__ag_node n = lm__ag_node_make("ag_attention", attention_backward, 3, 1, q, k, v);
    n.p.f = scale;
    n.p.flag = causal != 0;
    n.p.i0 = window;
    n.saved[0] = lse;
    return lm__ag_finish(ag, &n, record, &y, out);
}
