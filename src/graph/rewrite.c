/* graph/rewrite.c — rewrite passes over the IR, and the machinery they share.
 *
 * A pass never edits a graph in place: it walks the source graph in program order
 * and emits a new one, copying ops (inputs renamed through a value map) or emitting
 * a fused op in place of a matched pattern. Every pass keeps the program order valid
 * and the set of program outputs; what a fused op computes is exactly its pattern
 * (each fused kind is a public operator with a composed reference, ops.h).
 *
 * Passes here are structural. hoist_leaves moves inputs and parameters to the front
 * (so a fused op may sit at any matched op's position); add_rmsnorm fuses a residual
 * add with the RMSNorm reading its sum. Device-specific passes (the GPU's) live in
 * graph/fuse.c and use the same helpers (graph/rewrite.h).
 */
#include "graph/rewrite.h"

#include <stdio.h>

lm_status lm__rw_init(lm__rw *rw, const lm_graph *src) {
    memset(rw, 0, sizeof *rw);
    rw->src = src;
    rw->map = lm__alloc(sizeof *rw->map * (size_t)(src->nvalues ? src->nvalues : 1), 16);
    rw->done = lm__calloc((size_t)(src->nops ? src->nops : 1), 1);
    lm_status st = rw->map && rw->done ? lm_graph_create(&rw->dst) : LM_OUT_OF_MEMORY;
    for (int64_t i = 0; st == LM_OK && i < src->nvalues; i++) rw->map[i] = -1;
    if (st != LM_OK) lm__rw_free(rw);
    return st;
}

void lm__rw_free(lm__rw *rw) {
    lm__free(rw->map);
    lm__free(rw->done);
    lm_graph_destroy(rw->dst);
    memset(rw, 0, sizeof *rw);
}

lm_status lm__rw_finish(lm__rw *rw, lm_graph **out) {
    for (int64_t v = 0; v < rw->src->nvalues; v++)
        if (rw->src->values[v].output && rw->map[v] >= 0) rw->dst->values[rw->map[v]].output = 1;
    *out = rw->dst;
    rw->dst = NULL;
    lm__rw_free(rw);
    return LM_OK;
}

int lm__rw_in(const lm__rw *rw, int v) { return v < 0 ? -1 : rw->map[v]; }

lm_status lm__rw_copy(lm__rw *rw, int64_t i) {
    const lm__gop *op = &rw->src->ops[i];
    const lm__gvalue *v = &rw->src->values[op->out];
    if (op->kind == LM__GOP_REPEAT_IN || op->kind == LM__GOP_REPEAT_OUT || op->region >= 0)
        return lm__error(LM_UNSUPPORTED, "rewrite: op '%s' sits in a repeat region (tile-compiler workloads only)",
                         op->name);
    int in[LM__G_MAX_IN];
    for (int k = 0; k < op->nin; k++) {
        in[k] = lm__rw_in(rw, op->in[k]);
        if (op->in[k] >= 0 && in[k] < 0)
            return lm__error(LM_INTERNAL, "rewrite: op '%s' reads a value the pass dropped", op->name);
    }
    lm__gop *nop;
    int out;
    LM_TRY(lm__graph_append(rw->dst, op->kind, op->name, in, op->nin, v->ndim, v->dims, v->dtype, &nop, &out));
    nop->a = op->a, nop->b = op->b;
    memcpy(nop->i, op->i, sizeof nop->i);
    memcpy(nop->perm, op->perm, sizeof nop->perm);
    if (v->root != op->out) rw->dst->values[out].root = rw->dst->values[lm__rw_in(rw, v->root)].root;
    rw->map[op->out] = out;
    if (op->out2 >= 0) {
        const lm__gvalue *v2 = &rw->src->values[op->out2];
        int o2;
        LM_TRY(lm__graph_add_out2(rw->dst, v2->name, v2->ndim, v2->dims, v2->dtype, &o2));
        rw->map[op->out2] = o2;
    }
    rw->done[i] = 1;
    return LM_OK;
}

lm_status lm__rw_copy_rest(lm__rw *rw, int64_t i) { return rw->done[i] ? LM_OK : lm__rw_copy(rw, i); }

/* ---- queries on the source graph ----------------------------------------------------------- */
int lm__graph_sole_use(const lm_graph *g, int v, int64_t from) {
    int found = -1;
    for (int64_t i = from; i < g->nops; i++)
        for (int k = 0; k < g->ops[i].nin; k++)
            if (g->ops[i].in[k] == v) {
                if (found >= 0 && found != i) return -1;
                found = (int)i;
            }
    return g->values[v].output ? -1 : found;
}

int lm__graph_first_use(const lm_graph *g, int v, int64_t from) {
    for (int64_t i = from; i < g->nops; i++)
        for (int k = 0; k < g->ops[i].nin; k++)
            if (g->ops[i].in[k] == v) return (int)i;
    return -1;
}

int lm__gop_is_leaf(lm__gopk k) { return k == LM__GOP_INPUT || k == LM__GOP_PARAM; }

int lm__graph_whole_storage(const lm_graph *g, int v) {
    while (g->values[v].root != v) {
        const lm__gop *op = &g->ops[g->values[v].op];
        if (op->kind != LM__GOP_RESHAPE) return 0;
        v = op->in[0];
    }
    return 1;
}

int lm__graph_storage_dead_after(const lm_graph *g, int root, int64_t after) {
    for (int64_t i = after + 1; i < g->nops; i++)
        for (int k = 0; k < g->ops[i].nin; k++)
            if (g->ops[i].in[k] >= 0 && g->values[g->ops[i].in[k]].root == root) return 0;
    for (int64_t v = 0; v < g->nvalues; v++)
        if (g->values[v].output && g->values[v].root == root) return 0;
    return 1;
}

/* ---- passes ----------------------------------------------------------------------------------- */
lm_status lm__pass_hoist_leaves(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    (void)env;
    lm__rw rw;
    LM_TRY(lm__rw_init(&rw, g));
    lm_status st = LM_OK;
    for (int64_t i = 0; st == LM_OK && i < g->nops; i++)
        if (lm__gop_is_leaf(g->ops[i].kind)) st = lm__rw_copy(&rw, i);
    for (int64_t i = 0; st == LM_OK && i < g->nops; i++) st = lm__rw_copy_rest(&rw, i);
    if (st != LM_OK) {
        lm__rw_free(&rw);
        return st;
    }
    return lm__rw_finish(&rw, out);
}

/* A pass that walks the ops in order and lets `fuse` replace each one (and later
 * ops it absorbs) or leave it to be copied. */
typedef lm_status (*fuse_at_fn)(lm__rw *rw, int64_t i, int *fused);

static lm_status walk_pass(const lm_graph *g, fuse_at_fn fuse, lm_graph **out) {
    lm__rw rw;
    LM_TRY(lm__rw_init(&rw, g));
    lm_status st = LM_OK;
    for (int64_t i = 0; st == LM_OK && i < g->nops; i++) {
        if (rw.done[i]) continue;
        int fused = 0;
        st = fuse(&rw, i, &fused);
        if (st == LM_OK && !fused) st = lm__rw_copy(&rw, i);
    }
    if (st != LM_OK) {
        lm__rw_free(&rw);
        return st;
    }
    return lm__rw_finish(&rw, out);
}

/* s = add(a, b) followed by rmsnorm(s, w): one add_rmsnorm at the rmsnorm's place,
 * when no op between them reads s (so computing s later changes nothing). The sum
 * keeps s's name and consumers; x = a, residual = b as the operator defines them. */
static lm_status fuse_add_rmsnorm(lm__rw *rw, int64_t i, int *fused) {
    const lm_graph *g = rw->src;
    const lm__gop *add = &g->ops[i];
    *fused = 0;
    if (add->kind != LM__GOP_ADD) return LM_OK;
    int n = lm__graph_first_use(g, add->out, i + 1);
    if (n < 0 || g->ops[n].kind != LM__GOP_RMSNORM || g->ops[n].in[0] != add->out) return LM_OK;
    const lm__gvalue *s = &g->values[add->out], *y = &g->values[g->ops[n].out];
    if (g->values[add->in[0]].dtype != s->dtype || g->values[add->in[1]].dtype != s->dtype) return LM_OK;
    /* emit every op up to the rmsnorm first (none of them reads s), then the fused op */
    for (int64_t k = i + 1; k < n; k++) LM_TRY(lm__rw_copy_rest(rw, k));
    int in[3] = {lm__rw_in(rw, add->in[1]), lm__rw_in(rw, add->in[0]), lm__rw_in(rw, g->ops[n].in[1])};
    lm__gop *op;
    int sum, norm;
    LM_TRY(lm__graph_append(rw->dst, LM__GOP_ADD_RMSNORM, s->name, in, 3, s->ndim, s->dims, s->dtype, &op, &sum));
    op->a = g->ops[n].a;
    /* The residual stream updated in place (the residual's storage is read by nothing
     * after the add): one buffer for the whole stream, as the fused kernels expect. */
    int r = add->in[0];
    if (lm__graph_whole_storage(g, r) && !lm__gop_is_leaf(g->ops[g->values[g->values[r].root].op].kind) &&
        lm__graph_storage_dead_after(g, g->values[r].root, n)) {
        op->i[0] = 1;
        rw->dst->values[sum].root = rw->dst->values[in[1]].root;
    }
    LM_TRY(lm__graph_add_out2(rw->dst, y->name, y->ndim, y->dims, y->dtype, &norm));
    rw->map[add->out] = sum;
    rw->map[g->ops[n].out] = norm;
    rw->done[i] = rw->done[n] = 1;
    *fused = 1;
    return LM_OK;
}

lm_status lm__pass_add_rmsnorm(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    (void)env;
    return walk_pass(g, fuse_add_rmsnorm, out);
}

/* matmul(x, permute(w, {1, 0})) with w a parameter [N, K] (+ bias_add of a [N]
 * parameter reading only the product) -> linear(x, w, bias): y = x w^T + b, the
 * Hugging Face Linear as one operator (lm_linear_out, lm_ag_linear). */
static lm_status fuse_linear(lm__rw *rw, int64_t i, int *fused) {
    const lm_graph *g = rw->src;
    const lm__gop *mm = &g->ops[i];
    *fused = 0;
    if (mm->kind != LM__GOP_MATMUL || g->values[mm->in[0]].ndim != 2) return LM_OK;
    const lm__gop *pt = &g->ops[g->values[mm->in[1]].op];
    if (pt->kind != LM__GOP_PERMUTE || pt->perm[0] != 1 || g->ops[g->values[pt->in[0]].op].kind != LM__GOP_PARAM)
        return LM_OK;
    int w = pt->in[0], bias = -1, y = mm->out;
    int u = lm__graph_sole_use(g, mm->out, i + 1);
    if (u >= 0 && g->ops[u].kind == LM__GOP_BIAS_ADD && g->ops[g->values[g->ops[u].in[1]].op].kind == LM__GOP_PARAM) {
        bias = g->ops[u].in[1];
        y = g->ops[u].out;
    }
    const lm__gvalue *vy = &g->values[y];
    int in[6] = {lm__rw_in(rw, mm->in[0]), lm__rw_in(rw, w), lm__rw_in(rw, bias), -1, -1, -1}; /* float w: no scales */
    lm__gop *op;
    int out;
    LM_TRY(lm__graph_append(rw->dst, LM__GOP_LINEAR, vy->name, in, 6, vy->ndim, vy->dims, vy->dtype, &op, &out));
    op->i[0] = 0; /* LM_LINEAR_IN: x as it is */
    op->i[1] = bias >= 0;
    rw->map[y] = out;
    rw->done[i] = 1;
    if (bias >= 0) rw->done[u] = 1;
    *fused = 1;
    return LM_OK;
}

lm_status lm__pass_linear(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    (void)env;
    return walk_pass(g, fuse_linear, out);
}

lm_status lm__graph_run_passes(const lm_graph *g, const lm__pass_env *env, int n, const lm__pass_fn *passes,
                               lm_graph **out) {
    lm_graph *cur = NULL;
    LM_TRY(lm__graph_clone(g, &cur));
    for (int k = 0; k < n; k++) {
        lm_graph *next = NULL;
        lm_status st = passes[k](cur, env, &next);
        lm_graph_destroy(cur);
        if (st != LM_OK) return st;
        cur = next;
    }
    *out = cur;
    return LM_OK;
}
