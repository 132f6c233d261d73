/* autograd/graph.c — the tape: variable arena, node recording, leaves, bound gradient
 * buffers and hooks (see autograd/internal.h for the records and their invariants).
 * Variables and nodes keep their capacity across lm_ag_reset, so a training loop
 * that records the same graph every step stops allocating records after the first.
 */
#include "autograd/internal.h"
#include "runtime/internal.h"

#include <string.h>

lm_status lm_ag_create(lm_ctx *ctx, lm_ag **out) {
    if (!ctx || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_ag_create: NULL argument");
    lm_ag *ag = lm__calloc(1, sizeof *ag);
    if (!ag) return LM_OUT_OF_MEMORY;
    ag->ctx = ctx;
    ag->grad_enabled = 1;
    *out = ag;
    return LM_OK;
}

static lm_ag_var *var_at(const lm_ag *ag, int64_t i) { return &ag->blocks[i / LM__AG_BLOCK][i % LM__AG_BLOCK]; }

void lm_ag_reset(lm_ag *ag) {
    if (!ag) return;
    for (int64_t i = 0; i < ag->nnodes; i++)
        for (int s = 0; s < LM__AG_MAX_SAVED; s++) lm_tensor_destroy(ag->nodes[i].saved[s]);
    for (int64_t i = 0; i < ag->nvars; i++) {
        lm_ag_var *v = var_at(ag, i);
        lm_tensor_destroy(v->value);
        lm_tensor_destroy(v->grad);
        memset(v, 0, sizeof *v);
    }
    ag->nnodes = ag->nvars = 0;
    ag->backward_done = 0;
    memset(&ag->stats, 0, sizeof ag->stats);
}

void lm_ag_destroy(lm_ag *ag) {
    if (!ag) return;
    lm_ag_reset(ag);
    for (int64_t b = 0; b < ag->nblocks; b++) lm__free(ag->blocks[b]);
    lm__free(ag->blocks);
    lm__free(ag->nodes);
    lm__free(ag);
}

void lm_ag_set_grad_enabled(lm_ag *ag, int enabled) { ag->grad_enabled = enabled != 0; }
int lm_ag_grad_enabled(const lm_ag *ag) { return ag->grad_enabled; }

lm_ag_stats lm_ag_get_stats(const lm_ag *ag) {
    lm_ag_stats s = ag->stats;
    s.nodes = ag->nnodes;
    s.vars = ag->nvars;
    return s;
}

/* Room for one more variable: a new block when the arena is full. */
static lm_status grow_vars(lm_ag *ag) {
    if (ag->nvars < ag->nblocks * LM__AG_BLOCK) return LM_OK;
    lm_ag_var **blocks = lm__calloc((size_t)ag->nblocks + 1, sizeof *blocks);
    lm_ag_var *block = lm__calloc(LM__AG_BLOCK, sizeof *block);
    if (!blocks || !block) {
        lm__free(blocks);
        lm__free(block);
        return LM_OUT_OF_MEMORY;
    }
    if (ag->nblocks) memcpy(blocks, ag->blocks, (size_t)ag->nblocks * sizeof *blocks);
    blocks[ag->nblocks] = block;
    lm__free(ag->blocks);
    ag->blocks = blocks;
    ag->nblocks++;
    return LM_OK;
}

lm_status lm__ag_var_new(lm_ag *ag, lm_tensor *value, int requires_grad, lm_ag_var **out) {
    lm_status st = grow_vars(ag);
    if (st != LM_OK) {
        lm_tensor_destroy(value);
        return st;
    }
    lm_ag_var *v = var_at(ag, ag->nvars++);
    memset(v, 0, sizeof *v);
    v->ag = ag;
    v->value = value;
    v->requires_grad = requires_grad;
    *out = v;
    return LM_OK;
}

lm_status lm__ag_alias(const lm_tensor *t, lm_tensor **out) { return lm_tensor_from_view(t, lm_tensor_as_view(t), out); }

lm_status lm_ag_leaf(lm_ag *ag, const lm_tensor *value, int requires_grad, lm_ag_var **out) {
    if (!ag || !value || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_ag_leaf: NULL argument");
    if (requires_grad && !lm_dtype_is_float(lm_tensor_dtype(value)))
        return lm__error(LM_INVALID_ARGUMENT, "lm_ag_leaf: a %s tensor cannot require gradients",
                         lm_dtype_name(lm_tensor_dtype(value)));
    lm_tensor *ref = NULL;
    LM_TRY(lm__ag_alias(value, &ref));
    LM_TRY(lm__ag_var_new(ag, ref, requires_grad != 0, out));
    (*out)->is_leaf = 1;
    return LM_OK;
}

lm_status lm_ag_bind_grad(lm_ag_var *leaf, const lm_tensor_view *buffer, int accumulate) {
    if (!leaf || !buffer) return lm__error(LM_INVALID_ARGUMENT, "lm_ag_bind_grad: NULL argument");
    if (!leaf->is_leaf || !leaf->requires_grad)
        return lm__error(LM_INVALID_ARGUMENT, "lm_ag_bind_grad: the variable is not a leaf that requires gradients");
    const lm_tensor_view *v = lm_tensor_as_view(leaf->value);
    int same = buffer->ndim == v->ndim;
    for (int i = 0; same && i < v->ndim; i++) same = buffer->shape[i] == v->shape[i];
    if (!same) return lm__error(LM_SHAPE_MISMATCH, "lm_ag_bind_grad: the buffer's shape differs from the leaf's");
    if (buffer->dtype != v->dtype && buffer->dtype != LM_F32)
        return lm__error(LM_DTYPE_MISMATCH, "lm_ag_bind_grad: buffer dtype %s; expected %s or f32",
                         lm_dtype_name(buffer->dtype), lm_dtype_name(v->dtype));
    if (!lm_device_equal(buffer->device, v->device) || lm_tensor_view_overlaps_self(buffer))
        return lm__error(LM_INVALID_ARGUMENT, "lm_ag_bind_grad: the buffer is on another device or overlaps itself");
    leaf->bound = *buffer;
    leaf->has_bound = 1;
    leaf->bound_accumulate = accumulate != 0;
    return LM_OK;
}

lm_status lm_ag_set_hook(lm_ag_var *leaf, lm_ag_hook_fn fn, void *user) {
    if (!leaf || !leaf->is_leaf || !leaf->requires_grad)
        return lm__error(LM_INVALID_ARGUMENT, "lm_ag_set_hook: the variable is not a leaf that requires gradients");
    leaf->hook = fn;
    leaf->hook_user = user;
    return LM_OK;
}

const lm_tensor *lm_ag_value(const lm_ag_var *v) { return v->value; }
int lm_ag_requires_grad(const lm_ag_var *v) { return v->requires_grad; }
const lm_tensor *lm_ag_grad(const lm_ag_var *v) { return v->is_leaf ? v->grad : NULL; }

lm__ag_node lm__ag_node_make(const char *name, lm__ag_backward_fn fn, int nin, int nout, lm_ag_var *a, lm_ag_var *b,
                             lm_ag_var *c) {
    lm__ag_node n;
    memset(&n, 0, sizeof n);
    n.name = name;
    n.backward = fn;
    n.nin = nin;
    n.nout = nout;
    n.in[0] = a;
    n.in[1] = b;
    n.in[2] = c;
    return n;
}

int lm__ag_recording(const lm_ag *ag, int n, lm_ag_var *const *in) {
    if (!ag->grad_enabled) return 0;
    for (int i = 0; i < n; i++)
        if (in[i] && in[i]->requires_grad) return 1;
    return 0;
}

lm_status lm__ag_check_inputs(const lm_ag *ag, const char *op, int n, lm_ag_var *const *in) {
    if (!ag) return lm__error(LM_INVALID_ARGUMENT, "%s: the tape is NULL", op);
    if (ag->backward_done) return lm__error(LM_INVALID_ARGUMENT, "%s: backward already ran; reset the tape first", op);
    for (int i = 0; i < n; i++) {
        if (!in[i]) return lm__error(LM_INVALID_ARGUMENT, "%s: input %d is NULL", op, i);
        if (in[i]->ag != ag) return lm__error(LM_INVALID_ARGUMENT, "%s: input %d belongs to another tape", op, i);
    }
    return LM_OK;
}

lm_status lm__ag_push(lm_ag *ag, const lm__ag_node *node) {
    if (LM__PUSH(ag->nodes, ag->nnodes, ag->cap_nodes, *node) == LM_OK) return LM_OK;
    for (int s = 0; s < LM__AG_MAX_SAVED; s++) lm_tensor_destroy(node->saved[s]);
    return LM_OUT_OF_MEMORY;
}

lm_status lm__ag_tensor(lm_ag *ag, lm_dtype dt, int ndim, const int64_t *shape, lm_tensor **out) {
    return lm_tensor_create(lm_ctx_device(ag->ctx), dt, ndim, shape, out);
}

lm_status lm__ag_copy(lm_ag *ag, const lm_tensor_view *v, lm_tensor **out) {
    LM_TRY(lm__ag_tensor(ag, v->dtype, v->ndim, v->shape, out));
    lm_status st = lm_tensor_view_copy(ag->ctx, lm_tensor_as_view(*out), v);
    if (st != LM_OK) {
        lm_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

lm_status lm__ag_new_like(lm_ag *ag, const lm_tensor *t, lm_tensor **out) {
    const lm_tensor_view *v = lm_tensor_as_view(t);
    return lm__ag_tensor(ag, v->dtype, v->ndim, v->shape, out);
}

/* The dims of v by decreasing stride (ties keep their order) into perm; 1 when v is
 * dense in that order (every stride the product of the later dims' sizes). */
static int dense_order(const lm_tensor_view *v, int *perm) {
    for (int i = 0; i < v->ndim; i++) perm[i] = i;
    for (int i = 1; i < v->ndim; i++) /* insertion sort: stable */
        for (int j = i; j > 0 && v->stride[perm[j]] > v->stride[perm[j - 1]]; j--) {
            int t = perm[j];
            perm[j] = perm[j - 1], perm[j - 1] = t;
        }
    int64_t want = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[perm[i]] != 1 && v->stride[perm[i]] != want) return 0;
        want *= v->shape[perm[i]];
    }
    return 1;
}

lm_status lm__ag_new_ordered(lm_ag *ag, const lm_tensor_view *order, lm_dtype dt, int ndim, const int64_t *shape,
                             lm_tensor **out) {
    int perm[LM_MAX_DIMS], inv[LM_MAX_DIMS];
    if (!order || order->ndim != ndim || ndim < 2 || !dense_order(order, perm)) return lm__ag_tensor(ag, dt, ndim, shape, out);
    int64_t stored[LM_MAX_DIMS];
    for (int i = 0; i < ndim; i++) stored[i] = shape[perm[i]], inv[perm[i]] = i;
    lm_tensor *t = NULL;
    LM_TRY(lm__ag_tensor(ag, dt, ndim, stored, &t));
    lm_status st = lm_tensor_permute(t, inv, out); /* out dim i = stored dim inv[i] */
    lm_tensor_destroy(t);
    return st;
}

lm_status lm__ag_grads_like(lm_ag *ag, const lm__ag_node *n, lm_tensor **gin) {
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] && n->in[i]->requires_grad) LM_TRY(lm__ag_new_like(ag, n->in[i]->value, &gin[i]));
    return LM_OK;
}

const lm_tensor_view *lm__ag_claim_bound(lm_ag_var *v, int *accumulate) {
    if (!v->is_leaf || !v->has_bound || !v->requires_grad || v->pending != 1 || v->grad) return NULL;
    v->in_bound = 1; /* reset by the next backward's marking */
    *accumulate = v->bound_accumulate;
    return &v->bound;
}

lm_tensor *lm__ag_take_saved(lm_ag *ag, const lm__ag_node *n, int s) {
    if (n < ag->nodes || n >= ag->nodes + ag->nnodes || s < 0 || s >= LM__AG_MAX_SAVED) return NULL;
    lm__ag_node *mine = &ag->nodes[n - ag->nodes];
    lm_tensor *t = mine->saved[s];
    mine->saved[s] = NULL;
    return t;
}

lm_status lm__ag_finish(lm_ag *ag, const lm__ag_node *tmpl, int record, lm_tensor **values, lm_ag_var **outs) {
    lm_status st = LM_OK;
    for (int j = 0; j < tmpl->nout; j++) {
        if (st == LM_OK) st = lm__ag_var_new(ag, values[j], record, &outs[j]);
        else lm_tensor_destroy(values[j]);
    }
    if (st != LM_OK || !record) {
        for (int s = 0; s < LM__AG_MAX_SAVED; s++) lm_tensor_destroy(tmpl->saved[s]);
        return st;
    }
    lm__ag_node node = *tmpl;
    for (int j = 0; j < tmpl->nout; j++) node.out[j] = outs[j];
    lm_ag_profile_mark(ag->ctx, "fwd ", tmpl->name);
    return lm__ag_push(ag, &node);
}

lm_status lm__ag_zeros(lm_ag *ag, const lm_tensor_view *like, lm_tensor **out) {
    LM_TRY(lm_tensor_create(like->device, like->dtype, like->ndim, like->shape, out));
    lm_status st = lm__ctx_memset(ag->ctx, lm_tensor_data(*out), 0, lm_storage_nbytes(lm_tensor_storage(*out)));
    if (st != LM_OK) {
        lm_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}
