/* exec/autograd.c — the autograd executor: each op of a prepared graph becomes the
 * tape operation of its kind (lm_ag_linear, lm_ag_add_rmsnorm, lm_ag_attention, ...),
 * so the backward of a training step is the tape's derivation of the very graph the
 * inference executors run.
 *
 * Values are tape variables, except constants (inputs, and parameters the binding
 * marks constant such as the RoPE table), which are plain views. Token-major
 * attention operands [B, T, H, D] enter lm_ag_attention as transposed views and its
 * result is transposed back, as the IR's attention op is defined. Only the forms the
 * decoder's training graph uses are accepted; anything else is LM_UNSUPPORTED naming
 * the op (the inference executors run the rest).
 */
#include "exec/autograd.h"

#include "graph/rewrite.h"
#include "loom/trace.h"

lm_status lm__exec_autograd_prepare(const lm_graph *g, lm_graph **out) {
    static const lm__pass_fn passes[] = {lm__pass_hoist_leaves, lm__pass_linear, lm__pass_add_rmsnorm};
    lm__pass_env env = {lm_device_cpu(), lm_linear_supported, NULL, NULL, NULL}; /* structural passes only */
    return lm__graph_run_passes(g, &env, 3, passes, out);
}

typedef struct tape {
    lm_ag *ag;
    const lm_graph *g;
    lm_ag_var **var;      /* [nvalues] */
    lm_tensor_view *view; /* [nvalues] constants */
    unsigned char *isvar; /* [nvalues] */
} tape;

static const lm_tensor_view *const_view(const tape *t, int v) {
    return t->isvar[v] ? lm_tensor_as_view(lm_ag_value(t->var[v])) : &t->view[v];
}

static lm_status need_var(const tape *t, const lm__gop *op, int k) {
    int v = op->in[k];
    if (v < 0 || t->isvar[v]) return LM_OK;
    return lm__error(LM_UNSUPPORTED, "autograd executor: op '%s' reads constant '%s' where a variable is needed", op->name,
                     t->g->values[v].name);
}

static lm_status leaf(tape *t, const lm__gop *op, const lm__ag_bindings *b) {
    int v = op->out;
    if (op->kind == LM__GOP_INPUT) return b->input(b->user, op->name, &t->view[v]);
    lm_ag_var *var = NULL;
    LM_TRY(b->param(b->user, op->name, &var, &t->view[v]));
    t->var[v] = var;
    t->isvar[v] = var != NULL;
    return LM_OK;
}

/* q, k, v [B, T, H, D] -> lm_ag_attention on [B, H, T, D] -> back to [B, T, H, D]. */
static lm_status attention(tape *t, const lm__gop *op, lm_ag_var **out) {
    lm_ag_var *q, *k, *v, *a;
    LM_TRY(lm_ag_transpose(t->ag, t->var[op->in[0]], 1, 2, &q));
    LM_TRY(lm_ag_transpose(t->ag, t->var[op->in[1]], 1, 2, &k));
    LM_TRY(lm_ag_transpose(t->ag, t->var[op->in[2]], 1, 2, &v));
    LM_TRY(lm_ag_attention_window(t->ag, q, k, v, (float)op->a, (int)op->i[0], op->i[1], &a));
    return lm_ag_transpose(t->ag, a, 1, 2, out);
}

/* Inputs the tape operation takes as plain views: positions and tables, ids, targets. */
static int constant_input(lm__gopk kind, int k) {
    return (kind == LM__GOP_ROPE && k > 0) || (kind == LM__GOP_EMBEDDING && k == 1) ||
           (kind == LM__GOP_LINEAR_CE && k == 2);
}

static lm_status record(tape *t, const lm__gop *op) {
    lm_ag *ag = t->ag;
    lm_ag_var **V = t->var, *o = NULL, *o2 = NULL;
    if (op->kind == LM__GOP_LINEAR && op->in[5] >= 0)
        return lm__error(LM_UNSUPPORTED, "autograd executor: linear '%s' has int8 weights, which cannot be trained",
                         op->name);
    for (int k = 0; k < op->nin; k++)
        if (!constant_input(op->kind, k)) LM_TRY(need_var(t, op, k));
    switch (op->kind) {
    case LM__GOP_LINEAR:
        if (op->i[0] != 0 || op->i[3])
            return lm__error(LM_UNSUPPORTED, "autograd executor: linear '%s' with a fused prologue or accumulate", op->name);
        LM_TRY(lm_ag_linear(ag, V[op->in[0]], V[op->in[1]], op->in[2] >= 0 ? V[op->in[2]] : NULL, &o));
        break;
    case LM__GOP_MATMUL: LM_TRY(lm_ag_matmul(ag, V[op->in[0]], V[op->in[1]], &o)); break;
    case LM__GOP_BIAS_ADD:
    case LM__GOP_ADD: LM_TRY(lm_ag_add(ag, V[op->in[0]], V[op->in[1]], &o)); break;
    case LM__GOP_MUL: LM_TRY(lm_ag_mul(ag, V[op->in[0]], V[op->in[1]], &o)); break;
    case LM__GOP_RMSNORM: LM_TRY(lm_ag_rmsnorm(ag, V[op->in[0]], V[op->in[1]], (float)op->a, &o)); break;
    case LM__GOP_ADD_RMSNORM:
        LM_TRY(lm_ag_add_rmsnorm(ag, V[op->in[0]], V[op->in[1]], V[op->in[2]], (float)op->a, &o, &o2));
        break;
    case LM__GOP_SWIGLU: LM_TRY(lm_ag_swiglu(ag, V[op->in[0]], V[op->in[1]], &o)); break;
    case LM__GOP_ROPE: {
        lm_rope_params rp = {LM_ROPE_SPLIT_HALF, const_view(t, op->in[2]), (float)op->a, const_view(t, op->in[1]), 0,
                             NULL};
        LM_TRY(lm_ag_rope(ag, V[op->in[0]], &rp, &o));
        break;
    }
    case LM__GOP_ATTENTION: LM_TRY(attention(t, op, &o)); break;
    case LM__GOP_EMBEDDING: LM_TRY(lm_ag_embedding(ag, V[op->in[0]], const_view(t, op->in[1]), &o)); break;
    case LM__GOP_LINEAR_CE:
        LM_TRY(lm_ag_linear_cross_entropy(ag, V[op->in[0]], V[op->in[1]], const_view(t, op->in[2]), op->i[0], &o));
        break;
    case LM__GOP_RESHAPE: {
        const lm__gvalue *y = &t->g->values[op->out];
        LM_TRY(lm_ag_reshape(ag, V[op->in[0]], y->ndim, y->dims, &o));
        break;
    }
    case LM__GOP_PERMUTE:
        if (t->g->values[op->out].ndim != 2 || op->perm[0] != 1)
            return lm__error(LM_UNSUPPORTED, "autograd executor: permute '%s' (only 2-d transposes)", op->name);
        LM_TRY(lm_ag_transpose(ag, V[op->in[0]], 0, 1, &o));
        break;
    case LM__GOP_SLICE: LM_TRY(lm_ag_slice(ag, V[op->in[0]], (int)op->i[0], op->i[1], op->i[2], op->i[3], &o)); break;
    default:
        return lm__error(LM_UNSUPPORTED, "autograd executor: op '%s' (%s) has no tape operation", op->name,
                         lm__gop_name(op->kind));
    }
    V[op->out] = o, t->isvar[op->out] = 1;
    if (op->out2 >= 0) V[op->out2] = o2, t->isvar[op->out2] = 1;
    return LM_OK;
}

lm_status lm__exec_autograd(lm_ag *ag, const lm_graph *g, const lm__ag_bindings *b, lm_ag_var **out) {
    if (!ag || !g || !b || !out) return lm__error(LM_INVALID_ARGUMENT, "autograd executor: NULL argument");
    *out = NULL;
    tape t = {ag, g, NULL, NULL, NULL};
    size_t nv = (size_t)(g->nvalues ? g->nvalues : 1);
    t.var = lm__calloc(nv, sizeof *t.var);
    t.view = lm__calloc(nv, sizeof *t.view);
    t.isvar = lm__calloc(nv, 1);
    lm_status st = t.var && t.view && t.isvar ? LM_OK : LM_OUT_OF_MEMORY;
    for (int64_t i = 0; st == LM_OK && i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        int64_t t0 = lm__gop_is_leaf(op->kind) || lm__gop_is_view(op->kind) ? 0 : lm_trace_begin();
        st = lm__gop_is_leaf(op->kind) ? leaf(&t, op, b) : record(&t, op);
        lm_trace_end(t0, "op", lm__gop_name(op->kind), op->name); /* the forward operator, run as it is recorded */
        if (st != LM_OK) st = lm__error_context(st, "op '%s'", op->name);
    }
    int result = -1;
    for (int64_t v = 0; st == LM_OK && v < g->nvalues; v++)
        if (g->values[v].output) result = (int)v;
    if (st == LM_OK && (result < 0 || !t.isvar[result]))
        st = lm__error(LM_INVALID_ARGUMENT, "autograd executor: the graph's output is not computed from variables");
    if (st == LM_OK) *out = t.var[result];
    lm__free(t.var);
    lm__free(t.view);
    lm__free(t.isvar);
    return st;
}
