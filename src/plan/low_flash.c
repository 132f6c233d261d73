/* plan/low_flash.c — projecting a Flash mid op: per-tile state, score and block
 * buffers, one exchange + one compute phase per streamed K/V step, then the kv-split
 * combine and the normalization into the output layout.
 *
 * Tile ((ih*gq + iq)*gkv + ikv) keeps its query block (from the Q layout), a state
 * [heads, rows, dv+2] f32 (O, running max m, running sum l), and at step s receives
 * kv block j = s*gkv + ikv of K^T [kv heads, d, n] and V [kv heads, n, dv] for the kv
 * heads its query heads read (multicast to the query tiles that see the block;
 * pieces addressed in canonical coordinates through the affine view->root map).
 * Compute per step: S = Q K^T (matrix unit; one call per kv head when heads are
 * grouped), online softmax update writing P (masking the keys a query must not see
 * when the block is partly hidden), state O += P V. (query block, kv block) pairs a
 * causal or windowed mask hides entirely get no transfer and no call; a step no tile
 * needs gets no phase. Operands of q and the output are boxes of the values in their
 * own (token-major for the attention op) order, read through canonical strides.
 */
#include "plan/low.h"

#include <stdio.h>

typedef struct fl {
    const lm__plan_planner *P; /* borrowed */
    const lm__plan_mid *mid;   /* borrowed */
    lm__plan_low *low;         /* being built */
    const lm__plan_mop *o;     /* the Flash mid op */
    lm__plan_attn a;
    lm__plan_flash_geom f;
    int64_t bh, bq, bs, bkv;
    int64_t *state, *sbuf, *pbuf, *kbuf, *vbuf, *rbuf; /* [tiles] buffer ids, -1 inactive */
    lm_status st;
    int which;
    int64_t A[LM__PLAN_MAX_DIMS][LM__PLAN_MAX_DIMS];
} fl;

static lm__plan_opnd opnd(int64_t buf, lm_dtype dt, int64_t off, int nd, const int64_t *dims, const int64_t *strides) {
    lm__plan_opnd o;
    memset(&o, 0, sizeof o);
    o.buf = (int32_t)buf;
    o.dtype = dt;
    o.off = off;
    o.ndim = nd;
    for (int d = 0; d < nd; d++) o.dims[d] = (int32_t)dims[d], o.strides[d] = (int32_t)strides[d];
    return o;
}

static lm_status push(fl *f, lm__plan_call *c) {
    c->cycles = lm__plan_call_cycles(f->P->m, c);
    return lm__plan_low_add_call(f->low, c);
}

/* The canonical box [clo, chi) of mid value mv (q or the output, map: their canonical
 * map) on tile t as a 3-d operand in canonical order. */
static lm_status canon_operand(const fl *f, int mv, const int8_t *map, int64_t t, const int64_t *clo,
                               const int64_t *chi, lm__plan_opnd *o) {
    int64_t lo[LM__PLAN_MAX_DIMS] = {0}, hi[LM__PLAN_MAX_DIMS] = {1, 1, 1, 1};
    for (int c = 0; c < 3; c++) lo[map[c]] = clo[c], hi[map[c]] = chi[c];
    lm__plan_opnd v;
    LM_TRY(lm__plan_low_operand(f->low, f->mid, mv, t, lo, hi, &v));
    *o = v;
    o->ndim = 3;
    for (int c = 0; c < 3; c++) o->dims[c] = v.dims[map[c]], o->strides[c] = v.strides[map[c]];
    return LM_OK;
}

static int64_t tile_of(const fl *f, int64_t ih, int64_t iq, int64_t ikv) {
    return (ih * f->f.g[1] + iq) * f->f.g[2] + ikv;
}

/* Extents of tile (ih, iq): heads and query rows (0 when the tile is idle). */
static void extents(const fl *f, int64_t ih, int64_t iq, int64_t *h0, int64_t *hn, int64_t *q0, int64_t *qn) {
    *h0 = ih * f->bh;
    *hn = LM_MAX(0, LM_MIN(f->a.H, *h0 + f->bh) - *h0);
    *q0 = iq * f->bq;
    *qn = LM_MAX(0, LM_MIN(f->a.Tq, *q0 + f->bq) - *q0);
}

static int64_t kv_extent(const fl *f, int64_t ikv, int64_t s) {
    int64_t k0 = (s * f->f.g[2] + ikv) * f->bs;
    return LM_MAX(0, LM_MIN(f->a.Tk, k0 + f->bs) - k0);
}

static void state_opnd(const fl *f, int64_t t, int64_t hn, int64_t qn, int64_t cols, lm__plan_opnd *o) {
    int64_t dims[3] = {hn, qn, cols}, str[3] = {f->bq * (f->a.Dv + 2), f->a.Dv + 2, 1};
    *o = opnd(f->state[t], LM_F32, 0, 3, dims, str);
}

static void on_piece(void *ctx, const lm__plan_flash_piece *p) {
    fl *f = ctx;
    if (f->st != LM_OK) return;
    lm__plan_low *low = f->low;
    const lm__plan_mid *mid = f->mid;
    int src_mv = f->o->in[1 + f->which];
    const int8_t *map = f->which == 0 ? f->a.kmap : f->a.vmap;
    const lm__plan_layout *sl = &mid->vals[src_mv].l;
    int64_t rstr[LM__PLAN_MAX_DIMS], slo[LM__PLAN_MAX_DIMS], shi[LM__PLAN_MAX_DIMS];
    lm__plan_layout_strides(sl, rstr);
    lm__plan_layout_box(sl, p->src_shard, slo, shi);
    int32_t sb = low->buf_of[(size_t)src_mv * (size_t)low->tiles + (size_t)p->src_tile];
    int64_t dims[3], sstr[3], dstr[3];
    int64_t off = 0, doff = 0;
    for (int r = 0; r < sl->ndim; r++) off += (p->rlo[r] - slo[r]) * rstr[r];
    /* the destination block buffer: canonical [kv heads, x, y] dense at the padded block */
    int64_t bdims[3];
    if (f->which == 0)
        bdims[0] = f->bkv, bdims[1] = f->a.D, bdims[2] = f->bs;
    else
        bdims[0] = f->bkv, bdims[1] = f->bs, bdims[2] = f->a.Dv;
    dstr[2] = 1, dstr[1] = bdims[2], dstr[0] = bdims[1] * bdims[2];
    for (int i = 0; i < 3; i++) {
        dims[i] = p->phi[i] - p->plo[i];
        sstr[i] = 0;
        for (int r = 0; r < sl->ndim; r++) sstr[i] += f->A[r][map[i]] * rstr[r];
        if (i) doff += (p->plo[i] - p->vlo[i]) * dstr[i];
    }
    lm__plan_opnd src = opnd(sb, sl->dtype, off, 3, dims, sstr);
    int64_t x = -1;
    for (int64_t ih = p->ih0; ih < p->ih1 && f->st == LM_OK; ih++) {
        int64_t kh0, kh1;
        lm__plan_flash_kv_heads(&f->a, &f->f, ih, &kh0, &kh1);
        for (int64_t iq = 0; iq < f->f.g[1] && f->st == LM_OK; iq++) {
            int64_t t = tile_of(f, ih, iq, p->ikv);
            int64_t *bufs = f->which == 0 ? f->kbuf : f->vbuf;
            if (bufs[t] < 0 || !lm__plan_flash_visible(&f->a, &f->f, iq, p->j)) continue;
            lm__plan_opnd dst = opnd(bufs[t], sl->dtype, doff + (p->plo[0] - kh0) * dstr[0], 3, dims, dstr);
            if (t == p->src_tile) { /* already on the tile: a copy in the compute phase */
                lm__plan_call c = lm__plan_proj_call(t, LM__PLAN_K_COPY);
                c.op[0] = src, c.op[1] = dst;
                f->st = push(f, &c);
                continue;
            }
            if (x < 0) {
                lm__plan_xfer xf;
                memset(&xf, 0, sizeof xf);
                xf.src_tile = (int32_t)p->src_tile;
                xf.src = src;
                xf.bytes = lm__plan_opnd_elems(&src) * (int64_t)lm_dtype_size(src.dtype);
                xf.dst0 = low->nxdst;
                x = low->nxfers;
                f->st = LM__PUSH(low->xfers, low->nxfers, low->cap_xfers, xf);
            }
            lm__plan_xdst d = {(int32_t)t, dst};
            if (f->st == LM_OK) f->st = LM__PUSH(low->xdst, low->nxdst, low->cap_xdst, d);
            if (f->st == LM_OK) low->xfers[x].ndst++;
        }
    }
}

static lm_status buffers(fl *f) {
    lm__plan_low *low = f->low;
    int64_t T = low->tiles, al = f->P->m->align, es = (int64_t)lm_dtype_size(f->a.dt);
    int64_t *all = lm__alloc(sizeof(int64_t) * 6 * (size_t)T, 16);
    if (!all) return LM_OUT_OF_MEMORY;
    f->state = all, f->sbuf = all + T, f->pbuf = all + 2 * T, f->kbuf = all + 3 * T, f->vbuf = all + 4 * T,
    f->rbuf = all + 5 * T;
    for (int64_t i = 0; i < 6 * T; i++) all[i] = -1;
    int64_t rows = f->bh * f->bq, st_bytes = rows * (f->a.Dv + 2) * 4, gkv = f->f.g[2];
    for (int64_t ih = 0; ih < f->f.g[0]; ih++)
        for (int64_t iq = 0; iq < f->f.g[1]; iq++) {
            int64_t h0, hn, q0, qn;
            extents(f, ih, iq, &h0, &hn, &q0, &qn);
            if (!hn || !qn) continue;
            for (int64_t ikv = 0; ikv < gkv; ikv++) {
                int64_t t = tile_of(f, ih, iq, ikv);
                LM_TRY(lm__plan_low_add_buf(low, t, -1, lm__plan_round_up(st_bytes, al), &f->state[t]));
                LM_TRY(lm__plan_low_add_buf(low, t, -1, lm__plan_round_up(rows * f->bs * 4, al), &f->sbuf[t]));
                LM_TRY(lm__plan_low_add_buf(low, t, -1, lm__plan_round_up(rows * f->bs * es, al), &f->pbuf[t]));
                LM_TRY(lm__plan_low_add_buf(low, t, -1, lm__plan_round_up(f->bkv * f->a.D * f->bs * es, al),
                                            &f->kbuf[t]));
                LM_TRY(lm__plan_low_add_buf(low, t, -1, lm__plan_round_up(f->bkv * f->bs * f->a.Dv * es, al),
                                            &f->vbuf[t]));
                if (ikv == 0 && gkv > 1)
                    LM_TRY(lm__plan_low_add_buf(low, t, -1, lm__plan_round_up((gkv - 1) * st_bytes, al), &f->rbuf[t]));
            }
        }
    return LM_OK;
}

/* The matmuls of one tile and step for query heads [h0, h0 + hn): scores
 * (which = 0: S[h] = Q[h] K^T[kv(h)]) or values (which = 1: O[h] += P[h] V[kv(h)]);
 * one call over all heads without grouping, else one per kv head (its K/V block
 * read by every head of the group: batch stride 0). */
static lm_status head_matmuls(fl *f, int which, int64_t t, int64_t h0, int64_t hn, int64_t q0, int64_t qn, int64_t n,
                              const lm__plan_opnd *P) {
    int64_t g = f->a.group, kh0, kh1, ih = h0 / f->bh, D = f->a.D, Dv = f->a.Dv;
    lm__plan_flash_kv_heads(&f->a, &f->f, ih, &kh0, &kh1);
    for (int64_t kh = kh0; kh < kh1; kh++) {
        int64_t a = g == 1 ? h0 : LM_MAX(h0, kh * g), b = g == 1 ? h0 + hn : LM_MIN(h0 + hn, (kh + 1) * g);
        lm__plan_call mm = lm__plan_proj_call(t, LM__PLAN_K_MATMUL);
        if (which == 0) {
            int64_t lo[3] = {a, q0, 0}, hi[3] = {b, q0 + qn, D};
            LM_TRY(canon_operand(f, f->o->in[0], f->a.qmap, t, lo, hi, &mm.op[0]));
            int64_t kd[3] = {b - a, D, n}, ks[3] = {g == 1 ? D * f->bs : 0, f->bs, 1};
            mm.op[1] = opnd(f->kbuf[t], f->a.dt, (kh - kh0) * D * f->bs, 3, kd, ks);
            int64_t sd[3] = {b - a, qn, n}, ss[3] = {f->bq * f->bs, f->bs, 1};
            mm.op[2] = opnd(f->sbuf[t], LM_F32, (a - h0) * f->bq * f->bs, 3, sd, ss);
        } else {
            mm.op[0] = *P;
            mm.op[0].off += (a - h0) * P->strides[0];
            mm.op[0].dims[0] = (int32_t)(b - a);
            int64_t vd[3] = {b - a, n, Dv}, vs[3] = {g == 1 ? f->bs * Dv : 0, Dv, 1};
            mm.op[1] = opnd(f->vbuf[t], f->a.dt, (kh - kh0) * f->bs * Dv, 3, vd, vs);
            state_opnd(f, t, b - a, qn, Dv, &mm.op[2]);
            mm.op[2].off = (a - h0) * f->bq * (Dv + 2);
            mm.i[0] = 1;
        }
        LM_TRY(push(f, &mm));
        if (g == 1) break;
    }
    return LM_OK;
}

static lm_status step_compute(fl *f, int64_t s) {
    for (int64_t ih = 0; ih < f->f.g[0]; ih++)
        for (int64_t iq = 0; iq < f->f.g[1]; iq++) {
            int64_t h0, hn, q0, qn;
            extents(f, ih, iq, &h0, &hn, &q0, &qn);
            if (!hn || !qn) continue;
            for (int64_t ikv = 0; ikv < f->f.g[2]; ikv++) {
                int64_t n = kv_extent(f, ikv, s), t = tile_of(f, ih, iq, ikv), j = s * f->f.g[2] + ikv;
                int vis = lm__plan_flash_visible(&f->a, &f->f, iq, j);
                if (!n || !vis) continue;
                LM_TRY(head_matmuls(f, 0, t, h0, hn, q0, qn, n, NULL));
                int64_t sd[3] = {hn, qn, n}, ss[3] = {f->bq * f->bs, f->bs, 1};
                lm__plan_call up = lm__plan_proj_call(t, LM__PLAN_K_FLASH_UPDATE);
                up.op[0] = opnd(f->sbuf[t], LM_F32, 0, 3, sd, ss);
                up.op[1] = opnd(f->pbuf[t], f->a.dt, 0, 3, sd, ss);
                state_opnd(f, t, hn, qn, f->a.Dv + 2, &up.op[2]);
                up.f[0] = (float)f->a.scale;
                if (vis == 2) { /* key kj is seen by row qi iff kj <= qi + diag (and kj > qi + diag - window) */
                    up.i[0] = 1;
                    up.i[1] = q0 + (f->a.Tk - f->a.Tq) - j * f->bs;
                    up.i[2] = f->a.window;
                }
                LM_TRY(push(f, &up));
                LM_TRY(head_matmuls(f, 1, t, h0, hn, q0, qn, n, &up.op[1]));
            }
        }
    return LM_OK;
}

static lm_status finish(fl *f) {
    lm__plan_low *low = f->low;
    int64_t cols = f->a.Dv + 2, stride = f->bh * f->bq * cols, x0 = low->nxfers, sid;
    int mop = (int)(f->o - f->mid->ops);
    if (f->f.g[2] > 1) {
        LM_TRY(lm__plan_low_add_step(low, LM__PLAN_S_EXCHANGE, mop, "flash combine", &sid));
        for (int64_t ih = 0; ih < f->f.g[0]; ih++)
            for (int64_t iq = 0; iq < f->f.g[1]; iq++) {
                int64_t h0, hn, q0, qn;
                extents(f, ih, iq, &h0, &hn, &q0, &qn);
                if (!hn || !qn) continue;
                int64_t owner = tile_of(f, ih, iq, 0);
                for (int64_t ikv = 1; ikv < f->f.g[2]; ikv++) {
                    int64_t t = tile_of(f, ih, iq, ikv);
                    lm__plan_xfer xf;
                    memset(&xf, 0, sizeof xf);
                    xf.src_tile = (int32_t)t;
                    state_opnd(f, t, hn, qn, cols, &xf.src);
                    xf.bytes = lm__plan_opnd_elems(&xf.src) * 4;
                    xf.dst0 = low->nxdst;
                    xf.ndst = 1;
                    lm__plan_xdst d = {(int32_t)owner, xf.src};
                    d.dst.buf = (int32_t)f->rbuf[owner];
                    d.dst.off = (ikv - 1) * stride;
                    LM_TRY(LM__PUSH(low->xfers, low->nxfers, low->cap_xfers, xf));
                    LM_TRY(LM__PUSH(low->xdst, low->nxdst, low->cap_xdst, d));
                }
            }
        low->steps[sid].x1 = low->nxfers;
        low->steps[sid].nslots = lm__plan_low_slot(low, x0, low->nxfers);
    }
    LM_TRY(lm__plan_low_add_step(low, LM__PLAN_S_COMPUTE, mop, "flash final", &sid));
    for (int64_t ih = 0; ih < f->f.g[0]; ih++)
        for (int64_t iq = 0; iq < f->f.g[1]; iq++) {
            int64_t h0, hn, q0, qn;
            extents(f, ih, iq, &h0, &hn, &q0, &qn);
            if (!hn || !qn) continue;
            int64_t t = tile_of(f, ih, iq, 0);
            if (f->f.g[2] > 1) {
                lm__plan_call c = lm__plan_proj_call(t, LM__PLAN_K_FLASH_COMBINE);
                state_opnd(f, t, hn, qn, cols, &c.op[0]);
                c.op[1] = c.op[0];
                c.op[1].buf = (int32_t)f->rbuf[t];
                c.i[0] = f->f.g[2] - 1;
                c.i[1] = stride;
                LM_TRY(push(f, &c));
            }
            lm__plan_call c = lm__plan_proj_call(t, LM__PLAN_K_FLASH_FINAL);
            state_opnd(f, t, hn, qn, cols, &c.op[0]);
            int64_t lo[3] = {h0, q0, 0}, hi[3] = {h0 + hn, q0 + qn, f->a.Dv};
            LM_TRY(canon_operand(f, f->o->out, f->a.omap, t, lo, hi, &c.op[1]));
            LM_TRY(push(f, &c));
        }
    low->steps[sid].c1 = low->ncalls;
    lm__plan_low_sort_calls(low, low->steps[sid].c0, low->steps[sid].c1);
    return LM_OK;
}

/* Whether some tile sees a key of step s (a causal or windowed mask can hide all). */
static int step_needed(const fl *f, int64_t s) {
    for (int64_t iq = 0; iq < f->f.g[1]; iq++)
        for (int64_t ikv = 0; ikv < f->f.g[2]; ikv++)
            if (lm__plan_flash_visible(&f->a, &f->f, iq, s * f->f.g[2] + ikv)) return 1;
    return 0;
}

static lm_status run(fl *f, int mop) {
    lm__plan_low *low = f->low;
    const lm_graph *g = f->P->g;
    LM_TRY(buffers(f));
    int64_t sid;
    LM_TRY(lm__plan_low_add_step(low, LM__PLAN_S_COMPUTE, mop, "flash init", &sid));
    for (int64_t t = 0; t < low->tiles; t++)
        if (f->state[t] >= 0) {
            int64_t ih = t / (f->f.g[1] * f->f.g[2]), iq = t / f->f.g[2] % f->f.g[1];
            int64_t h0, hn, q0, qn;
            extents(f, ih, iq, &h0, &hn, &q0, &qn);
            lm__plan_call c = lm__plan_proj_call(t, LM__PLAN_K_FLASH_INIT);
            state_opnd(f, t, hn, qn, f->a.Dv + 2, &c.op[0]);
            LM_TRY(push(f, &c));
        }
    low->steps[sid].c1 = low->ncalls;
    for (int64_t s = 0; s < f->f.g[3]; s++) {
        if (f->a.causal && !step_needed(f, s)) continue;
        char label[48];
        snprintf(label, sizeof label, "flash step %lld", (long long)s);
        int64_t xs, cs;
        LM_TRY(lm__plan_low_add_step(low, LM__PLAN_S_EXCHANGE, mop, label, &xs));
        LM_TRY(lm__plan_low_add_step(low, LM__PLAN_S_COMPUTE, mop, label, &cs));
        for (f->which = 0; f->which < 2; f->which++) {
            int v = f->which == 0 ? f->a.kt : f->a.v;
            if (!lm__plan_view_chain_affine(g, v, f->A))
                return lm__error(LM_UNSUPPORTED, "flash: '%s' is not an affine view of its root", g->values[v].name);
            LM_TRY(lm__plan_flash_step_pieces(g, &f->a, f->f.g, f->which, s, &f->mid->vals[f->o->in[1 + f->which]].l,
                                              on_piece, f));
            LM_TRY(f->st);
        }
        low->steps[xs].x1 = low->nxfers;
        low->steps[xs].nslots = lm__plan_low_slot(low, low->steps[xs].x0, low->steps[xs].x1);
        LM_TRY(step_compute(f, s));
        low->steps[cs].c1 = low->ncalls;
        lm__plan_low_sort_calls(low, low->steps[cs].c0, low->steps[cs].c1);
    }
    return finish(f);
}

lm_status lm__plan_low_flash(const lm__plan_planner *P, const lm__plan_mid *mid, int mop, lm__plan_low *low) {
    fl f;
    memset(&f, 0, sizeof f);
    f.P = P, f.mid = mid, f.low = low, f.o = &mid->ops[mop];
    if (!lm__plan_attn_of(P->g, f.o->gop, &f.a)) return lm__error(LM_INTERNAL, "flash: pattern lost");
    lm__plan_flash_geom_of(&f.a, f.o->grid, &f.f);
    f.bh = f.f.bh, f.bq = f.f.bq, f.bs = f.f.bs, f.bkv = f.f.bkv;
    lm_status st = run(&f, mop);
    lm__free(f.state);
    return st;
}
