/* plan/attn_plan.c — flash attention candidates: the score matmul, softmax and value
 * matmul fused (the matmul pattern or the attention op, both read through
 * lm__plan_attn's canonical index spaces); queries stay on their tiles while K/V
 * blocks stream in steps.
 *
 * Grid (gh, gq, gkv, steps): tile ((ih*gq + iq)*gkv + ikv) owns query block (ih, iq)
 * and, at step s, kv block j = s*gkv + ikv (interleaved so each step's blocks form an
 * affine window). A step is one exchange (K and V pieces of the kv heads a query-head
 * block reads, multicast to the query tiles that see the block) and one compute
 * phase (scores, online-softmax update, P*V accumulate); no T x T matrix ever
 * exists. With grouped kv heads one kv head feeds every query-head block of its
 * group. Causal and windowed masks skip wholly hidden (query block, kv block) pairs
 * (no transfer, no kernel; a step no tile needs is dropped) and mask partial ones in
 * the update. With gkv > 1 the kv-split partial states (m, l, O) are combined on the
 * first kv tile. The materialized strategy is the plain op-by-op path (the pattern's
 * three ops planned as ordinary units; the attention op has none).
 */
#include "plan/planner.h"

#include <math.h>
#include <stdio.h>
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

static void set_map(int8_t *m, int a, int b, int c) { m[0] = (int8_t)a, m[1] = (int8_t)b, m[2] = (int8_t)c; }

int lm__plan_attn_of(const lm_graph *g, int op, lm__plan_attn *a) {
    memset(a, 0, sizeof *a);
    const lm__gop *o = &g->ops[op];
    a->op = op;
    if (o->kind == LM__GOP_ATTENTION) {
        a->q = o->in[0], a->kt = o->in[1], a->v = o->in[2], a->out = o->out;
        set_map(a->qmap, 2, 1, 3), set_map(a->kmap, 2, 3, 1), set_map(a->vmap, 2, 1, 3), set_map(a->omap, 2, 1, 3);
        const lm__gvalue *q = &g->values[a->q], *k = &g->values[a->kt], *v = &g->values[a->v];
        a->H = q->dims[2], a->Tq = q->dims[1], a->D = q->dims[3];
        a->Hkv = k->dims[2], a->Tk = k->dims[1], a->Dv = v->dims[3];
        a->scale = o->a;
        a->causal = o->i[0] != 0;
        a->window = o->i[1];
    } else {
        int ops[3];
        if (!lm__plan_attention_match(g, op, ops)) return 0;
        const lm__gop *pv = &g->ops[ops[2]];
        a->q = o->in[0], a->kt = o->in[1], a->v = pv->in[1], a->out = pv->out;
        set_map(a->qmap, 0, 1, 2), set_map(a->kmap, 0, 1, 2), set_map(a->vmap, 0, 1, 2), set_map(a->omap, 0, 1, 2);
        const lm__gvalue *q = &g->values[a->q], *v = &g->values[a->v];
        a->H = a->Hkv = q->dims[0], a->Tq = q->dims[1], a->D = q->dims[2];
        a->Tk = v->dims[1], a->Dv = v->dims[2];
        a->scale = g->ops[ops[1]].a;
    }
    a->group = a->H / a->Hkv;
    a->dt = g->values[a->q].dtype;
    a->out_dt = g->values[a->out].dtype;
    return 1;
}

void lm__plan_flash_geom_of(const lm__plan_attn *a, const int64_t *grid, lm__plan_flash_geom *f) {
    for (int i = 0; i < 4; i++) f->g[i] = grid[i];
    f->bh = lm__plan_ceil_div(a->H, grid[0]);
    f->bq = lm__plan_ceil_div(a->Tq, grid[1]);
    f->bs = lm__plan_ceil_div(a->Tk, grid[2] * grid[3]);
    f->bkv = 0;
    for (int64_t ih = 0; ih < grid[0]; ih++) {
        int64_t k0, k1;
        lm__plan_flash_kv_heads(a, f, ih, &k0, &k1);
        f->bkv = LM_MAX(f->bkv, k1 - k0);
    }
}

void lm__plan_flash_kv_heads(const lm__plan_attn *a, const lm__plan_flash_geom *f, int64_t ih, int64_t *k0,
                             int64_t *k1) {
    int64_t h0 = ih * f->bh, h1 = LM_MIN(a->H, h0 + f->bh);
    *k0 = *k1 = h0 < h1 ? h0 / a->group : 0;
    if (h0 < h1) *k1 = (h1 - 1) / a->group + 1;
}

int lm__plan_flash_visible(const lm__plan_attn *a, const lm__plan_flash_geom *f, int64_t iq, int64_t j) {
    int64_t q0 = iq * f->bq, q1 = LM_MIN(a->Tq, q0 + f->bq), k0 = j * f->bs, k1 = LM_MIN(a->Tk, k0 + f->bs);
    if (q0 >= q1 || k0 >= k1) return 0;
    if (!a->causal) return 1;
    int64_t off = a->Tk - a->Tq; /* query i sits at key position i + off */
    if (k0 > q1 - 1 + off) return 0; /* every key after the last query */
    if (a->window > 0 && k1 - 1 <= q0 + off - a->window) return 0; /* every key before the first query's window */
    int all = k1 - 1 <= q0 + off && (a->window <= 0 || k0 > q1 - 1 + off - a->window);
    return all ? 1 : 2;
}

/* Matrix-unit cycles of one tile's scores (n = keys, k = D) or P*V (n = Dv, k = keys)
 * for query heads [h0, h1) and rows query rows: one batched call, or with grouped kv
 * heads one call per kv head (its K/V block is shared by the group's heads). */
static double head_matmuls(const lm_plan_machine *m, const lm__plan_attn *a, int64_t h0, int64_t h1, int64_t rows,
                           int64_t n, int64_t k) {
    if (a->group == 1) return lm__plan_cost_matmul(m, a->dt, h1 - h0, rows, n, k);
    double c = 0;
    for (int64_t kh = h0 / a->group; kh * a->group < h1; kh++)
        c += lm__plan_cost_matmul(m, a->dt, LM_MIN(h1, (kh + 1) * a->group) - LM_MAX(h0, kh * a->group), rows, n, k);
    return c;
}

/* Cycles of one flash step on the busiest tile: the worst query-head block's
 * matmuls plus the online-softmax update (one more FLOP per score when masked). */
static double step_compute(const lm_plan_machine *m, const lm__plan_attn *a, const lm__plan_flash_geom *f,
                           int masked) {
    double mm = 0;
    for (int64_t ih = 0; ih < f->g[0]; ih++) {
        int64_t h0 = ih * f->bh, h1 = LM_MIN(a->H, h0 + f->bh);
        if (h0 < h1)
            mm = fmax(mm, head_matmuls(m, a, h0, h1, f->bq, f->bs, a->D) +
                              head_matmuls(m, a, h0, h1, f->bq, a->Dv, f->bs));
    }
    double rows = (double)(f->bh * f->bq), e = rows * (double)f->bs;
    return mm + lm__plan_cost_vector(m, LM_F32, e * 6 + rows * (double)a->Dv * 8,
                                     e * 5 + rows * (double)a->Dv + (masked ? e : 0), e + rows);
}

/* All steps: a step no tile needs costs nothing, one with a partial block pays the mask. */
static double steps_compute(const lm_plan_machine *m, const lm__plan_attn *a, const lm__plan_flash_geom *f) {
    if (!a->causal) return (double)f->g[3] * step_compute(m, a, f, 0);
    double c = 0;
    for (int64_t s = 0; s < f->g[3]; s++) {
        int active = 0, masked = 0;
        for (int64_t iq = 0; iq < f->g[1]; iq++)
            for (int64_t ikv = 0; ikv < f->g[2]; ikv++) {
                int vis = lm__plan_flash_visible(a, f, iq, s * f->g[2] + ikv);
                active |= vis != 0;
                masked |= vis == 2;
            }
        if (active) c += step_compute(m, a, f, masked);
    }
    return c;
}

/* A layout of value v with canonical dim c split in blocks blk[c] at tile stride ts[c]. */
static void canon_layout(const lm__gvalue *v, const int8_t *map, const int64_t *blk, const int64_t *ts,
                         lm__plan_layout *l) {
    lm__plan_layout_init(l, v->ndim, v->dims, v->dtype);
    for (int c = 0; c < 3; c++) {
        lm__plan_layout_set_block(l, map[c], blk[c]);
        l->tstride[map[c]] = ts[c];
    }
}

/* The candidate of grid (its working set in *work); 0 when its query layout cannot be expressed. */
static int grid_candidate(lm__plan_planner *P, const lm__plan_attn *a, const int64_t *grid, lm__plan_cand *k,
                          int64_t *work) {
    const lm_graph *g = P->g;
    const lm_plan_machine *m = P->m;
    int64_t es = (int64_t)lm_dtype_size(a->dt), gq = grid[1], gkv = grid[2];
    lm__plan_flash_geom f;
    lm__plan_flash_geom_of(a, grid, &f);
    int64_t rows = f.bh * f.bq;
    int64_t state = rows * (a->Dv + 2) * 4;
    *work = rows * a->D * es + f.bkv * f.bs * (a->D + a->Dv) * es + rows * f.bs * (4 + es) + state +
            rows * a->Dv * (int64_t)lm_dtype_size(a->out_dt) + (gkv - 1) * state;
    double comp = steps_compute(m, a, &f) + lm__plan_cost_vector(m, LM_F32, (double)state, 0, 0) +
                  lm__plan_cost_vector(m, LM_F32, (double)(rows * a->Dv * (4 + es)), (double)(rows * a->Dv),
                                       (double)rows);
    double red = 0;
    if (gkv > 1) {
        lm__plan_xcost x = {(gkv - 1) * state, state, gkv - 1, 0, 0, 0};
        red = lm__plan_cost_exchange(m, &x) + lm__plan_cost_vector(m, LM_F32, (double)(gkv * state),
                                                                   (double)(gkv * rows * (a->Dv + 4)),
                                                                   (double)(gkv * rows));
    }
    double stream = (double)grid[3] * ((double)m->sync_cycles +
                                       (double)(f.bkv * f.bs * (a->D + a->Dv) * es) / m->exch_bytes_per_cycle +
                                       (double)(2 * f.bkv * m->msg_cycles));
    memset(k, 0, sizeof *k);
    k->kind = LM__PLAN_C_FLASH;
    for (int i = 0; i < 4; i++) k->grid[i] = grid[i];
    k->nin = 1;
    const int64_t blk[3] = {f.bh, f.bq, a->D}, ts[3] = {gq * gkv, gkv, 0}, oblk[3] = {f.bh, f.bq, a->Dv};
    lm__plan_layout *q = &k->in_view[0];
    canon_layout(&g->values[a->q], a->qmap, blk, ts, q);
    lm__plan_layout_add_rep(q, gkv, 1);
    lm__plan_layout_canon(q);
    if (!lm__plan_view_chain_unmap(g, a->q, q, &k->in_root[0])) return 0;
    canon_layout(&g->values[a->out], a->omap, oblk, ts, &k->out);
    lm__plan_layout_canon(&k->out);
    k->compute = comp;
    k->reduce = red;
    k->estimate = comp + red + stream;
    k->work_bytes = *work;
    return 1;
}

/* Whether grid is a partition: every split gives distinct non-empty blocks. */
static int valid_grid(const lm__plan_attn *a, const int64_t *grid, int64_t tiles) {
    for (int i = 0; i < 4; i++)
        if (grid[i] < 1) return 0;
    return lm__plan_ceil_div(a->H, lm__plan_ceil_div(a->H, grid[0])) == grid[0] &&
           lm__plan_ceil_div(a->Tq, lm__plan_ceil_div(a->Tq, grid[1])) == grid[1] &&
           grid[0] * grid[1] * grid[2] <= tiles && grid[2] * grid[3] <= a->Tk;
}

/* Adds k to c[0..*n) keeping the best cap by estimate. */
static void offer(lm__plan_cand *c, int *n, int cap, const lm__plan_cand *k) {
    if (*n < cap) {
        c[(*n)++] = *k;
        return;
    }
    int worst = 0;
    for (int i = 1; i < *n; i++)
        if (c[i].estimate > c[worst].estimate) worst = i;
    if (k->estimate < c[worst].estimate) c[worst] = *k;
}

lm_status lm__plan_flash_candidates(lm__plan_planner *P, const lm__plan_attn *a) {
    const lm_plan_machine *m = P->m;
    int op = a->op;
    lm__free(P->flash[op]);
    P->flash[op] = NULL;
    P->nflash[op] = 0;
    int64_t T = m->tiles, smallest = INT64_MAX;
    const int64_t *forced = P->opt.flash_grid;
    int cap = 256, n = 0;
    lm__plan_cand *c = lm__calloc((size_t)cap, sizeof *c);
    if (!c) return LM_OUT_OF_MEMORY;
    static const int64_t steps[] = {1, 2, 4, 8, 16, 32};
    lm__plan_cand k;
    int64_t work;
    if (forced[0]) { /* lm_plan_options.flash_grid: this grid or nothing */
        if (valid_grid(a, forced, T) && grid_candidate(P, a, forced, &k, &work)) {
            smallest = work;
            if (work <= m->sram_bytes) offer(c, &n, cap, &k);
        }
    }
    for (int64_t gh = 1; !forced[0] && gh <= a->H && gh <= T; gh++) {
        for (int64_t gq = 1; gq <= a->Tq && gh * gq <= T; gq++) {
            for (int64_t gkv = 1; gkv <= a->Tk && gh * gq * gkv <= T; gkv *= 2) {
                for (int si = 0; si < 6; si++) {
                    int64_t grid[4] = {gh, gq, gkv, steps[si]};
                    if (grid[2] * grid[3] > a->Tk) break;
                    if (!valid_grid(a, grid, T) || !grid_candidate(P, a, grid, &k, &work)) continue;
                    smallest = LM_MIN(smallest, work);
                    if (work <= m->sram_bytes) offer(c, &n, cap, &k);
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
        if (forced[0])
            snprintf(P->op_reason + (size_t)op * LM__PLAN_REASON, LM__PLAN_REASON,
                     "attention '%s': the forced flash grid %lldx%lldx%lldx%lld is not a valid partition within %lld "
                     "tiles or does not fit %lld bytes of SRAM per tile",
                     P->g->ops[op].name, (long long)forced[0], (long long)forced[1], (long long)forced[2],
                     (long long)forced[3], (long long)T, (long long)m->sram_bytes);
        else
            snprintf(P->op_reason + (size_t)op * LM__PLAN_REASON, LM__PLAN_REASON,
                     "attention '%s': no flash partition fits %lld bytes of SRAM per tile (smallest working set %lld "
                     "bytes)",
                     P->g->ops[op].name, (long long)m->sram_bytes, (long long)smallest);
    }
    return LM_OK;
}

/* ---- streaming pieces ---------------------------------------------------------------------------- */
/* The canonical box [clo, chi) as a box of the value (dims outside the map, the
 * attention op's batch dim, at index 0). */
static void value_box(const int8_t *map, const int64_t *clo, const int64_t *chi, int64_t *lo, int64_t *hi) {
    for (int d = 0; d < LM__PLAN_MAX_DIMS; d++) lo[d] = 0, hi[d] = 1;
    for (int c = 0; c < 3; c++) lo[map[c]] = clo[c], hi[map[c]] = chi[c];
}

lm_status lm__plan_flash_step_pieces(const lm_graph *g, const lm__plan_attn *a, const int64_t *grid, int which,
                                     int64_t s, const lm__plan_layout *src, lm__plan_flash_piece_fn fn, void *ctx) {
    lm__plan_flash_geom f;
    lm__plan_flash_geom_of(a, grid, &f);
    int v = which == 0 ? a->kt : a->v;
    const int8_t *map = which == 0 ? a->kmap : a->vmap;
    int nd = src->ndim;
    for (int64_t ih = 0; ih < grid[0]; ih++)
        for (int64_t ikv = 0; ikv < grid[2]; ikv++) {
            int64_t j = s * grid[2] + ikv, k0 = j * f.bs, k1 = LM_MIN(a->Tk, k0 + f.bs), kh0, kh1;
            lm__plan_flash_kv_heads(a, &f, ih, &kh0, &kh1);
            if (k0 >= k1 || kh0 >= kh1) continue;
            /* one kv head at a time (pieces never straddle a head boundary of the root),
             * sent once for every query-head block reading it: emitted at the first */
            for (int64_t kh = kh0; kh < kh1; kh++) {
                int64_t ih0 = kh * a->group / f.bh, ih1 = ((kh + 1) * a->group - 1) / f.bh + 1;
                if (ih0 != ih) continue;
                int64_t clo[3] = {kh, 0, 0}, chi[3] = {kh + 1, 0, 0};
                if (which == 0)
                    chi[1] = a->D, clo[2] = k0, chi[2] = k1;
                else
                    clo[1] = k0, chi[1] = k1, chi[2] = a->Dv;
                int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS], rlo[LM__PLAN_MAX_DIMS], rhi[LM__PLAN_MAX_DIMS];
                value_box(map, clo, chi, lo, hi);
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
                    p.ih0 = ih0, p.ih1 = LM_MIN(ih1, grid[0]), p.ikv = ikv, p.j = j;
                    p.vlo[0] = clo[0], p.vlo[1] = clo[1], p.vlo[2] = clo[2];
                    int64_t plo[LM__PLAN_MAX_DIMS], phi[LM__PLAN_MAX_DIMS];
                    if (!lm__plan_view_chain_box_map(g, v, p.rlo, p.rhi, plo, phi))
                        return lm__error(LM_INTERNAL, "flash: a piece of '%s' is not a box of the view",
                                         g->values[v].name);
                    for (int k = 0; k < 3; k++) p.plo[k] = plo[map[k]], p.phi[k] = phi[map[k]];
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
    const lm__plan_attn *a;      /* borrowed */
    lm__plan_flash_geom f;
    int64_t *recv, *send, *msgs; /* [tiles] bytes / messages per tile */
    int64_t esize;
} stream_acc;

static void acc_piece(void *ctx, const lm__plan_flash_piece *p) {
    stream_acc *a = ctx;
    int64_t e = 1;
    for (int d = 0; d < LM__PLAN_MAX_DIMS; d++) e *= p->rhi[d] - p->rlo[d];
    int64_t bytes = e * a->esize, gq = a->f.g[1], gkv = a->f.g[2];
    int sent = 0;
    for (int64_t ih = p->ih0; ih < p->ih1; ih++)
        for (int64_t iq = 0; iq < gq; iq++) {
            int64_t t = (ih * gq + iq) * gkv + p->ikv;
            if (t == p->src_tile || !lm__plan_flash_visible(a->a, &a->f, iq, p->j)) continue;
            a->recv[t] += bytes;
            a->msgs[t]++;
            if (!sent) a->send[p->src_tile] += bytes;
            sent = 1;
        }
}

double lm__plan_flash_stream_cost(lm__plan_planner *P, const lm__plan_cand *c, const lm__plan_attn *at, int k_layout,
                                  int v_layout) {
    int64_t T = P->m->tiles;
    double total = 0;
    for (int64_t s = 0; s < c->grid[3]; s++) {
        memset(P->ws.acc, 0, sizeof(int64_t) * 3 * (size_t)T);
        stream_acc a = {at, {{0}, 0, 0, 0, 0}, P->ws.acc, P->ws.acc + T, P->ws.acc + 2 * T, 0};
        lm__plan_flash_geom_of(at, c->grid, &a.f);
        for (int which = 0; which < 2; which++) {
            const lm__plan_layout *src = &P->lay[which ? v_layout : k_layout];
            a.esize = (int64_t)lm_dtype_size(src->dtype);
            if (lm__plan_flash_step_pieces(P->g, at, c->grid, which, s, src, acc_piece, &a) != LM_OK) return INFINITY;
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
