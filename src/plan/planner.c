/* plan/planner.c — planner setup: layout interning, memoized conversion costs,
 * consumer layout requests and the search units.
 *
 * Inputs and parameters need no decision of their own: each is placed, for free,
 * where its first consumer wants it (inputs without replicas). Requests flow
 * backwards: ops are visited in reverse order, so every consumer has stated the
 * layouts it wants (through views, elementwise followers and Repeat carries, all
 * unmapped into root space) before its producer's candidates are made;
 * a second pass lets carried values see requests from the top of their body.
 * Conversion costs are memoized per (source, destination) layout pair: O(tiles)
 * to compute, O(1) to reuse.
 */
#include "plan/planner.h"

#include <stdio.h>

int lm__plan_is_elementwise(lm__gopk k) { return lm__gop_is_elementwise(k) || k == LM__GOP_SWIGLU; }
int lm__plan_is_rows(lm__gopk k) { return lm__gop_is_rows(k) || k == LM__GOP_ROPE; }

int lm__plan_follow_input(const lm_graph *g, const lm__gop *o, int i, const lm__plan_layout *lx,
                          lm__plan_layout *l, int *narrow) {
    const lm__gvalue *v = &g->values[o->in[i]];
    *narrow = v->ndim != lx->ndim;
    if (!*narrow) {
        *l = *lx;
        l->dtype = v->dtype;
        return 1;
    }
    int d0 = o->kind == LM__GOP_ROPE && i == 1 ? 0 : lx->ndim - v->ndim;
    return lm__plan_layout_project(lx, d0, v->ndim, v->dims, v->dtype, l);
}

static lm_status grow_index(lm__plan_planner *P) {
    int64_t cap = P->lay_hcap ? P->lay_hcap * 2 : 1024;
    int32_t *idx = lm__alloc(sizeof(int32_t) * (size_t)cap, 64);
    if (!idx) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < cap; i++) idx[i] = -1;
    for (int64_t id = 0; id < P->nlay; id++) {
        uint64_t h = lm__plan_layout_hash(&P->lay[id]) & (uint64_t)(cap - 1);
        while (idx[h] >= 0) h = (h + 1) & (uint64_t)(cap - 1);
        idx[h] = (int32_t)id;
    }
    lm__free(P->lay_index);
    P->lay_index = idx;
    P->lay_hcap = cap;
    return LM_OK;
}

int lm__plan_layout_id(lm__plan_planner *P, const lm__plan_layout *l) {
    if (P->lay_hcap) {
        uint64_t h = lm__plan_layout_hash(l) & (uint64_t)(P->lay_hcap - 1);
        while (P->lay_index[h] >= 0) {
            if (lm__plan_layout_equal(&P->lay[P->lay_index[h]], l)) return P->lay_index[h];
            h = (h + 1) & (uint64_t)(P->lay_hcap - 1);
        }
    }
    if ((P->nlay + 1) * 2 > P->lay_hcap && grow_index(P) != LM_OK) return -1;
    if (LM__PUSH(P->lay, P->nlay, P->cap_lay, *l) != LM_OK) return -1;
    uint64_t h = lm__plan_layout_hash(l) & (uint64_t)(P->lay_hcap - 1);
    while (P->lay_index[h] >= 0) h = (h + 1) & (uint64_t)(P->lay_hcap - 1);
    P->lay_index[h] = (int32_t)(P->nlay - 1);
    return (int)(P->nlay - 1);
}

static lm_status grow_memo(lm__plan_planner *P) {
    int64_t cap = P->memo_cap ? P->memo_cap * 2 : 4096;
    uint64_t *k = lm__calloc((size_t)cap, sizeof *k);
    double *v = lm__alloc(sizeof(double) * (size_t)cap, 64);
    if (!k || !v) {
        lm__free(k);
        lm__free(v);
        return LM_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < P->memo_cap; i++) {
        if (!P->memo_key[i]) continue;
        uint64_t h = (P->memo_key[i] * 0x9e3779b97f4a7c15ULL) >> 17 & (uint64_t)(cap - 1);
        while (k[h]) h = (h + 1) & (uint64_t)(cap - 1);
        k[h] = P->memo_key[i];
        v[h] = P->memo_val[i];
    }
    lm__free(P->memo_key);
    lm__free(P->memo_val);
    P->memo_key = k;
    P->memo_val = v;
    P->memo_cap = cap;
    return LM_OK;
}

int lm__plan_memo_get(const lm__plan_planner *P, uint64_t key, double *val) {
    if (!P->memo_cap) return 0;
    uint64_t h = (key * 0x9e3779b97f4a7c15ULL) >> 17 & (uint64_t)(P->memo_cap - 1);
    while (P->memo_key[h]) {
        if (P->memo_key[h] == key) {
            *val = P->memo_val[h];
            return 1;
        }
        h = (h + 1) & (uint64_t)(P->memo_cap - 1);
    }
    return 0;
}

void lm__plan_memo_put(lm__plan_planner *P, uint64_t key, double val) {
    if ((P->memo_n + 1) * 2 > P->memo_cap && grow_memo(P) != LM_OK) return; /* just not memoized */
    uint64_t h = (key * 0x9e3779b97f4a7c15ULL) >> 17 & (uint64_t)(P->memo_cap - 1);
    while (P->memo_key[h]) h = (h + 1) & (uint64_t)(P->memo_cap - 1);
    P->memo_key[h] = key;
    P->memo_val[h] = val;
    P->memo_n++;
}

double lm__plan_conv_cost(lm__plan_planner *P, int s, int d) {
    if (s == d) return 0;
    uint64_t key = ((uint64_t)(uint32_t)(s + 1) << 32) | (uint32_t)(d + 1);
    double c;
    if (lm__plan_memo_get(P, key, &c)) return c;
    c = lm__plan_cost_redist(P->m, &P->lay[s], &P->lay[d], &P->ws, NULL);
    P->costed++;
    lm__plan_memo_put(P, key, c);
    return c;
}

void lm__plan_request(lm__plan_planner *P, int v, int id) {
    if (id < 0) return;
    int32_t *r = P->req + (size_t)v * LM__PLAN_MAX_REQ;
    for (int i = 0; i < LM__PLAN_MAX_REQ; i++) {
        if (r[i] == id) return;
        if (r[i] < 0) {
            r[i] = id;
            return;
        }
    }
}

/* Requests of out (own space) passed to the root of in through in's view chain. */
static void forward_requests(lm__plan_planner *P, int from, int to, int need_rows) {
    const int32_t *r = P->req + (size_t)from * LM__PLAN_MAX_REQ;
    for (int i = 0; i < LM__PLAN_MAX_REQ && r[i] >= 0; i++) {
        lm__plan_layout l = P->lay[r[i]], root;
        if (need_rows && l.grid[l.ndim - 1] > 1) continue;
        if (l.partial) continue;
        if (!lm__plan_view_chain_unmap(P->g, to, &l, &root)) continue;
        lm__plan_request(P, P->g->values[to].root, lm__plan_layout_id(P, &root));
    }
}

/* Requests of the consumers of op's inputs, from its best few candidates. */
static void request_inputs(lm__plan_planner *P, int op, const lm__plan_cand *c, int n) {
    const lm__gop *o = &P->g->ops[op];
    for (int k = 0; k < n && k < 8; k++)
        for (int i = 0; i < c[k].nin && i < o->nin && c[k].steps <= 1; i++)
            if (!c[k].in_param[i])
                lm__plan_request(P, P->g->values[o->in[i]].root, lm__plan_layout_id(P, &c[k].in_root[i]));
}

/* Flash candidates of attention a; their query layouts are requested of q's producer. */
static lm_status flash_requests(lm__plan_planner *P, const lm__plan_attn *a) {
    LM_TRY(lm__plan_flash_candidates(P, a));
    for (int k = 0; k < P->nflash[a->op] && k < 8; k++)
        lm__plan_request(P, P->g->values[a->q].root, lm__plan_layout_id(P, &P->flash[a->op][k].in_root[0]));
    return LM_OK;
}

static lm_status candidates_pass(lm__plan_planner *P) {
    const lm_graph *g = P->g;
    for (int64_t i = g->nops - 1; i >= 0; i--) {
        const lm__gop *op = &g->ops[i];
        lm__plan_attn a;
        switch (op->kind) {
        case LM__GOP_MATMUL:
            if (P->opt.attention != LM_PLAN_ATTN_MATERIALIZED && lm__plan_attn_of(g, (int)i, &a))
                LM_TRY(flash_requests(P, &a));
            LM_TRY(lm__plan_gemm_candidates(P, (int)i));
            request_inputs(P, (int)i, P->cands[i], P->ncands[i]);
            break;
        case LM__GOP_ATTENTION:
            if (lm__plan_attn_of(g, (int)i, &a)) LM_TRY(flash_requests(P, &a));
            break;
        case LM__GOP_BIAS_ADD:
        case LM__GOP_GELU:
        case LM__GOP_SILU:
        case LM__GOP_ADD:
        case LM__GOP_MUL:
        case LM__GOP_SWIGLU:
            forward_requests(P, op->out, op->in[0], 0);
            if (op->nin > 1 && op->kind != LM__GOP_BIAS_ADD) forward_requests(P, op->out, op->in[1], 0);
            break;
        case LM__GOP_SOFTMAX:
        case LM__GOP_LAYERNORM:
        case LM__GOP_RMSNORM:
        case LM__GOP_ROPE: forward_requests(P, op->out, op->in[0], 1); break;
        case LM__GOP_REPEAT_OUT: forward_requests(P, op->out, op->in[0], 0); break;
        case LM__GOP_REPEAT_IN: {
            const lm__gregion *r = &g->regions[op->region];
            forward_requests(P, op->out, op->in[0], 0);
            for (int c = 0; c < r->ncarry; c++)
                if (r->body_in[c] == op->out) forward_requests(P, op->out, r->body_out[c], 0);
            break;
        }
        default: break;
        }
    }
    return LM_OK;
}

/* ---- units ------------------------------------------------------------------------------------------ */
static lm_status push_unit(lm__plan_planner *P, lm__plan_unit u, int64_t *index) {
    *index = P->nunits;
    return LM__PUSH(P->units, P->nunits, P->cap_units, u);
}

static lm_status build_units(lm__plan_planner *P, int begin, int end, int region) {
    const lm_graph *g = P->g;
    for (int i = begin; i < end;) {
        const lm__gop *op = &g->ops[i];
        if (op->region != region) { /* a nested region starts here */
            const lm__gregion *r = &g->regions[op->region];
            int64_t u;
            LM_TRY(push_unit(P, (lm__plan_unit){LM__PLAN_U_REPEAT, -1, op->region, 0, 0}, &u));
            P->units[u].child_begin = (int)P->nunits;
            LM_TRY(build_units(P, r->begin, r->end, op->region));
            P->units[u].next = (int)P->nunits;
            i = r->end;
            continue;
        }
        int ops3[3];
        if (op->kind == LM__GOP_PARAM || op->kind == LM__GOP_INPUT || lm__gop_is_view(op->kind) ||
            op->kind == LM__GOP_REPEAT_IN || op->kind == LM__GOP_REPEAT_OUT) {
            i++;
            continue;
        }
        if (op->kind == LM__GOP_MATMUL && P->nflash[i] > 0 && lm__plan_attention_match(g, i, ops3)) {
            int64_t u;
            LM_TRY(push_unit(P, (lm__plan_unit){LM__PLAN_U_ATTN, i, -1, 0, 0}, &u));
            P->units[u].child_begin = (int)P->nunits;
            for (int k = 0; k < 3; k++) {
                int64_t c;
                LM_TRY(push_unit(P, (lm__plan_unit){LM__PLAN_U_OP, ops3[k], -1, 0, 0}, &c));
                P->units[c].next = (int)c + 1;
            }
            P->units[u].next = (int)P->nunits;
            i = ops3[2] + 1;
            continue;
        }
        int64_t u;
        /* the attention op: a flash unit with no op-by-op alternative (no children) */
        lm__plan_uk kind = op->kind == LM__GOP_ATTENTION ? LM__PLAN_U_ATTN : LM__PLAN_U_OP;
        LM_TRY(push_unit(P, (lm__plan_unit){kind, i, -1, 0, 0}, &u));
        P->units[u].child_begin = P->units[u].next = (int)u + 1;
        i++;
    }
    return LM_OK;
}

lm_status lm__plan_planner_init(lm__plan_planner *P, const lm_graph *g, const lm_plan_machine *m,
                                const lm_plan_options *o) {
    memset(P, 0, sizeof *P);
    P->g = g;
    P->m = m;
    P->opt = *o;
    LM_TRY(lm__plan_ws_init(&P->ws, m->tiles));
    int64_t nops = g->nops, nv = g->nvalues;
    P->cands = lm__calloc((size_t)nops, sizeof *P->cands);
    P->ncands = lm__calloc((size_t)nops, sizeof *P->ncands);
    P->flash = lm__calloc((size_t)nops, sizeof *P->flash);
    P->nflash = lm__calloc((size_t)nops, sizeof *P->nflash);
    P->req = lm__alloc(sizeof(int32_t) * LM__PLAN_MAX_REQ * (size_t)nv, 64);
    P->op_reason = lm__calloc((size_t)nops + 1, LM__PLAN_REASON);
    if (!P->cands || !P->ncands || !P->flash || !P->nflash || !P->req || !P->op_reason) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < nv * LM__PLAN_MAX_REQ; i++) P->req[i] = -1;
    for (int pass = 0; pass < 2; pass++) LM_TRY(candidates_pass(P));
    LM_TRY(build_units(P, 0, (int)nops, -1));
    return LM_OK;
}

void lm__plan_planner_free(lm__plan_planner *P) {
    if (P->cands)
        for (int64_t i = 0; i < P->g->nops; i++) lm__free(P->cands[i]);
    if (P->flash)
        for (int64_t i = 0; i < P->g->nops; i++) lm__free(P->flash[i]);
    lm__free(P->cands);
    lm__free(P->ncands);
    lm__free(P->flash);
    lm__free(P->nflash);
    lm__free(P->req);
    lm__free(P->op_reason);
    lm__free(P->lay);
    lm__free(P->lay_index);
    lm__free(P->memo_key);
    lm__free(P->memo_val);
    lm__free(P->units);
    lm__free(P->trace);
    lm__plan_ws_free(&P->ws);
    memset(P, 0, sizeof *P);
}

int64_t lm__plan_planner_bytes(const lm__plan_planner *P) {
    int64_t b = P->cap_lay * (int64_t)sizeof(lm__plan_layout) + P->lay_hcap * 4 + P->memo_cap * 16 +
                P->cap_trace * (int64_t)sizeof(lm__plan_trace) + P->cap_units * (int64_t)sizeof(lm__plan_unit) +
                P->ws.tiles * 48 + P->g->nvalues * LM__PLAN_MAX_REQ * 4;
    for (int64_t i = 0; i < P->g->nops; i++)
        b += (int64_t)(P->ncands[i] + P->nflash[i]) * (int64_t)sizeof(lm__plan_cand);
    return b;
}
