/* plan/low.c — projecting the mid program onto tiles: buffers per (mid value, tile),
 * per-tile kernel calls, exchange transfers and repeat/checkpoint steps.
 *
 * Compute: one call per output shard (and replica) on its tile, operands being the
 * inputs' shards on the same tile (the planner's layouts guarantee they are there).
 * An elementwise op whose input dies there writes in place (its output buffer
 * aliases the input's). Data movement (Copy/Exchange/Reduce, streamed matmuls) is
 * projected in low_move.c, flash attention in low_flash.c; exchange slots are
 * assigned here.
 */
#include "plan/low.h"

#include <stdio.h>
#include <stdlib.h>

int lm__plan_mid_owner(const lm__plan_mid *mid, int mv) {
    while (mid->vals[mv].view_of >= 0) mv = mid->vals[mv].view_of;
    return mv;
}

int64_t lm__plan_opnd_elems(const lm__plan_opnd *o) {
    int64_t n = 1;
    for (int d = 0; d < o->ndim; d++) n *= o->dims[d];
    return n;
}

lm_status lm__plan_low_add_call(lm__plan_low *low, const lm__plan_call *c) {
    return LM__PUSH(low->calls, low->ncalls, low->cap_calls, *c);
}

lm_status lm__plan_low_add_buf(lm__plan_low *low, int64_t tile, int mval, int64_t bytes, int64_t *id) {
    lm__plan_buf b;
    memset(&b, 0, sizeof b);
    b.tile = (int32_t)tile;
    b.mval = mval;
    b.alias = -1;
    b.first = b.last = -1;
    b.bytes = bytes;
    b.copies = 1;
    *id = low->nbufs;
    return LM__PUSH(low->bufs, low->nbufs, low->cap_bufs, b);
}

lm_status lm__plan_low_add_step(lm__plan_low *low, lm__plan_sk kind, int mop, const char *label, int64_t *id) {
    lm__plan_step s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.mop = mop;
    s.c0 = s.c1 = low->ncalls;
    s.x0 = s.x1 = low->nxfers;
    s.match = s.check = s.mval = -1;
    snprintf(s.label, sizeof s.label, "%s", label);
    *id = low->nsteps;
    return LM__PUSH(low->steps, low->nsteps, low->cap_steps, s);
}

static int cmp_call(const void *a, const void *b) {
    const lm__plan_call *x = a, *y = b;
    if (x->tile != y->tile) return x->tile < y->tile ? -1 : 1;
    /* stable: the program order is kept in i[1] of no kernel; compare addresses instead */
    return (x > y) - (x < y);
}

void lm__plan_low_sort_calls(lm__plan_low *low, int64_t c0, int64_t c1) {
    /* insertion-order stability: a merge of per-tile runs; calls are appended per
     * shard, so a counting sort by tile keeps each tile's order */
    int64_t n = c1 - c0;
    if (n < 2) return;
    lm__plan_call *tmp = lm__alloc(sizeof *tmp * (size_t)n, 64);
    int64_t *cnt = lm__calloc((size_t)low->tiles + 1, sizeof *cnt);
    if (!tmp || !cnt) { /* fall back to an in-place sort (still grouped by tile) */
        lm__free(tmp);
        lm__free(cnt);
        qsort(low->calls + c0, (size_t)n, sizeof *low->calls, cmp_call);
        return;
    }
    for (int64_t i = c0; i < c1; i++) cnt[low->calls[i].tile + 1]++;
    for (int64_t t = 0; t < low->tiles; t++) cnt[t + 1] += cnt[t];
    for (int64_t i = c0; i < c1; i++) tmp[cnt[low->calls[i].tile]++] = low->calls[i];
    memcpy(low->calls + c0, tmp, sizeof *tmp * (size_t)n);
    lm__free(tmp);
    lm__free(cnt);
}

lm_status lm__plan_low_operand(const lm__plan_low *low, const lm__plan_mid *mid, int mv, int64_t t, const int64_t *lo,
                               const int64_t *hi, lm__plan_opnd *o) {
    const lm__plan_layout *l = &mid->vals[mv].l;
    int owner = lm__plan_mid_owner(mid, mv);
    int32_t buf = low->buf_of[(size_t)owner * (size_t)low->tiles + (size_t)t];
    if (buf < 0) return lm__error(LM_INTERNAL, "low: mid value %d has no buffer on tile %lld", mv, (long long)t);
    /* the shard on tile t: coordinates from the box origin */
    int64_t slo[LM__PLAN_MAX_DIMS], strides[LM__PLAN_MAX_DIMS];
    lm__plan_layout_strides(l, strides);
    memset(o, 0, sizeof *o);
    o->buf = buf;
    o->ndim = l->ndim;
    o->dtype = l->dtype;
    for (int d = 0; d < l->ndim; d++) {
        slo[d] = lo[d] / l->block[d] * l->block[d];
        if (hi[d] > slo[d] + l->block[d] || hi[d] <= lo[d])
            return lm__error(LM_INTERNAL, "low: box [%lld,%lld) of dim %d leaves its shard", (long long)lo[d],
                             (long long)hi[d], d);
        o->off += (lo[d] - slo[d]) * strides[d];
        o->dims[d] = (int32_t)(hi[d] - lo[d]);
        o->strides[d] = (int32_t)strides[d];
    }
    return LM_OK;
}

/* ---- slots --------------------------------------------------------------------------------------- */
int32_t lm__plan_low_slot(lm__plan_low *low, int64_t x0, int64_t x1) {
    int64_t n = x1 - x0;
    if (n <= 0) return 0;
    int64_t T = low->tiles;
    int64_t *sends = lm__calloc((size_t)T, sizeof *sends), *recvs = lm__calloc((size_t)T, sizeof *recvs);
    int64_t *order = lm__alloc(sizeof(int64_t) * (size_t)n, 16);
    if (!sends || !recvs || !order) goto serial;
    int64_t bound = 1;
    for (int64_t i = x0; i < x1; i++) {
        sends[low->xfers[i].src_tile]++;
        for (int32_t k = 0; k < low->xfers[i].ndst; k++) recvs[low->xdst[low->xfers[i].dst0 + k].tile]++;
    }
    for (int64_t i = x0; i < x1; i++) {
        int64_t b = sends[low->xfers[i].src_tile];
        for (int32_t k = 0; k < low->xfers[i].ndst; k++) b += recvs[low->xdst[low->xfers[i].dst0 + k].tile];
        bound = LM_MAX(bound, b);
    }
    int64_t W = (bound + 63) / 64;
    uint64_t *sb = lm__calloc((size_t)(T * W), 8), *rb = lm__calloc((size_t)(T * W), 8);
    if (!sb || !rb) {
        lm__free(sb);
        lm__free(rb);
        goto serial;
    }
    for (int64_t i = 0; i < n; i++) order[i] = x0 + i;
    /* largest first: big transfers share slots, small ones fill the gaps */
    for (int64_t i = 1; i < n; i++) {
        int64_t v = order[i], j = i;
        while (j > 0 && low->xfers[order[j - 1]].bytes < low->xfers[v].bytes) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    int32_t nslots = 0;
    for (int64_t i = 0; i < n; i++) {
        lm__plan_xfer *x = &low->xfers[order[i]];
        for (int64_t s = 0; s < W * 64; s++) {
            uint64_t bit = 1ULL << (s & 63);
            int free_ = !(sb[x->src_tile * W + s / 64] & bit);
            for (int32_t k = 0; k < x->ndst && free_; k++)
                free_ = !(rb[low->xdst[x->dst0 + k].tile * W + s / 64] & bit);
            if (!free_) continue;
            sb[x->src_tile * W + s / 64] |= bit;
            for (int32_t k = 0; k < x->ndst; k++) rb[low->xdst[x->dst0 + k].tile * W + s / 64] |= bit;
            x->slot = (int32_t)s;
            if (s + 1 > nslots) nslots = (int32_t)s + 1;
            break;
        }
    }
    lm__free(sb);
    lm__free(rb);
    lm__free(sends);
    lm__free(recvs);
    lm__free(order);
    return nslots;
serial: /* out of memory: one transfer per slot is always hazard-free */
    lm__free(sends);
    lm__free(recvs);
    lm__free(order);
    for (int64_t i = x0; i < x1; i++) low->xfers[i].slot = (int32_t)(i - x0);
    return (int32_t)n;
}

/* ---- projection helpers ------------------------------------------------------------------------- */

int32_t lm__plan_proj_shard_at(const lm__plan_proj *p, int mv, int64_t t) {
    return p->shard_at[(size_t)mv * (size_t)p->low->tiles + (size_t)t];
}

lm_status lm__plan_proj_shard_box(const lm__plan_proj *p, int mv, int64_t t, int64_t *lo, int64_t *hi) {
    int32_t s = lm__plan_proj_shard_at(p, mv, t);
    if (s < 0) return lm__error(LM_INTERNAL, "low: mid value %d has no shard on tile %lld", mv, (long long)t);
    lm__plan_layout_box(&p->mid->vals[mv].l, s, lo, hi);
    return LM_OK;
}

/* Pads a k-dim operand to 3 dims (leading extent 1) or inserts a broadcast batch dim. */
void lm__plan_proj_to3(lm__plan_opnd *o, int32_t batch) {
    while (o->ndim < 3) {
        for (int d = o->ndim; d > 0; d--) o->dims[d] = o->dims[d - 1], o->strides[d] = o->strides[d - 1];
        o->dims[0] = batch;
        o->strides[0] = 0;
        o->ndim++;
        batch = 1;
    }
}

lm_status lm__plan_proj_add_call(lm__plan_proj *p, lm__plan_call *c) {
    c->cycles = lm__plan_call_cycles(p->P->m, c);
    return lm__plan_low_add_call(p->low, c);
}

lm__plan_call lm__plan_proj_call(int64_t t, lm__plan_kk k) {
    lm__plan_call c;
    memset(&c, 0, sizeof c);
    c.tile = (int32_t)t;
    c.kernel = (int16_t)k;
    for (int i = 0; i < 4; i++) c.op[i].buf = -1;
    return c;
}

static lm_status compute_matmul(lm__plan_proj *p, const lm__plan_mop *o, int64_t t, const int64_t *lo,
                                const int64_t *hi) {
    const lm__plan_mid *mid = p->mid;
    lm__plan_call c = lm__plan_proj_call(t, LM__PLAN_K_MATMUL);
    int nd = mid->vals[o->out].l.ndim;
    int64_t alo[LM__PLAN_MAX_DIMS], ahi[LM__PLAN_MAX_DIMS], blo[LM__PLAN_MAX_DIMS], bhi[LM__PLAN_MAX_DIMS];
    LM_TRY(lm__plan_proj_shard_box(p, o->in[0], t, alo, ahi));
    LM_TRY(lm__plan_proj_shard_box(p, o->in[1], t, blo, bhi));
    int bnd = mid->vals[o->in[1]].l.ndim;
    int64_t k0 = alo[nd - 1], k1 = ahi[nd - 1];
    if (blo[bnd - 2] != k0 || bhi[bnd - 2] != k1)
        return lm__error(LM_INTERNAL, "low: matmul operands disagree on the k range on tile %lld", (long long)t);
    int64_t l[LM__PLAN_MAX_DIMS], h[LM__PLAN_MAX_DIMS];
    for (int d = 0; d < nd - 1; d++) l[d] = lo[d], h[d] = hi[d];
    l[nd - 1] = k0, h[nd - 1] = k1;
    LM_TRY(lm__plan_low_operand(p->low, mid, o->in[0], t, l, h, &c.op[0]));
    if (bnd == 3) l[0] = lo[0], h[0] = hi[0];
    l[bnd - 2] = k0, h[bnd - 2] = k1;
    l[bnd - 1] = lo[nd - 1], h[bnd - 1] = hi[nd - 1];
    LM_TRY(lm__plan_low_operand(p->low, mid, o->in[1], t, l, h, &c.op[1]));
    LM_TRY(lm__plan_low_operand(p->low, mid, o->out, t, lo, hi, &c.op[2]));
    if (o->epi & LM__PLAN_EPI_BIAS) { /* the bias of this shard's columns */
        int64_t clo[1] = {lo[nd - 1]}, chi[1] = {hi[nd - 1]};
        LM_TRY(lm__plan_low_operand(p->low, mid, o->in[o->nin - 1], t, clo, chi, &c.op[3]));
    }
    c.i[2] = o->epi;
    int32_t batch = nd == 3 ? (int32_t)(hi[0] - lo[0]) : 1;
    lm__plan_proj_to3(&c.op[0], 1);
    lm__plan_proj_to3(&c.op[1], batch);
    lm__plan_proj_to3(&c.op[2], 1);
    return lm__plan_proj_add_call(p, &c);
}

static int in_place_ok(const lm__plan_proj *p, int mop_index, const lm__plan_mop *o) {
    const lm__plan_mid *mid = p->mid;
    const lm__plan_mval *in = &mid->vals[o->in[0]], *out = &mid->vals[o->out];
    if (in->view_of >= 0 || in->placed || p->last_use[o->in[0]] != mop_index) return 0;
    if (p->P->g->values[in->value].output || in->region != out->region || in->l.partial) return 0;
    lm__plan_layout a = in->l, b = out->l;
    a.dtype = b.dtype;
    return in->l.dtype == out->l.dtype && lm__plan_layout_equal(&a, &b);
}

static lm_status compute_op(lm__plan_proj *p, int i) {
    const lm__plan_mid *mid = p->mid;
    const lm__plan_mop *o = &mid->ops[i];
    const lm__gop *gop = &p->P->g->ops[o->gop];
    const lm__plan_layout *L = &mid->vals[o->out].l;
    lm__plan_low *low = p->low;
    if (gop->kind == LM__GOP_MATMUL && o->steps > 1) return lm__plan_low_stream_matmul(p, i);
    int64_t st;
    LM_TRY(lm__plan_low_add_step(low, LM__PLAN_S_COMPUTE, i, gop->name, &st));
    if (lm__plan_is_elementwise(gop->kind) || lm__plan_is_rows(gop->kind)) {
        if (in_place_ok(p, i, o)) {
            int in = o->in[0];
            for (int64_t t = 0; t < low->tiles; t++) {
                int32_t bi = low->buf_of[(size_t)in * (size_t)low->tiles + (size_t)t];
                int32_t bo = low->buf_of[(size_t)o->out * (size_t)low->tiles + (size_t)t];
                if (bi >= 0 && bo >= 0) low->bufs[bo].alias = bi;
            }
        }
    }
    int64_t S = lm__plan_layout_shards(L), R = lm__plan_layout_reps(L);
    for (int64_t s = 0; s < S; s++) {
        int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS];
        if (!lm__plan_layout_box(L, s, lo, hi)) continue;
        for (int64_t r = 0; r < R; r++) {
            int64_t t = lm__plan_layout_tile(L, s, r);
            if (gop->kind == LM__GOP_MATMUL) {
                LM_TRY(compute_matmul(p, o, t, lo, hi));
                continue;
            }
            lm__plan_call c = lm__plan_proj_call(t, LM__PLAN_K_COPY);
            int nd = L->ndim;
            LM_TRY(lm__plan_low_operand(low, mid, o->in[0], t, lo, hi, &c.op[0]));
            lm__plan_opnd outo;
            LM_TRY(lm__plan_low_operand(low, mid, o->out, t, lo, hi, &outo));
            int64_t plo[1] = {lo[nd - 1]}, phi[1] = {hi[nd - 1]};
            int64_t flo[1] = {0}, fhi[1] = {L->dims[nd - 1]};
            switch (gop->kind) {
            case LM__GOP_BIAS_ADD:
                c.kernel = LM__PLAN_K_BIAS;
                LM_TRY(lm__plan_low_operand(low, mid, o->in[1], t, plo, phi, &c.op[1]));
                c.op[2] = outo;
                break;
            case LM__GOP_GELU:
            case LM__GOP_SILU:
                c.kernel = LM__PLAN_K_UNARY;
                c.i[0] = gop->kind == LM__GOP_SILU;
                c.op[1] = outo;
                break;
            case LM__GOP_ADD:
            case LM__GOP_MUL:
            case LM__GOP_SWIGLU:
                c.kernel = LM__PLAN_K_BINARY;
                c.i[0] = gop->kind == LM__GOP_MUL ? 1 : gop->kind == LM__GOP_SWIGLU ? 2 : 0;
                LM_TRY(lm__plan_low_operand(low, mid, o->in[1], t, lo, hi, &c.op[1]));
                c.op[2] = outo;
                break;
            case LM__GOP_SOFTMAX:
                c.kernel = LM__PLAN_K_SOFTMAX;
                c.f[0] = (float)gop->a;
                c.op[1] = outo;
                break;
            case LM__GOP_ROPE: {
                int64_t tlo[2] = {lo[0], lo[1]}, thi[2] = {hi[0], hi[1]}; /* the tokens' positions */
                int64_t ilo[1] = {0}, ihi[1] = {L->dims[nd - 1] / 2};      /* the whole inv_freq table */
                c.kernel = LM__PLAN_K_ROPE;
                c.f[0] = (float)gop->a;
                c.op[1] = outo;
                LM_TRY(lm__plan_low_operand(low, mid, o->in[1], t, tlo, thi, &c.op[2]));
                LM_TRY(lm__plan_low_operand(low, mid, o->in[2], t, ilo, ihi, &c.op[3]));
                break;
            }
            case LM__GOP_LAYERNORM:
            case LM__GOP_RMSNORM:
                c.kernel = gop->kind == LM__GOP_LAYERNORM ? LM__PLAN_K_LAYERNORM : LM__PLAN_K_RMSNORM;
                c.f[0] = (float)gop->a;
                c.op[1] = outo;
                LM_TRY(lm__plan_low_operand(low, mid, o->in[1], t, flo, fhi, &c.op[2]));
                if (o->nin > 2) LM_TRY(lm__plan_low_operand(low, mid, o->in[2], t, flo, fhi, &c.op[3]));
                break;
            default: return lm__error(LM_INTERNAL, "low: no kernel for op '%s'", gop->name);
            }
            LM_TRY(lm__plan_proj_add_call(p, &c));
        }
    }
    low->steps[st].c1 = low->ncalls;
    lm__plan_low_sort_calls(low, low->steps[st].c0, low->steps[st].c1);
    return LM_OK;
}

/* Copy / Exchange: S (possibly a view) into owner D. */
/* ---- driver ------------------------------------------------------------------------------------- */
static lm_status make_buffers(lm__plan_proj *p) {
    const lm__plan_mid *mid = p->mid;
    lm__plan_low *low = p->low;
    int64_t T = low->tiles, align = p->P->m->align;
    for (int64_t v = 0; v < mid->nvals; v++) {
        const lm__plan_mval *mv = &mid->vals[v];
        lm__plan_layout_tilemap(&mv->l, T, p->shard_at + (size_t)v * (size_t)T, p->ws.rep_of);
        if (mv->view_of >= 0) continue;
        int64_t bytes = lm__plan_round_up(lm__plan_layout_shard_bytes(&mv->l), align);
        for (int64_t t = 0; t < T; t++) {
            if (lm__plan_proj_shard_at(p, (int)v, t) < 0) continue;
            int64_t id;
            LM_TRY(lm__plan_low_add_buf(low, t, (int)v, bytes, &id));
            low->bufs[id].copies = mv->stacked > 1 ? mv->stacked : 1;
            low->bufs[id].placed = mv->placed;
            low->buf_of[(size_t)v * (size_t)T + (size_t)t] = (int32_t)id;
        }
    }
    return LM_OK;
}

static void compute_last_use(lm__plan_proj *p) {
    const lm__plan_mid *mid = p->mid;
    for (int64_t v = 0; v < mid->nvals; v++) p->last_use[v] = -1;
    for (int64_t i = 0; i < mid->nops; i++)
        for (int k = 0; k < mid->ops[i].nin; k++) p->last_use[lm__plan_mid_owner(mid, mid->ops[i].in[k])] = (int32_t)i;
    /* a value read inside a repeat body and defined outside stays live to the body end */
    for (int64_t i = 0; i < mid->nops; i++) {
        const lm__plan_mop *r = &mid->ops[i];
        if (r->kind != LM__PLAN_M_REPEAT) continue;
        for (int64_t j = i + 1; j < r->body_end; j++)
            for (int k = 0; k < mid->ops[j].nin; k++) {
                int v = lm__plan_mid_owner(mid, mid->ops[j].in[k]);
                if (mid->vals[v].region < 0) p->last_use[v] = LM_MAX(p->last_use[v], (int32_t)r->body_end);
            }
    }
}

lm_status lm__plan_low_build(const lm__plan_planner *P, const lm__plan_mid *mid, lm__plan_low *low) {
    memset(low, 0, sizeof *low);
    int64_t T = P->m->tiles;
    low->tiles = T;
    low->nmvals = mid->nvals;
    lm__plan_proj p = {P, mid, low, {0}, NULL, NULL};
    lm_status st = lm__plan_ws_init(&p.ws, T);
    low->buf_of = lm__alloc(sizeof(int32_t) * (size_t)(mid->nvals * T), 64);
    p.shard_at = lm__alloc(sizeof(int32_t) * (size_t)(mid->nvals * T), 64);
    p.last_use = lm__alloc(sizeof(int32_t) * (size_t)(mid->nvals + 1), 64);
    if (st == LM_OK && (!low->buf_of || !p.shard_at || !p.last_use)) st = LM_OUT_OF_MEMORY;
    if (st == LM_OK) {
        for (int64_t i = 0; i < mid->nvals * T; i++) low->buf_of[i] = -1;
        st = make_buffers(&p);
    }
    if (st == LM_OK) compute_last_use(&p);
    int64_t stack[8];
    int depth = 0;
    for (int64_t i = 0; i <= mid->nops && st == LM_OK; i++) {
        while (depth && mid->ops[stack[depth - 1]].body_end == i) {
            int64_t e;
            st = lm__plan_low_add_step(low, LM__PLAN_S_END, (int)stack[depth - 1], "end", &e);
            if (st != LM_OK) break;
            /* match with its REPEAT step */
            for (int64_t k = e - 1; k >= 0; k--)
                if (low->steps[k].kind == LM__PLAN_S_REPEAT && low->steps[k].mop == stack[depth - 1]) {
                    low->steps[k].match = (int32_t)e;
                    low->steps[e].match = (int32_t)k;
                    break;
                }
            depth--;
        }
        if (i == mid->nops || st != LM_OK) break;
        const lm__plan_mop *o = &mid->ops[i];
        int64_t sid;
        switch (o->kind) {
        case LM__PLAN_M_COMPUTE: st = compute_op(&p, (int)i); break;
        case LM__PLAN_M_COPY:
        case LM__PLAN_M_EXCHANGE: st = lm__plan_low_convert(&p, (int)i); break;
        case LM__PLAN_M_REDUCE: st = lm__plan_low_reduce(&p, (int)i); break;
        case LM__PLAN_M_FLASH: st = lm__plan_low_flash(P, mid, (int)i, low); break;
        case LM__PLAN_M_REPEAT:
            st = lm__plan_low_add_step(low, LM__PLAN_S_REPEAT, (int)i, "repeat", &sid);
            if (st == LM_OK) {
                low->steps[sid].count = o->count;
                if (depth >= 8)
                    st = lm__error(LM_UNSUPPORTED, "low: repeats nested too deep");
                else
                    stack[depth++] = i;
            }
            break;
        case LM__PLAN_M_CHECKPOINT:
            st = lm__plan_low_add_step(low, LM__PLAN_S_CHECK, (int)i, "check", &sid);
            if (st == LM_OK) {
                low->steps[sid].check = o->check;
                low->steps[sid].mval = o->in[0];
            }
            break;
        }
    }
    lm__plan_ws_free(&p.ws);
    lm__free(p.shard_at);
    lm__free(p.last_use);
    if (st != LM_OK) lm__plan_low_free(low);
    return st;
}

void lm__plan_low_free(lm__plan_low *low) {
    lm__free(low->steps);
    lm__free(low->calls);
    lm__free(low->xfers);
    lm__free(low->xdst);
    lm__free(low->bufs);
    lm__free(low->buf_of);
    lm__free(low->peak);
    lm__free(low->live_bound);
    memset(low, 0, sizeof *low);
}
