/* plan/check.c — independent checkers of a low program; they share nothing with the
 * allocator's lifetime computation and trust nothing in the program (a corrupted one
 * is refused with a message naming the hazard, never read out of bounds).
 *
 * Structure: indices in range, alias chains acyclic and on one tile, every operand's
 * buffer on the tile that accesses it (a transfer delivering into a buffer of another
 * tile is *misrouted*). SRAM: every accessed buffer, and each tile's allocated peak,
 * inside the tile's SRAM (*SRAM overflow*). Slots: in each exchange slot a tile sends at
 * most one stream and receives at most one (*too many streams per slot*). Memory: every
 * access is replayed per tile in program order (repeat bodies twice, so cross-iteration
 * reuse is exercised) against an ownership map of byte intervals: a write makes the
 * bytes belong to its buffer (alias root), a read demands they still belong to the
 * buffer read, every access stays inside its buffer (a reduction kernel's operand is
 * all of its pieces). Exchange hazards: within one exchange phase no byte of a tile is
 * written twice or *written while read*. A failed read is classified from the tile's
 * other accesses: a later write of those bytes by the same buffer => *misordered* (a
 * transfer or kernel after its consumer); an earlier one => overwritten (*live values
 * overlap*); none => *stale data* (a missing or misrouted transfer). Dead writes: every
 * write access must have some of its data read (else its reader ran before it, or the
 * transfer carrying it on is missing) -- this also catches a missing or late transfer
 * into a streamed buffer whose consumer finds the previous block there. The violation
 * reported is the first one in program order over all tiles (a dead write only when no
 * tile has another kind). Cost: O(accesses + contiguous runs x log(segments per tile)),
 * memory O(accesses + segments of one tile).
 */
#include "plan/low.h"

#include <stdio.h>
#include <stdlib.h>

enum { R = 1, W = 2 };
static const uint8_t k_rw[LM__PLAN_K_COUNT][4] = {
    [LM__PLAN_K_MATMUL] = {R, R, W, R}, /* op3: a fused epilogue's bias */
    [LM__PLAN_K_BIAS] = {R, R, W, 0},
    [LM__PLAN_K_UNARY] = {R, W, 0, 0},
    [LM__PLAN_K_BINARY] = {R, R, W, 0},
    [LM__PLAN_K_SOFTMAX] = {R, W, 0, 0},
    [LM__PLAN_K_LAYERNORM] = {R, W, R, R},
    [LM__PLAN_K_RMSNORM] = {R, W, R, 0},
    [LM__PLAN_K_COPY] = {R, W, 0, 0},
    [LM__PLAN_K_REDUCE] = {W, R, R, R},
    [LM__PLAN_K_FLASH_INIT] = {W, 0, 0, 0},
    [LM__PLAN_K_FLASH_UPDATE] = {R, W, R | W, 0},
    [LM__PLAN_K_FLASH_COMBINE] = {R | W, R, 0, 0},
    [LM__PLAN_K_FLASH_FINAL] = {R, W, 0, 0},
    [LM__PLAN_K_ROPE] = {R, W, R, R},
};

static uint8_t call_rw(const lm__plan_call *c, int k) {
    uint8_t rw = k_rw[c->kernel][k];
    if (c->kernel == LM__PLAN_K_MATMUL && k == 2 && c->i[0]) rw = R | W; /* accumulating matmul */
    return rw;
}

/* The reduction kernels read an operand as i[0] copies of its box, i[1] elements apart
 * (REDUCE op2: the contributors' pieces; FLASH_COMBINE op1: the kv-split states). */
static int64_t call_pieces(const lm__plan_call *c, int k, int64_t *step) {
    *step = 0;
    if ((c->kernel == LM__PLAN_K_REDUCE && k == 2) || (c->kernel == LM__PLAN_K_FLASH_COMBINE && k == 1)) {
        *step = c->i[1];
        return c->i[0];
    }
    return 1;
}

/* ---- structure ------------------------------------------------------------------------------ */

/* Distinct element positions of o (stride-0 dims repeat the same ones; 0 when a dim is
 * empty). Only for operands bad_operand accepts: the product stays below 2^40. */
static int64_t positions(const lm__plan_opnd *o) {
    int64_t pos = 1;
    for (int d = 0; d < o->ndim; d++) pos *= o->strides[d] > 0 || o->dims[d] == 0 ? o->dims[d] : 1;
    return pos;
}

/* NULL when o is a well-formed operand of a buffer in range, else why not. */
static const char *bad_operand(const lm__plan_low *low, const lm__plan_opnd *o) {
    const int64_t big = (int64_t)1 << 40; /* bounds every product below away from overflow */
    if (o->buf < 0 || o->buf >= low->nbufs) return "a buffer id out of range";
    if (o->ndim < 0 || o->ndim > LM__PLAN_MAX_DIMS) return "a rank out of range";
    if (o->dtype < 0 || o->dtype >= LM_DTYPE_COUNT || lm_dtype_size(o->dtype) == 0) return "an unknown dtype";
    if (o->off < 0 || o->off > big) return "an element offset out of range";
    int64_t n = 1; /* product of the non-empty extents */
    for (int d = 0; d < o->ndim; d++) {
        if (o->dims[d] < 0 || o->strides[d] < 0) return "a negative extent or stride";
        if (o->dims[d] > 0 && (int64_t)(o->dims[d] - 1) * o->strides[d] > big) return "a stride out of range";
        int64_t e = LM_MAX(o->dims[d], 1);
        if (n > big / e) return "an extent out of range";
        n *= e;
    }
    /* distinct positions never outnumber the buffer's elements */
    return positions(o) > LM_MAX(low->bufs[o->buf].bytes / (int64_t)lm_dtype_size(o->dtype), 1)
               ? "more elements than its buffer holds"
               : NULL;
}

/* Indices, alias roots (root[b], acyclic, same tile) and operand placement. */
static lm_status check_structure(const lm_plan_machine *m, const lm__plan_mid *mid, const lm__plan_low *low,
                                 int32_t *root) {
    int64_t T = low->tiles, nb = low->nbufs;
    if (low->ncalls > INT32_MAX || low->nxfers > INT32_MAX || low->nsteps > INT32_MAX / 4)
        return lm__error(LM_INTERNAL, "check: %lld calls, %lld transfers, %lld steps: more than the checker indexes",
                         (long long)low->ncalls, (long long)low->nxfers, (long long)low->nsteps);
    if (T != m->tiles || !low->peak)
        return lm__error(LM_INTERNAL, "check: the low program has %lld tiles (machine %lld) or no allocation",
                         (long long)T, (long long)m->tiles);
    for (int64_t b = 0; b < nb; b++) {
        const lm__plan_buf *x = &low->bufs[b];
        const int64_t big = (int64_t)1 << 40;
        if (x->tile < 0 || x->tile >= T || x->alias < -1 || x->alias >= nb || x->copies < 1 || x->copies > big ||
            x->bytes < 0 || x->bytes > big || x->copies > big / LM_MAX(x->bytes, 1) || x->offset < -big ||
            x->offset > big)
            return lm__error(
                LM_INTERNAL,
                "check: buffer %lld: tile %d, alias %d, offset %lld or %lld bytes x %lld copies out of range",
                (long long)b, x->tile, x->alias, (long long)x->offset, (long long)x->bytes, (long long)x->copies);
        int32_t r = (int32_t)b;
        for (int64_t hops = 0; low->bufs[r].alias >= 0; hops++) {
            if (hops >= nb)
                return lm__error(LM_INTERNAL, "check: buffer %lld: its alias chain is a cycle", (long long)b);
            r = low->bufs[r].alias;
        }
        if (low->bufs[r].tile != x->tile)
            return lm__error(LM_INTERNAL, "check: buffer %lld on tile %d aliases buffer %d of tile %d", (long long)b,
                             x->tile, r, low->bufs[r].tile);
        root[b] = r;
    }
    for (int64_t s = 0; s < low->nsteps; s++) {
        const lm__plan_step *st = &low->steps[s];
        const char *lb = st->label;
        switch (st->kind) {
        case LM__PLAN_S_COMPUTE:
            if (st->c0 < 0 || st->c0 > st->c1 || st->c1 > low->ncalls)
                return lm__error(LM_INTERNAL, "check: step %lld (%s): calls out of range", (long long)s, lb);
            for (int64_t c = st->c0; c < st->c1; c++) {
                const lm__plan_call *call = &low->calls[c];
                if (call->tile < 0 || call->tile >= T || call->kernel < 0 || call->kernel >= LM__PLAN_K_COUNT)
                    return lm__error(LM_INTERNAL, "check: step %lld (%s) call %lld: tile %d or kernel %d out of range",
                                     (long long)s, lb, (long long)c, call->tile, call->kernel);
                for (int k = 0; k < 4; k++) {
                    const lm__plan_opnd *o = &call->op[k];
                    if (!call_rw(call, k) || o->buf < 0) continue;
                    const char *why = bad_operand(low, o);
                    if (why)
                        return lm__error(LM_INTERNAL, "check: step %lld (%s) call %lld operand %d: %s", (long long)s,
                                         lb, (long long)c, k, why);
                    int64_t pstep, pieces = call_pieces(call, k, &pstep), pos = positions(o);
                    if (pieces < 0 || pieces > 65536 || pstep < 0 || pstep > ((int64_t)1 << 40) ||
                        (pieces > 1 && pstep > 0 &&
                         pos * pieces > low->bufs[o->buf].bytes / (int64_t)lm_dtype_size(o->dtype)))
                        return lm__error(LM_INTERNAL,
                                         "check: step %lld (%s) call %lld operand %d: %lld pieces %lld "
                                         "elements apart out of range",
                                         (long long)s, lb, (long long)c, k, (long long)pieces, (long long)pstep);
                    if (low->bufs[o->buf].tile != call->tile)
                        return lm__error(
                            LM_INTERNAL,
                            "check: step %lld (%s) call %lld on tile %d: operand %d is buffer %d of tile %d "
                            "(misplaced operand)",
                            (long long)s, lb, (long long)c, call->tile, k, o->buf, low->bufs[o->buf].tile);
                }
            }
            break;
        case LM__PLAN_S_EXCHANGE:
            if (st->x0 < 0 || st->x0 > st->x1 || st->x1 > low->nxfers || st->nslots < 0)
                return lm__error(LM_INTERNAL, "check: step %lld (%s): transfers or slots out of range", (long long)s,
                                 lb);
            for (int64_t x = st->x0; x < st->x1; x++) {
                const lm__plan_xfer *xf = &low->xfers[x];
                const char *why = bad_operand(low, &xf->src);
                if (xf->src_tile < 0 || xf->src_tile >= T || why || xf->ndst < 1 || xf->dst0 < 0 ||
                    xf->dst0 + xf->ndst > low->nxdst)
                    return lm__error(LM_INTERNAL, "check: step %lld (%s) transfer %lld: %s", (long long)s, lb,
                                     (long long)x, why ? why : "source tile or destinations out of range");
                if (low->bufs[xf->src.buf].tile != xf->src_tile)
                    return lm__error(LM_INTERNAL,
                                     "check: step %lld (%s) transfer %lld: misrouted: it sends from tile %d out of "
                                     "buffer %d, which lives on tile %d",
                                     (long long)s, lb, (long long)x, xf->src_tile, xf->src.buf,
                                     low->bufs[xf->src.buf].tile);
                for (int32_t d = 0; d < xf->ndst; d++) {
                    const lm__plan_xdst *xd = &low->xdst[xf->dst0 + d];
                    why = bad_operand(low, &xd->dst);
                    for (int k = 0; !why && k < xd->dst.ndim; k++)
                        if (xd->dst.strides[k] == 0 && xd->dst.dims[k] > 1) why = "it writes the same bytes twice";
                    if (xd->tile < 0 || xd->tile >= T || why)
                        return lm__error(LM_INTERNAL, "check: step %lld (%s) transfer %lld destination %d: %s",
                                         (long long)s, lb, (long long)x, d, why ? why : "tile out of range");
                    if (low->bufs[xd->dst.buf].tile != xd->tile)
                        return lm__error(
                            LM_INTERNAL,
                            "check: step %lld (%s) transfer %lld: misrouted: destination %d is tile %d but "
                            "its buffer %d lives on tile %d",
                            (long long)s, lb, (long long)x, d, xd->tile, xd->dst.buf, low->bufs[xd->dst.buf].tile);
                }
            }
            break;
        case LM__PLAN_S_CHECK:
            if (st->mval < 0 || st->mval >= mid->nvals)
                return lm__error(LM_INTERNAL, "check: step %lld (%s): checked value out of range", (long long)s, lb);
            break;
        case LM__PLAN_S_REPEAT:
            if (st->match <= s || st->match >= low->nsteps || low->steps[st->match].kind != LM__PLAN_S_END ||
                st->count < 0)
                return lm__error(LM_INTERNAL, "check: step %lld (%s): repeat without its end", (long long)s, lb);
            break;
        case LM__PLAN_S_END: break;
        default: return lm__error(LM_INTERNAL, "check: step %lld: unknown kind %d", (long long)s, (int)st->kind);
        }
    }
    return LM_OK;
}

/* ---- slots ---------------------------------------------------------------------------------- */

/* Per (step, slot) key: which transfer a tile sends / receives; O(transfers + tiles). */
static lm_status check_slots(const lm__plan_low *low) {
    int64_t T = low->tiles;
    int64_t *sk = lm__alloc(sizeof(int64_t) * (size_t)(4 * T), 16);
    if (!sk) return LM_OUT_OF_MEMORY;
    int64_t *sx = sk + T, *rk = sk + 2 * T, *rx = sk + 3 * T; /* send key / transfer, receive key / transfer */
    for (int64_t t = 0; t < T; t++) sk[t] = rk[t] = -1;
    lm_status st = LM_OK;
    for (int64_t s = 0; s < low->nsteps && st == LM_OK; s++) {
        const lm__plan_step *step = &low->steps[s];
        if (step->kind != LM__PLAN_S_EXCHANGE) continue;
        for (int64_t x = step->x0; x < step->x1 && st == LM_OK; x++) {
            const lm__plan_xfer *xf = &low->xfers[x];
            if (xf->slot < 0 || xf->slot >= step->nslots) {
                st = lm__error(LM_INTERNAL, "check: step %lld (%s) transfer %lld has slot %d of %d", (long long)s,
                               step->label, (long long)x, xf->slot, step->nslots);
                break;
            }
            int64_t key = s * ((int64_t)1 << 31) + xf->slot;
            if (sk[xf->src_tile] == key)
                st = lm__error(LM_INTERNAL,
                               "check: step %lld (%s) slot %d: tile %d sends two streams (transfers %lld and %lld: "
                               "too many streams per slot)",
                               (long long)s, step->label, xf->slot, xf->src_tile, (long long)sx[xf->src_tile],
                               (long long)x);
            sk[xf->src_tile] = key, sx[xf->src_tile] = x;
            for (int32_t d = 0; d < xf->ndst && st == LM_OK; d++) {
                const lm__plan_xdst *xd = &low->xdst[xf->dst0 + d];
                if (rk[xd->tile] == key)
                    st =
                        lm__error(LM_INTERNAL,
                                  "check: step %lld (%s) slot %d: tile %d receives two streams (transfers %lld and "
                                  "%lld: too many streams per slot)",
                                  (long long)s, step->label, xf->slot, xd->tile, (long long)rx[xd->tile], (long long)x);
                rk[xd->tile] = key, rx[xd->tile] = x;
                if (st == LM_OK &&
                    (lm__plan_opnd_elems(&xd->dst) != lm__plan_opnd_elems(&xf->src) || xd->dst.dtype != xf->src.dtype))
                    st = lm__error(LM_INTERNAL,
                                   "check: step %lld (%s) transfer %lld: source and destination %d differ in size or "
                                   "dtype",
                                   (long long)s, step->label, (long long)x, d);
            }
        }
    }
    lm__free(sk);
    return st;
}

/* ---- access records ------------------------------------------------------------------------- */

typedef struct rec {        /* 32 bytes: a full-size program has millions */
    const lm__plan_opnd *o; /* the accessed operand (borrowed) */
    int32_t seq;            /* program order of the executed step instance */
    int32_t item;           /* call or transfer index (checkpoints: -1) */
    int32_t tile, step, iter;
    uint8_t rw;   /* R or W */
    uint8_t xchg; /* 1: an access of an exchange phase */
    uint8_t k;    /* calls: the operand (its pieces: call_pieces) */
} rec;

/* A record's pieces (a reduction kernel's operand; else 1) and their distance in elements. */
static int64_t rec_pieces(const lm__plan_low *low, const rec *r, int64_t *step) {
    *step = 0;
    return r->xchg || r->item < 0 ? 1 : call_pieces(&low->calls[r->item], r->k, step);
}

typedef struct recs {
    rec *v; /* [n] in emission order: per tile, program order with reads before writes */
    int64_t n, cap;
    int64_t seq;
    lm__plan_opnd *checks; /* operands of checkpoint reads */
    int64_t nchecks, cap_checks;
    uint8_t *seen; /* [nbufs] 1 when accessed */
} recs;

static lm_status push(recs *r, int32_t tile, int64_t step, uint8_t rw, uint8_t xchg, int64_t iter, int64_t item,
                      const lm__plan_opnd *o) {
    rec x = {o, (int32_t)r->seq, (int32_t)item, tile, (int32_t)step, (int32_t)iter, rw, xchg, 0};
    if (r->seq > INT32_MAX) return lm__error(LM_INTERNAL, "check: more than 2^31 step instances");
    r->seen[o->buf] = 1;
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
            int64_t t = lm__plan_layout_tile(l, sh, 0);
            lm__plan_opnd o;
            LM_TRY(lm__plan_low_operand(low, mid, st->mval, t, lo, hi, &o));
            if (bad_operand(low, &o) || low->bufs[o.buf].tile != t)
                return lm__error(LM_INTERNAL,
                                 "check: step %lld (%s): the checked value's shard on tile %lld has no "
                                 "buffer there",
                                 (long long)s, st->label, (long long)t);
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
            for (int64_t c = st->c0; c < st->c1; c++) { /* a call reads all its operands, then writes */
                const lm__plan_call *call = &low->calls[c];
                for (int pass = R; pass <= W; pass++)
                    for (int k = 0; k < 4; k++) {
                        int64_t pstep;
                        int64_t pieces = call_pieces(call, k, &pstep);
                        if (!(call_rw(call, k) & pass) || call->op[k].buf < 0 || pieces == 0) continue;
                        LM_TRY(push(r, call->tile, s, (uint8_t)pass, 0, iter, c, &call->op[k]));
                        r->v[r->n - 1].k = (uint8_t)k;
                    }
            }
        if (st->kind == LM__PLAN_S_EXCHANGE) { /* a phase reads every source before anything lands */
            for (int64_t x = st->x0; x < st->x1; x++)
                LM_TRY(push(r, low->xfers[x].src_tile, s, R, 1, iter, x, &low->xfers[x].src));
            for (int64_t x = st->x0; x < st->x1; x++)
                for (int32_t d = 0; d < low->xfers[x].ndst; d++) {
                    const lm__plan_xdst *xd = &low->xdst[low->xfers[x].dst0 + d];
                    LM_TRY(push(r, xd->tile, s, W, 1, iter, x, &xd->dst));
                }
        }
        if (st->kind == LM__PLAN_S_CHECK) {
            const lm__plan_layout *l = &mid->vals[st->mval].l;
            for (int64_t sh = 0; sh < lm__plan_layout_shards(l); sh++) {
                int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS];
                if (!lm__plan_layout_box(l, sh, lo, hi)) continue;
                LM_TRY(push(r, (int32_t)lm__plan_layout_tile(l, sh, 0), s, R, 0, iter, -1, &r->checks[(*ci)++]));
            }
        }
    }
    return LM_OK;
}

/* The records emit will push for steps [s0, s1) (repeat bodies at most twice), so the
 * array is allocated once. */
static int64_t count_recs(const lm__plan_mid *mid, const lm__plan_low *low, int64_t s0, int64_t s1) {
    int64_t n = 0;
    for (int64_t s = s0; s < s1; s++) {
        const lm__plan_step *st = &low->steps[s];
        if (st->kind == LM__PLAN_S_REPEAT) {
            n += (st->count < 2 ? st->count : 2) * count_recs(mid, low, s + 1, st->match);
            s = st->match;
        } else if (st->kind == LM__PLAN_S_COMPUTE) {
            n += 8 * (st->c1 - st->c0); /* at most 4 operands, each read and written */
        } else if (st->kind == LM__PLAN_S_EXCHANGE) {
            for (int64_t x = st->x0; x < st->x1; x++) n += 1 + low->xfers[x].ndst;
        } else if (st->kind == LM__PLAN_S_CHECK) {
            n += lm__plan_layout_shards(&mid->vals[st->mval].l);
        }
    }
    return n;
}

/* ---- SRAM ------------------------------------------------------------------------------------ */

static lm_status check_sram(const lm_plan_machine *m, const lm__plan_low *low, const uint8_t *seen) {
    for (int64_t b = 0; b < low->nbufs; b++) {
        const lm__plan_buf *x = &low->bufs[b];
        if (!seen[b]) continue;
        int64_t end = x->offset + x->bytes * x->copies;
        if (x->offset < 0 || end > m->sram_bytes)
            return lm__error(
                LM_INTERNAL,
                "check: SRAM overflow: buffer %lld on tile %d occupies bytes [%lld, %lld) but the tile has "
                "%lld bytes of SRAM",
                (long long)b, x->tile, (long long)x->offset, (long long)end, (long long)m->sram_bytes);
        if (end > low->peak[x->tile])
            return lm__error(LM_INTERNAL,
                             "check: buffer %lld on tile %d occupies bytes [%lld, %lld) beyond the tile's allocated "
                             "peak %lld",
                             (long long)b, x->tile, (long long)x->offset, (long long)end,
                             (long long)low->peak[x->tile]);
    }
    for (int64_t t = 0; t < low->tiles; t++)
        if (low->peak[t] > m->sram_bytes)
            return lm__error(LM_INTERNAL,
                             "check: SRAM overflow: tile %lld's allocated peak %lld exceeds its %lld bytes of SRAM",
                             (long long)t, (long long)low->peak[t], (long long)m->sram_bytes);
    return LM_OK;
}

/* ---- contiguous runs of an access ----------------------------------------------------------- */

typedef struct runs {
    int nd;                                                              /* outer dims left after merging */
    int64_t dims[LM__PLAN_MAX_DIMS + 1], strides[LM__PLAN_MAX_DIMS + 1]; /* outer extents, byte strides */
    int64_t run;                                                         /* bytes of one contiguous run */
    int64_t base;                                                        /* tile address of element 0 */
    int64_t count;                                                       /* runs */
    int64_t idx[LM__PLAN_MAX_DIMS + 1], addr, i;                         /* iteration state */
} runs;

static void runs_init(const lm__plan_low *low, const rec *r, runs *q) {
    const lm__plan_opnd *o = r->o;
    const lm__plan_buf *b = &low->bufs[o->buf];
    int64_t es = (int64_t)lm_dtype_size(o->dtype);
    q->base = b->offset + (b->copies > 1 ? (r->iter % b->copies) * b->bytes : 0) + o->off * es;
    q->nd = 0;
    q->count = 1;
    for (int d = 0; d < o->ndim; d++) { /* unit and stride-0 dims add no bytes */
        if (o->dims[d] == 0) q->count = 0;
        if (o->dims[d] > 1 && o->strides[d] > 0)
            q->dims[q->nd] = o->dims[d], q->strides[q->nd] = (int64_t)o->strides[d] * es, q->nd++;
    }
    int64_t pstep, pieces = rec_pieces(low, r, &pstep);
    if (pieces > 1 && pstep > 0) { /* the pieces: one more outer dim */
        memmove(q->dims + 1, q->dims, sizeof q->dims[0] * (size_t)q->nd);
        memmove(q->strides + 1, q->strides, sizeof q->strides[0] * (size_t)q->nd);
        q->dims[0] = pieces, q->strides[0] = pstep * es, q->nd++;
    }
    /* an access is one instant for the checker, so its elements may be visited in any order:
     * largest stride outermost, then contiguous inner dims merged (a transposed dense box
     * becomes one run) */
    for (int d = 1; d < q->nd; d++)
        for (int e = d; e > 0 && q->strides[e - 1] < q->strides[e]; e--) {
            int64_t td = q->dims[e], ts = q->strides[e];
            q->dims[e] = q->dims[e - 1], q->strides[e] = q->strides[e - 1];
            q->dims[e - 1] = td, q->strides[e - 1] = ts;
        }
    q->run = es;
    while (q->nd > 0 && q->strides[q->nd - 1] == q->run) q->run *= q->dims[--q->nd]; /* contiguous inner dims */
    for (int d = 0; d < q->nd; d++) q->count *= q->dims[d], q->idx[d] = 0;
    q->addr = q->base;
    q->i = 0;
}

/* Next run [*a, *a + q->run); 0 when done. */
static int runs_next(runs *q, int64_t *a) {
    if (q->i >= q->count) return 0;
    *a = q->addr;
    q->i++;
    for (int d = q->nd - 1; d >= 0; d--) {
        q->addr += q->strides[d];
        if (++q->idx[d] < q->dims[d]) break;
        q->addr -= q->strides[d] * q->dims[d];
        q->idx[d] = 0;
    }
    return 1;
}

static int covers(const lm__plan_low *low, const rec *r, int64_t x) {
    runs q;
    runs_init(low, r, &q);
    int64_t a;
    while (runs_next(&q, &a))
        if (x >= a && x < a + q.run) return 1;
    return 0;
}

/* ---- the ownership map: per 2 KiB page of a tile, disjoint byte intervals sorted by address,
 * coalesced (same owner and writer); pages keep each insertion's memmove short ------------------ */

typedef struct seg {
    int64_t a, e;   /* bytes [a, e) */
    int64_t writer; /* position of the write access that put the data there, -1 placed before the start */
    int64_t xseq;   /* the exchange phase instance (seq) that wrote it, -1 a kernel or placement */
    int32_t owner;  /* root buffer */
} seg;

typedef struct segpage {
    seg *v; /* [n] inside the page */
    int64_t n, cap;
} segpage;

enum { PAGE_SHIFT = 11 };

typedef struct segmap {
    segpage *p; /* [np] page i holds bytes [i << PAGE_SHIFT, (i + 1) << PAGE_SHIFT) */
    int64_t np;
} segmap;

/* The first segment ending after x. O(log n). */
static int64_t sm_find(const segpage *m, int64_t x) {
    int64_t lo = 0, hi = m->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (m->v[mid].e > x)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* 1 when [a, e) belongs entirely to id (marking the writes read in used[]); else the first
 * byte that does not and its owner (-1: nobody). */
static int page_read(const segpage *m, int64_t a, int64_t e, int32_t id, uint8_t *used, int64_t *bad, int32_t *who) {
    for (int64_t i = sm_find(m, a); a < e; i++) {
        if (i >= m->n || m->v[i].a > a) {
            *bad = a, *who = -1;
            return 0;
        }
        if (m->v[i].owner != id) {
            *bad = a, *who = m->v[i].owner;
            return 0;
        }
        if (m->v[i].writer >= 0) used[m->v[i].writer] = 1;
        a = m->v[i].e;
    }
    return 1;
}

/* Bytes [a, e) now hold id's data written by access writer. O(log n + segments replaced + the tail moved). */
static lm_status page_write(segpage *m, int64_t a, int64_t e, int32_t id, int64_t writer, int64_t xseq, int64_t *clash,
                            int64_t *byte) {
    if (a >= e) return LM_OK;
    int64_t i = sm_find(m, a), j = i;
    while (j < m->n && m->v[j].a < e) j++; /* [i, j) overlap [a, e) */
    for (int64_t k = i; xseq >= 0 && k < j; k++)
        if (m->v[k].xseq == xseq) { /* written twice in this exchange phase */
            *clash = m->v[k].writer, *byte = LM_MAX(a, m->v[k].a);
            return LM_OK;
        }
    seg p[3];
    int np = 0;
    if (i < j && m->v[i].a < a) p[np++] = m->v[i], p[np - 1].e = a;
    p[np++] = (seg){a, e, writer, xseq, id};
    if (i < j && m->v[j - 1].e > e) p[np++] = m->v[j - 1], p[np - 1].a = e;
#define SAME(x, y) ((x).owner == (y).owner && (x).writer == (y).writer)
    if (i > 0 && m->v[i - 1].e == p[0].a && SAME(m->v[i - 1], p[0])) p[0].a = m->v[--i].a;
    if (j < m->n && m->v[j].a == p[np - 1].e && SAME(m->v[j], p[np - 1])) p[np - 1].e = m->v[j++].e;
    int w = 0;
    for (int k = 0; k < np; k++)
        if (w && SAME(p[w - 1], p[k]) && p[w - 1].e == p[k].a)
            p[w - 1].e = p[k].e;
        else
            p[w++] = p[k];
#undef SAME
    int64_t n = m->n - (j - i) + w;
    LM_TRY(lm__reserve((void **)&m->v, &m->cap, n, sizeof *m->v));
    memmove(m->v + i + w, m->v + j, sizeof *m->v * (size_t)(m->n - j));
    memcpy(m->v + i, p, sizeof *p * (size_t)w);
    m->n = n;
    return LM_OK;
}

static int sm_read(const segmap *m, int64_t a, int64_t e, int32_t id, uint8_t *used, int64_t *bad, int32_t *who) {
    for (int64_t pg = a >> PAGE_SHIFT; a < e; pg++) {
        int64_t pe = LM_MIN(e, (pg + 1) << PAGE_SHIFT);
        if (!page_read(&m->p[pg], a, pe, id, used, bad, who)) return 0;
        a = pe;
    }
    return 1;
}

/* Bytes [a, e) now hold id's data from access writer (of exchange phase xseq, -1 none); a
 * byte already written in that phase sets *clash (that writer) and *byte instead. */
static lm_status sm_write(segmap *m, int64_t a, int64_t e, int32_t id, int64_t writer, int64_t xseq, int64_t *clash,
                          int64_t *byte) {
    for (int64_t pg = a >> PAGE_SHIFT; a < e && *clash < 0; pg++) {
        int64_t pe = LM_MIN(e, (pg + 1) << PAGE_SHIFT);
        LM_TRY(page_write(&m->p[pg], a, pe, id, writer, xseq, clash, byte));
        a = pe;
    }
    return LM_OK;
}

/* ---- the per-tile replay -------------------------------------------------------------------- */

enum { V_NONE, V_BOUNDS, V_TWICE, V_WHILE_READ, V_READ, V_DEAD };

typedef struct viol {
    int kind;
    int64_t seq;
    int32_t tile, owner; /* V_READ: the bytes' owner (-1 nobody) */
    int64_t k, k2;       /* positions in ord of the access and of the other access (V_TWICE, V_WHILE_READ) */
    int64_t k0, k1;      /* the tile's records: ord[k0, k1) */
    int64_t byte;        /* tile address */
} viol;

typedef struct hz {
    int64_t a, e, k;
    int rw;
} hz;

static int cmp_hz(const void *x, const void *y) {
    const hz *a = x, *b = y;
    return (a->a > b->a) - (a->a < b->a);
}

typedef struct walker {
    const lm__plan_low *low;
    const rec *v;        /* records */
    const int32_t *ord;  /* [n] record indices grouped by tile, program order within */
    const int32_t *root; /* [nbufs] */
    segmap sm;
    uint8_t *used; /* [records] 1 when something read data the write access at that position put there */
    hz *h;         /* [nh] runs of one exchange phase's overlapping accesses (scratch) */
    int64_t nh, cap_h;
    hz *b; /* [nb] bounding intervals of one exchange phase's accesses (scratch) */
    int64_t nb, cap_b;
} walker;

/* Run-level sweep over records ord[b[i].k] for i in [i0, i1): any byte written twice or written while read. */
static lm_status sweep_runs(walker *w, const hz *b, int64_t i0, int64_t i1, viol *out) {
    w->nh = 0;
    for (int64_t i = i0; i < i1; i++) {
        runs q;
        runs_init(w->low, &w->v[w->ord[b[i].k]], &q);
        int64_t a;
        while (runs_next(&q, &a)) {
            hz x = {a, a + q.run, b[i].k, b[i].rw};
            LM_TRY(LM__PUSH(w->h, w->nh, w->cap_h, x));
        }
    }
    if (w->nh > 1) qsort(w->h, (size_t)w->nh, sizeof *w->h, cmp_hz);
    int64_t we = INT64_MIN, re = INT64_MIN, wk = -1, rk = -1; /* furthest-reaching write and read so far */
    for (int64_t i = 0; i < w->nh; i++) {
        const hz *x = &w->h[i];
        int kind = V_NONE;
        int64_t writer = x->k, other = -1; /* the writing access and the one it collides with */
        if (x->rw == W && we > x->a)
            kind = V_TWICE, other = wk;
        else if (x->rw == W && re > x->a)
            kind = V_WHILE_READ, other = rk;
        else if (x->rw == R && we > x->a)
            kind = V_WHILE_READ, writer = wk, other = x->k;
        if (kind != V_NONE) {
            out->kind = kind, out->k = writer, out->k2 = other, out->byte = x->a;
            return LM_OK;
        }
        if (x->rw == W && x->e > we) we = x->e, wk = x->k;
        if (x->rw == R && x->e > re) re = x->e, rk = x->k;
    }
    return LM_OK;
}

/* Within one exchange phase on a tile (records ord[k0, k1)): no byte written while read
 * (bytes written twice are caught as they are written: the map knows each byte's phase).
 * The accesses' bounding intervals are sorted first; only a chain of overlapping ones
 * holding both a read and a write is swept run by run, so sources and destinations in
 * distinct buffers cost O(records log records). */
static lm_status phase_hazards(walker *w, int64_t k0, int64_t k1, viol *out) {
    w->nb = 0;
    for (int64_t k = k0; k < k1; k++) {
        runs q;
        runs_init(w->low, &w->v[w->ord[k]], &q);
        if (q.count == 0) continue;
        int64_t hi = q.base + q.run;
        for (int d = 0; d < q.nd; d++) hi += (q.dims[d] - 1) * q.strides[d];
        hz x = {q.base, hi, k, w->v[w->ord[k]].rw};
        LM_TRY(LM__PUSH(w->b, w->nb, w->cap_b, x));
    }
    if (w->nb > 1) qsort(w->b, (size_t)w->nb, sizeof *w->b, cmp_hz);
    for (int64_t i = 0, j; i < w->nb; i = j) {
        int64_t end = w->b[i].e;
        int rw = w->b[i].rw;
        for (j = i + 1; j < w->nb && w->b[j].a < end; j++) end = LM_MAX(end, w->b[j].e), rw |= w->b[j].rw;
        if (rw == (R | W)) LM_TRY(sweep_runs(w, w->b, i, j, out));
        if (out->kind != V_NONE) return LM_OK;
    }
    return LM_OK;
}

/* Replays tile t's records ord[k0, k1); the first violation goes to *out (kind V_NONE: none). */
static lm_status walk_tile(walker *w, int64_t t, const int64_t *placed, int64_t np, int64_t k0, int64_t k1, viol *out) {
    const lm__plan_low *low = w->low;
    for (int64_t i = 0; i < w->sm.np; i++) w->sm.p[i].n = 0;
    for (int64_t i = 0; i < np; i++) { /* placed buffers hold their data from the start */
        const lm__plan_buf *b = &low->bufs[placed[i]];
        int64_t none = -1, byte;
        LM_TRY(sm_write(&w->sm, b->offset, b->offset + b->bytes * b->copies, w->root[placed[i]], -1, -1, &none, &byte));
    }
    out->kind = V_NONE, out->tile = (int32_t)t, out->k0 = k0, out->k1 = k1;
    for (int64_t k = k0; k < k1; k++) {
        const rec *r = &w->v[w->ord[k]];
        out->seq = r->seq, out->k = k;
        if (r->xchg && (k == k0 || w->v[w->ord[k - 1]].seq != r->seq)) { /* a new exchange phase */
            int64_t e = k + 1;
            while (e < k1 && w->v[w->ord[e]].seq == r->seq) e++;
            LM_TRY(phase_hazards(w, k, e, out));
            if (out->kind != V_NONE) return LM_OK;
        }
        const lm__plan_opnd *o = r->o;
        const lm__plan_buf *b = &low->bufs[o->buf];
        int64_t pstep, es = (int64_t)lm_dtype_size(o->dtype), span = (rec_pieces(low, r, &pstep) - 1) * pstep;
        int64_t n = lm__plan_opnd_elems(o);
        for (int d = 0; d < o->ndim; d++) span += (int64_t)(o->dims[d] - 1) * o->strides[d];
        if (n > 0 && (o->off < 0 || (o->off + span + 1) * es > b->bytes)) {
            out->kind = V_BOUNDS;
            return LM_OK;
        }
        runs q;
        runs_init(low, r, &q);
        int64_t a;
        int32_t id = w->root[o->buf];
        while (runs_next(&q, &a)) {
            if (r->rw == W) {
                int64_t clash = -1;
                LM_TRY(sm_write(&w->sm, a, a + q.run, id, k, r->xchg ? r->seq : -1, &clash, &out->byte));
                if (clash >= 0) {
                    out->kind = V_TWICE, out->k2 = clash;
                    return LM_OK;
                }
            } else if (!sm_read(&w->sm, a, a + q.run, id, w->used, &out->byte, &out->owner)) {
                out->kind = V_READ;
                return LM_OK;
            }
        }
    }
    /* a write nothing ever reads: its data arrived after its reader (or was never needed) */
    for (int64_t k = k0; k < k1; k++) {
        const rec *r = &w->v[w->ord[k]];
        if (r->rw != W || w->used[k] || lm__plan_opnd_elems(r->o) == 0) continue;
        out->kind = V_DEAD, out->seq = r->seq, out->k = k;
        return LM_OK;
    }
    return LM_OK;
}

static const char *what(const rec *r) { return r->xchg ? "transfer" : r->item >= 0 ? "call" : "checkpoint"; }

/* The message of violation v (classifying a failed read from the tile's other accesses). */
static lm_status report(const lm_plan_machine *m, const walker *w, const viol *v) {
    const lm__plan_low *low = w->low;
    const rec *r = &w->v[w->ord[v->k]];
    const lm__plan_step *st = &low->steps[r->step];
    int32_t id = w->root[r->o->buf];
    long long t = v->tile, s = r->step, x = v->byte;
    if (v->kind == V_BOUNDS) {
        const lm__plan_buf *b = &low->bufs[r->o->buf];
        int64_t pstep, es = (int64_t)lm_dtype_size(r->o->dtype), span = (rec_pieces(low, r, &pstep) - 1) * pstep;
        for (int d = 0; d < r->o->ndim; d++) span += (int64_t)(r->o->dims[d] - 1) * r->o->strides[d];
        int64_t lo = r->o->off * es, hi = (r->o->off + span + 1) * es;
        return lm__error(LM_INTERNAL,
                         "check: tile %lld step %lld (%s) %s %lld: an access of buffer %d spans bytes [%lld, %lld) of "
                         "its %lld (out of bounds: it leaves its buffer%s)",
                         t, s, st->label, what(r), (long long)r->item, r->o->buf, (long long)lo, (long long)hi,
                         (long long)b->bytes,
                         b->offset + hi > m->sram_bytes ? "; SRAM overflow: it leaves the tile's SRAM" : "");
    }
    if (v->kind == V_TWICE || v->kind == V_WHILE_READ) {
        const rec *o = &w->v[w->ord[v->k2]];
        int same = w->root[o->o->buf] == id; /* one buffer: a misrouted piece; two: their allocations overlap */
        return lm__error(LM_INTERNAL,
                         "check: tile %lld step %lld (%s): byte %lld written %s in one exchange phase (transfer %lld "
                         "writes buffer %d where transfer %lld %s buffer %d: %s)",
                         t, s, st->label, x, v->kind == V_TWICE ? "twice" : "while read", (long long)r->item, r->o->buf,
                         (long long)o->item, v->kind == V_TWICE ? "writes" : "reads", o->o->buf,
                         !same                ? "live values overlap"
                         : v->kind == V_TWICE ? "overlapping or misrouted destinations"
                                              : "a transfer overwrites what the phase sends");
    }
    if (v->kind == V_DEAD)
        return lm__error(LM_INTERNAL,
                         "check: tile %lld step %lld (%s) %s %lld: nothing reads the data it writes into buffer %d "
                         "(a dead write: the transfer carrying it on is missing, or it is misordered after its "
                         "consumer, or superfluous)",
                         t, s, st->label, what(r), (long long)r->item, r->o->buf);
    /* V_READ: a later write of these bytes by the same buffer, or an earlier one since overwritten, or none */
    for (int64_t j = v->k + 1; j < v->k1; j++) {
        const rec *q = &w->v[w->ord[j]];
        if (q->rw == W && w->root[q->o->buf] == id && covers(low, q, v->byte))
            return lm__error(LM_INTERNAL,
                             "check: tile %lld step %lld (%s): buffer %d reads byte %lld before step %lld (%s) %s %lld "
                             "writes it (misordered: a write placed after its consumer)",
                             t, s, st->label, r->o->buf, x, (long long)q->step, low->steps[q->step].label, what(q),
                             (long long)q->item);
    }
    int64_t last = -1, mine = -1;
    for (int64_t j = v->k - 1; j >= v->k0 && mine < 0; j--) {
        const rec *q = &w->v[w->ord[j]];
        if (q->rw != W || !covers(low, q, v->byte)) continue;
        if (last < 0) last = j;
        if (w->root[q->o->buf] == id) mine = j;
    }
    const lm__plan_buf *rb = &low->bufs[id];
    int placed = rb->placed && v->byte >= rb->offset && v->byte < rb->offset + rb->bytes * rb->copies;
    if ((mine >= 0 || placed) && v->owner >= 0) {
        char when[96] = "";
        if (last >= 0) {
            const rec *q = &w->v[w->ord[last]];
            snprintf(when, sizeof when, " at step %lld (%s)", (long long)q->step, low->steps[q->step].label);
        }
        return lm__error(LM_INTERNAL,
                         "check: tile %lld step %lld (%s): buffer %d reads byte %lld that buffer %d overwrote%s (live "
                         "values overlap)",
                         t, s, st->label, r->o->buf, x, v->owner, when);
    }
    return lm__error(LM_INTERNAL,
                     "check: tile %lld step %lld (%s): buffer %d reads byte %lld that nothing delivered to it (stale "
                     "data: a missing or misrouted transfer%s)",
                     t, s, st->label, r->o->buf, x, v->owner >= 0 ? "; the byte holds another buffer's data" : "");
}

static lm_status walk_tiles(const lm_plan_machine *m, const lm__plan_low *low, const recs *r, const int32_t *root) {
    int64_t T = low->tiles;
    walker w;
    memset(&w, 0, sizeof w);
    w.low = low, w.v = r->v, w.root = root;
    int32_t *ord = lm__alloc(sizeof(int32_t) * (size_t)(r->n + 1), 16);
    int64_t *rstart = lm__calloc((size_t)T + 1, sizeof(int64_t)), *pstart = lm__calloc((size_t)T + 1, sizeof(int64_t));
    int64_t *placed = lm__alloc(sizeof(int64_t) * (size_t)(low->nbufs + 1), 16);
    w.used = lm__calloc((size_t)r->n + 1, 1);
    int64_t maxb = 1; /* every access lies below its tile's peak (check_sram, bounds) */
    for (int64_t t = 0; t < T; t++) maxb = LM_MAX(maxb, low->peak[t]);
    w.sm.np = (maxb >> PAGE_SHIFT) + 1;
    w.sm.p = lm__calloc((size_t)w.sm.np, sizeof *w.sm.p);
    lm_status st = (!ord || !rstart || !pstart || !placed || !w.used || !w.sm.p) ? LM_OUT_OF_MEMORY : LM_OK;
    if (st == LM_OK) { /* stable counting sorts by tile: records, then placed accessed buffers */
        for (int64_t i = 0; i < r->n; i++) rstart[r->v[i].tile + 1]++;
        for (int64_t t = 0; t < T; t++) rstart[t + 1] += rstart[t];
        for (int64_t i = 0; i < r->n; i++) ord[rstart[r->v[i].tile]++] = (int32_t)i;
        for (int64_t t = T; t > 0; t--) rstart[t] = rstart[t - 1];
        rstart[0] = 0;
        for (int64_t b = 0; b < low->nbufs; b++)
            if (low->bufs[b].placed && r->seen[b]) pstart[low->bufs[b].tile + 1]++;
        for (int64_t t = 0; t < T; t++) pstart[t + 1] += pstart[t];
        for (int64_t b = 0; b < low->nbufs; b++)
            if (low->bufs[b].placed && r->seen[b]) placed[pstart[low->bufs[b].tile]++] = b;
        for (int64_t t = T; t > 0; t--) pstart[t] = pstart[t - 1];
        pstart[0] = 0;
    }
    w.ord = ord;
    viol first = {.kind = V_NONE}, v;
    for (int64_t t = 0; t < T && st == LM_OK; t++) {
        st = walk_tile(&w, t, placed + pstart[t], pstart[t + 1] - pstart[t], rstart[t], rstart[t + 1], &v);
        /* the first in program order, a dead write (a symptom seen only at the end) after any other */
        int better = first.kind == V_NONE || (v.kind == V_DEAD) < (first.kind == V_DEAD) ||
                     ((v.kind == V_DEAD) == (first.kind == V_DEAD) && v.seq < first.seq);
        if (st == LM_OK && v.kind != V_NONE && better) first = v;
    }
    if (st == LM_OK && first.kind != V_NONE) st = report(m, &w, &first);
    for (int64_t i = 0; w.sm.p && i < w.sm.np; i++) lm__free(w.sm.p[i].v);
    lm__free(w.sm.p);
    lm__free(w.used);
    lm__free(w.h);
    lm__free(w.b);
    lm__free(ord);
    lm__free(rstart);
    lm__free(pstart);
    lm__free(placed);
    return st;
}

lm_status lm__plan_check_low(const lm_plan_machine *m, const lm__plan_mid *mid, const lm__plan_low *low) {
    int32_t *root = lm__alloc(sizeof(int32_t) * (size_t)(low->nbufs + 1), 16);
    recs r;
    memset(&r, 0, sizeof r);
    r.seen = lm__calloc((size_t)low->nbufs + 1, 1);
    lm_status st = (!root || !r.seen) ? LM_OUT_OF_MEMORY : LM_OK;
    int64_t ci = 0;
    if (st == LM_OK) st = check_structure(m, mid, low, root);
    if (st == LM_OK) st = check_operands(mid, low, &r);
    if (st == LM_OK) {
        r.cap = count_recs(mid, low, 0, low->nsteps) + 1;
        r.v = r.cap <= INT32_MAX ? lm__alloc(sizeof *r.v * (size_t)r.cap, 16) : NULL;
        if (!r.v) st = r.cap > INT32_MAX ? lm__error(LM_INTERNAL, "check: more than 2^31 accesses") : LM_OUT_OF_MEMORY;
    }
    if (st == LM_OK) st = emit(mid, low, &r, 0, low->nsteps, 0, &ci);
    if (st == LM_OK) st = check_sram(m, low, r.seen);
    if (st == LM_OK) st = check_slots(low);
    if (st == LM_OK) st = walk_tiles(m, low, &r, root);
    lm__free(root);
    lm__free(r.v);
    lm__free(r.checks);
    lm__free(r.seen);
    return st;
}
