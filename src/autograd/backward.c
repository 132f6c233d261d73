/* autograd/backward.c — the reverse pass.
 *
 * 1. Marking, one reverse sweep over the nodes (recording order is topological): a
 *    node is live when the root depends on one of its outputs; each input of a live
 *    node that requires gradients is marked and its pending count raised by one per
 *    use. So pending = the exact number of contributions the variable will receive.
 * 2. Execution, a second reverse sweep: a live node's backward turns its outputs'
 *    complete gradients into one contribution per input; the outputs' gradients are
 *    released right away (peak memory = live activations + a frontier of gradients).
 *    A contribution is adopted when it is the first, otherwise summed (fresh tensor,
 *    or in place when the accumulated storage has no other reference). When a leaf's
 *    pending count reaches zero its gradient is final: it goes to the bound buffer,
 *    then to the hook — exactly once. A node may put a leaf's only contribution straight
 *    into its bound buffer (lm__ag_claim_bound: the Linear weight gradient, written
 *    or added by the GEMM); the leaf then skips the copy.
 * 3. Leaves that require gradients but were never marked are finalized at the end
 *    with no gradient.
 */
#include "autograd/internal.h"
#include "ops/internal.h"
#include "runtime/internal.h"

#include <string.h>

#define V(t) lm_tensor_as_view(t)

static lm_ag_var *var_at(const lm_ag *ag, int64_t i) { return &ag->blocks[i / LM__AG_BLOCK][i % LM__AG_BLOCK]; }

static int single_owner(const lm_tensor *g) {
    return lm_storage_refcount(lm_tensor_storage(g)) == 1 && !lm_tensor_view_overlaps_self(V(g));
}

lm_tensor *lm__ag_summable_grad(const lm_ag_var *v) {
    if (!v->grad || !single_owner(v->grad) || lm_tensor_dtype(v->grad) != lm_tensor_dtype(v->value)) return NULL;
    return v->grad;
}

/* Adds contribution g (ownership taken) into v's gradient. */
static lm_status accumulate(lm_ag *ag, lm_ag_var *v, lm_tensor *g) {
    if (!v->grad) {
        v->grad = g;
        return LM_OK;
    }
    lm_status st;
    if (single_owner(v->grad)) {
        st = lm_add_out(ag->ctx, V(v->grad), V(g), V(v->grad));
        ag->stats.inplace_sums++;
    } else {
        lm_tensor *sum = NULL;
        st = lm_add(ag->ctx, V(v->grad), V(g), &sum);
        if (st == LM_OK) {
            lm_tensor_destroy(v->grad);
            v->grad = sum;
        }
        ag->stats.fresh_sums++;
    }
    lm_tensor_destroy(g);
    return st;
}

/* Writes (or adds) the leaf's gradient into its bound buffer; zeros when none came. A
 * gradient of another dtype (a bf16 leaf's, bound to f32) is cast into the buffer, or
 * added converted to its dtype (lm__accumulate_out: one pass into f32). */
static lm_status to_buffer(lm_ag *ag, lm_ag_var *v) {
    const lm_tensor_view *buf = &v->bound;
    lm_tensor *src = v->grad, *tmp = NULL;
    lm_status st = LM_OK;
    if (!src) {
        if (v->bound_accumulate) return LM_OK;
        st = lm__ag_zeros(ag, buf, &tmp);
        src = tmp;
    }
    if (st == LM_OK) {
        if (v->bound_accumulate && v->grad)
            st = lm__accumulate_out(ag->ctx, buf, V(src));
        else if (lm_tensor_dtype(src) == buf->dtype)
            st = lm_tensor_view_copy(ag->ctx, buf, V(src));
        else
            st = lm_cast_out(ag->ctx, V(src), buf);
    }
    lm_tensor_destroy(tmp);
    return st;
}

static lm_status finalize_leaf(lm_ag *ag, lm_ag_var *v) {
    lm_status st = LM_OK;
    if (v->has_bound && !v->in_bound) st = to_buffer(ag, v);
    const lm_tensor_view *g = v->has_bound ? &v->bound : v->grad ? V(v->grad) : NULL;
    if (st == LM_OK && v->hook) {
        ag->stats.hooks_fired++;
        st = v->hook(v->hook_user, v, g);
    }
    if (v->has_bound) {
        lm_tensor_destroy(v->grad);
        v->grad = NULL;
    }
    return st;
}

/* Sweep 1: liveness of nodes (live[i]) and pending counts of variables. */
static void mark(lm_ag *ag, lm_ag_var *root, unsigned char *live) {
    for (int64_t i = 0; i < ag->nvars; i++) {
        lm_ag_var *v = var_at(ag, i);
        v->needed = 0;
        v->pending = 0;
        v->in_bound = 0;
    }
    root->needed = 1;
    for (int64_t i = ag->nnodes - 1; i >= 0; i--) {
        const lm__ag_node *n = &ag->nodes[i];
        for (int j = 0; j < n->nout; j++) live[i] |= (unsigned char)n->out[j]->needed;
        if (!live[i]) continue;
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] && n->in[k]->requires_grad) {
                n->in[k]->needed = 1;
                n->in[k]->pending++;
            }
    }
}

/* One live node: its backward, then the contributions to its inputs. */
static lm_status run_node(lm_ag *ag, const lm__ag_node *n) {
    lm_tensor *gout[LM__AG_MAX_OUT] = {NULL}, *gin[LM__AG_MAX_IN] = {NULL};
    int any = 0;
    for (int j = 0; j < n->nout; j++) any |= (gout[j] = n->out[j]->grad) != NULL;
    lm_status st = any ? n->backward(ag, n, gout, gin) : LM_OK;
    if (st != LM_OK) st = lm__error_context(st, "backward of %s", n->name);
    for (int j = 0; j < n->nout; j++) {
        lm_tensor_destroy(n->out[j]->grad);
        n->out[j]->grad = NULL;
    }
    for (int k = 0; k < n->nin; k++) {
        lm_ag_var *in = n->in[k];
        if (st != LM_OK || !in || !in->requires_grad) {
            lm_tensor_destroy(gin[k]);
            continue;
        }
        if (gin[k]) st = accumulate(ag, in, gin[k]);
        if (st == LM_OK && --in->pending == 0 && in->is_leaf) st = finalize_leaf(ag, in);
    }
    lm_ag_profile_mark(ag->ctx, "bwd ", n->name);
    return st;
}

/* The root's gradient: seed everywhere (a fill in the tape's stream order, so nothing
 * waits for the device and a captured step may hold it). */
static lm_status seed_root(lm_ag *ag, lm_ag_var *root, float seed) {
    const lm_tensor_view *rv = V(root->value);
    lm_tensor *s = NULL;
    uint32_t word;
    memcpy(&word, &seed, sizeof word);
    LM_TRY(lm_tensor_create(rv->device, LM_F32, rv->ndim, rv->shape, &s));
    lm_status fs = lm__ctx_fill32(ag->ctx, lm_tensor_data(s), word, (size_t)lm_tensor_numel(s));
    if (fs != LM_OK) {
        lm_tensor_destroy(s);
        return fs;
    }
    if (rv->dtype == LM_F32) {
        root->grad = s;
        return LM_OK;
    }
    lm_status st = lm_cast(ag->ctx, V(s), rv->dtype, &root->grad);
    lm_tensor_destroy(s);
    return st;
}

lm_status lm_ag_backward(lm_ag *ag, lm_ag_var *root, float seed) {
    if (!ag || !root) return lm__error(LM_INVALID_ARGUMENT, "lm_ag_backward: NULL argument");
    if (root->ag != ag) return lm__error(LM_INVALID_ARGUMENT, "lm_ag_backward: the root belongs to another tape");
    if (ag->backward_done) return lm__error(LM_INVALID_ARGUMENT, "lm_ag_backward: backward already ran; reset the tape");
    if (!root->requires_grad)
        return lm__error(LM_INVALID_ARGUMENT, "lm_ag_backward: the root does not require gradients (recorded under no_grad "
                                              "or from constants only)");
    if (lm_tensor_numel(root->value) != 1)
        return lm__error(LM_SHAPE_MISMATCH, "lm_ag_backward: the root has %lld elements; it must hold exactly one",
                         (long long)lm_tensor_numel(root->value));
    ag->backward_done = 1;
    unsigned char *live = lm__calloc((size_t)ag->nnodes + 1, 1);
    if (!live) return LM_OUT_OF_MEMORY;
    mark(ag, root, live);
    lm_status st = seed_root(ag, root, seed);
    if (st == LM_OK && root->is_leaf) st = finalize_leaf(ag, root);
    for (int64_t i = ag->nnodes - 1; st == LM_OK && i >= 0; i--)
        if (live[i]) st = run_node(ag, &ag->nodes[i]);
    for (int64_t i = 0; st == LM_OK && i < ag->nvars; i++) {
        lm_ag_var *v = var_at(ag, i);
        if (v->is_leaf && v->requires_grad && !v->needed) st = finalize_leaf(ag, v);
    }
    lm__free(live);
    return st;
}
