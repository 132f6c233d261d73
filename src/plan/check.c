/* plan/check.c — independent checkers of a low program; they share nothing with the
 * allocator's lifetime computation.
 *
 * Slots: in each exchange slot a tile sends at most one stream and receives at most
 * one. Memory: every access is replayed per tile in program order (repeat bodies
 * twice, so cross-iteration reuse is exercised) with a byte-exact ownership map:
 * a write makes the bytes belong to its buffer, a read demands they still belong to
 * the buffer being read (a live value overwritten by another buffer means the
 * allocation overlapped), and every access must lie inside its buffer and the
 * tile's SRAM. Hazards: within one exchange phase no byte is written twice or
 * written while it is read. Cost O(bytes touched + accesses log accesses).
 */
#include "plan/low.h"

#include <stdio.h>
#include <stdlib.h>

enum { R = 1, W = 2 };
static const uint8_t k_rw[LM__PLAN_K_COUNT][4] = {
    [LM__PLAN_K_MATMUL] = {R, R, W, 0},
    [LM__PLAN_K_BIAS] = {R, R, W, 0},
    [LM__PLAN_K_UNARY] = {R, W, 0, 0},
    [LM__PLAN_K_BINARY] = {R, R, W, 0},
    [LM__PLAN_K_SOFTMAX] = {R, W, 0, 0},
    [LM__PLAN_K_LAYERNORM] = {R, W, R, R},
    [LM__PLAN_K_RMSNORM] = {R, W, R, 0},
    [LM__PLAN_K_COPY] = {R, W, 0, 0},
    [LM__PLAN_K_REDUCE] = {W, R, R, 0},
    [LM__PLAN_K_FLASH_INIT] = {W, 0, 0, 0},
    [LM__PLAN_K_FLASH_UPDATE] = {R, W, R | W, 0},
    [LM__PLAN_K_FLASH_COMBINE] = {R | W, R, 0, 0},
    [LM__PLAN_K_FLASH_FINAL] = {R, W, 0, 0},
    [LM__PLAN_K_ROPE] = {R, W, R, R},
};

static lm_status check_slots(const lm__plan_low *low) {
    int64_t T = low->tiles;
    int64_t *ss = lm__alloc(sizeof(int64_t) * (size_t)T, 16), *rs = lm__alloc(sizeof(int64_t) * (size_t)T, 16);
    lm_status st = (!ss || !rs) ? LM_OUT_OF_MEMORY : LM_OK;
    for (int64_t s = 0; s < low->nsteps && st == LM_OK; s++) {
        const lm__plan_step *step = &low->steps[s];
        if (step->kind != LM__PLAN_S_EXCHANGE) continue;
        for (int32_t slot = 0; slot < step->nslots && st == LM_OK; slot++) {
            for (int64_t t = 0; t < T; t++) ss[t] = rs[t] = -1;
            for (int64_t x = step->x0; x < step->x1 && st == LM_OK; x++) {
                const lm__plan_xfer *xf = &low->xfers[x];
                if (xf->slot < 0 || xf->slot >= step->nslots)
                    st = lm__error(LM_INTERNAL, "check: step %lld transfer %lld has slot %d of %d", (long long)s,
                                   (long long)x, xf->slot, step->nslots);
                if (xf->slot != slot) continue;
                if (ss[xf->src_tile] >= 0)
                    st = lm__error(LM_INTERNAL, "check: step %lld slot %d: tile %d sends two streams", (long long)s,
                                   slot, xf->src_tile);
                ss[xf->src_tile] = x;
                for (int32_t d = 0; d < xf->ndst && st == LM_OK; d++) {
                    int32_t t = low->xdst[xf->dst0 + d].tile;
                    if (rs[t] >= 0)
                        st = lm__error(LM_INTERNAL, "check: step %lld slot %d: tile %d receives two streams",
                                       (long long)s, slot, t);
                    rs[t] = x;
                    if (lm__plan_opnd_elems(&low->xdst[xf->dst0 + d].dst) != lm__plan_opnd_elems(&xf->src) ||
                        low->xdst[xf->dst0 + d].dst.dtype != xf->src.dtype)
                        st = lm__error(LM_INTERNAL, "check: step %lld transfer %lld: source and destination differ",
                                       (long long)s, (long long)x);
                }
            }
        }
    }
    lm__free(ss);
    lm__free(rs);
    return st;
}

typedef struct rec {
    int32_t tile;
    uint8_t rw;
    uint8_t xchg; /* access of an exchange phase */
    int32_t iter;
    int64_t seq;            /* program order of the executed step instance */
    int64_t order;          /* order within the step (reads before writes in exchanges) */
    const lm__plan_opnd *o; /* the accessed operand (borrowed) */
} rec;

typedef struct recs {
    rec *v; /* [n] */
    int64_t n, cap;
    int64_t seq;
    lm__plan_opnd *checks; /* operands of checkpoint reads */
    int64_t nchecks, cap_checks;
} recs;

static int cmp_rec(const void *a, const void *b) {
    const rec *x = a, *y = b;
    if (x->tile != y->tile) return x->tile < y->tile ? -1 : 1;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static lm_status push(recs *r, int32_t tile, uint8_t rw, uint8_t xchg, int64_t iter, int64_t order,
                      const lm__plan_opnd *o) {
    rec x = {tile, rw, xchg, (int32_t)iter, r->seq, order, o};
    return LM__PUSH(r->v, r->n, r->cap, x);
}

static lm_status check_operands(const lm__plan_mid *mid, const lm__plan_low *low, recs *r) {
    for (int64_t s = 0; s < low->nsteps; s++) {
        const lm__plan_step *st = &low->steps[s];
        if (st->kind != LM__PLAN_S_CHECK) continue;
        const lm__plan_layout *l = &mid->vals[st->mval].l;
        for (int64_t sh = 0; sh < lm__plan_layout_shards(l); sh++) {
            int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS];
            if (!lm__plan_layout_box(l, sh, lo, hi)) continue;
            lm__plan_opnd o;
            LM_TRY(lm__plan_low_operand(low, mid, st->mval, lm__plan_layout_tile(l, sh, 0), lo, hi, &o));
            LM_TRY(LM__PUSH(r->checks, r->nchecks, r->cap_checks, o));
        }
    }
    return LM_OK;
}

static lm_status emit(const lm__plan_mid *mid, const lm__plan_low *low, recs *r, int64_t s0, int64_t s1, int64_t iter,
                      int64_t *ci) {
    for (int64_t s = s0; s < s1; s++) {
        const lm__plan_step *st = &low->steps[s];
        r->seq++;
        if (st->kind == LM__PLAN_S_REPEAT) {
            int64_t reps = st->count < 2 ? st->count : 2, c0 = *ci;
            for (int64_t it = 0; it < reps; it++) {
                *ci = c0;
                LM_TRY(emit(mid, low, r, s + 1, st->match, it, ci));
            }
            s = st->match;
            continue;
        }
        if (st->kind == LM__PLAN_S_COMPUTE)
            for (int64_t c = st->c0; c < st->c1; c++) {
                const lm__plan_call *call = &low->calls[c];
                for (int k = 0; k < 4; k++) {
                    uint8_t rw = k_rw[call->kernel][k];
                    if (call->kernel == LM__PLAN_K_MATMUL && k == 2 && call->i[0]) rw = R | W;
                    if (!rw || call->op[k].buf < 0) continue;
                    if (rw & R) LM_TRY(push(r, call->tile, R, 0, iter, 2 * c, &call->op[k]));
                    if (rw & W) LM_TRY(push(r, call->tile, W, 0, iter, 2 * c + 1, &call->op[k]));
                }
            }
        if (st->kind == LM__PLAN_S_EXCHANGE)
            for (int64_t x = st->x0; x < st->x1; x++) {
                const lm__plan_xfer *xf = &low->xfers[x];
                LM_TRY(push(r, xf->src_tile, R, 1, iter, 0, &xf->src));
                for (int32_t d = 0; d < xf->ndst; d++)
                    LM_TRY(push(r, low->xdst[xf->dst0 + d].tile, W, 1, iter, 1, &low->xdst[xf->dst0 + d].dst));
            }
        if (st->kind == LM__PLAN_S_CHECK) {
            const lm__plan_layout *l = &mid->vals[st->mval].l;
            for (int64_t sh = 0; sh < lm__plan_layout_shards(l); sh++) {
                int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS];
                if (!lm__plan_layout_box(l, sh, lo, hi)) continue;
                LM_TRY(push(r, (int32_t)lm__plan_layout_tile(l, sh, 0), R, 0, iter, 0, &r->checks[(*ci)++]));
            }
        }
    }
    return LM_OK;
}

/* Per-byte maps shared by all tiles without clearing: entries carry the tile they
 * belong to (owner = (tile+1) << 32 | buffer; stamps = seq * tiles + tile + 1), so a
 * stale entry of another tile reads as "never written". */
typedef struct tilemem {
    int64_t *owner;           /* [max peak] */
    int64_t *wstamp, *rstamp; /* [max peak] exchange instance that last wrote / read the byte */
    int64_t bytes, tile, tiles;
} tilemem;

static int32_t root_of(const lm__plan_low *low, int32_t b) {
    while (low->bufs[b].alias >= 0) b = low->bufs[b].alias;
    return b;
}

/* Applies one access to the tile's maps; returns an error naming the conflict. */
static lm_status access(const lm_plan_machine *m, const lm__plan_low *low, tilemem *tm, const rec *r) {
    const lm__plan_opnd *o = r->o;
    const lm__plan_buf *b = &low->bufs[o->buf];
    int64_t es = (int64_t)lm_dtype_size(o->dtype);
    int64_t base = b->offset + (b->copies > 1 ? (r->iter % b->copies) * b->bytes : 0);
    int64_t span = 0;
    for (int d = 0; d < o->ndim; d++) span += (int64_t)(o->dims[d] - 1) * o->strides[d];
    if (o->off < 0 || (o->off + span + 1) * es > b->bytes || b->offset + b->bytes * b->copies > m->sram_bytes ||
        base + b->bytes > tm->bytes)
        return lm__error(LM_INTERNAL, "check: tile %d: an access of buffer %d leaves the buffer or the SRAM", r->tile,
                         o->buf);
    int64_t id = ((tm->tile + 1) << 32) | (int64_t)root_of(low, o->buf);
    int64_t stamp = r->seq * tm->tiles + tm->tile + 1;
    int64_t n = lm__plan_opnd_elems(o), last = o->ndim - 1, run = o->strides[last] == 1 ? o->dims[last] : 1;
    for (int64_t i = 0; i < n; i += run) {
        int64_t rem = i, off = o->off;
        for (int d = (int)last; d >= 0; d--) {
            off += (rem % o->dims[d]) * o->strides[d];
            rem /= o->dims[d];
        }
        int64_t a = base + off * es, e = a + run * es;
        for (int64_t x = a; x < e; x++) {
            if (r->rw == R) {
                if (tm->owner[x] != id)
                    return lm__error(LM_INTERNAL,
                                     "check: tile %d byte %lld: buffer %d reads data %s (live values overlap)", r->tile,
                                     (long long)x, o->buf,
                                     tm->owner[x] >> 32 != tm->tile + 1 ? "nobody wrote" : "another buffer overwrote");
                if (r->xchg) tm->rstamp[x] = stamp;
            } else {
                if (r->xchg && tm->wstamp[x] == stamp)
                    return lm__error(LM_INTERNAL, "check: tile %d byte %lld written twice in one exchange phase",
                                     r->tile, (long long)x);
                if (r->xchg && tm->rstamp[x] == stamp)
                    return lm__error(LM_INTERNAL, "check: tile %d byte %lld written while read in one exchange phase",
                                     r->tile, (long long)x);
                if (r->xchg) tm->wstamp[x] = stamp;
                tm->owner[x] = id;
            }
        }
    }
    return LM_OK;
}

static lm_status walk_tiles(const lm_plan_machine *m, const lm__plan_low *low, recs *r) {
    if (r->n > 1) qsort(r->v, (size_t)r->n, sizeof *r->v, cmp_rec);
    int64_t maxb = 8;
    for (int64_t t = 0; t < low->tiles; t++) maxb = LM_MAX(maxb, low->peak[t]);
    tilemem tm;
    tm.tiles = low->tiles;
    tm.owner = lm__calloc((size_t)maxb, sizeof(int64_t));
    tm.wstamp = lm__calloc((size_t)maxb, sizeof(int64_t));
    tm.rstamp = lm__calloc((size_t)maxb, sizeof(int64_t));
    /* placed buffers indexed by tile */
    int64_t *pidx = lm__calloc((size_t)low->tiles + 1, sizeof(int64_t)), *placed = NULL, np = 0;
    for (int64_t b = 0; pidx && b < low->nbufs; b++)
        if (low->bufs[b].placed) pidx[low->bufs[b].tile + 1]++, np++;
    placed = lm__alloc(sizeof(int64_t) * (size_t)(np + 1), 16);
    lm_status st = (!tm.owner || !tm.wstamp || !tm.rstamp || !pidx || !placed) ? LM_OUT_OF_MEMORY : LM_OK;
    if (st == LM_OK) {
        for (int64_t t = 0; t < low->tiles; t++) pidx[t + 1] += pidx[t];
        int64_t *fill = lm__alloc(sizeof(int64_t) * (size_t)(low->tiles + 1), 16);
        if (!fill) st = LM_OUT_OF_MEMORY;
        for (int64_t t = 0; fill && t <= low->tiles; t++) fill[t] = pidx[t];
        for (int64_t b = 0; fill && b < low->nbufs; b++)
            if (low->bufs[b].placed) placed[fill[low->bufs[b].tile]++] = b;
        lm__free(fill);
    }
    int64_t k = 0;
    for (int64_t t = 0; t < low->tiles && st == LM_OK; t++) {
        tm.bytes = LM_MAX(8, low->peak[t]);
        tm.tile = t;
        /* placed buffers hold their data from the start */
        for (int64_t i = pidx[t]; i < pidx[t + 1]; i++) {
            const lm__plan_buf *bf = &low->bufs[placed[i]];
            if (bf->first < 0) continue;
            for (int64_t x = bf->offset; x < bf->offset + bf->bytes * bf->copies && x < tm.bytes; x++)
                tm.owner[x] = ((t + 1) << 32) | placed[i];
        }
        while (k < r->n && r->v[k].tile < t) k++;
        for (; k < r->n && r->v[k].tile == t && st == LM_OK; k++) st = access(m, low, &tm, &r->v[k]);
    }
    lm__free(tm.owner);
    lm__free(tm.wstamp);
    lm__free(tm.rstamp);
    lm__free(pidx);
    lm__free(placed);
    return st;
}

lm_status lm__plan_check_low(const lm_plan_machine *m, const lm__plan_mid *mid, const lm__plan_low *low) {
    LM_TRY(check_slots(low));
    recs r;
    memset(&r, 0, sizeof r);
    int64_t ci = 0;
    lm_status st = check_operands(mid, low, &r);
    if (st == LM_OK) st = emit(mid, low, &r, 0, low->nsteps, 0, &ci);
    if (st == LM_OK) st = walk_tiles(m, low, &r);
    lm__free(r.v);
    lm__free(r.checks);
    return st;
}
