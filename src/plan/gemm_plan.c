/* plan/gemm_plan.c — matmul candidates: partitions over batch/M/N/K and output
 * layouts, costed with the machine model.
 *
 * A grid (gb, gm, gn, gk) puts block (ib, im, in, ik) on tile ((ib*gm + im)*gn + in)*gk
 * + ik. The left operand block (ib, im, ik) is replicated over the gn tiles that need
 * it, the right block (ib, ik, in) over gm (and gb when weights are shared); with
 * gk > 1 each tile holds a partial sum and a Reduce adds the gk contributors into
 * the chosen output layout: reduce-scatter along N (gk | N block), along M (gn = 1,
 * gk | M block), to the first contributor, or a layout a consumer requested. All
 * grids are ranked by an analytic estimate (compute + operand exchange + reduction);
 * of opt.gemm_candidates kept (with exact reduction costs) three quarters are the
 * cheapest and one quarter the lightest in resident parameters. When no single pass
 * fits the SRAM, grids with serial K steps stream both operands' K blocks step by
 * step into an f32 accumulator (windowed redistribution from where they live).
 */
#include "plan/planner.h"

#include <stdlib.h>

typedef struct grid_est {
    int64_t g[4];  /* b, m, n, k */
    int64_t steps; /* serial K steps */
    double est;
    int64_t params; /* per-tile resident parameter bytes */
} grid_est;

static int cmp_est(const void *a, const void *b) {
    double x = ((const grid_est *)a)->est, y = ((const grid_est *)b)->est;
    return x < y ? -1 : x > y;
}

static int cmp_mem(const void *a, const void *b) {
    const grid_est *x = a, *y = b;
    if (x->params != y->params) return x->params < y->params ? -1 : 1;
    return cmp_est(a, b);
}

/* Split counts of X giving distinct block sizes, up to maxg. */
static int split_values(int64_t X, int64_t maxg, int64_t *out, int cap) {
    int n = 0;
    for (int64_t g = 1; g <= X && g <= maxg && n < cap; g++) {
        int64_t b = lm__plan_ceil_div(X, g);
        if (lm__plan_ceil_div(X, b) == g) out[n++] = g;
    }
    return n;
}

void lm__plan_spread_layout(const lm__plan_planner *P, const lm__gvalue *v, lm__plan_layout *l) {
    int64_t T = P->m->tiles;
    lm__plan_layout_init(l, v->ndim, v->dims, v->dtype);
    int64_t used = 1, stride[LM__PLAN_MAX_DIMS] = {0};
    int64_t g[LM__PLAN_MAX_DIMS];
    for (int d = 0; d < v->ndim; d++) {
        g[d] = 1;
        if (used * 2 <= T) {
            int64_t want = LM_MIN(v->dims[d], T / used);
            int64_t b = lm__plan_ceil_div(v->dims[d], want);
            g[d] = lm__plan_ceil_div(v->dims[d], b);
            used *= g[d];
        }
    }
    int64_t s = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= g[d];
    }
    for (int d = 0; d < v->ndim; d++) {
        lm__plan_layout_set_block(l, d, lm__plan_ceil_div(v->dims[d], g[d]));
        l->tstride[d] = stride[d];
    }
    lm__plan_layout_canon(l);
}

typedef struct gemm_shape {
    int batched, shared; /* a is [B,M,K]; b is [K,N] while a is batched */
    int64_t B, M, N, K;
    lm_dtype in_dt, out_dt, part_dt;
    int a_param, b_param;
    int64_t stack;  /* parameter copies (repeat count inside a body) */
    int can_stream; /* both operands are stored values (not views): K steps allowed */
} gemm_shape;

/* Ranking estimate of grid g with serial steps ns: kernel cycles, operand exchange
 * (all of both operands streamed per step when ns > 1; non-parameter operands once
 * otherwise) and the partial-sum reduction; *work / *params the per-tile bytes. */
static double estimate(const lm__plan_planner *P, const gemm_shape *s, const int64_t *g, int64_t ns, int64_t *work,
                       int64_t *params) {
    const lm_plan_machine *m = P->m;
    int64_t bb = lm__plan_ceil_div(s->B, g[0]), bm = lm__plan_ceil_div(s->M, g[1]), bn = lm__plan_ceil_div(s->N, g[2]),
            bk = lm__plan_ceil_div(s->K, g[3] * ns);
    int64_t es = (int64_t)lm_dtype_size(s->in_dt), ps = (int64_t)lm_dtype_size(ns > 1 ? LM_F32 : s->part_dt),
            os = (int64_t)lm_dtype_size(s->out_dt);
    double c = (double)ns * lm__plan_cost_matmul(m, s->in_dt, bb, bm, bn, bk);
    int64_t a_bytes = bb * bm * bk * es, b_bytes = (s->shared ? 1 : bb) * bk * bn * es;
    double moved =
        ns > 1 ? (double)(a_bytes + b_bytes) : (s->a_param ? 0 : (double)a_bytes) + (s->b_param ? 0 : (double)b_bytes);
    if (moved > 0) c += (double)ns * ((double)m->sync_cycles + moved / m->exch_bytes_per_cycle);
    int64_t part = g[3] > 1 || ns > 1 ? bb * bm * bn : 0, gather = 0;
    if (g[3] > 1) {
        /* reduce-scatter when a block splits evenly over the contributors, else all
         * contributors send their partial block to the first one */
        int scatter = bn % g[3] == 0 || (g[2] == 1 && bm % g[3] == 0);
        double recv = (double)(part * ps) * (double)(g[3] - 1) / (double)(scatter ? g[3] : 1);
        gather = (int64_t)recv;
        c += (double)m->sync_cycles + recv / m->exch_bytes_per_cycle + (double)((g[3] - 1) * m->msg_cycles);
        int64_t out_elems = scatter ? part / g[3] : part;
        c += lm__plan_cost_reduce(m, ns > 1 ? LM_F32 : s->part_dt, s->out_dt, out_elems, out_elems * (g[3] - 1));
    } else if (ns > 1) {
        c += lm__plan_cost_reduce(m, LM_F32, s->out_dt, part, 0); /* accumulator -> output dtype */
    }
    if (ns > 1) { /* resident parameters are spread, not replicated */
        int64_t spread = lm__plan_ceil_div(s->K * s->N * es, m->tiles);
        *params =
            ((s->a_param ? lm__plan_ceil_div(s->B * s->M * s->K * es, m->tiles) : 0) + (s->b_param ? spread : 0)) *
            s->stack;
        *work = a_bytes + b_bytes + part * ps + bb * bm * bn * os + gather;
        return c;
    }
    *params = ((s->a_param ? a_bytes : 0) + (s->b_param ? b_bytes : 0)) * s->stack;
    *work = (s->a_param ? 0 : a_bytes) + (s->b_param ? 0 : b_bytes) + part * ps + bb * bm * bn * os + gather;
    return c;
}

/* Operand and output layouts of grid g (tile0 = 0). */
static void grid_layouts(const gemm_shape *s, const int64_t *g, const lm__gvalue *va, const lm__gvalue *vb,
                         const lm__gvalue *vo, lm__plan_layout *A, lm__plan_layout *Bl, lm__plan_layout *C) {
    int64_t Sk = 1, Sn = g[3], Sm = g[2] * g[3], Sb = g[1] * g[2] * g[3];
    int64_t bb = lm__plan_ceil_div(s->B, g[0]), bm = lm__plan_ceil_div(s->M, g[1]), bn = lm__plan_ceil_div(s->N, g[2]),
            bk = lm__plan_ceil_div(s->K, g[3]);
    int o = s->batched;
    lm__plan_layout_init(A, va->ndim, va->dims, va->dtype);
    lm__plan_layout_init(Bl, vb->ndim, vb->dims, vb->dtype);
    lm__plan_layout_init(C, vo->ndim, vo->dims, vo->dtype);
    if (s->batched) {
        lm__plan_layout_set_block(A, 0, bb);
        A->tstride[0] = Sb;
        lm__plan_layout_set_block(C, 0, bb);
        C->tstride[0] = Sb;
    }
    lm__plan_layout_set_block(A, o, bm);
    A->tstride[o] = Sm;
    lm__plan_layout_set_block(A, o + 1, bk);
    A->tstride[o + 1] = Sk;
    lm__plan_layout_add_rep(A, g[2], Sn);
    int ob = vb->ndim - 2;
    if (ob) {
        lm__plan_layout_set_block(Bl, 0, bb);
        Bl->tstride[0] = Sb;
    }
    lm__plan_layout_set_block(Bl, ob, bk);
    Bl->tstride[ob] = Sk;
    lm__plan_layout_set_block(Bl, ob + 1, bn);
    Bl->tstride[ob + 1] = Sn;
    lm__plan_layout_add_rep(Bl, (s->shared ? g[0] : 1) * g[1], Sm);
    lm__plan_layout_set_block(C, o, bm);
    C->tstride[o] = Sm;
    lm__plan_layout_set_block(C, o + 1, bn);
    C->tstride[o + 1] = Sn;
    lm__plan_layout_canon(A);
    lm__plan_layout_canon(Bl);
    lm__plan_layout_canon(C);
}

static lm_status add_cand(lm__plan_cand **arr, int *n, int64_t *cap, const lm__plan_cand *c) {
    return LM__PUSH(*arr, *n, *cap, *c);
}

/* Candidates for one grid: every output option. */
static lm_status grid_candidates(lm__plan_planner *P, int op, const gemm_shape *s, const grid_est *ge,
                                 lm__plan_cand **arr, int *n, int64_t *cap) {
    const lm_graph *g = P->g;
    const lm__gop *o = &g->ops[op];
    const lm__gvalue *va = &g->values[o->in[0]], *vb = &g->values[o->in[1]], *vo = &g->values[o->out];
    lm__plan_cand c;
    memset(&c, 0, sizeof c);
    c.kind = LM__PLAN_C_GEMM;
    c.nin = 2;
    c.steps = ge->steps;
    for (int i = 0; i < 4; i++) c.grid[i] = ge->g[i];
    lm__plan_layout C;
    int64_t ns = ge->steps;
    int64_t bb = lm__plan_ceil_div(s->B, ge->g[0]), bm = lm__plan_ceil_div(s->M, ge->g[1]),
            bn = lm__plan_ceil_div(s->N, ge->g[2]), bk = lm__plan_ceil_div(s->K, ge->g[3] * ns);
    grid_layouts(s, ge->g, va, vb, vo, &c.in_view[0], &c.in_view[1], &C);
    int64_t es = (int64_t)lm_dtype_size(s->in_dt);
    int64_t a_bytes = bb * bm * bk * es, b_bytes = (s->shared ? 1 : bb) * bk * bn * es;
    int64_t stack = o->region >= 0 ? g->regions[o->region].count : 1;
    int64_t base_work;
    for (int i = 0; i < 2; i++) c.in_param[i] = i ? s->b_param : s->a_param;
    if (ns > 1) {
        /* step layouts: K in gk*ns blocks, step 0 on the grid's tiles; parameters stay
         * spread over the machine (no replication) and stream like activations */
        for (int i = 0; i < 2; i++) {
            c.step[i] = c.in_view[i];
            int kd = i ? vb->ndim - 2 : va->ndim - 1;
            lm__plan_layout_set_block(&c.step[i], kd, bk);
            c.step[i].tstride[kd] = 1;
            lm__plan_layout_canon(&c.step[i]);
            if (c.in_param[i]) lm__plan_spread_layout(P, i ? vb : va, &c.in_root[i]);
        }
        base_work = a_bytes + b_bytes;
        c.param_bytes = ((c.in_param[0] ? lm__plan_layout_shard_bytes(&c.in_root[0]) : 0) +
                         (c.in_param[1] ? lm__plan_layout_shard_bytes(&c.in_root[1]) : 0)) *
                        stack;
    } else {
        for (int i = 0; i < 2; i++)
            if (!lm__plan_view_chain_unmap(g, o->in[i], &c.in_view[i], &c.in_root[i])) return LM_OK;
        base_work = (s->a_param ? 0 : a_bytes) + (s->b_param ? 0 : b_bytes);
        c.param_bytes = ((s->a_param ? a_bytes : 0) + (s->b_param ? b_bytes : 0)) * stack;
    }
    c.compute = (double)ns * lm__plan_cost_matmul(P->m, s->in_dt, bb, bm, bn, bk);
    c.estimate = ge->est;
    int64_t gk = ge->g[3];
    if (ns > 1 && gk == 1) { /* f32 accumulator converted into the output */
        c.has_partial = 1;
        c.partial = C;
        c.partial.dtype = LM_F32;
        c.out = C;
        c.reduce = lm__plan_cost_redist(P->m, &c.partial, &c.out, &P->ws, NULL);
        c.work_bytes = base_work + lm__plan_layout_shard_bytes(&c.partial) + lm__plan_layout_shard_bytes(&C);
        return c.work_bytes + c.param_bytes > P->m->sram_bytes ? LM_OK : add_cand(arr, n, cap, &c);
    }
    if (gk == 1) {
        c.out = C;
        c.work_bytes = base_work + lm__plan_layout_shard_bytes(&C);
        return add_cand(arr, n, cap, &c);
    }
    c.has_partial = 1;
    c.partial = C;
    c.partial.dtype = ns > 1 ? LM_F32 : s->part_dt;
    lm__plan_layout_add_rep(&c.partial, gk, 1);
    c.partial.partial = 1;
    lm__plan_layout_canon(&c.partial);
    lm__plan_layout outs[3 + LM__PLAN_MAX_REQ];
    int nout = 0;
    outs[nout++] = C; /* owner: the first contributor */
    int o_ = s->batched;
    if (bn % gk == 0) {
        lm__plan_layout sc = C;
        lm__plan_layout_set_block(&sc, o_ + 1, bn / gk);
        sc.tstride[o_ + 1] = 1;
        lm__plan_layout_canon(&sc);
        outs[nout++] = sc;
    }
    if (ge->g[2] == 1 && bm % gk == 0) {
        lm__plan_layout sc = C;
        lm__plan_layout_set_block(&sc, o_, bm / gk);
        sc.tstride[o_] = 1;
        lm__plan_layout_canon(&sc);
        outs[nout++] = sc;
    }
    const int32_t *r = P->req + (size_t)o->out * LM__PLAN_MAX_REQ;
    for (int i = 0; i < LM__PLAN_MAX_REQ && r[i] >= 0; i++) {
        const lm__plan_layout *l = &P->lay[r[i]];
        if (!l->partial && l->dtype == vo->dtype) outs[nout++] = *l;
    }
    int64_t part_bytes = lm__plan_layout_shard_bytes(&c.partial);
    for (int k = 0; k < nout; k++) {
        int dup = 0;
        for (int j = 0; j < k; j++) dup |= lm__plan_layout_equal(&outs[j], &outs[k]);
        if (dup || !lm__plan_layout_valid(&outs[k], P->m->tiles)) continue;
        c.out = outs[k];
        lm__plan_xcost x;
        c.reduce = lm__plan_cost_redist(P->m, &c.partial, &c.out, &P->ws, &x);
        P->costed++;
        /* the reduction's gather buffer holds every remote contributor's piece */
        c.work_bytes = base_work + part_bytes + lm__plan_layout_shard_bytes(&c.out) + x.max_recv;
        if (c.work_bytes + c.param_bytes > P->m->sram_bytes) continue;
        LM_TRY(add_cand(arr, n, cap, &c));
    }
    return LM_OK;
}

lm_status lm__plan_gemm_candidates(lm__plan_planner *P, int op) {
    const lm_graph *g = P->g;
    const lm__gop *o = &g->ops[op];
    const lm__gvalue *va = &g->values[o->in[0]], *vb = &g->values[o->in[1]], *vo = &g->values[o->out];
    lm__free(P->cands[op]);
    P->cands[op] = NULL;
    P->ncands[op] = 0;
    gemm_shape s;
    s.batched = va->ndim == 3;
    s.shared = s.batched && vb->ndim == 2;
    s.B = s.batched ? va->dims[0] : 1;
    s.M = va->dims[va->ndim - 2];
    s.K = va->dims[va->ndim - 1];
    s.N = vb->dims[vb->ndim - 1];
    s.in_dt = va->dtype;
    s.out_dt = vo->dtype;
    s.part_dt = (P->opt.partials == LM_F16 && vo->dtype == LM_F16) ? LM_F16 : LM_F32;
    s.a_param = g->ops[g->values[va->root].op].kind == LM__GOP_PARAM;
    s.b_param = g->ops[g->values[vb->root].op].kind == LM__GOP_PARAM;
    s.stack = o->region >= 0 ? g->regions[o->region].count : 1;
    s.can_stream = va->root == o->in[0] && vb->root == o->in[1];
    int64_t T = P->m->tiles;
    int64_t sb[256], sm[256], sn[256], sk[256];
    int nb = split_values(s.B, T, sb, 256), nm = split_values(s.M, T, sm, 256), nn = split_values(s.N, T, sn, 256),
        nk = split_values(s.K, T, sk, 256);
    grid_est *all = NULL;
    int64_t nall = 0, capall = 0;
    int64_t best_work = INT64_MAX;
    lm_status st = LM_OK;
    const int64_t *fg = P->opt.gemm_grid;
    /* single-pass grids first; serial K steps (streamed operands) only when no
     * single pass fits, as they cost a sync and a full operand exchange per step */
    for (int pass = 0; pass < 2 && st == LM_OK && !nall; pass++)
        for (int ib = 0; ib < nb && st == LM_OK; ib++)
            for (int im = 0; im < nm && st == LM_OK; im++) {
                if (sb[ib] * sm[im] > T) break;
                if (fg[0] && sm[im] != fg[0]) continue;
                for (int in = 0; in < nn && st == LM_OK; in++) {
                    if (sb[ib] * sm[im] * sn[in] > T) break;
                    if (fg[1] && sn[in] != fg[1]) continue;
                    for (int ik = 0; ik < nk && st == LM_OK; ik++) {
                        if (sb[ib] * sm[im] * sn[in] * sk[ik] > T) break;
                        if (fg[2] && sk[ik] != fg[2]) continue;
                        for (int64_t ns = pass ? 2 : 1; ns <= (pass ? 64 : 1) && sk[ik] * ns <= s.K && st == LM_OK;
                             ns *= 2) {
                            if (ns > 1 && !s.can_stream) break;
                            grid_est e = {{sb[ib], sm[im], sn[in], sk[ik]}, ns, 0, 0};
                            int64_t work;
                            e.est = estimate(P, &s, e.g, ns, &work, &e.params);
                            work += e.params;
                            if (work < best_work) best_work = work;
                            if (work > P->m->sram_bytes) continue;
                            st = LM__PUSH(all, nall, capall, e);
                        }
                    }
                }
            }
    if (st != LM_OK) {
        lm__free(all);
        return st;
    }
    char *why = P->op_reason + (size_t)op * LM__PLAN_REASON;
    why[0] = 0;
    if (!nall) {
        lm__free(all);
        if (fg[0] || fg[1] || fg[2])
            snprintf(why, LM__PLAN_REASON,
                     "matmul '%s': the forced grid %lldx%lldx%lld is not a valid partition within %lld tiles or "
                     "does not fit %lld bytes of SRAM per tile",
                     o->name, (long long)fg[0], (long long)fg[1], (long long)fg[2], (long long)T,
                     (long long)P->m->sram_bytes);
        else
            snprintf(why, LM__PLAN_REASON,
                     "matmul '%s': no partition fits %lld bytes of SRAM per tile (smallest working set %lld bytes)",
                     o->name, (long long)P->m->sram_bytes, (long long)best_work);
        return LM_OK;
    }
    /* three quarters of the kept grids are the cheapest, one quarter the lightest in
     * resident parameters (so later ops and repeated bodies still find room) */
    qsort(all, (size_t)nall, sizeof *all, cmp_est);
    int keep = P->opt.gemm_candidates > 0 ? P->opt.gemm_candidates : 48;
    int64_t by_cost = keep - keep / 4;
    if (nall > by_cost) qsort(all + by_cost, (size_t)(nall - by_cost), sizeof *all, cmp_mem);
    lm__plan_cand *arr = NULL;
    int n = 0;
    int64_t cap = 0;
    for (int64_t i = 0; i < nall && i < keep && st == LM_OK; i++)
        st = grid_candidates(P, op, &s, &all[i], &arr, &n, &cap);
    lm__free(all);
    if (st != LM_OK) {
        lm__free(arr);
        return st;
    }
    P->cands[op] = arr;
    P->ncands[op] = n;
    return LM_OK;
}

void lm__plan_gemm_step_layout(const lm__plan_cand *c, int operand, int64_t s, lm__plan_layout *l,
                               lm__plan_window *win) {
    *l = c->step[operand];
    int kd = operand ? l->ndim - 2 : l->ndim - 1;
    l->tile0 -= s * c->grid[3] * l->tstride[kd];
    win->dim = kd;
    win->lo = s * c->grid[3];
    win->hi = (s + 1) * c->grid[3];
}

double lm__plan_gemm_stream_cost(lm__plan_planner *P, int op, const lm__plan_cand *c, int a_id, int b_id) {
    uint64_t key = 0x5eedULL;
    int64_t parts[4] = {op, c - P->cands[op], a_id, b_id};
    for (int i = 0; i < 4; i++) key = (key ^ (uint64_t)parts[i]) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
    key |= 1ULL << 63;
    double total;
    if (lm__plan_memo_get(P, key, &total)) return total;
    total = 0;
    int ids[2] = {a_id, b_id};
    for (int64_t s = 0; s < c->steps; s++) {
        lm__plan_redist_clear(&P->ws);
        for (int i = 0; i < 2; i++) {
            lm__plan_layout dst;
            lm__plan_window win;
            lm__plan_gemm_step_layout(c, i, s, &dst, &win);
            lm__plan_redist_accumulate(&P->lay[ids[i]], &dst, &win, &P->ws);
        }
        lm__plan_xcost x;
        lm__plan_redist_summary(&P->ws, 0, 0, &x);
        total += lm__plan_cost_exchange(P->m, &x) + lm__plan_cost_copy(P->m, x.max_local);
    }
    P->costed++;
    lm__plan_memo_put(P, key, total);
    return total;
}
