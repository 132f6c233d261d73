/* graph/fuse.c — the rewrite passes that turn a canonical decoder graph into the
 * GPU's fused form (the CUDA executor runs them in the order of graph/rewrite.h).
 *
 * Each pass first decides, on the source graph, which ops a fusion absorbs and where
 * the fused op goes (plan[]), then emits: absorbed ops are skipped, the fused op is
 * written at its place, everything else is copied. A fusion applies only when the
 * values it hides are read by nothing else, when every input it needs exists at its
 * place, and (for the linear fusions) when lm_linear_supported says the device runs
 * the result as one kernel without scratch memory (for the decode GEMV's pair
 * epilogues, lm_linear_qkv_rope_fused and lm_linear_swiglu_fused), so a captured step
 * never needs to allocate. The fused kinds are public operators with composed references
 * (include/loom/ops.h); their dtypes and shapes are those of the values they replace.
 * Quantized linears (weight scales in in[5]; int4's group in b) keep their scales and
 * group through every fusion that rewrites a linear in place (input forms, residual
 * accumulate, the re-emitted qkv projection); members of one format and group stack,
 * with their scales stacked by rows beside the weights (nn/upload.c registers both).
 * Work per pass: O(ops * uses) with the linear scans of graph/rewrite.c.
 */
#include "graph/rewrite.h"

#include "loom/ops.h"

#include <stdio.h>

/* ---- shared helpers -------------------------------------------------------------------------- */
static const lm__gop *producer(const lm_graph *g, int v) { return v >= 0 ? &g->ops[g->values[v].op] : NULL; }

/* The name of parameter value v, or NULL when v is not a parameter. */
static const char *param_name(const lm_graph *g, int v) {
    const lm__gop *p = producer(g, v);
    return p && p->kind == LM__GOP_PARAM ? p->name : NULL;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The [M, 2I] value whose halves (column slices [0, I) and [I, 2I), step 1) SWIGLU op sw
 * reads as gate and up, or -1. */
static int swiglu_halves(const lm_graph *g, const lm__gop *sw) {
    const lm__gop *a = producer(g, sw->in[0]), *b = producer(g, sw->in[1]);
    if (a->kind != LM__GOP_SLICE || b->kind != LM__GOP_SLICE || a->in[0] != b->in[0] || a->i[0] != 1 ||
        b->i[0] != 1 || a->i[3] != 1 || b->i[3] != 1)
        return -1;
    const lm__gvalue *y = &g->values[a->in[0]], *o = &g->values[sw->out];
    if (y->ndim != 2 || o->ndim != 2) return -1;
    const int64_t I = o->dims[1];
    if (y->dims[1] != 2 * I || a->i[1] != 0 || a->i[2] != I || b->i[1] != I || b->i[2] != 2 * I) return -1;
    return a->in[0];
}

/* A plain linear: the input as it is, no accumulate. */
static int plain_linear(const lm__gop *op) { return op && op->kind == LM__GOP_LINEAR && op->i[0] == 0 && !op->i[3]; }
/* A plain linear: stacking concatenates the weights (and a quantized one's scales) by
 * rows, as nn/upload.c lays them out. */
static int stackable_linear(const lm__gop *op) { return plain_linear(op); }

/* 1 when linears a and b may share a stack: weights of one dtype and width, scales
 * (present for both or neither) of one dtype and width, one int4 group. */
static int same_format(const lm_graph *g, const lm__gop *a, const lm__gop *b) {
    const lm__gvalue *wa = &g->values[a->in[1]], *wb = &g->values[b->in[1]];
    if (wa->dtype != wb->dtype || wa->dims[1] != wb->dims[1] || (a->in[5] >= 0) != (b->in[5] >= 0) || a->b != b->b)
        return 0;
    if (a->in[5] < 0) return 1;
    const lm__gvalue *sa = &g->values[a->in[5]], *sb = &g->values[b->in[5]];
    return sa->dtype == sb->dtype && sa->ndim == sb->ndim && (sa->ndim == 1 || sa->dims[1] == sb->dims[1]);
}

/* Per source op: -1 copy, -2 absorbed into a fusion emitted elsewhere, k >= 0 the
 * start of fusion k. */
typedef struct plan {
    int *at; /* [nops] */
} plan;

static lm_status plan_init(plan *p, const lm_graph *g) {
    p->at = lm__alloc(sizeof *p->at * (size_t)(g->nops ? g->nops : 1), 16);
    if (!p->at) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < g->nops; i++) p->at[i] = -1;
    return LM_OK;
}

/* The emitting loop every pass ends with: emit(rw, k, user) writes fusion k. */
typedef lm_status (*emit_fn)(lm__rw *rw, int k, void *user);

static lm_status run_plan(const lm_graph *g, plan *p, emit_fn emit, void *user, lm_graph **out) {
    lm__rw rw;
    lm_status st = lm__rw_init(&rw, g);
    for (int64_t i = 0; st == LM_OK && i < g->nops; i++) {
        if (p->at[i] >= 0) st = emit(&rw, p->at[i], user);
        else if (p->at[i] == -1) st = lm__rw_copy_rest(&rw, i);
    }
    lm__free(p->at);
    if (st != LM_OK) {
        lm__rw_free(&rw);
        return st;
    }
    return lm__rw_finish(&rw, out);
}

/* The tail of every fusing pass: emits what `planned` (the planning step's status)
 * planned, or stops with its error; frees the plan and the pass's fusion list. */
static lm_status finish_pass(const lm_graph *g, plan *p, lm_status planned, emit_fn emit, void *user, void *list,
                             lm_graph **out) {
    lm_status st = planned;
    if (st == LM_OK) st = run_plan(g, p, emit, user, out); /* frees p->at */
    else lm__free(p->at);
    lm__free(list);
    return st;
}

/* ---- stacked projections ------------------------------------------------------------------------ */
typedef struct stack_group {
    int head;       /* the first member's op */
    int n;          /* 3 (q, k, v) or 2 (gate, up) */
    int ops[3];     /* the members' linear ops */
    int has_bias;
    char prefix[LM__G_NAME]; /* "model.layers.N." */
    const char *stacked;     /* "self_attn.qkv_proj" or "mlp.gate_up_proj" */
} stack_group;

typedef struct stacks {
    const lm_graph *g;
    stack_group *v;
    int64_t n, cap;
} stacks;

static const char *const k_qkv[3] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"};
static const char *const k_gu[2] = {"mlp.gate_proj", "mlp.up_proj"};

/* The linear after `from` reading x with the parameter prefix + member + ".weight". */
static int find_member(const lm_graph *g, int64_t from, int x, const char *prefix, const char *member, int bias) {
    char want[2 * LM__G_NAME], wantb[2 * LM__G_NAME];
    snprintf(want, sizeof want, "%s%s.weight", prefix, member);
    snprintf(wantb, sizeof wantb, "%s%s.bias", prefix, member);
    for (int64_t j = from; j < g->nops; j++) {
        const lm__gop *op = &g->ops[j];
        if (!stackable_linear(op) || op->in[0] != x) continue;
        const char *w = param_name(g, op->in[1]), *b = param_name(g, op->in[2]);
        if (!w || strcmp(w, want) != 0) continue;
        if ((op->in[2] >= 0) != bias || (bias && (!b || strcmp(b, wantb) != 0))) return -1;
        return (int)j;
    }
    return -1;
}

static lm_status plan_stacks(stacks *s, plan *p) {
    const lm_graph *g = s->g;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        const char *w = stackable_linear(op) && p->at[i] == -1 ? param_name(g, op->in[1]) : NULL;
        if (!w) continue;
        const char *const *members = ends_with(w, ".self_attn.q_proj.weight") ? k_qkv
                                     : ends_with(w, ".mlp.gate_proj.weight")  ? k_gu
                                                                              : NULL;
        if (!members) continue;
        stack_group grp;
        memset(&grp, 0, sizeof grp);
        grp.head = (int)i, grp.n = members == k_qkv ? 3 : 2, grp.has_bias = op->in[2] >= 0;
        grp.stacked = members == k_qkv ? "self_attn.qkv_proj" : "mlp.gate_up_proj";
        snprintf(grp.prefix, sizeof grp.prefix, "%.*s", (int)(strlen(w) - strlen(members[0]) - strlen(".weight")), w);
        int ok = 1;
        for (int k = 0; k < grp.n && ok; k++) {
            grp.ops[k] = k ? find_member(g, i + 1, op->in[0], grp.prefix, members[k], grp.has_bias) : (int)i;
            ok = grp.ops[k] >= 0 && g->values[g->ops[grp.ops[k]].out].dtype == g->values[op->out].dtype &&
                 same_format(g, op, &g->ops[grp.ops[k]]);
        }
        if (!ok) continue;
        LM_TRY(LM__PUSH(s->v, s->n, s->cap, grp));
        for (int k = 0; k < grp.n; k++) p->at[grp.ops[k]] = -2;
        p->at[i] = (int)s->n - 1;
    }
    return LM_OK;
}

static lm_status emit_stack(lm__rw *rw, int k, void *user) {
    const stacks *s = user;
    const stack_group *grp = &s->v[k];
    const lm_graph *g = s->g;
    const lm__gop *first = &g->ops[grp->ops[0]];
    const lm__gvalue *w0 = &g->values[first->in[1]], *y0 = &g->values[first->out];
    int64_t rows = 0;
    for (int m = 0; m < grp->n; m++) rows += g->values[g->ops[grp->ops[m]].in[1]].dims[0];
    char name[2 * LM__G_NAME];
    int64_t ws[2] = {rows, w0->dims[1]}, bs[1] = {rows};
    lm_graph_value w, b = -1, y;
    snprintf(name, sizeof name, "%s%s.weight", grp->prefix, grp->stacked);
    LM_TRY(lm_graph_param(rw->dst, name, w0->dtype, 2, ws, 0.0, 0.0, &w));
    if (grp->has_bias) {
        snprintf(name, sizeof name, "%s%s.bias", grp->prefix, grp->stacked);
        LM_TRY(lm_graph_param(rw->dst, name, g->values[first->in[2]].dtype, 1, bs, 0.0, 0.0, &b));
    }
    lm_graph_value sc = -1;
    if (first->in[5] >= 0) { /* quantized: "<stack>.weight_scale", the members' scales by rows */
        const lm__gvalue *s0 = &g->values[first->in[5]];
        int64_t ss[2] = {rows, s0->ndim == 2 ? s0->dims[1] : 1};
        snprintf(name, sizeof name, "%s%s.weight_scale", grp->prefix, grp->stacked);
        LM_TRY(lm_graph_param(rw->dst, name, s0->dtype, s0->ndim, ss, 0.0, 0.0, &sc));
    }
    int in[6] = {lm__rw_in(rw, first->in[0]), w, b, -1, -1, sc};
    int64_t ys[2] = {y0->dims[0], rows};
    lm__gop *op;
    snprintf(name, sizeof name, "%s%s", grp->prefix, grp->stacked); /* "model.layers.3.self_attn.qkv_proj" */
    LM_TRY(lm__graph_append(rw->dst, LM__GOP_LINEAR, name, in, 6, 2, ys, y0->dtype, &op, &y));
    op->i[1] = b >= 0;
    op->b = first->b; /* int4: the group */
    int64_t off = 0;
    for (int m = 0; m < grp->n; m++) { /* each member's output is a column slice of the stack */
        const lm__gop *mop = &g->ops[grp->ops[m]];
        int64_t n = g->values[mop->in[1]].dims[0];
        lm_graph_value sl;
        LM_TRY(lm__graph_slice(rw->dst, g->values[mop->out].name, y, 1, off, off + n, &sl));
        rw->map[mop->out] = sl;
        rw->done[grp->ops[m]] = 1;
        off += n;
    }
    return LM_OK;
}

lm_status lm__pass_stack_linears(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    (void)env;
    plan p;
    stacks s = {g, NULL, 0, 0};
    LM_TRY(plan_init(&p, g));
    lm_status planned = plan_stacks(&s, &p);
    return finish_pass(g, &p, planned, emit_stack, &s, s.v, out);
}

/* ---- q|k|v -> bias, norms, RoPE, KV stores ---------------------------------------------------- */
typedef struct qkv_match {
    int attn;                 /* the attention_cache op */
    int stack;                /* the stacked projection's output value [N, (Hq + 2 Hkv) D] */
    int q, kc0, vc0;          /* values: the roped q ([B, T, Hq, D]), the caches before the stores */
    int kc1, vc1;             /* the caches after the stores */
    int qn, kn;               /* norm weights or -1 */
    int inv, pos, slots;
    double eps, factor;
    int64_t Hq;
    int chain[16], nchain;    /* absorbed ops */
    int linear;               /* the stacked projection, absorbed to move its bias here, or -1 */
} qkv_match;

typedef struct qkvs {
    const lm_graph *g;
    qkv_match *v;
    int64_t n, cap;
} qkvs;

/* Walks one head chain back from the roped (or plain, for v) value: rope? <- rmsnorm?
 * <- reshape <- slice of the stack. Fills *slice_lo/hi and the norm; 0 if it does
 * not match or an intermediate has another reader. */
static int head_chain(const lm_graph *g, int v, int want_rope, qkv_match *m, int *norm, int64_t *lo, int64_t *hi) {
    const lm__gop *op = producer(g, v);
    if (want_rope) {
        if (op->kind != LM__GOP_ROPE || op->in[1] != m->pos || lm__graph_sole_use(g, op->out, 0) < 0) return 0;
        if (m->inv >= 0 && (op->in[2] != m->inv || op->a != m->factor)) return 0;
        m->inv = op->in[2], m->factor = op->a;
        m->chain[m->nchain++] = g->values[v].op;
        v = op->in[0], op = producer(g, v);
        *norm = -1;
        if (op->kind == LM__GOP_RMSNORM && lm__graph_sole_use(g, v, 0) >= 0 && op->in[0] >= 0) {
            *norm = op->in[1];
            m->eps = op->a;
            m->chain[m->nchain++] = g->values[v].op;
            v = op->in[0], op = producer(g, v);
        }
    }
    if (op->kind != LM__GOP_RESHAPE || lm__graph_sole_use(g, v, 0) < 0) return 0;
    m->chain[m->nchain++] = g->values[v].op;
    v = op->in[0], op = producer(g, v);
    if (op->kind != LM__GOP_SLICE || op->i[0] != 1 || lm__graph_sole_use(g, v, 0) < 0) return 0;
    if (m->stack >= 0 && op->in[0] != m->stack) return 0;
    m->stack = op->in[0];
    *lo = op->i[1], *hi = op->i[2];
    m->chain[m->nchain++] = g->values[v].op;
    return 1;
}

static int match_qkv(const lm_graph *g, int64_t a, qkv_match *m) {
    const lm__gop *at = &g->ops[a];
    memset(m, 0, sizeof *m);
    m->attn = (int)a, m->stack = m->inv = -1, m->pos = at->in[4], m->slots = at->in[3];
    const lm__gop *ks = producer(g, at->in[1]), *vs = producer(g, at->in[2]);
    if (ks->kind != LM__GOP_KV_STORE || vs->kind != LM__GOP_KV_STORE) return 0;
    for (int s = 0; s < 2; s++) {
        const lm__gop *st = s ? vs : ks;
        if (st->in[2] != m->slots || st->in[3] != m->pos || lm__graph_sole_use(g, st->out, 0) != a) return 0;
    }
    if (lm__graph_sole_use(g, at->in[0], 0) != a) return 0;
    m->q = at->in[0], m->kc0 = ks->in[0], m->vc0 = vs->in[0], m->kc1 = ks->out, m->vc1 = vs->out;
    m->chain[m->nchain++] = g->values[m->kc1].op;
    m->chain[m->nchain++] = g->values[m->vc1].op;
    int64_t ql, qh, kl, kh, vl, vh;
    int vn;
    if (!head_chain(g, m->q, 1, m, &m->qn, &ql, &qh) || !head_chain(g, ks->in[1], 1, m, &m->kn, &kl, &kh) ||
        !head_chain(g, vs->in[1], 0, m, &vn, &vl, &vh))
        return 0;
    const lm__gvalue *q = &g->values[m->q], *st = &g->values[m->stack];
    int64_t D = q->dims[3], Hq = q->dims[2], Hkv = g->values[m->kc0].dims[1];
    m->Hq = Hq;
    if ((m->qn < 0) != (m->kn < 0) || ql != 0 || qh != Hq * D || kl != qh || kh != kl + Hkv * D || vl != kh ||
        vh != vl + Hkv * D || st->dims[1] != vh || st->dims[0] != q->dims[0] * q->dims[1])
        return 0;
    for (int c = 0; c < m->nchain; c++) /* every absorbed op reads only this fusion's values */
        if (g->ops[m->chain[c]].region >= 0) return 0;
    /* A plain projection with a bias feeding only the three slices: its bias moves into
     * the fused op (one more load per element there, instead of an epilogue read at
     * the end of the projection) and the projection is re-emitted without it. */
    m->linear = -1;
    const lm__gop *lin = producer(g, m->stack);
    if (lin->kind == LM__GOP_LINEAR && lin->i[0] == LM_LINEAR_IN && lin->i[1] && !lin->i[3] && lin->region < 0) {
        if (g->values[m->stack].nuses == 3 && !g->values[m->stack].output) {
            m->linear = g->values[m->stack].op;
            m->chain[m->nchain++] = m->linear;
        }
    }
    return 1;
}

static lm_status plan_qkv(qkvs *s, plan *p) {
    const lm_graph *g = s->g;
    for (int64_t a = 0; a < g->nops; a++) {
        if (g->ops[a].kind != LM__GOP_ATTENTION_CACHE) continue;
        qkv_match m;
        if (!match_qkv(g, a, &m)) continue;
        int first = m.chain[0];
        for (int c = 1; c < m.nchain; c++) first = LM_MIN(first, m.chain[c]);
        LM_TRY(LM__PUSH(s->v, s->n, s->cap, m));
        for (int c = 0; c < m.nchain; c++) p->at[m.chain[c]] = -2;
        p->at[first] = (int)s->n - 1;
    }
    return LM_OK;
}

static lm_status emit_qkv(lm__rw *rw, int k, void *user) {
    const qkvs *s = user;
    const qkv_match *m = &s->v[k];
    const lm_graph *g = s->g;
    const lm__gvalue *q = &g->values[m->q], *st = &g->values[m->stack];
    int64_t s3[3] = {q->dims[0], q->dims[1], st->dims[1]};
    char name[LM__G_NAME];
    lm_graph_value stack = -1, bias = -1;
    if (m->linear >= 0) { /* the projection again, without its bias */
        const lm__gop *lin = &g->ops[m->linear];
        int lin_in[6] = {lm__rw_in(rw, lin->in[0]), lm__rw_in(rw, lin->in[1]), -1, -1, -1, lm__rw_in(rw, lin->in[5])};
        lm__gop *lop;
        LM_TRY(lm__graph_append(rw->dst, LM__GOP_LINEAR, lin->name, lin_in, 6, st->ndim, st->dims, st->dtype, &lop,
                                &stack));
        lop->i[0] = LM_LINEAR_IN, lop->a = lin->a, lop->b = lin->b;
        bias = lm__rw_in(rw, lin->in[2]);
    } else {
        stack = lm__rw_in(rw, m->stack);
    }
    snprintf(name, sizeof name, "%.50s.rows", st->name);
    lm_graph_value x3, y;
    LM_TRY(lm_graph_reshape(rw->dst, name, stack, 3, s3, &x3));
    int in[9] = {x3, bias, lm__rw_in(rw, m->qn), lm__rw_in(rw, m->kn), lm__rw_in(rw, m->inv), lm__rw_in(rw, m->pos),
                 lm__rw_in(rw, m->slots), lm__rw_in(rw, m->kc0), lm__rw_in(rw, m->vc0)};
    lm__gop *op;
    LM_TRY(lm__graph_append(rw->dst, LM__GOP_QKV_ROPE_STORE, q->name, in, 9, 4, q->dims, q->dtype, &op, &y));
    op->a = m->qn >= 0 ? m->eps : 0.0, op->b = m->factor;
    op->i[0] = m->Hq, op->i[1] = bias >= 0, op->i[2] = m->qn >= 0;
    rw->map[m->q] = y;
    rw->map[m->kc1] = lm__rw_in(rw, m->kc0); /* written in place: later readers see the stores in program order */
    rw->map[m->vc1] = lm__rw_in(rw, m->vc0);
    for (int c = 0; c < m->nchain; c++) rw->done[m->chain[c]] = 1;
    return LM_OK;
}

lm_status lm__pass_qkv_rope_store(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    (void)env;
    plan p;
    qkvs s = {g, NULL, 0, 0};
    LM_TRY(plan_init(&p, g));
    lm_status planned = plan_qkv(&s, &p);
    return finish_pass(g, &p, planned, emit_qkv, &s, s.v, out);
}

/* ---- the q|k|v projection into the attention front ------------------------------------------------ */
typedef struct front_fusion {
    int linear, reshape, front; /* the projection, its [B, T, N] view, the qkv_rope_store */
} front_fusion;

typedef struct fronts {
    const lm_graph *g;
    front_fusion *v;
    int64_t n, cap;
} fronts;

static lm_status plan_fronts(fronts *s, plan *p, const lm__pass_env *env) {
    const lm_graph *g = s->g;
    if (!env->front_fused) return LM_OK;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *fr = &g->ops[i];
        if (fr->kind != LM__GOP_QKV_ROPE_STORE || fr->i[2] || fr->region >= 0) continue;
        const lm__gop *rs = producer(g, fr->in[0]);
        if (rs->kind != LM__GOP_RESHAPE || lm__graph_sole_use(g, fr->in[0], 0) != i) continue;
        int y = rs->in[0], reshape = g->values[fr->in[0]].op;
        const lm__gop *lin = producer(g, y);
        if (lin->kind != LM__GOP_LINEAR || lin->i[3] || lin->in[2] >= 0 || lin->region >= 0 ||
            lm__graph_sole_use(g, y, 0) != reshape)
            continue;
        const lm__gvalue *x = &g->values[lin->in[0]], *w = &g->values[lin->in[1]];
        if (x->ndim != 2) continue;
        int64_t K = lin->i[0] == LM_LINEAR_IN_SWIGLU ? x->dims[1] / 2 : x->dims[1];
        if (!env->front_fused(env->device, (lm_linear_input)lin->i[0], x->dims[0], K, x->dtype, w->dtype, 0)) continue;
        front_fusion f = {g->values[y].op, reshape, (int)i};
        LM_TRY(LM__PUSH(s->v, s->n, s->cap, f));
        p->at[f.linear] = p->at[f.reshape] = -2;
        p->at[i] = (int)s->n - 1;
    }
    return LM_OK;
}

static lm_status emit_front(lm__rw *rw, int k, void *user) {
    const fronts *s = user;
    const front_fusion *f = &s->v[k];
    const lm_graph *g = s->g;
    const lm__gop *lin = &g->ops[f->linear], *fr = &g->ops[f->front];
    const lm__gvalue *q = &g->values[fr->out];
    int in[10] = {lm__rw_in(rw, lin->in[0]), lm__rw_in(rw, lin->in[1]), lm__rw_in(rw, lin->in[3]),
                  lm__rw_in(rw, lin->in[5]), lm__rw_in(rw, fr->in[1]),  lm__rw_in(rw, fr->in[4]),
                  lm__rw_in(rw, fr->in[5]),  lm__rw_in(rw, fr->in[6]),  lm__rw_in(rw, fr->in[7]),
                  lm__rw_in(rw, fr->in[8])};
    lm__gop *op;
    lm_graph_value y;
    LM_TRY(lm__graph_append(rw->dst, LM__GOP_LINEAR_QKV_ROPE, q->name, in, 10, q->ndim, q->dims, q->dtype, &op, &y));
    op->a = lin->a, op->b = fr->b;
    op->i[0] = fr->i[0], op->i[1] = lin->i[0], op->i[2] = (int64_t)lin->b; /* Hq, the input form, the int4 group */
    rw->map[fr->out] = y;
    rw->done[f->linear] = rw->done[f->reshape] = rw->done[f->front] = 1;
    return LM_OK;
}

lm_status lm__pass_linear_qkv_rope(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    plan p;
    fronts s = {g, NULL, 0, 0};
    LM_TRY(plan_init(&p, g));
    lm_status planned = plan_fronts(&s, &p, env);
    return finish_pass(g, &p, planned, emit_front, &s, s.v, out);
}

/* ---- the gate|up projection with its SwiGLU ------------------------------------------------------- */
typedef struct swiglu_fusion {
    int gate_up, down; /* the [M, 2I] projection and its SWIGLU-form reader */
    int act;           /* the dst value of the [M, I] activation (set when the first is emitted) */
} swiglu_fusion;

typedef struct swiglus {
    const lm_graph *g;
    swiglu_fusion *v;
    int64_t n, cap;
} swiglus;

static lm_status plan_swiglus(swiglus *s, plan *p, const lm__pass_env *env) {
    const lm_graph *g = s->g;
    if (!env->swiglu_fused) return LM_OK;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *down = &g->ops[i];
        if (down->kind != LM__GOP_LINEAR || down->i[0] != LM_LINEAR_IN_SWIGLU || down->region >= 0) continue;
        int y = down->in[0];
        const lm__gop *gu = producer(g, y);
        if (gu->kind != LM__GOP_LINEAR || gu->i[3] || gu->region >= 0 || lm__graph_sole_use(g, y, 0) != i ||
            p->at[g->values[y].op] != -1)
            continue;
        const lm__gvalue *x = &g->values[gu->in[0]], *w = &g->values[gu->in[1]], *vy = &g->values[y];
        if (x->ndim != 2 || vy->dtype != LM_F32 || vy->dims[1] % 2) continue;
        int64_t K = gu->i[0] == LM_LINEAR_IN_SWIGLU ? x->dims[1] / 2 : x->dims[1];
        if (!env->swiglu_fused(env->device, (lm_linear_input)gu->i[0], x->dims[0], K, x->dtype, w->dtype)) continue;
        swiglu_fusion f = {g->values[y].op, (int)i, -1};
        LM_TRY(LM__PUSH(s->v, s->n, s->cap, f));
        p->at[f.gate_up] = (int)(2 * (s->n - 1)); /* even: the projection, odd: its reader */
        p->at[i] = (int)(2 * (s->n - 1) + 1);
    }
    return LM_OK;
}

static lm_status emit_swiglu(lm__rw *rw, int k, void *user) {
    swiglus *s = user;
    swiglu_fusion *f = &s->v[k / 2];
    const lm_graph *g = s->g;
    const lm__gop *src = &g->ops[k % 2 ? f->down : f->gate_up];
    int in[6] = {k % 2 ? f->act : lm__rw_in(rw, src->in[0]), lm__rw_in(rw, src->in[1]), lm__rw_in(rw, src->in[2]),
                 k % 2 ? -1 : lm__rw_in(rw, src->in[3]), lm__rw_in(rw, src->in[4]), lm__rw_in(rw, src->in[5])};
    const lm__gvalue *y = &g->values[src->out];
    int64_t dims[2] = {y->dims[0], k % 2 ? y->dims[1] : y->dims[1] / 2};
    char name[LM__G_NAME];
    snprintf(name, sizeof name, "%.50s%s", y->name, k % 2 ? "" : ".act");
    lm__gop *op;
    lm_graph_value out;
    LM_TRY(lm__graph_append(rw->dst, k % 2 ? LM__GOP_LINEAR : LM__GOP_LINEAR_SWIGLU, k % 2 ? src->name : name, in, 6, 2,
                            dims, y->dtype, &op, &out));
    op->i[0] = k % 2 ? LM_LINEAR_IN : src->i[0], op->i[1] = src->i[1], op->i[2] = k % 2 ? 0 : src->i[2];
    op->i[3] = src->i[3], op->a = src->a, op->b = src->b; /* the reader keeps its accumulate and int4 group */
    if (k % 2) {
        if (src->i[3]) rw->dst->values[out].root = rw->dst->values[in[4]].root; /* in place, as before */
        rw->map[src->out] = out;
    } else {
        f->act = out;
    }
    rw->done[k % 2 ? f->down : f->gate_up] = 1;
    return LM_OK;
}

lm_status lm__pass_linear_swiglu(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    plan p;
    swiglus s = {g, NULL, 0, 0};
    LM_TRY(plan_init(&p, g));
    lm_status planned = plan_swiglus(&s, &p, env);
    return finish_pass(g, &p, planned, emit_swiglu, &s, s.v, out);
}

/* ---- linear input forms and the residual add -------------------------------------------------- */
typedef struct lin_fusion {
    int linear;   /* the linear op */
    int x;        /* its new input value */
    int form;     /* lm_linear_input */
    int norm;     /* RMSNORM: the weight value */
    double eps;
    int residual; /* accumulate into this value (-1: none) */
    int result;   /* the value the fused linear stands for (the add's sum, or the linear's output) */
} lin_fusion;

typedef struct lins {
    const lm_graph *g;
    lin_fusion *v;
    int64_t n, cap;
} lins;

static int supported(const lm__pass_env *env, const lm_graph *g, int form, int accumulate, int x, int w) {
    const lm__gvalue *vx = &g->values[x], *vw = &g->values[w];
    return env->linear_supported(env->device, (lm_linear_input)form, accumulate, vx->dims[0], vw->dims[1], vx->dtype,
                                 vw->dtype);
}

static lm_status plan_inputs(lins *s, plan *p, const lm__pass_env *env) {
    const lm_graph *g = s->g;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (!plain_linear(op) || g->values[op->in[0]].ndim != 2) continue;
        int x = op->in[0];
        const lm__gop *pr = producer(g, x);
        lin_fusion f = {(int)i, -1, 0, -1, 0.0, -1, op->out};
        int absorbed[3] = {-1, -1, -1};
        if (pr->kind == LM__GOP_RMSNORM && lm__graph_sole_use(g, x, 0) == i && g->values[pr->in[0]].ndim == 2) {
            f.x = pr->in[0], f.form = LM_LINEAR_IN_RMSNORM, f.norm = pr->in[1], f.eps = pr->a;
            absorbed[0] = g->values[x].op;
        } else if (pr->kind == LM__GOP_SWIGLU && lm__graph_sole_use(g, x, 0) == i) {
            const int y = swiglu_halves(g, pr);
            if (y < 0) continue;
            if (lm__graph_sole_use(g, pr->in[0], 0) < 0 || lm__graph_sole_use(g, pr->in[1], 0) < 0) continue;
            f.x = y, f.form = LM_LINEAR_IN_SWIGLU;
            absorbed[0] = g->values[x].op, absorbed[1] = g->values[pr->in[0]].op, absorbed[2] = g->values[pr->in[1]].op;
        } else {
            continue;
        }
        if (!supported(env, g, f.form, (int)op->i[3], f.x, op->in[1])) continue;
        LM_TRY(LM__PUSH(s->v, s->n, s->cap, f));
        for (int k = 0; k < 3; k++)
            if (absorbed[k] >= 0) p->at[absorbed[k]] = -2;
        p->at[i] = (int)s->n - 1;
    }
    return LM_OK;
}

static lm_status emit_linear(lm__rw *rw, int k, void *user) {
    const lins *s = user;
    const lin_fusion *f = &s->v[k];
    const lm_graph *g = s->g;
    const lm__gop *lin = &g->ops[f->linear];
    const lm__gvalue *y = &g->values[f->result];
    int norm = f->norm >= 0 ? f->norm : lin->in[3];
    int in[6] = {lm__rw_in(rw, f->x >= 0 ? f->x : lin->in[0]), lm__rw_in(rw, lin->in[1]), lm__rw_in(rw, lin->in[2]),
                 lm__rw_in(rw, norm), lm__rw_in(rw, f->residual), lm__rw_in(rw, lin->in[5])}; /* scales ride along */
    lm__gop *op;
    lm_graph_value out;
    LM_TRY(lm__graph_append(rw->dst, LM__GOP_LINEAR, y->name, in, 6, y->ndim, y->dims, y->dtype, &op, &out));
    op->i[0] = f->x >= 0 ? f->form : lin->i[0];
    op->i[1] = lin->in[2] >= 0;
    op->i[2] = norm >= 0;
    op->i[3] = f->residual >= 0;
    op->a = f->norm >= 0 ? f->eps : lin->a;
    op->b = lin->b; /* int4: the group */
    if (f->residual >= 0) rw->dst->values[out].root = rw->dst->values[in[4]].root; /* in place */
    rw->map[f->result] = out;
    rw->done[f->linear] = 1;
    return LM_OK;
}

lm_status lm__pass_linear_input(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    plan p;
    lins s = {g, NULL, 0, 0};
    LM_TRY(plan_init(&p, g));
    lm_status planned = plan_inputs(&s, &p, env);
    return finish_pass(g, &p, planned, emit_linear, &s, s.v, out);
}

static lm_status plan_residuals(lins *s, plan *p, const lm__pass_env *env) {
    const lm_graph *g = s->g;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *add = &g->ops[i];
        if (add->kind != LM__GOP_ADD || p->at[i] != -1) continue;
        for (int side = 0; side < 2; side++) {
            int y = add->in[side], r = add->in[1 - side];
            const lm__gop *lin = producer(g, y);
            if (lin->kind != LM__GOP_LINEAR || lin->i[3] || lin->in[4] >= 0 || lm__graph_sole_use(g, y, 0) != i) continue;
            const lm__gvalue *vr = &g->values[r], *vy = &g->values[y];
            int root = vr->root;
            if (vr->dtype != vy->dtype || vr->ndim != 2 || vr->dims[0] != vy->dims[0] || vr->dims[1] != vy->dims[1])
                continue;
            if (lm__gop_is_leaf(producer(g, root)->kind) || g->values[lin->in[0]].root == root) continue;
            if (!lm__graph_whole_storage(g, r) || !lm__graph_storage_dead_after(g, root, i)) continue;
            if (!supported(env, g, (int)lin->i[0], 1, lin->in[0], lin->in[1])) continue;
            lin_fusion f = {g->values[y].op, -1, (int)lin->i[0], -1, lin->a, r, add->out};
            LM_TRY(LM__PUSH(s->v, s->n, s->cap, f));
            p->at[g->values[y].op] = -2;
            p->at[i] = (int)s->n - 1;
            break;
        }
    }
    return LM_OK;
}

lm_status lm__pass_linear_residual(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    plan p;
    lins s = {g, NULL, 0, 0};
    LM_TRY(plan_init(&p, g));
    lm_status planned = plan_residuals(&s, &p, env);
    return finish_pass(g, &p, planned, emit_linear, &s, s.v, out);
}

/* ---- low-precision GEMM inputs ------------------------------------------------------------------- */
/* 1 when v has readers and every one (through views, up to 4 deep) passes reader(op, k,
 * v, user): op reads v as its input k; v is not a graph output. */
typedef int (*reader_fn)(const lm_graph *g, const lm__gop *op, int k, int v, void *user);
static int all_readers(const lm_graph *g, int v, int depth, reader_fn reader, void *user) {
    int readers = 0;
    if (g->values[v].output || depth > 4) return 0;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        for (int k = 0; k < op->nin; k++) {
            if (op->in[k] != v) continue;
            readers++;
            if (lm__gop_is_view(op->kind) ? !all_readers(g, op->out, depth + 1, reader, user) : !reader(g, op, k, v, user))
                return 0;
        }
    }
    return readers > 0;
}

/* The input of a plain linear whose weights are of dtype *low (16-bit; the first reader
 * sets it) and that the device runs as one GEMM at that dtype. */
typedef struct gemm_reader {
    const lm__pass_env *env;
    lm_dtype low;
} gemm_reader;

static int gemm_input(const lm_graph *g, const lm__gop *op, int k, int v, void *user) {
    gemm_reader *r = user;
    lm_dtype wd = plain_linear(op) ? g->values[op->in[1]].dtype : LM_F32;
    if (!plain_linear(op) || k != 0 || (wd != LM_BF16 && wd != LM_F16) || (r->low != LM_F32 && wd != r->low)) return 0;
    r->low = wd;
    const lm__gvalue *x = &g->values[v], *w = &g->values[op->in[1]];
    return r->env->linear_supported(r->env->device, LM_LINEAR_IN, 0, x->ndim == 2 ? x->dims[0] : 0, w->dims[1], wd, wd);
}

/* A SwiGLU whose output dt (user) made bf16. */
static int low_swiglu(const lm_graph *g, const lm__gop *op, int k, int v, void *user) {
    (void)g, (void)k, (void)v;
    const lm_dtype *dt = user;
    return op->kind == LM__GOP_SWIGLU && dt[op->out] == LM_BF16;
}

/* 1 when the graph's projections hold quantized weights (scales in in[5]). */
static int quantized_linears(const lm_graph *g) {
    for (int64_t i = 0; i < g->nops; i++)
        if (g->ops[i].kind == LM__GOP_LINEAR && g->ops[i].in[5] >= 0) return 1;
    return 0;
}

/* The dtype each source value gets: its own, or the weights' for GEMM inputs. A
 * multi-token q from the fused front goes bf16 (the flash kernel's q) with the
 * attention's output, or on its own in a quantized model, whose linears take f32 x
 * but whose prefill attention would otherwise run the per-row kernel. */
static lm_status plan_low(const lm_graph *g, const lm__pass_env *env, lm_dtype *dt) {
    for (int64_t v = 0; v < g->nvalues; v++) dt[v] = g->values[v].dtype;
    int quant = quantized_linears(g);
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        int v = op->kind == LM__GOP_ADD_RMSNORM ? op->out2 : op->out;
        if (op->kind != LM__GOP_RMSNORM && op->kind != LM__GOP_ADD_RMSNORM && op->kind != LM__GOP_SWIGLU &&
            op->kind != LM__GOP_ATTENTION_CACHE)
            continue;
        if (g->values[v].dtype != LM_F32) continue;
        gemm_reader r = {env, LM_F32}; /* low: set by the readers' weights */
        int lowered = all_readers(g, v, 0, gemm_input, &r);
        lm_dtype low = r.low;
        if (lowered) dt[v] = low;
        if (op->kind == LM__GOP_ATTENTION_CACHE && (lowered || quant)) {
            const lm__gop *qp = producer(g, op->in[0]);
            if (qp->kind == LM__GOP_QKV_ROPE_STORE && g->values[op->in[0]].dims[1] > 1 &&
                g->values[op->in[0]].dtype == LM_F32 && lm__graph_sole_use(g, op->in[0], 0) == i)
                dt[op->in[0]] = lowered ? low : LM_BF16;
        }
    }
    /* then products (bf16 x, no bias) read only by such SwiGLUs: stored as bf16, so the
     * SwiGLU reads half the bytes (transformers' bf16 Linear rounds its output alike) */
    for (int64_t i = 0; env->low_out && i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (!plain_linear(op) || op->in[2] >= 0 || op->in[5] >= 0 || g->values[op->out].dtype != LM_F32) continue;
        const lm__gvalue *x = &g->values[op->in[0]], *w = &g->values[op->in[1]];
        if (x->ndim != 2 || !env->low_out(env->device, x->dims[0], w->dims[1], dt[op->in[0]], w->dtype)) continue;
        if (all_readers(g, op->out, 0, low_swiglu, dt)) dt[op->out] = LM_BF16;
    }
    return LM_OK;
}

static lm_status emit_low(const lm_graph *g, const lm_dtype *dt, lm_graph **out) {
    lm__rw rw;
    LM_TRY(lm__rw_init(&rw, g));
    lm_status st = LM_OK;
    for (int64_t i = 0; st == LM_OK && i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (rw.done[i]) continue;
        /* embedding (bf16 table) -> cast to f32 as the only reader: one widening embedding */
        if (op->kind == LM__GOP_CAST && producer(g, op->in[0])->kind == LM__GOP_EMBEDDING &&
            lm__graph_sole_use(g, op->in[0], 0) == i && g->values[op->out].dtype == LM_F32) {
            lm__gvalue *emb = &rw.dst->values[lm__rw_in(&rw, op->in[0])];
            emb->dtype = LM_F32; /* the embedding op was copied just before (its only reader is this cast) */
            rw.map[op->out] = lm__rw_in(&rw, op->in[0]);
            rw.done[i] = 1;
            continue;
        }
        st = lm__rw_copy(&rw, i);
        if (st != LM_OK) break;
        int outs[2] = {op->out, op->out2};
        for (int k = 0; k < 2; k++) {
            if (outs[k] < 0) continue;
            lm__gvalue *d = &rw.dst->values[rw.map[outs[k]]];
            if (lm__gop_is_view(op->kind)) d->dtype = rw.dst->values[d->root].dtype; /* views follow their storage */
            else d->dtype = dt[outs[k]];
        }
    }
    if (st != LM_OK) {
        lm__rw_free(&rw);
        return st;
    }
    return lm__rw_finish(&rw, out);
}

lm_status lm__pass_gemm_inputs(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    lm_dtype *dt = lm__alloc(sizeof *dt * (size_t)(g->nvalues ? g->nvalues : 1), 16);
    if (!dt) return LM_OUT_OF_MEMORY;
    lm_status st = plan_low(g, env, dt);
    if (st == LM_OK) st = emit_low(g, dt, out);
    lm__free(dt);
    return st;
}

/* ---- the gate|up GEMM with its SwiGLU (prefill, batched decode) ---------------------------------- */
typedef struct gemm_swiglu {
    int swiglu, linear, slices[2]; /* the SWIGLU op, the product's linear, the two halves */
} gemm_swiglu;

typedef struct gemm_swiglus {
    const lm_graph *g;
    gemm_swiglu *v;
    int64_t n, cap;
} gemm_swiglus;

/* 1 when value v is read by exactly the ops a and b (once each) and is no graph output. */
static int read_only_by(const lm_graph *g, int v, int a, int b) {
    int uses = 0;
    if (g->values[v].output) return 0;
    for (int64_t i = 0; i < g->nops; i++)
        for (int k = 0; k < g->ops[i].nin; k++)
            if (g->ops[i].in[k] == v) {
                if (i != a && i != b) return 0;
                uses++;
            }
    return uses == 2;
}

static lm_status plan_gemm_swiglus(gemm_swiglus *s, plan *p, const lm__pass_env *env) {
    const lm_graph *g = s->g;
    if (!env->swiglu_fused) return LM_OK;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *sw = &g->ops[i];
        if (sw->kind != LM__GOP_SWIGLU || p->at[i] != -1) continue;
        const int y = swiglu_halves(g, sw);
        if (y < 0) continue;
        const lm__gvalue *vy = &g->values[y], *vo = &g->values[sw->out];
        if (vo->dims[1] % 2) continue; /* the kernel stores activations in pairs */
        if (lm__graph_sole_use(g, sw->in[0], 0) != i || lm__graph_sole_use(g, sw->in[1], 0) != i) continue;
        const lm__gop *lin = producer(g, y);
        if (!plain_linear(lin) || lin->in[2] >= 0 || lin->in[5] >= 0 || lin->region >= 0) continue;
        if (!read_only_by(g, y, g->values[sw->in[0]].op, g->values[sw->in[1]].op)) continue;
        const lm__gvalue *x = &g->values[lin->in[0]], *w = &g->values[lin->in[1]];
        /* the product stored as bf16 (lm__pass_gemm_inputs): the fused epilogue rounds alike */
        if (x->ndim != 2 || x->dtype != LM_BF16 || w->dtype != LM_BF16 || vy->dtype != LM_BF16 || vo->dtype != LM_BF16)
            continue;
        if (!env->swiglu_fused(env->device, LM_LINEAR_IN, x->dims[0], w->dims[1], LM_BF16, LM_BF16)) continue;
        gemm_swiglu f = {(int)i, g->values[y].op, {g->values[sw->in[0]].op, g->values[sw->in[1]].op}};
        LM_TRY(LM__PUSH(s->v, s->n, s->cap, f));
        p->at[f.linear] = p->at[f.slices[0]] = p->at[f.slices[1]] = -2;
        p->at[i] = (int)s->n - 1;
    }
    return LM_OK;
}

static lm_status emit_gemm_swiglu(lm__rw *rw, int k, void *user) {
    gemm_swiglus *s = user;
    const gemm_swiglu *f = &s->v[k];
    const lm_graph *g = s->g;
    const lm__gop *lin = &g->ops[f->linear], *sw = &g->ops[f->swiglu];
    const lm__gvalue *y = &g->values[sw->out];
    int in[6] = {lm__rw_in(rw, lin->in[0]), lm__rw_in(rw, lin->in[1]), -1, -1, -1, -1};
    char name[LM__G_NAME];
    snprintf(name, sizeof name, "%.50s.act", g->values[lin->out].name);
    lm__gop *op;
    lm_graph_value out;
    LM_TRY(lm__graph_append(rw->dst, LM__GOP_LINEAR_SWIGLU, name, in, 6, 2, y->dims, y->dtype, &op, &out));
    op->i[0] = LM_LINEAR_IN, op->i[1] = 0, op->i[2] = 0, op->i[3] = 0, op->a = 0.0, op->b = 0.0;
    rw->map[sw->out] = out;
    rw->done[f->swiglu] = 1;
    return LM_OK;
}

lm_status lm__pass_swiglu_gemm(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    plan p;
    gemm_swiglus s = {g, NULL, 0, 0};
    LM_TRY(plan_init(&p, g));
    lm_status planned = plan_gemm_swiglus(&s, &p, env);
    return finish_pass(g, &p, planned, emit_gemm_swiglu, &s, s.v, out);
}
