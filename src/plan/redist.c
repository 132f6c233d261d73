/* plan/redist.c — converting a value from one layout to another: which box moves
 * from which (shard, replica) to which, and what that costs per tile.
 *
 * For every destination shard the overlapping source blocks are found per dim
 * (O(destination shards x replicas x overlapping source shards)). A non-partial
 * source sends each piece once per destination shard from one replica (the same
 * one for all destination replicas: a multicast), unless a destination tile holds
 * a replica itself (local copy). A partial source sends every contributor's piece;
 * the destination accumulates them.
 */
#include "plan/internal.h"

lm_status lm__plan_ws_init(lm__plan_ws *w, int64_t tiles) {
    memset(w, 0, sizeof *w);
    w->tiles = tiles;
    w->shard_of = lm__alloc(sizeof(int32_t) * (size_t)tiles, 64);
    w->rep_of = lm__alloc(sizeof(int32_t) * (size_t)tiles, 64);
    w->acc = lm__alloc(sizeof(int64_t) * 5 * (size_t)tiles, 64);
    if (!w->shard_of || !w->rep_of || !w->acc) {
        lm__plan_ws_free(w);
        return LM_OUT_OF_MEMORY;
    }
    return LM_OK;
}

void lm__plan_ws_free(lm__plan_ws *w) {
    lm__free(w->shard_of);
    lm__free(w->rep_of);
    lm__free(w->acc);
    memset(w, 0, sizeof *w);
}

typedef struct piece_sink {
    void (*fn)(struct piece_sink *k, const lm__plan_piece *p, int first_from_sender);
} piece_sink;

static int64_t linear(const lm__plan_layout *l, const int64_t *c) {
    int64_t s = 0;
    for (int d = 0; d < l->ndim; d++) s = s * l->grid[d] + c[d];
    return s;
}

/* Tile offsets of every replica of l (row-major over the replica axes). */
static void rep_offsets(const lm__plan_layout *l, int64_t *off) {
    int64_t R = lm__plan_layout_reps(l);
    for (int64_t r = 0; r < R; r++) {
        int64_t t = 0, rem = r;
        for (int a = l->nrep - 1; a >= 0; a--) {
            t += (rem % l->rcount[a]) * l->rstride[a];
            rem /= l->rcount[a];
        }
        off[r] = t;
    }
}

/* Visits every piece of s -> d (destination shards inside win only); the tile map
 * of s must be in w. Shard coordinates advance as odometers and replica tile
 * offsets are precomputed, so a piece costs O(dims) without divisions. */
static void walk(const lm__plan_layout *s, const lm__plan_layout *d, const lm__plan_window *win, lm__plan_ws *w,
                 piece_sink *k) {
    int nd = d->ndim;
    int64_t R = lm__plan_layout_reps(d), SR = lm__plan_layout_reps(s);
    int64_t contributors = s->partial ? s->rcount[0] : 1;
    int64_t stack_d[64], stack_s[64];
    int64_t *drep = R <= 64 ? stack_d : lm__alloc(sizeof(int64_t) * (size_t)R, 16);
    int64_t *srep = SR <= 64 ? stack_s : lm__alloc(sizeof(int64_t) * (size_t)SR, 16);
    if (!drep || !srep) { /* out of memory: visit nothing (callers see no pieces) */
        if (drep != stack_d) lm__free(drep);
        if (srep != stack_s) lm__free(srep);
        return;
    }
    rep_offsets(d, drep);
    rep_offsets(s, srep);
    /* destination shard coordinates: all, or the window on its dim */
    int64_t dc[LM__PLAN_MAX_DIMS], rlo[LM__PLAN_MAX_DIMS], rhi[LM__PLAN_MAX_DIMS];
    for (int i = 0; i < nd; i++) rlo[i] = 0, rhi[i] = d->grid[i];
    if (win && win->dim >= 0) {
        rlo[win->dim] = LM_MAX(0, win->lo);
        rhi[win->dim] = LM_MIN(d->grid[win->dim], win->hi);
    }
    int64_t count = 1;
    for (int i = 0; i < nd; i++) {
        dc[i] = rlo[i];
        count *= LM_MAX(0, rhi[i] - rlo[i]);
    }
    for (int64_t visit = 0; visit < count; visit++) {
        if (visit) { /* advance the destination odometer */
            int i = nd - 1;
            while (i > 0 && dc[i] == rhi[i] - 1) {
                dc[i] = rlo[i];
                i--;
            }
            dc[i]++;
        }
        int64_t ds = linear(d, dc);
        int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS], b0[LM__PLAN_MAX_DIMS], b1[LM__PLAN_MAX_DIMS],
            c[LM__PLAN_MAX_DIMS];
        int64_t dbase = d->tile0;
        int empty = 0;
        for (int i = 0; i < nd; i++) {
            lo[i] = dc[i] * d->block[i];
            hi[i] = LM_MIN(d->dims[i], lo[i] + d->block[i]);
            empty |= lo[i] >= hi[i];
            dbase += dc[i] * d->tstride[i];
        }
        if (empty) continue;
        for (int i = 0; i < nd; i++) {
            b0[i] = lo[i] / s->block[i];
            b1[i] = (hi[i] - 1) / s->block[i];
            c[i] = b0[i];
        }
        for (;;) {
            lm__plan_piece p;
            memset(&p, 0, sizeof p);
            for (int i = nd; i < LM__PLAN_MAX_DIMS; i++) p.hi[i] = 1;
            int64_t ss = linear(s, c), sbase = s->tile0;
            for (int i = 0; i < nd; i++) {
                p.lo[i] = LM_MAX(lo[i], c[i] * s->block[i]);
                p.hi[i] = LM_MIN(hi[i], (c[i] + 1) * s->block[i]);
                sbase += c[i] * s->tstride[i];
            }
            p.src_shard = (int32_t)ss;
            p.dst_shard = (int32_t)ds;
            for (int64_t rp = 0; rp < contributors; rp++) {
                int64_t chosen = s->partial ? rp : ds % SR;
                int sent = 0;
                for (int64_t dr = 0; dr < R; dr++) {
                    int64_t dt = dbase + drep[dr];
                    p.dst_tile = (int32_t)dt;
                    p.dst_rep = (int32_t)dr;
                    if (!s->partial && w->shard_of[dt] == ss) { /* a local replica */
                        p.src_tile = (int32_t)dt;
                        p.src_rep = w->rep_of[dt];
                        k->fn(k, &p, 1);
                        continue;
                    }
                    p.src_rep = (int32_t)chosen;
                    p.src_tile = (int32_t)(sbase + srep[chosen]);
                    k->fn(k, &p, p.src_tile == dt || !sent);
                    if (p.src_tile != dt) sent = 1;
                }
            }
            int i = nd - 1;
            while (i >= 0 && c[i] == b1[i]) {
                c[i] = b0[i];
                i--;
            }
            if (i < 0) break;
            c[i]++;
        }
    }
    if (drep != stack_d) lm__free(drep);
    if (srep != stack_s) lm__free(srep);
}

typedef struct collect_sink {
    piece_sink base;
    lm__plan_piece *v; /* [n] */
    int64_t n, cap;
    lm_status st;
} collect_sink;

static void collect(piece_sink *k, const lm__plan_piece *p, int first) {
    (void)first;
    collect_sink *c = (collect_sink *)k;
    if (c->st == LM_OK) c->st = LM__PUSH(c->v, c->n, c->cap, *p);
}

lm_status lm__plan_redist_pieces_w(const lm__plan_layout *s, const lm__plan_layout *d, const lm__plan_window *win,
                                   lm__plan_ws *w, lm__plan_piece **out, int64_t *n) {
    *out = NULL;
    *n = 0;
    LM_ASSERT(!s->partial || s->nrep == 1);
    lm__plan_layout_tilemap(s, w->tiles, w->shard_of, w->rep_of);
    collect_sink c = {{collect}, NULL, 0, 0, LM_OK};
    walk(s, d, win, w, &c.base);
    if (c.st != LM_OK) {
        lm__free(c.v);
        return c.st;
    }
    *out = c.v;
    *n = c.n;
    return LM_OK;
}

lm_status lm__plan_redist_pieces(const lm__plan_layout *s, const lm__plan_layout *d, lm__plan_ws *w,
                                 lm__plan_piece **out, int64_t *n) {
    return lm__plan_redist_pieces_w(s, d, NULL, w, out, n);
}

typedef struct stat_sink {
    piece_sink base;
    int64_t *recv, *send, *msgs, *local, *add; /* [tiles] each, inside lm__plan_ws.acc */
    int64_t esize;
} stat_sink;

static void count(piece_sink *k, const lm__plan_piece *p, int first) {
    stat_sink *c = (stat_sink *)k;
    int64_t e = 1;
    for (int i = 0; i < LM__PLAN_MAX_DIMS; i++) e *= p->hi[i] - p->lo[i];
    if (p->src_tile == p->dst_tile) {
        c->local[p->dst_tile] += e * c->esize;
    } else {
        c->recv[p->dst_tile] += e * c->esize;
        c->msgs[p->dst_tile]++;
        if (first) c->send[p->src_tile] += e * c->esize;
    }
    c->add[p->dst_tile] += e;
}

void lm__plan_redist_clear(lm__plan_ws *w) { memset(w->acc, 0, sizeof(int64_t) * 5 * (size_t)w->tiles); }

void lm__plan_redist_accumulate(const lm__plan_layout *s, const lm__plan_layout *d, const lm__plan_window *win,
                                lm__plan_ws *w) {
    LM_ASSERT(!s->partial || s->nrep == 1);
    int64_t T = w->tiles;
    lm__plan_layout_tilemap(s, T, w->shard_of, w->rep_of);
    stat_sink c = {
        {count}, w->acc, w->acc + T, w->acc + 2 * T, w->acc + 3 * T, w->acc + 4 * T, (int64_t)lm_dtype_size(s->dtype)};
    walk(s, d, win, w, &c.base);
}

void lm__plan_redist_summary(const lm__plan_ws *w, int partial, int64_t shard_elems, lm__plan_xcost *out) {
    int64_t T = w->tiles;
    const int64_t *recv = w->acc, *send = w->acc + T, *msgs = w->acc + 2 * T, *local = w->acc + 3 * T,
                  *add = w->acc + 4 * T;
    memset(out, 0, sizeof *out);
    for (int64_t t = 0; t < T; t++) {
        out->max_recv = LM_MAX(out->max_recv, recv[t]);
        out->max_send = LM_MAX(out->max_send, send[t]);
        out->max_msgs = LM_MAX(out->max_msgs, msgs[t]);
        out->max_local = LM_MAX(out->max_local, local[t]);
        if (partial) out->max_add = LM_MAX(out->max_add, add[t] - LM_MIN(add[t], shard_elems));
        out->total_recv += recv[t];
    }
}

void lm__plan_redist_stats(const lm__plan_layout *s, const lm__plan_layout *d, lm__plan_ws *w, lm__plan_xcost *out) {
    lm__plan_redist_clear(w);
    lm__plan_redist_accumulate(s, d, NULL, w);
    lm__plan_redist_summary(w, s->partial, lm__plan_layout_shard_elems(d), out);
}
