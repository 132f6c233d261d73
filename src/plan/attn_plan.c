/* plan/attn_plan.c — flash attention candidates: the score matmul, softmax and value
 * matmul fused; queries stay on their tiles while K/V blocks stream in steps.
 *
 * Grid (gh, gq, gkv, steps): tile ((ih*gq + iq)*gkv + ikv) owns query block (ih, iq)
 * and, at step s, kv block s*gkv + ikv (interleaved so each step's blocks form an
 * affine window). A step is one exchange (K and V pieces, multicast to the gq query
 * tiles of a head block) and one compute phase (scores, online-softmax update,
 * P*V accumulate); no T x T matrix ever exists. With gkv > 1 the kv-split partial
 * states (m, l, O) are combined on the first kv tile. The materialized strategy is
 * the plain op-by-op path (the three ops planned as ordinary units).
 */
#include "plan/planner.h"

#include <math.h>
#include <stdlib.h>

static int next_compute(const lm_graph *g, int i) {
    for (i = i + 1; i < g->nops; i++) {
        lm__gopk k = g->ops[i].kind;
        if (k != LM__GOP_PARAM && !lm__gop_is_view(k)) return i;
    }
    return -1;
}

int lm__plan_attention_match(const lm_graph *g, int op, int ops[3]) {
    const lm__gop *s = &g->ops[op];
    if (s->kind != LM__GOP_MATMUL || g->values[s->in[0]].ndim != 3 || g->values[s->in[1]].ndim != 3) return 0;
    int i2 = next_compute(g, op);
    if (i2 < 0) return 0;
    const lm__gop *sm = &g->ops[i2];
    if (sm->kind != LM__GOP_SOFTMAX || sm->in[0] != s->out || g->values[s->out].nuses != 1) return 0;
    int i3 = next_compute(g, i2);
    if (i3 < 0) return 0;
    const lm__gop *pv = &g->ops[i3];
    if (pv->kind != LM__GOP_MATMUL || pv->in[0] != sm->out || g->values[sm->out].nuses != 1) return 0;
    const lm__gvalue *v = &g->values[pv->in[1]];
    if (v->ndim != 3 || s->region != sm->region || s->region != pv->region) return 0;
    if (g->values[s->in[0]].dtype != LM_F16 && g->values[s->in[0]].dtype != LM_F32) return 0;
    ops[0] = op, ops[1] = i2, ops[2] = i3;
    return 1;
}

typedef struct flash_shape {
    int64_t H, Tq, Tk, D, Dv;
    lm_dtype dt, out_dt;
} flash_shape;

static void shape_of(const lm_graph *g, const int ops[3], flash_shape *f) {
    const lm__gvalue *q = &g->values[g->ops[ops[0]].in[0]], *v = &g->values[g->ops[ops[2]].in[1]];
    f->H = q->dims[0];
    f->Tq = q->dims[1];
    f->D = q->dims[2];
    f->Tk = v->dims[1];
    f->Dv = v->dims[2];
    f->dt = q->dtype;
    f->out_dt = g->values[g->ops[ops[2]].out].dtype;
}

/* Per-tile blocks of candidate grid g: heads, query rows, kv rows per step. */
static void blocks(const flash_shape *f, const int64_t *g, int64_t *bh, int64_t *bq, int64_t *bs) {
    *bh = lm__plan_ceil_div(f->H, g[0]);
    *bq = lm__plan_ceil_div(f->Tq, g[1]);
    *bs = lm__plan_ceil_div(f->Tk, g[2] * g[3]);
}

static double step_compute(const lm_plan_machine *m, const flash_shape *f, int64_t bh, int64_t bq, int64_t bs) {
    double rows = (double)(bh * bq), e = rows * (double)bs;
    double c = lm__plan_cost_matmul(m, f->dt, bh, bq, bs, f->D);
    c += lm__plan_cost_vector(m, LM_F32, e * 6 + rows * (double)f->Dv * 8, e * 5 + rows * (double)f->Dv, e + rows);
    c += lm__plan_cost_matmul(m, f->dt, bh, bq, f->Dv, bs);
    return c;
}

lm_status lm__plan_flash_candidates(lm__plan_planner *P, const int ops[3]) {
    const lm_graph *g = P->g;
    const lm_plan_machine *m = P->m;
    int op = ops[0];
    lm__free(P->flash[op]);
    P->flash[op] = NULL;
    P->nflash[op] = 0;
    flash_shape f;
    shape_of(g, ops, &f);
    int64_t T = m->tiles, es = (int64_t)lm_dtype_size(f.dt);
    int cap = 256, n = 0;
    lm__plan_cand *c = lm__calloc((size_t)cap, sizeof *c);
    if (!c) return LM_OUT_OF_MEMORY;
    static const int64_t steps[] = {1, 2, 4, 8, 16, 32};
    const lm__gvalue *vq = &g->values[g->ops[op].in[0]], *vo = &g->values[g->ops[ops[2]].out];
    for (int64_t gh = 1; gh <= f.H && gh <= T; gh++) {
        if (lm__plan_ceil_div(f.H, lm__plan_ceil_div(f.H, gh)) != gh) continue;
        for (int64_t gq = 1; gq <= f.Tq && gh * gq <= T; gq++) {
            if (lm__plan_ceil_div(f.Tq, lm__plan_ceil_div(f.Tq, gq)) != gq) continue;
            for (int64_t gkv = 1; gkv <= f.Tk && gh * gq * gkv <= T; gkv *= 2) {
                for (int si = 0; si < 6; si++) {
                    int64_t grid[4] = {gh, gq, gkv, steps[si]};
                    if (grid[2] * grid[3] > f.Tk) break;
                    int64_t bh, bq, bs;
                    blocks(&f, grid, &bh, &bq, &bs);
                    int64_t rows = bh * bq;
                    int64_t state = rows * (f.Dv + 2) * 4;
                    int64_t work = rows * f.D * es + 2 * bh * bs * f.D * es + rows * bs * (4 + es) + state +
                                   rows * f.Dv * (int64_t)lm_dtype_size(f.out_dt) + (gkv - 1) * state;
                    if (work > m->sram_bytes) continue;
                    double comp = (double)grid[3] * step_compute(m, &f, bh, bq, bs) +
                                  lm__plan_cost_vector(m, LM_F32, (double)state, 0, 0) +
                                  lm__plan_cost_vector(m, LM_F32, (double)(rows * f.Dv * (4 + es)),
                                                       (double)(rows * f.Dv), (double)rows);
                    double red = 0;
                    if (gkv > 1) {
                        lm__plan_xcost x = {(gkv - 1) * state, state, gkv - 1, 0, 0, 0};
                        red = lm__plan_cost_exchange(m, &x) + lm__plan_cost_vector(m, LM_F32, (double)(gkv * state),
                                                                                   (double)(gkv * rows * (f.Dv + 4)),
                                                                                   (double)(gkv * rows));
                    }
                    double stream = (double)grid[3] * ((double)m->sync_cycles +
                                                       (double)(2 * bh * bs * f.D * es) / m->exch_bytes_per_cycle +
                                                       (double)(2 * bh * m->msg_cycles));
                    double est = comp + red + stream;
                    lm__plan_cand k;
                    memset(&k, 0, sizeof k);
                    k.kind = LM__PLAN_C_FLASH;
                    for (int i = 0; i < 4; i++) k.grid[i] = grid[i];
                    k.nin = 1;
                    lm__plan_layout *q = &k.in_view[0];
                    lm__plan_layout_init(q, 3, vq->dims, vq->dtype);
                    lm__plan_layout_set_block(q, 0, bh);
                    q->tstride[0] = gq * gkv;
                    lm__plan_layout_set_block(q, 1, bq);
                    q->tstride[1] = gkv;
                    lm__plan_layout_add_rep(q, gkv, 1);
                    lm__plan_layout_canon(q);
                    if (!lm__plan_view_chain_unmap(g, g->ops[op].in[0], q, &k.in_root[0])) continue;
                    lm__plan_layout_init(&k.out, 3, vo->dims, vo->dtype);
                    lm__plan_layout_set_block(&k.out, 0, bh);
                    k.out.tstride[0] = gq * gkv;
                    lm__plan_layout_set_block(&k.out, 1, bq);
                    k.out.tstride[1] = gkv;
                    lm__plan_layout_canon(&k.out);
                    k.compute = comp;
                    k.reduce = red;
                    k.estimate = est;
                    k.work_bytes = work;
                    if (n < cap) {
                        c[n++] = k;
                    } else { /* keep the best cap by estimate */
                        int worst = 0;
                        for (int i = 1; i < n; i++)
                            if (c[i].estimate > c[worst].estimate) worst = i;
                        if (est < c[worst].estimate) c[worst] = k;
                    }
                }
            }
        }
    }
    /* the best 24 by estimate */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (c[j].estimate < c[i].estimate) {
                lm__plan_cand t = c[i];
                c[i] = c[j];
                c[j] = t;
            }
    P->flash[op] = c;
    P->nflash[op] = n < 24 ? n : 24;
    if (!n) {
        lm__free(c);
        P->flash[op] = NULL;
    }
    return LM_OK;
}

/* ---- streaming pieces ---------------------------------------------------------------------------- */
/* The kv box of the K^T (which = 0, view [H, D, Tk]) or V (which = 1, [H, Tk, Dv])
 * value needed by (ih, ikv) at step s, in that value's own coordinates. */
static int step_box(const flash_shape *f, const int64_t *grid, int which, int64_t ih, int64_t ikv, int64_t s,
                    int64_t *lo, int64_t *hi) {
    int64_t bh, bq, bs;
    blocks(f, grid, &bh, &bq, &bs);
    int64_t j = s * grid[2] + ikv;
    int64_t k0 = j * bs, k1 = LM_MIN(f->Tk, k0 + bs), h0 = ih * bh, h1 = LM_MIN(f->H, h0 + bh);
    if (k0 >= k1 || h0 >= h1) return 0;
    lo[0] = h0, hi[0] = h1;
    if (which == 0)
        lo[1] = 0, hi[1] = f->D, lo[2] = k0, hi[2] = k1;
    else
        lo[1] = k0, hi[1] = k1, lo[2] = 0, hi[2] = f->Dv;
    return 1;
}

lm_status lm__plan_flash_step_pieces(const lm_graph *g, const int64_t *grid, const int ops[3], int which,
                                     int64_t s, const lm__plan_layout *src, lm__plan_flash_piece_fn fn, void *ctx) {
    flash_shape f;
    shape_of(g, ops, &f);
    int v = which == 0 ? g->ops[ops[0]].in[1] : g->ops[ops[2]].in[1];
    int nd = src->ndim;
    for (int64_t ih = 0; ih < grid[0]; ih++)
        for (int64_t ikv = 0; ikv < grid[2]; ikv++) {
            int64_t vlo[LM__PLAN_MAX_DIMS], vhi[LM__PLAN_MAX_DIMS];
            if (!step_box(&f, grid, which, ih, ikv, s, vlo, vhi)) continue;
            /* one head at a time: pieces never straddle a head boundary of the root */
            for (int64_t h = vlo[0]; h < vhi[0]; h++) {
                int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS], rlo[LM__PLAN_MAX_DIMS], rhi[LM__PLAN_MAX_DIMS];
                for (int d = 0; d < 3; d++) lo[d] = vlo[d], hi[d] = vhi[d];
                lo[0] = h, hi[0] = h + 1;
                if (!lm__plan_view_chain_box_unmap(g, v, lo, hi, rlo, rhi))
                    return lm__error(LM_INTERNAL, "flash: the kv box of '%s' is not a box of its root",
                                     g->values[v].name);
                int64_t b0[LM__PLAN_MAX_DIMS], b1[LM__PLAN_MAX_DIMS], c[LM__PLAN_MAX_DIMS];
                for (int d = 0; d < nd; d++) {
                    b0[d] = rlo[d] / src->block[d];
                    b1[d] = (rhi[d] - 1) / src->block[d];
                    c[d] = b0[d];
                }
                for (;;) {
                    lm__plan_flash_piece p;
                    memset(&p, 0, sizeof p);
                    int64_t ss = 0;
                    for (int d = 0; d < nd; d++) {
                        ss = ss * src->grid[d] + c[d];
                        p.rlo[d] = LM_MAX(rlo[d], c[d] * src->block[d]);
                        p.rhi[d] = LM_MIN(rhi[d], (c[d] + 1) * src->block[d]);
                    }
                    for (int d = nd; d < LM__PLAN_MAX_DIMS; d++) p.rhi[d] = 1;
                    p.src_shard = ss;
                    p.src_tile = lm__plan_layout_tile(src, ss, (ih * grid[2] + ikv) % lm__plan_layout_reps(src));
                    p.ih = ih, p.ikv = ikv;
                    for (int d = 0; d < 3; d++) p.vlo[d] = vlo[d], p.vhi[d] = vhi[d];
                    for (int d = 3; d < LM__PLAN_MAX_DIMS; d++) p.vhi[d] = p.phi[d] = 1;
                    if (!lm__plan_view_chain_box_map(g, v, p.rlo, p.rhi, p.plo, p.phi))
                        return lm__error(LM_INTERNAL, "flash: a piece of '%s' is not a box of the view",
                                         g->values[v].name);
                    fn(ctx, &p);
                    int d = nd - 1;
                    while (d >= 0 && c[d] == b1[d]) {
                        c[d] = b0[d];
                        d--;
                    }
                    if (d < 0) break;
                    c[d]++;
                }
            }
        }
    return LM_OK;
}

typedef struct stream_acc {
    const lm__plan_planner *P;   /* borrowed */
    const int64_t *grid;         /* [4] the candidate grid */
    int64_t *recv, *send, *msgs; /* [tiles] bytes / messages per tile */
    int64_t esize;
} stream_acc;

static void acc_piece(void *ctx, const lm__plan_flash_piece *p) {
    stream_acc *a = ctx;
    int64_t e = 1;
    for (int d = 0; d < LM__PLAN_MAX_DIMS; d++) e *= p->rhi[d] - p->rlo[d];
    int64_t bytes = e * a->esize, gq = a->grid[1], gkv = a->grid[2];
    int sent = 0;
    for (int64_t iq = 0; iq < gq; iq++) {
        int64_t t = (p->ih * gq + iq) * gkv + p->ikv;
        if (t == p->src_tile) continue;
        a->recv[t] += bytes;
        a->msgs[t]++;
        if (!sent) a->send[p->src_tile] += bytes;
        sent = 1;
    }
}

double lm__plan_flash_stream_cost(lm__plan_planner *P, const lm__plan_cand *c, const int ops[3], int k_layout,
                                  int v_layout) {
    int64_t T = P->m->tiles;
    double total = 0;
    for (int64_t s = 0; s < c->grid[3]; s++) {
        memset(P->ws.acc, 0, sizeof(int64_t) * 3 * (size_t)T);
        stream_acc a = {P, c->grid, P->ws.acc, P->ws.acc + T, P->ws.acc + 2 * T, 0};
        for (int which = 0; which < 2; which++) {
            const lm__plan_layout *src = &P->lay[which ? v_layout : k_layout];
            a.esize = (int64_t)lm_dtype_size(src->dtype);
            if (lm__plan_flash_step_pieces(P->g, c->grid, ops, which, s, src, acc_piece, &a) != LM_OK) return INFINITY;
        }
        lm__plan_xcost x = {0};
        for (int64_t t = 0; t < T; t++) {
            x.max_recv = LM_MAX(x.max_recv, a.recv[t]);
            x.max_send = LM_MAX(x.max_send, a.send[t]);
            x.max_msgs = LM_MAX(x.max_msgs, a.msgs[t]);
        }
        total += lm__plan_cost_exchange(P->m, &x);
    }
    P->costed++;
    return total;
}
