/* plan/mid.c — lowering the search's winning decisions to the mid program: mid
 * values (a graph value in one layout; views reuse their root's buffers) and
 * whole-device operations.
 *
 * Every decision is replayed in program order: inputs are converted from the
 * recorded source materialization (Copy when every piece stays on its tile,
 * Exchange otherwise), the op's kernel grid becomes a Compute (plus a Reduce when
 * the matmul splits K: the partial sums are explicit values whose contributor count
 * is the replica axis), flash attention becomes one streamed op, a Repeat wraps its
 * body and carries values back into the body input's buffers. Checkpoints follow
 * the value they name; outputs are checked at the end. Predicted cycles are the sum
 * of the ops' costs with bodies counted count times.
 */
#include "plan/low.h"

#include <stdio.h>

typedef struct mb {
    lm__plan_planner *P; /* borrowed */
    lm__plan_mid *mid;   /* being built */
} mb;

static int mval_add(mb *b, int value, const lm__plan_layout *l, int view_of, int region) {
    lm__plan_mval v;
    memset(&v, 0, sizeof v);
    v.value = value;
    v.l = *l;
    v.view_of = view_of;
    v.region = region;
    v.stacked = 1;
    if (LM__PUSH(b->mid->vals, b->mid->nvals, b->mid->cap_vals, v) != LM_OK) return -1;
    return (int)b->mid->nvals - 1;
}

static int mval_find(const mb *b, int value, const lm__plan_layout *l) {
    for (int64_t i = b->mid->nvals - 1; i >= 0; i--) {
        const lm__plan_mval *v = &b->mid->vals[i];
        if (v->value == value && lm__plan_layout_equal(&v->l, l)) return (int)i;
    }
    return -1;
}

static lm_status op_add(mb *b, lm__plan_mop *o) {
    return LM__PUSH(b->mid->ops, b->mid->nops, b->mid->cap_ops, *o);
}

static lm__plan_mop mop(lm__plan_mk k, int gop, int out) {
    lm__plan_mop o;
    memset(&o, 0, sizeof o);
    o.kind = k;
    o.gop = gop;
    o.out = out;
    o.check = -1;
    o.flash_k = o.flash_v = -1;
    o.steps = 1;
    return o;
}

/* The view value v of root mid value rm (rm itself when v is the root). */
static lm_status view_of(mb *b, int v, int rm, int *out) {
    const lm_graph *g = b->P->g;
    if (g->values[v].root == v || rm < 0) {
        *out = rm;
        return LM_OK;
    }
    lm__plan_layout l;
    if (!lm__plan_view_chain_map(g, v, &b->mid->vals[rm].l, &l))
        return lm__error(LM_INTERNAL, "plan: layout of '%s' does not map to its view '%s'",
                         g->values[g->values[v].root].name, g->values[v].name);
    for (int64_t i = 0; i < b->mid->nvals; i++)
        if (b->mid->vals[i].value == v && b->mid->vals[i].view_of == rm) {
            *out = (int)i;
            return LM_OK;
        }
    *out = mval_add(b, v, &l, rm, b->mid->vals[rm].region);
    return *out < 0 ? LM_OUT_OF_MEMORY : LM_OK;
}

static lm_status placed(mb *b, int value, const lm__plan_layout *l, int *out) {
    int i = mval_find(b, value, l);
    if (i < 0) {
        const lm_graph *g = b->P->g;
        int region = g->values[value].region;
        i = mval_add(b, value, l, -1, region);
        if (i < 0) return LM_OUT_OF_MEMORY;
        b->mid->vals[i].placed = 1;
        b->mid->vals[i].stacked = region >= 0 ? (int)g->regions[region].count : 1;
    }
    *out = i;
    return LM_OK;
}

/* The materialization of root r in layout id src; an input not placed there yet is
 * placed now (inputs are placed where their first consumer wants them). */
static lm_status source(mb *b, int r, int src, int *out) {
    lm__plan_planner *P = b->P;
    *out = src >= 0 ? mval_find(b, r, &P->lay[src]) : -1;
    if (*out >= 0) return LM_OK;
    lm__gopk k = P->g->ops[P->g->values[r].op].kind;
    if (src >= 0 && (k == LM__GOP_INPUT || k == LM__GOP_PARAM)) return placed(b, r, &P->lay[src], out);
    return lm__error(LM_INTERNAL, "plan: '%s' has no materialization in the recorded source layout",
                     P->g->values[r].name);
}

/* Materializes root value r in layout id req from layout id src. */
static lm_status convert(mb *b, int r, int src, int req, int region, int *out) {
    lm__plan_planner *P = b->P;
    int s;
    LM_TRY(source(b, r, src, &s));
    if (src == req) {
        *out = s;
        return LM_OK;
    }
    int d = mval_find(b, r, &P->lay[req]);
    if (d >= 0) {
        *out = d;
        return LM_OK;
    }
    d = mval_add(b, r, &P->lay[req], -1, region);
    if (d < 0) return LM_OUT_OF_MEMORY;
    lm__plan_xcost x;
    lm__plan_mop o = mop(LM__PLAN_M_COPY, -1, d);
    o.cost = lm__plan_cost_redist(P->m, &P->lay[src], &P->lay[req], &P->ws, &x);
    if (x.max_recv || x.max_send) o.kind = LM__PLAN_M_EXCHANGE;
    o.in[0] = s;
    o.nin = 1;
    *out = d;
    return op_add(b, &o);
}

/* The cheapest existing materialization of root r to turn into layout id req. */
static int cheapest_source(mb *b, int r, int req) {
    lm__plan_planner *P = b->P;
    int best = -1;
    double bc = 0;
    for (int64_t i = 0; i < b->mid->nvals; i++) {
        const lm__plan_mval *v = &b->mid->vals[i];
        if (v->value != r || v->l.partial) continue;
        int id = lm__plan_layout_id(P, &v->l);
        if (id < 0) continue;
        double c = lm__plan_conv_cost(P, id, req);
        if (best < 0 || c < bc) best = id, bc = c;
    }
    if (best < 0 && P->g->ops[P->g->values[r].op].kind == LM__GOP_INPUT) { /* placed for this consumer */
        lm__plan_layout l;
        lm__plan_layout_strip_reps(&P->lay[req], &l);
        best = lm__plan_layout_id(P, &l);
    }
    return best;
}

static lm_status checkpoints(mb *b, int value, int m) {
    const lm_graph *g = b->P->g;
    for (int64_t i = 0; i < g->nchecks; i++) {
        int w = g->checks[i].value;
        if (g->values[w].root != value) continue;
        int vm;
        if (view_of(b, w, m, &vm) != LM_OK) {
            lm_clear_error(); /* a view no layout of this root maps to: checked at the outputs only */
            continue;
        }
        lm__plan_mop o = mop(LM__PLAN_M_CHECKPOINT, -1, -1);
        o.in[0] = vm;
        o.nin = 1;
        o.check = (int)i;
        LM_TRY(op_add(b, &o));
    }
    return LM_OK;
}

static lm_status build_chain(mb *b, int end, int start);

static lm_status decision(mb *b, const lm__plan_trace *t) {
    lm__plan_planner *P = b->P;
    const lm_graph *g = P->g;
    const lm__plan_unit *u = &P->units[t->unit];
    if (u->kind == LM__PLAN_U_OP) {
        const lm__gop *o = &g->ops[u->op];
        int region = o->region;
        lm__plan_mop c = mop(LM__PLAN_M_COMPUTE, u->op, -1);
        c.nin = o->nin;
        const lm__plan_cand *cd = o->kind == LM__GOP_MATMUL ? &P->cands[u->op][t->choice] : NULL;
        lm__plan_layout lx = P->lay[t->out];
        for (int i = 0; i < o->nin; i++) {
            int v = o->in[i], r = g->values[v].root, rm, narrow;
            if (cd && cd->steps > 1 && g->ops[g->values[r].op].kind != LM__GOP_PARAM) { /* streamed from here */
                LM_TRY(source(b, r, t->src[i], &rm));
            } else if (g->ops[g->values[r].op].kind == LM__GOP_PARAM) {
                lm__plan_layout pl;
                if (cd)
                    pl = cd->in_root[i];
                else if (t->src[i] >= 0) /* read like an activation: placed where the search put it */
                    pl = P->lay[t->src[i]];
                else if (!lm__plan_follow_input(g, o, i, &lx, &pl, &narrow))
                    return lm__error(LM_UNSUPPORTED, "op '%s': parameter '%s' layout needs too many replica axes",
                                     o->name, g->values[v].name);
                LM_TRY(placed(b, r, &pl, &rm));
            } else {
                LM_TRY(convert(b, r, t->src[i], t->req[i], region, &rm));
            }
            LM_TRY(view_of(b, v, rm, &c.in[i]));
        }
        if (cd) {
            for (int i = 0; i < 4; i++) c.grid[i] = cd->grid[i];
            c.cost = cd->compute;
            c.steps = cd->steps;
            if (cd->steps > 1) {
                c.step[0] = cd->step[0];
                c.step[1] = cd->step[1];
                c.cost += lm__plan_gemm_stream_cost(P, u->op, cd, t->src[0], t->src[1]);
            }
            if (cd->has_partial) {
                int pm = mval_add(b, o->out, &cd->partial, -1, region);
                if (pm < 0) return LM_OUT_OF_MEMORY;
                c.out = pm;
                LM_TRY(op_add(b, &c));
                int fm = mval_add(b, o->out, &P->lay[t->out], -1, region);
                if (fm < 0) return LM_OUT_OF_MEMORY;
                lm__plan_mop r = mop(LM__PLAN_M_REDUCE, u->op, fm);
                r.in[0] = pm;
                r.nin = 1;
                r.cost = cd->reduce;
                LM_TRY(op_add(b, &r));
                return checkpoints(b, o->out, fm);
            }
        } else {
            c.cost = lm__plan_cost_follow(P->m, o->kind, &lx);
        }
        c.out = mval_add(b, o->out, &P->lay[t->out], -1, region);
        if (c.out < 0) return LM_OUT_OF_MEMORY;
        LM_TRY(op_add(b, &c));
        return checkpoints(b, o->out, c.out);
    }
    if (u->kind == LM__PLAN_U_ATTN) {
        if (t->choice < 0) return build_chain(b, t->body, t->start);
        lm__plan_attn a;
        if (!lm__plan_attn_of(g, u->op, &a)) return lm__error(LM_INTERNAL, "plan: attention unit lost");
        const lm__plan_cand *cd = &P->flash[a.op][t->choice];
        int region = g->ops[a.op].region;
        lm__plan_mop f = mop(LM__PLAN_M_FLASH, a.op, -1);
        int qm;
        LM_TRY(convert(b, g->values[a.q].root, t->src[0], t->req[0], region, &qm));
        LM_TRY(view_of(b, a.q, qm, &f.in[0]));
        int kv[2] = {a.kt, a.v};
        for (int i = 0; i < 2; i++) {
            LM_TRY(source(b, g->values[kv[i]].root, t->src[1 + i], &f.in[1 + i]));
        }
        f.nin = 3;
        f.flash_k = kv[0];
        f.flash_v = kv[1];
        for (int i = 0; i < 4; i++) f.grid[i] = cd->grid[i];
        f.cost = cd->compute + cd->reduce + lm__plan_flash_stream_cost(P, cd, &a, t->src[1], t->src[2]);
        f.out = mval_add(b, a.out, &P->lay[t->out], -1, region);
        if (f.out < 0) return LM_OUT_OF_MEMORY;
        LM_TRY(op_add(b, &f));
        return checkpoints(b, a.out, f.out);
    }
    /* REPEAT */
    const lm__gregion *rg = &g->regions[u->region];
    int bin[LM__G_MAX_CARRY];
    for (int c = 0; c < rg->ncarry; c++) {
        lm__plan_layout L = P->lay[t->carry[c]], root;
        bin[c] = mval_add(b, rg->body_in[c], &L, -1, u->region);
        if (bin[c] < 0) return LM_OUT_OF_MEMORY;
        int ov = rg->outer_in[c], r = g->values[ov].root;
        if (!lm__plan_view_chain_unmap(g, ov, &L, &root)) return lm__error(LM_INTERNAL, "plan: repeat entry layout");
        int req = lm__plan_layout_id(P, &root), src = req < 0 ? -1 : cheapest_source(b, r, req), rm, vm;
        if (req < 0 || src < 0) return LM_OUT_OF_MEMORY; /* interning failed: the sources exist */
        LM_TRY(convert(b, r, src, req, -1, &rm));
        LM_TRY(view_of(b, ov, rm, &vm));
        lm__plan_mop cp = mop(LM__PLAN_M_COPY, -1, bin[c]);
        cp.in[0] = vm;
        cp.nin = 1;
        cp.cost = lm__plan_cost_copy(P->m, lm__plan_layout_shard_bytes(&L));
        LM_TRY(op_add(b, &cp));
    }
    int rep = (int)b->mid->nops;
    lm__plan_mop ro = mop(LM__PLAN_M_REPEAT, -1, -1);
    ro.count = rg->count;
    LM_TRY(op_add(b, &ro));
    for (int c = 0; c < rg->ncarry; c++) LM_TRY(checkpoints(b, rg->body_in[c], bin[c]));
    LM_TRY(build_chain(b, t->body, t->start));
    for (int c = 0; c < rg->ncarry; c++) {
        lm__plan_layout L = P->lay[t->carry[c]], root;
        int ov = rg->body_out[c], r = g->values[ov].root;
        if (!lm__plan_view_chain_unmap(g, ov, &L, &root)) return lm__error(LM_INTERNAL, "plan: repeat carry layout");
        int req = lm__plan_layout_id(P, &root), src = req < 0 ? -1 : cheapest_source(b, r, req), rm, vm;
        if (req < 0 || src < 0) return LM_OUT_OF_MEMORY; /* interning failed: the sources exist */
        LM_TRY(convert(b, r, src, req, u->region, &rm));
        LM_TRY(view_of(b, ov, rm, &vm));
        lm__plan_mop cp = mop(LM__PLAN_M_COPY, -1, bin[c]);
        cp.in[0] = vm;
        cp.nin = 1;
        cp.cost = lm__plan_cost_copy(P->m, lm__plan_layout_shard_bytes(&L));
        LM_TRY(op_add(b, &cp));
    }
    b->mid->ops[rep].body_end = (int)b->mid->nops;
    for (int c = 0; c < rg->ncarry; c++) {
        int om = mval_add(b, rg->outer_out[c], &P->lay[t->carry[c]], bin[c], -1);
        if (om < 0) return LM_OUT_OF_MEMORY;
        LM_TRY(checkpoints(b, rg->outer_out[c], om));
    }
    return LM_OK;
}

/* ---- fused epilogues ---------------------------------------------------------------------------- */
/* Op j can be folded into producer op i's final write: it is the next op, an
 * elementwise bias add (its bias parameter read as a narrow row) or GeLU / SiLU reading
 * exactly i's output (no view, no other reader, no checkpoint between), in the same
 * layout and dtype, in the same region. */
static int foldable(const mb *b, const int32_t *readers, int i, int j, lm__gopk *kind) {
    const lm__plan_mid *mid = b->mid;
    const lm_graph *g = b->P->g;
    if (j >= mid->nops) return 0;
    const lm__plan_mop *o = &mid->ops[i], *n = &mid->ops[j];
    if (n->kind != LM__PLAN_M_COMPUTE || n->in[0] != o->out) return 0;
    *kind = g->ops[n->gop].kind;
    if (*kind != LM__GOP_BIAS_ADD && *kind != LM__GOP_GELU && *kind != LM__GOP_SILU) return 0;
    if (*kind == LM__GOP_BIAS_ADD && (o->epi || n->nin != 2)) return 0; /* the bias comes first */
    if (o->epi & (LM__PLAN_EPI_GELU | LM__PLAN_EPI_SILU)) return 0;     /* nothing after the activation */
    const lm__plan_mval *a = &mid->vals[o->out], *c = &mid->vals[n->out];
    if (a->view_of >= 0 || c->view_of >= 0 || a->region != c->region || a->l.partial ||
        g->values[a->value].output || readers[o->out] != 1)
        return 0;
    return a->l.dtype == c->l.dtype && lm__plan_layout_equal(&a->l, &c->l);
}

/* Folds bias adds and GeLU / SiLU into the final write of the matmul (single pass, no
 * K split) or reduction producing their input: one kernel call per shard instead of
 * two or three, one rounding instead of three. Dropped ops' outputs become dead mid
 * values (no buffer is used for them); repeat bounds are renumbered. */
static lm_status fuse_epilogues(mb *b) {
    lm__plan_mid *mid = b->mid;
    const lm_graph *g = b->P->g;
    const lm_plan_machine *m = b->P->m;
    int64_t n = mid->nops, w = 0;
    int *newi = lm__alloc(sizeof(int) * (size_t)(n + 1), 16);
    int32_t *readers = lm__calloc((size_t)(mid->nvals + 1), sizeof(int32_t)); /* of each value's storage */
    if (!newi || !readers) {
        lm__free(newi);
        lm__free(readers);
        return LM_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < mid->ops[i].nin; k++) readers[lm__plan_mid_owner(mid, mid->ops[i].in[k])]++;
    for (int64_t i = 0; i < n; i++) {
        lm__plan_mop *o = &mid->ops[i];
        newi[i] = (int)w;
        int host = (o->kind == LM__PLAN_M_REDUCE && o->nin == 1) ||
                   (o->kind == LM__PLAN_M_COMPUTE && o->gop >= 0 && g->ops[o->gop].kind == LM__GOP_MATMUL &&
                    o->steps == 1 && o->nin == 2);
        int64_t j = i + 1;
        lm__gopk k;
        while (host && foldable(b, readers, (int)i, (int)j, &k)) {
            lm__plan_mop *f = &mid->ops[j];
            if (k == LM__GOP_BIAS_ADD) {
                o->in[o->nin++] = f->in[1];
                o->epi |= LM__PLAN_EPI_BIAS;
            } else {
                o->epi |= k == LM__GOP_GELU ? LM__PLAN_EPI_GELU : LM__PLAN_EPI_SILU;
            }
            o->out = f->out;
            newi[j] = (int)w; /* a dropped op maps to its host */
            j++;
        }
        if (o->epi) {
            const lm__plan_layout *L = &mid->vals[o->out].l;
            int64_t elems = lm__plan_layout_shard_bytes(L) / (int64_t)lm_dtype_size(L->dtype);
            o->cost += lm__plan_cost_epilogue(m, L->dtype, elems, o->epi);
        }
        mid->ops[w++] = *o;
        i = j - 1;
    }
    newi[n] = (int)w;
    for (int64_t i = 0; i < w; i++)
        if (mid->ops[i].kind == LM__PLAN_M_REPEAT) mid->ops[i].body_end = newi[mid->ops[i].body_end];
    mid->nops = w;
    lm__free(newi);
    lm__free(readers);
    return LM_OK;
}

/* Replays the decisions from the node after 'start' to 'end'. */
static lm_status build_chain(mb *b, int end, int start) {
    int n = 0;
    for (int t = end; t != start && t >= 0; t = b->P->trace[t].parent) n++;
    int *seq = lm__alloc(sizeof(int) * (size_t)(n ? n : 1), 16);
    if (!seq) return LM_OUT_OF_MEMORY;
    int k = n;
    for (int t = end; t != start && t >= 0; t = b->P->trace[t].parent) seq[--k] = t;
    lm_status st = LM_OK;
    for (int i = 0; i < n && st == LM_OK; i++) st = decision(b, &b->P->trace[seq[i]]);
    lm__free(seq);
    return st;
}

static double total_cost(const lm__plan_mid *mid, int64_t begin, int64_t end) {
    double c = 0;
    for (int64_t i = begin; i < end; i++) {
        const lm__plan_mop *o = &mid->ops[i];
        if (o->kind == LM__PLAN_M_REPEAT) {
            c += (double)o->count * total_cost(mid, i + 1, o->body_end);
            i = o->body_end - 1;
        } else {
            c += o->cost;
        }
    }
    return c;
}

lm_status lm__plan_mid_build(lm__plan_planner *P, int trace_end, lm__plan_mid *mid) {
    memset(mid, 0, sizeof *mid);
    mb b = {P, mid};
    lm_status st = build_chain(&b, trace_end, -1);
    const lm_graph *g = P->g;
    for (int64_t v = 0; st == LM_OK && v < g->nvalues; v++) {
        if (!g->values[v].output) continue;
        int r = g->values[v].root, m = -1;
        for (int64_t i = mid->nvals - 1; i >= 0 && m < 0; i--)
            if (mid->vals[i].value == r && !mid->vals[i].l.partial) m = (int)i;
        lm__gopk rk = g->ops[g->values[r].op].kind;
        if (m < 0 && (rk == LM__GOP_INPUT || rk == LM__GOP_PARAM)) { /* an output nobody consumed */
            lm__plan_layout l;
            lm__plan_spread_layout(P, &g->values[r], &l);
            st = placed(&b, r, &l, &m);
            if (st != LM_OK) break;
        }
        if (m < 0) {
            st = lm__error(LM_INTERNAL, "plan: output '%s' was never produced", g->values[v].name);
            break;
        }
        int vm;
        st = view_of(&b, (int)v, m, &vm);
        if (st != LM_OK) break;
        lm__plan_mop o = mop(LM__PLAN_M_CHECKPOINT, -1, -1);
        o.in[0] = vm;
        o.nin = 1;
        o.check = -1 - (int)v;
        st = op_add(&b, &o);
    }
    if (st == LM_OK) st = fuse_epilogues(&b);
    if (st != LM_OK) {
        lm__plan_mid_free(mid);
        return st;
    }
    mid->cost = total_cost(mid, 0, mid->nops);
    return LM_OK;
}

void lm__plan_mid_free(lm__plan_mid *mid) {
    lm__free(mid->vals);
    lm__free(mid->ops);
    memset(mid, 0, sizeof *mid);
}

const char *lm__plan_mid_kind_name(lm__plan_mk k) {
    static const char *const n[] = {"Compute", "Copy", "Exchange", "Reduce", "Flash", "Repeat", "Checkpoint"};
    return (unsigned)k < 7u ? n[k] : "?";
}
