/* plan/low_move.c — projecting data movement: Copy/Exchange conversions, partial-sum
 * Reduce and matmuls whose K operands stream in over serial steps.
 *
 * Copy/Exchange: the redistribution pieces; local pieces become copy calls, remote
 * ones transfers (consecutive pieces of one source box form a multicast). Reduce:
 * contributors' partial boxes are received into a per-tile gather buffer, then one
 * reduce call per box adds them (plus the local contributor). Streamed matmul: per
 * step one exchange (the step's K block of both operands into per-tile step buffers,
 * windowed redistribution from their resident layouts) and one accumulate phase.
 */
#include "plan/low.h"

#include <stdio.h>
#include <stdlib.h>

static int same_source(const lm__plan_piece *a, const lm__plan_piece *b) {
    if (a->src_tile != b->src_tile || a->src_shard != b->src_shard || a->src_rep != b->src_rep) return 0;
    for (int d = 0; d < LM__PLAN_MAX_DIMS; d++)
        if (a->lo[d] != b->lo[d] || a->hi[d] != b->hi[d]) return 0;
    return 1;
}

static lm_status add_xfer(lm__plan_low *low, const lm__plan_opnd *src, int64_t src_tile, int64_t *xfer) {
    lm__plan_xfer x;
    memset(&x, 0, sizeof x);
    x.src_tile = (int32_t)src_tile;
    x.src = *src;
    x.bytes = lm__plan_opnd_elems(src) * (int64_t)lm_dtype_size(src->dtype);
    x.dst0 = low->nxdst;
    *xfer = low->nxfers;
    return LM__PUSH(low->xfers, low->nxfers, low->cap_xfers, x);
}

static lm_status add_dst(lm__plan_low *low, int64_t xfer, int64_t tile, const lm__plan_opnd *dst) {
    lm__plan_xdst d = {(int32_t)tile, *dst};
    LM_TRY(LM__PUSH(low->xdst, low->nxdst, low->cap_xdst, d));
    low->xfers[xfer].ndst++;
    return LM_OK;
}

/* A local piece whose copy would rewrite the same bytes elsewhere on the tile: the
 * piece is the whole source shard and the whole destination shard, stored alike (dtype,
 * extents, strides, offset, one copy each), and the source dies at this conversion.
 * Then the destination's buffer joins the source's alias group instead of a copy call
 * (nothing writes the shared bytes while the source is still read). Not for values
 * of a repeat body, which a carry rewrites every iteration. */
static int copy_redundant(const lm__plan_proj *p, int i, const lm__plan_call *c) {
    const lm__plan_mid *mid = p->mid;
    const lm__plan_mop *o = &mid->ops[i];
    const lm__plan_low *low = p->low;
    const lm__plan_opnd *s = &c->op[0], *d = &c->op[1];
    int src = lm__plan_mid_owner(mid, o->in[0]);
    if (p->last_use[src] != i || mid->vals[o->out].view_of >= 0 || mid->vals[o->out].placed) return 0;
    /* not inside a repeat: a carry rewrites a body's values every iteration */
    if (mid->vals[src].region >= 0 || mid->vals[o->out].region >= 0) return 0;
    if (s->dtype != d->dtype || s->ndim != d->ndim || s->off != d->off) return 0;
    for (int k = 0; k < s->ndim; k++)
        if (s->dims[k] != d->dims[k] || s->strides[k] != d->strides[k]) return 0;
    const lm__plan_buf *bs = &low->bufs[s->buf], *bd = &low->bufs[d->buf];
    if (bs->copies != 1 || bd->copies != 1 || bs->bytes != bd->bytes || bd->alias >= 0) return 0;
    int64_t bytes = lm__plan_opnd_elems(s) * (int64_t)lm_dtype_size(s->dtype);
    return bytes == lm__plan_layout_shard_bytes(&mid->vals[src].l) &&
           bytes == lm__plan_layout_shard_bytes(&mid->vals[o->out].l);
}

lm_status lm__plan_low_convert(lm__plan_proj *p, int i) {
    const lm__plan_mid *mid = p->mid;
    const lm__plan_mop *o = &mid->ops[i];
    lm__plan_low *low = p->low;
    lm__plan_piece *pc = NULL;
    int64_t n = 0;
    LM_TRY(lm__plan_redist_pieces(&mid->vals[o->in[0]].l, &mid->vals[o->out].l, &p->ws, &pc, &n));
    int64_t xs, cs;
    lm_status st = lm__plan_low_add_step(low, LM__PLAN_S_EXCHANGE, i, lm__plan_mid_kind_name(o->kind), &xs);
    int64_t cur = -1;
    for (int64_t k = 0; k < n && st == LM_OK; k++) {
        const lm__plan_piece *q = &pc[k];
        if (q->src_tile == q->dst_tile) continue;
        lm__plan_opnd dst;
        st = lm__plan_low_operand(low, mid, o->out, q->dst_tile, q->lo, q->hi, &dst);
        if (st == LM_OK && (cur < 0 || !same_source(&pc[k - 1], q) || pc[k - 1].src_tile == pc[k - 1].dst_tile)) {
            lm__plan_opnd src;
            st = lm__plan_low_operand(low, mid, o->in[0], q->src_tile, q->lo, q->hi, &src);
            if (st == LM_OK) st = add_xfer(low, &src, q->src_tile, &cur);
        }
        if (st == LM_OK) st = add_dst(low, cur, q->dst_tile, &dst);
    }
    if (st == LM_OK) {
        low->steps[xs].x1 = low->nxfers;
        low->steps[xs].nslots = lm__plan_low_slot(low, low->steps[xs].x0, low->steps[xs].x1);
        if (low->steps[xs].x1 == low->steps[xs].x0) low->nsteps--; /* nothing remote */
        st = lm__plan_low_add_step(low, LM__PLAN_S_COMPUTE, i, "copy", &cs);
    }
    for (int64_t k = 0; k < n && st == LM_OK; k++) {
        const lm__plan_piece *q = &pc[k];
        if (q->src_tile != q->dst_tile) continue;
        lm__plan_call c = lm__plan_proj_call(q->src_tile, LM__PLAN_K_COPY);
        st = lm__plan_low_operand(low, mid, o->in[0], q->src_tile, q->lo, q->hi, &c.op[0]);
        if (st == LM_OK) st = lm__plan_low_operand(low, mid, o->out, q->dst_tile, q->lo, q->hi, &c.op[1]);
        if (st == LM_OK && copy_redundant(p, i, &c))
            low->bufs[c.op[1].buf].alias = c.op[0].buf;
        else if (st == LM_OK)
            st = lm__plan_proj_add_call(p, &c);
    }
    lm__free(pc);
    LM_TRY(st);
    low->steps[cs].c1 = low->ncalls;
    if (low->steps[cs].c1 == low->steps[cs].c0)
        low->nsteps--;
    else
        lm__plan_low_sort_calls(low, low->steps[cs].c0, low->steps[cs].c1);
    return LM_OK;
}

static int same_box(const lm__plan_piece *a, const lm__plan_piece *b) {
    for (int d = 0; d < LM__PLAN_MAX_DIMS; d++)
        if (a->lo[d] != b->lo[d] || a->hi[d] != b->hi[d]) return 0;
    return a->dst_tile == b->dst_tile;
}

static int cmp_dst(const void *x, const void *y) {
    const lm__plan_piece *a = x, *b = y;
    if (a->dst_tile != b->dst_tile) return a->dst_tile < b->dst_tile ? -1 : 1;
    for (int d = 0; d < LM__PLAN_MAX_DIMS; d++)
        if (a->lo[d] != b->lo[d]) return a->lo[d] < b->lo[d] ? -1 : 1;
    return (a->src_rep > b->src_rep) - (a->src_rep < b->src_rep);
}

/* Reduce: partial S into owner D through per-tile gather buffers. */
lm_status lm__plan_low_reduce(lm__plan_proj *p, int i) {
    const lm__plan_mid *mid = p->mid;
    const lm__plan_mop *o = &mid->ops[i];
    lm__plan_low *low = p->low;
    const lm__plan_layout *S = &mid->vals[o->in[0]].l;
    lm__plan_piece *pc = NULL;
    int64_t n = 0;
    LM_TRY(lm__plan_redist_pieces(S, &mid->vals[o->out].l, &p->ws, &pc, &n));
    if (n > 1) qsort(pc, (size_t)n, sizeof *pc, cmp_dst);
    int64_t es = (int64_t)lm_dtype_size(S->dtype), align = p->P->m->align;
    lm_status st = LM_OK;
    /* gather buffer per destination tile: remote pieces stacked densely */
    int64_t *gbuf = lm__alloc(sizeof(int64_t) * (size_t)low->tiles, 16);
    int64_t *gsize = lm__calloc((size_t)low->tiles, sizeof(int64_t));
    if (!gbuf || !gsize) st = LM_OUT_OF_MEMORY;
    for (int64_t k = 0; k < n && st == LM_OK; k++)
        if (pc[k].src_tile != pc[k].dst_tile) {
            int64_t e = 1;
            for (int d = 0; d < LM__PLAN_MAX_DIMS; d++) e *= pc[k].hi[d] - pc[k].lo[d];
            gsize[pc[k].dst_tile] += e;
        }
    for (int64_t t = 0; t < low->tiles && st == LM_OK; t++) {
        gbuf[t] = -1;
        if (gsize[t]) st = lm__plan_low_add_buf(low, t, -1, lm__plan_round_up(gsize[t] * es, align), &gbuf[t]);
    }
    int64_t xs = -1, cs = -1;
    if (st == LM_OK) st = lm__plan_low_add_step(low, LM__PLAN_S_EXCHANGE, i, "reduce", &xs);
    /* exchange: each remote piece into the next gather slot of its destination */
    int64_t *gfill = gsize; /* reuse as fill counters (elements) */
    if (st == LM_OK) memset(gfill, 0, sizeof(int64_t) * (size_t)low->tiles);
    for (int64_t k = 0; k < n && st == LM_OK; k++) {
        lm__plan_piece *q = &pc[k];
        if (q->src_tile == q->dst_tile) continue;
        lm__plan_opnd src, dst;
        st = lm__plan_low_operand(low, mid, o->in[0], q->src_tile, q->lo, q->hi, &src);
        if (st != LM_OK) break;
        dst = src;
        dst.buf = (int32_t)gbuf[q->dst_tile];
        dst.off = gfill[q->dst_tile];
        int64_t stride = 1;
        for (int d = src.ndim - 1; d >= 0; d--) {
            dst.strides[d] = (int32_t)stride;
            stride *= dst.dims[d];
        }
        gfill[q->dst_tile] += stride;
        q->src_shard = (int32_t)dst.off; /* remember the gather offset for the reduce call */
        int64_t x;
        st = add_xfer(low, &src, q->src_tile, &x);
        if (st == LM_OK) st = add_dst(low, x, q->dst_tile, &dst);
    }
    if (st == LM_OK) {
        low->steps[xs].x1 = low->nxfers;
        low->steps[xs].nslots = lm__plan_low_slot(low, low->steps[xs].x0, low->steps[xs].x1);
        if (low->steps[xs].x1 == low->steps[xs].x0) low->nsteps--;
        st = lm__plan_low_add_step(low, LM__PLAN_S_COMPUTE, i, "reduce", &cs);
    }
    /* one reduce call per (destination tile, box) */
    for (int64_t k = 0; k < n && st == LM_OK;) {
        int64_t e = k;
        while (e < n && same_box(&pc[k], &pc[e])) e++;
        lm__plan_call c = lm__plan_proj_call(pc[k].dst_tile, LM__PLAN_K_REDUCE);
        st = lm__plan_low_operand(low, mid, o->out, pc[k].dst_tile, pc[k].lo, pc[k].hi, &c.op[0]);
        int64_t remote = 0, first_off = -1, elems = 1;
        for (int d = 0; d < LM__PLAN_MAX_DIMS; d++) elems *= pc[k].hi[d] - pc[k].lo[d];
        for (int64_t j = k; j < e && st == LM_OK; j++) {
            if (pc[j].src_tile == pc[j].dst_tile) {
                st = lm__plan_low_operand(low, mid, o->in[0], pc[j].src_tile, pc[j].lo, pc[j].hi, &c.op[1]);
            } else {
                if (first_off < 0) first_off = pc[j].src_shard;
                remote++;
            }
        }
        if (st == LM_OK && remote) {
            c.op[2] = c.op[0];
            c.op[2].buf = (int32_t)gbuf[pc[k].dst_tile];
            c.op[2].dtype = S->dtype;
            c.op[2].off = first_off;
            int64_t stride = 1;
            for (int d = c.op[2].ndim - 1; d >= 0; d--) {
                c.op[2].strides[d] = (int32_t)stride;
                stride *= c.op[2].dims[d];
            }
        }
        c.i[0] = remote;
        c.i[1] = elems;
        c.i[2] = o->epi;
        if (st == LM_OK && (o->epi & LM__PLAN_EPI_BIAS)) { /* the bias of the box's columns */
            int nd = mid->vals[o->out].l.ndim;
            int64_t blo[1] = {pc[k].lo[nd - 1]}, bhi[1] = {pc[k].hi[nd - 1]};
            st = lm__plan_low_operand(low, mid, o->in[o->nin - 1], pc[k].dst_tile, blo, bhi, &c.op[3]);
        }
        if (st == LM_OK) st = lm__plan_proj_add_call(p, &c);
        k = e;
    }
    lm__free(pc);
    lm__free(gbuf);
    lm__free(gsize);
    LM_TRY(st);
    low->steps[cs].c1 = low->ncalls;
    lm__plan_low_sort_calls(low, low->steps[cs].c0, low->steps[cs].c1);
    return LM_OK;
}

/* ---- streamed matmul (serial K steps) ---------------------------------------------------------- */
/* Step-s layout of streamed operand i (0 = A, 1 = B) of mid op o, and its window. */
static void step_layout(const lm__plan_mop *o, int i, int64_t s, lm__plan_layout *l, lm__plan_window *win) {
    *l = o->step[i];
    int kd = i ? l->ndim - 2 : l->ndim - 1;
    l->tile0 -= s * o->grid[3] * l->tstride[kd];
    win->dim = kd;
    win->lo = s * o->grid[3];
    win->hi = (s + 1) * o->grid[3];
}

/* Box of the step shard with coordinates c (grid order) of layout l. */
static int coord_box(const lm__plan_layout *l, const int64_t *c, int64_t *lo, int64_t *hi) {
    for (int d = 0; d < l->ndim; d++) {
        lo[d] = c[d] * l->block[d];
        hi[d] = LM_MIN(l->dims[d], lo[d] + l->block[d]);
        if (lo[d] >= hi[d]) return 0;
    }
    return 1;
}

static lm__plan_opnd step_opnd(int64_t buf, const lm__plan_layout *l, const int64_t *origin, const int64_t *lo,
                               const int64_t *hi) {
    lm__plan_opnd o;
    memset(&o, 0, sizeof o);
    int64_t str[LM__PLAN_MAX_DIMS];
    lm__plan_layout_strides(l, str);
    o.buf = (int32_t)buf;
    o.ndim = l->ndim;
    o.dtype = l->dtype;
    for (int d = 0; d < l->ndim; d++) {
        o.off += (lo[d] - origin[d]) * str[d];
        o.dims[d] = (int32_t)(hi[d] - lo[d]);
        o.strides[d] = (int32_t)str[d];
    }
    return o;
}

static lm_status stream_exchange(lm__plan_proj *p, int i, int64_t s, const int64_t *const bufs[2], int64_t xs) {
    const lm__plan_mid *mid = p->mid;
    const lm__plan_mop *o = &mid->ops[i];
    lm__plan_low *low = p->low;
    for (int k = 0; k < 2; k++) {
        lm__plan_layout dl;
        lm__plan_window win;
        step_layout(o, k, s, &dl, &win);
        lm__plan_piece *pc = NULL;
        int64_t n = 0, cur = -1;
        LM_TRY(lm__plan_redist_pieces_w(&mid->vals[o->in[k]].l, &dl, &win, &p->ws, &pc, &n));
        lm_status st = LM_OK;
        for (int64_t j = 0; j < n && st == LM_OK; j++) {
            const lm__plan_piece *q = &pc[j];
            int64_t olo[LM__PLAN_MAX_DIMS], ohi[LM__PLAN_MAX_DIMS];
            lm__plan_layout_box(&dl, q->dst_shard, olo, ohi);
            lm__plan_opnd dst = step_opnd(bufs[k][q->dst_tile], &dl, olo, q->lo, q->hi), src;
            st = lm__plan_low_operand(low, mid, o->in[k], q->src_tile, q->lo, q->hi, &src);
            if (st != LM_OK) break;
            if (q->src_tile == q->dst_tile) {
                lm__plan_call c = lm__plan_proj_call(q->dst_tile, LM__PLAN_K_COPY);
                c.op[0] = src, c.op[1] = dst;
                st = lm__plan_proj_add_call(p, &c);
                continue;
            }
            if (cur < 0 || !same_source(&pc[j - 1], q) || pc[j - 1].src_tile == pc[j - 1].dst_tile)
                st = add_xfer(low, &src, q->src_tile, &cur);
            if (st == LM_OK) st = add_dst(low, cur, q->dst_tile, &dst);
        }
        lm__free(pc);
        LM_TRY(st);
    }
    low->steps[xs].x1 = low->nxfers;
    low->steps[xs].nslots = lm__plan_low_slot(low, low->steps[xs].x0, low->steps[xs].x1);
    return LM_OK;
}

lm_status lm__plan_low_stream_matmul(lm__plan_proj *p, int i) {
    const lm__plan_mid *mid = p->mid;
    const lm__plan_mop *o = &mid->ops[i];
    lm__plan_low *low = p->low;
    const lm__plan_layout *C = &mid->vals[o->out].l;
    int64_t T = low->tiles, al = p->P->m->align;
    int64_t *all = lm__alloc(sizeof(int64_t) * 3 * (size_t)T, 16);
    if (!all) return LM_OUT_OF_MEMORY;
    int64_t *abuf = all, *bbuf = all + T, *done = all + 2 * T;
    const int64_t *bufs[2] = {abuf, bbuf};
    lm_status st = LM_OK;
    for (int64_t t = 0; t < 3 * T; t++) all[t] = -1;
    int64_t g[4] = {o->grid[0], o->grid[1], o->grid[2], o->grid[3]};
    int batched = C->ndim == 3, bshared = o->step[1].ndim == 2;
    for (int64_t t = 0; t < g[0] * g[1] * g[2] * g[3] && st == LM_OK; t++) {
        st =
            lm__plan_low_add_buf(low, t, -1, lm__plan_round_up(lm__plan_layout_shard_bytes(&o->step[0]), al), &abuf[t]);
        if (st == LM_OK)
            st = lm__plan_low_add_buf(low, t, -1, lm__plan_round_up(lm__plan_layout_shard_bytes(&o->step[1]), al),
                                      &bbuf[t]);
    }
    for (int64_t s = 0; s < o->steps && st == LM_OK; s++) {
        char label[48];
        snprintf(label, sizeof label, "%.20s step %lld", p->P->g->ops[o->gop].name, (long long)s);
        int64_t xs, cs;
        st = lm__plan_low_add_step(low, LM__PLAN_S_EXCHANGE, i, label, &xs);
        if (st == LM_OK) st = lm__plan_low_add_step(low, LM__PLAN_S_COMPUTE, i, label, &cs);
        if (st == LM_OK) st = stream_exchange(p, i, s, bufs, xs);
        lm__plan_layout al_, bl_;
        lm__plan_window aw, bw;
        step_layout(o, 0, s, &al_, &aw);
        step_layout(o, 1, s, &bl_, &bw);
        for (int64_t ib = 0; ib < g[0] && st == LM_OK; ib++)
            for (int64_t im = 0; im < g[1] && st == LM_OK; im++)
                for (int64_t in = 0; in < g[2] && st == LM_OK; in++)
                    for (int64_t ik = 0; ik < g[3] && st == LM_OK; ik++) {
                        int64_t t = ((ib * g[1] + im) * g[2] + in) * g[3] + ik, j = s * g[3] + ik;
                        int64_t clo[3] = {0}, chi[3] = {1, 1, 1}, ac[3], bc[3], alo[3], ahi[3], blo[3], bhi[3];
                        int64_t cc[3] = {ib, im, in};
                        if (!coord_box(C, batched ? cc : cc + 1, clo, chi)) continue;
                        if (batched)
                            ac[0] = ib, ac[1] = im, ac[2] = j;
                        else
                            ac[0] = im, ac[1] = j;
                        if (bshared)
                            bc[0] = j, bc[1] = in;
                        else
                            bc[0] = ib, bc[1] = j, bc[2] = in;
                        int have = coord_box(&al_, ac, alo, ahi) && coord_box(&bl_, bc, blo, bhi);
                        if (!have && done[t] >= 0) continue; /* nothing left to add on this tile */
                        lm__plan_call c = lm__plan_proj_call(t, LM__PLAN_K_MATMUL);
                        st = lm__plan_low_operand(low, mid, o->out, t, clo, chi, &c.op[2]);
                        if (st != LM_OK) break;
                        if (have) {
                            c.op[0] = step_opnd(abuf[t], &al_, alo, alo, ahi);
                            c.op[1] = step_opnd(bbuf[t], &bl_, blo, blo, bhi);
                        } else { /* this tile's K range is empty: zero its accumulator */
                            c.op[0] = step_opnd(abuf[t], &al_, clo, clo, clo);
                            c.op[1] = step_opnd(bbuf[t], &bl_, clo, clo, clo);
                            c.op[0].ndim = al_.ndim, c.op[1].ndim = bl_.ndim;
                            c.op[0].dims[al_.ndim - 2] = (int32_t)(chi[batched] - clo[batched]);
                            c.op[1].dims[bl_.ndim - 1] = (int32_t)(chi[batched + 1] - clo[batched + 1]);
                            if (batched) c.op[0].dims[0] = (int32_t)(chi[0] - clo[0]);
                        }
                        c.i[0] = done[t] >= 0;
                        done[t] = 1;
                        int32_t batch = batched ? (int32_t)(chi[0] - clo[0]) : 1;
                        lm__plan_proj_to3(&c.op[0], 1);
                        lm__plan_proj_to3(&c.op[1], batch);
                        lm__plan_proj_to3(&c.op[2], 1);
                        st = lm__plan_proj_add_call(p, &c);
                    }
        if (st == LM_OK) {
            low->steps[cs].c1 = low->ncalls;
            lm__plan_low_sort_calls(low, low->steps[cs].c0, low->steps[cs].c1);
        }
    }
    lm__free(all);
    return st;
}

/* Whether op o may write its output into its first input's buffers. */
