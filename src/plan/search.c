/* plan/search.c — beam search over the graph's units (and exhaustive search, which is
 * the same walk without truncation).
 *
 * A state is (cost so far, decision trace, per root value the layouts materialized).
 * Each unit expands every state by every candidate: inputs are taken from the
 * cheapest materialization (conversion cost memoized per layout pair), converted
 * copies stay materialized for later consumers. States with identical
 * materializations are merged (the cheaper survives: future costs depend only on
 * them), then the beam keeps the cheapest width states. Repeat bodies and the
 * materialized attention path are nested searches from the incoming state; a
 * Repeat costs entry + count x (body + carry conversion).
 */
#include "plan/planner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define EXHAUSTIVE_LIMIT 200000

typedef struct beam {
    lm__plan_state *v; /* [n] */
    int64_t n, cap;
} beam;

static void beam_free(beam *b) {
    for (int64_t i = 0; i < b->n; i++) lm__free(b->v[i].mat);
    lm__free(b->v);
    memset(b, 0, sizeof *b);
}

static size_t mat_bytes(const lm__plan_planner *P) {
    return sizeof(int32_t) * LM__PLAN_MAX_MAT * (size_t)P->g->nvalues;
}

static lm_status state_copy(const lm__plan_planner *P, const lm__plan_state *s, lm__plan_state *out) {
    out->cost = s->cost;
    out->resident = s->resident;
    out->trace = s->trace;
    out->mat = lm__alloc(mat_bytes(P), 16);
    if (!out->mat) return LM_OUT_OF_MEMORY;
    memcpy(out->mat, s->mat, mat_bytes(P));
    return LM_OK;
}

static int32_t *mats(const lm__plan_planner *P, const lm__plan_state *s, int v) {
    return s->mat + (size_t)P->g->values[v].root * LM__PLAN_MAX_MAT;
}

/* Adds id to the (ascending) set; the largest id is dropped when full. */
static void mat_add(int32_t *m, int id) {
    for (int i = 0; i < LM__PLAN_MAX_MAT; i++)
        if (m[i] == id) return;
    int32_t tmp[LM__PLAN_MAX_MAT + 1];
    int n = 0, placed = 0;
    for (int i = 0; i < LM__PLAN_MAX_MAT && m[i] >= 0; i++) {
        if (!placed && id < m[i]) tmp[n++] = id, placed = 1;
        tmp[n++] = m[i];
    }
    if (!placed) tmp[n++] = id;
    if (n > LM__PLAN_MAX_MAT) {
        /* keep the new one: drop the largest other id */
        int drop = tmp[n - 1] == id ? n - 2 : n - 1;
        for (int i = drop; i < n - 1; i++) tmp[i] = tmp[i + 1];
        n--;
    }
    for (int i = 0; i < LM__PLAN_MAX_MAT; i++) m[i] = i < n ? tmp[i] : -1;
}

static void mat_set(int32_t *m, int id) {
    m[0] = id;
    for (int i = 1; i < LM__PLAN_MAX_MAT; i++) m[i] = -1;
}

static int is_param(const lm_graph *g, int v) {
    return g->ops[g->values[g->values[v].root].op].kind == LM__GOP_PARAM;
}

/* An input not placed yet (it is placed where its first consumer wants it). */
static int unplaced_input(const lm__plan_planner *P, const lm__plan_state *s, int v) {
    int r = P->g->values[v].root;
    return P->g->ops[P->g->values[r].op].kind == LM__GOP_INPUT && s->mat[(size_t)r * LM__PLAN_MAX_MAT] < 0;
}

/* Cheapest materialization of v's root to convert into layout id req; an unplaced
 * input is placed at req without replicas (cost: the broadcast to the replicas), a
 * parameter read as an activation is placed at req for free. */
static double best_source(lm__plan_planner *P, const lm__plan_state *s, int v, int req, int *src) {
    const int32_t *m = mats(P, s, v);
    double best = INFINITY;
    *src = -1;
    if (is_param(P->g, v)) {
        *src = req;
        return 0;
    }
    if (unplaced_input(P, s, v)) {
        lm__plan_layout l;
        lm__plan_layout_strip_reps(&P->lay[req], &l);
        *src = lm__plan_layout_id(P, &l);
        return *src < 0 ? INFINITY : lm__plan_conv_cost(P, *src, req);
    }
    for (int i = 0; i < LM__PLAN_MAX_MAT && m[i] >= 0; i++) {
        double c = lm__plan_conv_cost(P, m[i], req);
        if (c < best) best = c, *src = m[i];
    }
    return best;
}

static lm_status trace_push(lm__plan_planner *P, const lm__plan_trace *t, int *id) {
    *id = (int)P->ntrace;
    return LM__PUSH(P->trace, P->ntrace, P->cap_trace, *t);
}

static lm__plan_trace trace_new(int parent, int unit) {
    lm__plan_trace t;
    memset(&t, 0, sizeof t);
    t.parent = parent;
    t.unit = unit;
    t.choice = t.out = t.body = t.start = -1;
    for (int i = 0; i < 3; i++) t.src[i] = t.req[i] = -1;
    for (int i = 0; i < LM__G_MAX_CARRY; i++) t.carry[i] = -1;
    return t;
}

/* Pushes a successor of s: cost += t->cost, resident += added parameter bytes, trace
 * node t appended. m holds its mats. */
static lm_status emit(lm__plan_planner *P, beam *out, const lm__plan_state *s, lm__plan_trace *t, int32_t *m,
                      double added) {
    lm__plan_state n;
    n.cost = s->cost + t->cost;
    n.resident = s->resident + added;
    n.mat = m;
    lm_status st = trace_push(P, t, &n.trace);
    if (st == LM_OK) st = LM__PUSH(out->v, out->n, out->cap, n);
    if (st != LM_OK) lm__free(m);
    P->states_made++;
    return st;
}

static int32_t *mat_dup(const lm__plan_planner *P, const lm__plan_state *s) {
    int32_t *m = lm__alloc(mat_bytes(P), 16);
    if (m) memcpy(m, s->mat, mat_bytes(P));
    return m;
}

/* ---- op units ------------------------------------------------------------------------------------ */
static lm_status expand_gemm(lm__plan_planner *P, int u, const lm__plan_state *s, beam *out) {
    int op = P->units[u].op;
    const lm__gop *o = &P->g->ops[op];
    for (int k = 0; k < P->ncands[op]; k++) {
        const lm__plan_cand *c = &P->cands[op][k];
        lm__plan_trace t = trace_new(s->trace, u);
        t.choice = k;
        t.cost = c->compute + c->reduce;
        if (c->steps > 1) { /* streamed operands: no conversion, a per-step exchange instead */
            int ids[2][LM__PLAN_MAX_MAT], nid[2] = {0, 0};
            for (int i = 0; i < 2; i++) {
                if (c->in_param[i]) {
                    t.req[i] = t.src[i] = ids[i][0] = lm__plan_layout_id(P, &c->in_root[i]);
                    if (ids[i][0] < 0) return LM_OUT_OF_MEMORY;
                    nid[i] = 1;
                    continue;
                }
                const int32_t *m = mats(P, s, o->in[i]);
                for (int j = 0; j < LM__PLAN_MAX_MAT && m[j] >= 0; j++) ids[i][nid[i]++] = m[j];
                if (!nid[i]) { /* an unplaced input: spread it */
                    lm__plan_layout l;
                    lm__plan_spread_layout(P, &P->g->values[o->in[i]], &l);
                    ids[i][nid[i]++] = lm__plan_layout_id(P, &l);
                    if (ids[i][0] < 0) return LM_OUT_OF_MEMORY;
                }
            }
            double best = INFINITY;
            for (int a = 0; a < nid[0]; a++)
                for (int b = 0; b < nid[1]; b++) {
                    double sc = lm__plan_gemm_stream_cost(P, op, c, ids[0][a], ids[1][b]);
                    if (sc < best) best = sc, t.src[0] = ids[0][a], t.src[1] = ids[1][b];
                }
            t.cost += best;
        } else {
            for (int i = 0; i < 2; i++) {
                t.req[i] = lm__plan_layout_id(P, &c->in_root[i]);
                if (t.req[i] < 0) return LM_OUT_OF_MEMORY;
                if (c->in_param[i]) continue;
                t.cost += best_source(P, s, o->in[i], t.req[i], &t.src[i]);
            }
        }
        if (!isfinite(t.cost)) continue;
        if (s->resident + (double)(c->param_bytes + c->work_bytes) > (double)P->m->sram_bytes) {
            snprintf(P->op_reason + (size_t)op * LM__PLAN_REASON, LM__PLAN_REASON,
                     "matmul '%s': with %.0f bytes of resident parameters per tile no partition fits %lld bytes of "
                     "SRAM",
                     o->name, s->resident, (long long)P->m->sram_bytes);
            continue;
        }
        t.out = lm__plan_layout_id(P, &c->out);
        int32_t *m = mat_dup(P, s);
        if (!m || t.out < 0) {
            lm__free(m);
            return LM_OUT_OF_MEMORY;
        }
        for (int i = 0; i < 2; i++)
            if (!c->in_param[i]) {
                int32_t *mr = m + (size_t)P->g->values[o->in[i]].root * LM__PLAN_MAX_MAT;
                if (t.src[i] >= 0) mat_add(mr, t.src[i]);
                if (c->steps == 1) mat_add(mr, t.req[i]);
            }
        mat_set(m + (size_t)o->out * LM__PLAN_MAX_MAT, t.out);
        LM_TRY(emit(P, out, s, &t, m, (double)c->param_bytes));
    }
    return LM_OK;
}

/* Elementwise and row ops: the output takes the layout of the first input's
 * materialization (whole rows for row ops); other activation inputs convert to it. */
static lm_status follow_one(lm__plan_planner *P, int u, const lm__plan_state *s, const lm__plan_layout *lx_in, int src,
                            beam *out) {
    const lm_graph *g = P->g;
    int op = P->units[u].op;
    const lm__gop *o = &g->ops[op];
    lm__plan_layout lx = *lx_in;
    lm__plan_trace t = trace_new(s->trace, u);
    int rows = lm__plan_is_rows(o->kind);
    if (rows && lx.grid[lx.ndim - 1] > 1) {
        lm__plan_layout_set_block(&lx, lx.ndim - 1, lx.dims[lx.ndim - 1]);
        lm__plan_layout_canon(&lx);
    }
    lm__plan_layout root;
    if (!lm__plan_view_chain_unmap(g, o->in[0], &lx, &root)) return LM_OK;
    t.req[0] = lm__plan_layout_id(P, &root);
    if (t.req[0] < 0) return LM_OUT_OF_MEMORY;
    if (src >= 0) {
        t.src[0] = src;
        t.cost += lm__plan_conv_cost(P, src, t.req[0]);
    } else {
        t.cost += best_source(P, s, o->in[0], t.req[0], &t.src[0]);
    }
    double added = 0;
    for (int i = 1; i < o->nin; i++) {
        lm__plan_layout li, r1;
        int narrow;
        if (!lm__plan_follow_input(g, o, i, &lx, &li, &narrow)) return LM_OK;
        if (narrow && is_param(g, o->in[i])) { /* a broadcast parameter (bias, scale, inv_freq): placed there */
            added += (double)lm__plan_layout_shard_bytes(&li) *
                     (double)(o->region >= 0 ? g->regions[o->region].count : 1);
            continue;
        }
        if (!lm__plan_view_chain_unmap(g, o->in[i], &li, &r1)) return LM_OK;
        t.req[i] = lm__plan_layout_id(P, &r1);
        if (t.req[i] < 0) return LM_OUT_OF_MEMORY;
        t.cost += best_source(P, s, o->in[i], t.req[i], &t.src[i]);
    }
    t.cost += lm__plan_cost_follow(P->m, o->kind, &lx);
    if (!isfinite(t.cost)) return LM_OK;
    /* its shards must fit beside the resident parameters (a row op over few tiles can
     * gather far more than a tile holds) */
    double work = (double)lm__plan_layout_shard_bytes(&lx) * 2;
    if (s->resident + added + work > (double)P->m->sram_bytes) {
        snprintf(P->reason, sizeof P->reason, "%s '%s': a %.0f-byte shard of its input and output beside %.0f bytes "
                 "of resident parameters does not fit %lld bytes of SRAM", lm__gop_name(o->kind), o->name, work / 2,
                 s->resident + added, (long long)P->m->sram_bytes);
        return LM_OK;
    }
    lx.dtype = g->values[o->out].dtype;
    t.out = lm__plan_layout_id(P, &lx);
    int32_t *m = mat_dup(P, s);
    if (!m || t.out < 0) {
        lm__free(m);
        return LM_OUT_OF_MEMORY;
    }
    for (int i = 0; i < o->nin; i++) {
        if (t.src[i] >= 0) mat_add(m + (size_t)g->values[o->in[i]].root * LM__PLAN_MAX_MAT, t.src[i]);
        if (t.req[i] >= 0) mat_add(m + (size_t)g->values[o->in[i]].root * LM__PLAN_MAX_MAT, t.req[i]);
    }
    mat_set(m + (size_t)o->out * LM__PLAN_MAX_MAT, t.out);
    return emit(P, out, s, &t, m, added);
}

static lm_status expand_follow(lm__plan_planner *P, int u, const lm__plan_state *s, beam *out) {
    const lm_graph *g = P->g;
    const lm__gop *o = &g->ops[P->units[u].op];
    const int32_t *m = mats(P, s, o->in[0]);
    int64_t before = out->n;
    for (int i = 0; i < LM__PLAN_MAX_MAT && m[i] >= 0; i++) {
        lm__plan_layout lx;
        if (!lm__plan_view_chain_map(g, o->in[0], &P->lay[m[i]], &lx)) continue;
        LM_TRY(follow_one(P, u, s, &lx, m[i], out));
    }
    if (out->n == before) { /* no materialization maps through the view: convert to a spread layout */
        lm__plan_layout lx;
        lm__plan_spread_layout(P, &g->values[o->in[0]], &lx);
        LM_TRY(follow_one(P, u, s, &lx, -1, out));
    }
    if (out->n == before)
        snprintf(P->reason, sizeof P->reason, "%s '%s': no layout of its input can be used",
                 lm__gop_name(o->kind), o->name);
    return LM_OK;
}

/* ---- nested searches -------------------------------------------------------------------------------- */
static lm_status search_range(lm__plan_planner *P, int ubegin, int uend, beam *cur, int width);

static lm_status nested(lm__plan_planner *P, int ubegin, int uend, const lm__plan_state *s, int width, beam *res,
                        int *marker) {
    lm__plan_trace mk = trace_new(s->trace, -1);
    LM_TRY(trace_push(P, &mk, marker));
    lm__plan_state st;
    LM_TRY(state_copy(P, s, &st));
    st.trace = *marker;
    memset(res, 0, sizeof *res);
    lm_status e = LM__PUSH(res->v, res->n, res->cap, st);
    if (e != LM_OK) {
        lm__free(st.mat);
        return e;
    }
    return search_range(P, ubegin, uend, res, width);
}

static lm_status expand_attn(lm__plan_planner *P, int u, const lm__plan_state *s, beam *out, int width) {
    const lm_graph *g = P->g;
    const lm__plan_unit *un = &P->units[u];
    lm__plan_attn a;
    if (!lm__plan_attn_of(g, un->op, &a)) return lm__error(LM_INTERNAL, "plan search: attention unit lost");
    int materialized = un->child_begin < un->next; /* the pattern's ops can also run one by one */
    if (P->opt.attention != LM_PLAN_ATTN_MATERIALIZED || !materialized) {
        int kv[2] = {a.kt, a.v};
        for (int k = 0; k < P->nflash[a.op]; k++) {
            const lm__plan_cand *c = &P->flash[a.op][k];
            lm__plan_trace t = trace_new(s->trace, u);
            t.choice = k;
            t.req[0] = lm__plan_layout_id(P, &c->in_root[0]);
            if (t.req[0] < 0) return LM_OUT_OF_MEMORY;
            t.cost = c->compute + c->reduce + best_source(P, s, a.q, t.req[0], &t.src[0]);
            int32_t kvm[2][LM__PLAN_MAX_MAT];
            for (int i = 0; i < 2; i++) {
                memcpy(kvm[i], mats(P, s, kv[i]), sizeof kvm[i]);
                if (kvm[i][0] < 0) { /* an unplaced input: spread its root */
                    lm__plan_layout l;
                    lm__plan_spread_layout(P, &g->values[g->values[kv[i]].root], &l);
                    kvm[i][0] = lm__plan_layout_id(P, &l);
                    if (kvm[i][0] < 0) return LM_OUT_OF_MEMORY;
                }
            }
            double best = INFINITY;
            for (int ka = 0; ka < LM__PLAN_MAX_MAT && kvm[0][ka] >= 0; ka++)
                for (int kb = 0; kb < LM__PLAN_MAX_MAT && kvm[1][kb] >= 0; kb++) {
                    double sc = lm__plan_flash_stream_cost(P, c, &a, kvm[0][ka], kvm[1][kb]);
                    if (sc < best) best = sc, t.src[1] = kvm[0][ka], t.src[2] = kvm[1][kb];
                }
            t.cost += best;
            if (!isfinite(t.cost)) continue;
            t.out = lm__plan_layout_id(P, &c->out);
            int32_t *m = mat_dup(P, s);
            if (!m || t.out < 0) {
                lm__free(m);
                return LM_OUT_OF_MEMORY;
            }
            mat_add(m + (size_t)g->values[a.q].root * LM__PLAN_MAX_MAT, t.src[0]);
            mat_add(m + (size_t)g->values[a.q].root * LM__PLAN_MAX_MAT, t.req[0]);
            for (int i = 0; i < 2; i++) mat_add(m + (size_t)g->values[kv[i]].root * LM__PLAN_MAX_MAT, t.src[1 + i]);
            mat_set(m + (size_t)a.out * LM__PLAN_MAX_MAT, t.out);
            LM_TRY(emit(P, out, s, &t, m, 0));
        }
    }
    if (P->opt.attention != LM_PLAN_ATTN_FLASH && materialized) {
        beam res;
        int marker;
        lm_status st = nested(P, un->child_begin, un->next, s, width, &res, &marker);
        if (st == LM_UNSUPPORTED && out->n) st = LM_OK; /* flash remains */
        for (int64_t i = 0; st == LM_OK && i < res.n; i++) {
            lm__plan_trace t = trace_new(s->trace, u);
            t.body = res.v[i].trace;
            t.start = marker;
            t.cost = res.v[i].cost - s->cost;
            int32_t *m = res.v[i].mat;
            res.v[i].mat = NULL;
            st = emit(P, out, s, &t, m, res.v[i].resident - s->resident);
        }
        beam_free(&res);
        LM_TRY(st);
    }
    return LM_OK;
}

static lm_status carry_options(lm__plan_planner *P, int v, int *ids, int *n) {
    const int32_t *r = P->req + (size_t)v * LM__PLAN_MAX_REQ;
    *n = 0;
    for (int i = 0; i < LM__PLAN_MAX_REQ && r[i] >= 0 && *n < 4; i++) {
        lm__plan_layout l;
        lm__plan_layout_strip_reps(&P->lay[r[i]], &l);
        int id = lm__plan_layout_id(P, &l);
        if (id < 0) return LM_OUT_OF_MEMORY;
        int dup = 0;
        for (int k = 0; k < *n; k++) dup |= ids[k] == id;
        if (!dup) ids[(*n)++] = id;
    }
    if (!*n) {
        lm__plan_layout l;
        lm__plan_spread_layout(P, &P->g->values[v], &l);
        ids[(*n)++] = lm__plan_layout_id(P, &l);
        if (ids[0] < 0) return LM_OUT_OF_MEMORY;
    }
    return LM_OK;
}

/* Cost of bringing value v (any of its materializations) into own-space layout L
 * of a carried value: conversion in v's root space plus the on-tile copy. */
static double carry_in_cost(lm__plan_planner *P, const lm__plan_state *s, int v, int lid, int *src, int *req) {
    lm__plan_layout L = P->lay[lid], root;
    *src = *req = -1;
    if (!lm__plan_view_chain_unmap(P->g, v, &L, &root)) return INFINITY;
    *req = lm__plan_layout_id(P, &root);
    if (*req < 0) return INFINITY;
    return best_source(P, s, v, *req, src) + lm__plan_cost_copy(P->m, lm__plan_layout_shard_bytes(&L));
}

static lm_status expand_repeat(lm__plan_planner *P, int u, const lm__plan_state *s, beam *out, int width) {
    const lm_graph *g = P->g;
    const lm__plan_unit *un = &P->units[u];
    const lm__gregion *r = &g->regions[un->region];
    int opts[LM__G_MAX_CARRY][4], nopt[LM__G_MAX_CARRY], pick[LM__G_MAX_CARRY] = {0};
    for (int c = 0; c < r->ncarry; c++) LM_TRY(carry_options(P, r->body_in[c], opts[c], &nopt[c]));
    for (;;) {
        lm__plan_trace t = trace_new(s->trace, u);
        double entry = 0;
        lm__plan_state in;
        LM_TRY(state_copy(P, s, &in));
        for (int c = 0; c < r->ncarry; c++) {
            int id = opts[c][pick[c]];
            t.carry[c] = id;
            int src, req;
            entry += carry_in_cost(P, s, r->outer_in[c], id, &src, &req);
            mat_set(in.mat + (size_t)r->body_in[c] * LM__PLAN_MAX_MAT, id);
        }
        beam res = {0};
        int marker = -1;
        lm_status st = isfinite(entry) ? nested(P, un->child_begin, un->next, &in, width, &res, &marker) : LM_OK;
        lm__free(in.mat);
        if (st == LM_UNSUPPORTED) st = LM_OK; /* this carry layout has no feasible body */
        int best = -1;
        double best_total = INFINITY;
        for (int64_t i = 0; st == LM_OK && i < res.n; i++) {
            double carry = 0;
            for (int c = 0; c < r->ncarry; c++) {
                int src, req;
                carry += carry_in_cost(P, &res.v[i], r->body_out[c], t.carry[c], &src, &req);
            }
            double total = res.v[i].cost - s->cost + carry;
            if (total < best_total) best_total = total, best = (int)i;
        }
        if (st == LM_OK && best >= 0 && isfinite(best_total)) {
            t.body = res.v[best].trace;
            t.start = marker;
            t.out = t.carry[0];
            t.cost = entry + (double)r->count * best_total;
            int32_t *m = mat_dup(P, s);
            if (!m) st = LM_OUT_OF_MEMORY;
            for (int c = 0; st == LM_OK && c < r->ncarry; c++)
                mat_set(m + (size_t)r->outer_out[c] * LM__PLAN_MAX_MAT, t.carry[c]);
            if (st == LM_OK) st = emit(P, out, s, &t, m, res.v[best].resident - s->resident);
        }
        beam_free(&res);
        LM_TRY(st);
        int c = 0;
        while (c < r->ncarry && ++pick[c] == nopt[c]) pick[c++] = 0;
        if (c == r->ncarry) break;
    }
    return LM_OK;
}

/* ---- the walk --------------------------------------------------------------------------------------- */
static int cmp_state(const void *a, const void *b) {
    const lm__plan_state *x = a, *y = b;
    if (x->cost != y->cost) return x->cost < y->cost ? -1 : 1;
    return (x->trace > y->trace) - (x->trace < y->trace);
}

/* Merges identical materializations (the cheaper survives unless it holds more
 * resident parameters) and keeps width states: the cheapest, plus two with less
 * resident memory than every kept one (in cost order) so that memory-hungry prefixes
 * cannot starve later ops. Beyond width, two more points of the rest's (cost,
 * resident) Pareto frontier: its lightest state and its middle one. Without them a
 * layer whose weights only fit unreplicated (a SigLIP encoder layer on ipu21) found no
 * plan: the two light states were always the first lighter ones in cost order, never
 * light enough for the MLP after the attention. */
/* 1 when a state kept before i (in cost order) has i's materializations with no more
 * resident memory. */
static int same_as_kept(const lm__plan_planner *P, const beam *b, int64_t i) {
    size_t mb = mat_bytes(P);
    for (int64_t j = 0; j < i; j++)
        if (b->v[j].keep == 1 && b->v[j].resident <= b->v[i].resident && !memcmp(b->v[j].mat, b->v[i].mat, mb))
            return 1;
    return 0;
}

static void prune(lm__plan_planner *P, beam *b, int width) {
    if (b->n > 1) qsort(b->v, (size_t)b->n, sizeof *b->v, cmp_state);
    int64_t k = 0;
    int light = width >= 4 ? 2 : 0;
    double lightest = INFINITY; /* least resident among the kept */
    for (int64_t i = 0; i < b->n; i++) {
        lm__plan_state *x = &b->v[i];
        x->keep = 0;
        if (same_as_kept(P, b, i)) continue;
        int keep = width <= 0 || k < width - light;
        if (!keep && k < width) keep = x->resident < lightest; /* a light state */
        if (keep) {
            x->keep = 1;
            k++;
            lightest = LM_MIN(lightest, x->resident);
        } else {
            x->keep = 2;
        }
    }
    int64_t nf = 0;
    if (width >= 4) {
        /* the rest's frontier in cost order: resident strictly falling below the kept */
        double below = lightest;
        for (int64_t i = 0; i < b->n; i++) {
            lm__plan_state *x = &b->v[i];
            if (x->keep != 2) continue;
            if (x->resident < below && !same_as_kept(P, b, i)) {
                below = x->resident;
                nf++;
            } else {
                x->keep = 0;
            }
        }
        /* keep its last (lightest) point and its middle one */
        int64_t seen = 0, mid = nf > 2 ? (nf - 1) / 2 : -1;
        for (int64_t i = 0; i < b->n; i++)
            if (b->v[i].keep == 2) {
                b->v[i].keep = seen == nf - 1 || seen == mid ? 1 : 0;
                seen++;
            }
    }
    int64_t out = 0;
    for (int64_t i = 0; i < b->n; i++) {
        if (b->v[i].keep != 1) {
            lm__free(b->v[i].mat);
            continue;
        }
        b->v[out++] = b->v[i];
    }
    b->n = out;
}

static lm_status expand(lm__plan_planner *P, int u, const lm__plan_state *s, beam *out, int width) {
    const lm__plan_unit *un = &P->units[u];
    if (un->kind == LM__PLAN_U_ATTN) return expand_attn(P, u, s, out, width);
    if (un->kind == LM__PLAN_U_REPEAT) return expand_repeat(P, u, s, out, width);
    const lm__gop *o = &P->g->ops[un->op];
    if (o->kind == LM__GOP_MATMUL) return expand_gemm(P, u, s, out);
    if (lm__plan_is_elementwise(o->kind) || lm__plan_is_rows(o->kind)) return expand_follow(P, u, s, out);
    return lm__error(LM_INTERNAL, "plan search: op '%s' (%s) has no planner", o->name, lm__gop_name(o->kind));
}

static lm_status search_range(lm__plan_planner *P, int ubegin, int uend, beam *cur, int width) {
    for (int u = ubegin; u < uend; u = P->units[u].next) {
        beam next = {0};
        lm_status st = LM_OK;
        for (int64_t i = 0; i < cur->n && st == LM_OK; i++) st = expand(P, u, &cur->v[i], &next, width);
        if (st == LM_OK) prune(P, &next, width);
        if (getenv("PLAN_DEBUG")) {
            double mr = 1e30, mc = 1e30;
            for (int64_t i = 0; i < next.n; i++) { if (next.v[i].resident < mr) mr = next.v[i].resident; if (next.v[i].cost < mc) mc = next.v[i].cost; }
            fprintf(stderr, "unit %d %s: %lld states, min resident %.0f, min cost %.0f\n", u, P->units[u].op >= 0 ? P->g->ops[P->units[u].op].name : "-", (long long)next.n, mr, mc);
        }
        if (st == LM_OK && width <= 0 && next.n > EXHAUSTIVE_LIMIT)
            st = lm__error(LM_UNSUPPORTED, "exhaustive plan search: more than %d distinct states (use beam search)",
                           EXHAUSTIVE_LIMIT);
        if (st == LM_OK && !next.n) {
            const lm__plan_unit *un = &P->units[u];
            const char *name = un->op >= 0 ? P->g->ops[un->op].name : "repeat";
            const char *why = un->op >= 0 ? P->op_reason + (size_t)un->op * LM__PLAN_REASON : "";
            if (!*why && un->kind == LM__PLAN_U_OP && lm__plan_is_elementwise(P->g->ops[un->op].kind))
                why = P->reason;
            st = *why ? lm__error(LM_UNSUPPORTED, "no feasible plan: %s", why)
                      : lm__error(LM_UNSUPPORTED, "no feasible plan for '%s' (every candidate was rejected)", name);
        }
        beam_free(cur);
        if (st != LM_OK) {
            beam_free(&next);
            return st;
        }
        *cur = next;
    }
    return LM_OK;
}

lm_status lm__plan_search(lm__plan_planner *P, int *best_trace, double *best_cost, int *finals, int *nfinals,
                          int max_finals) {
    beam cur = {0};
    lm__plan_state s0;
    s0.cost = 0;
    s0.resident = 0;
    s0.trace = -1;
    s0.mat = lm__alloc(mat_bytes(P), 16);
    if (!s0.mat) return LM_OUT_OF_MEMORY;
    for (size_t i = 0; i < (size_t)P->g->nvalues * LM__PLAN_MAX_MAT; i++) s0.mat[i] = -1;
    lm_status st = LM__PUSH(cur.v, cur.n, cur.cap, s0);
    if (st != LM_OK) {
        lm__free(s0.mat);
        return st;
    }
    int width = P->opt.exhaustive ? 0 : (P->opt.beam_width > 0 ? P->opt.beam_width : 8);
    st = search_range(P, 0, (int)P->nunits, &cur, width);
    if (st == LM_OK) {
        *best_trace = cur.v[0].trace;
        *best_cost = cur.v[0].cost;
        *nfinals = 0;
        for (int64_t i = 0; i < cur.n && *nfinals < max_finals; i++) finals[(*nfinals)++] = cur.v[i].trace;
    }
    beam_free(&cur);
    return st;
}
