/* plan/sram_alloc.c — buffer lifetimes from the low program and per-tile SRAM offsets.
 *
 * A buffer lives from its first to its last accessing step (placed inputs and
 * parameters from step 0; parameters to the end). A buffer used both inside and
 * outside a repeat body lives across the whole body. In-place aliases share one
 * allocation whose lifetime is the union. Per tile, groups are placed by the shared
 * interval packer (base/pack.c: largest first at the lowest aligned offset not
 * overlapping any time-overlapping group), which also gives the live-bytes lower
 * bound the allocated peak is reported against.
 */
#include "plan/low.h"

#include <stdio.h>
#include <stdlib.h>

static void touch(lm__plan_low *low, int32_t b, int64_t s) {
    if (b < 0) return;
    lm__plan_buf *x = &low->bufs[b];
    if (x->first < 0 || s < x->first) x->first = (int32_t)s;
    if (s > x->last) x->last = (int32_t)s;
}

static void liveness(lm__plan_low *low, const lm__plan_mid *mid, const lm_graph *g) {
    for (int64_t b = 0; b < low->nbufs; b++) low->bufs[b].first = low->bufs[b].last = -1;
    for (int64_t s = 0; s < low->nsteps; s++) {
        const lm__plan_step *st = &low->steps[s];
        if (st->kind == LM__PLAN_S_COMPUTE)
            for (int64_t c = st->c0; c < st->c1; c++)
                for (int k = 0; k < 4; k++) touch(low, low->calls[c].op[k].buf, s);
        if (st->kind == LM__PLAN_S_EXCHANGE)
            for (int64_t x = st->x0; x < st->x1; x++) {
                touch(low, low->xfers[x].src.buf, s);
                for (int32_t d = 0; d < low->xfers[x].ndst; d++)
                    touch(low, low->xdst[low->xfers[x].dst0 + d].dst.buf, s);
            }
        if (st->kind == LM__PLAN_S_CHECK) {
            int owner = lm__plan_mid_owner(mid, st->mval);
            for (int64_t t = 0; t < low->tiles; t++)
                touch(low, low->buf_of[(size_t)owner * (size_t)low->tiles + (size_t)t], s);
        }
    }
    int64_t end = low->nsteps;
    for (int64_t b = 0; b < low->nbufs; b++) {
        lm__plan_buf *x = &low->bufs[b];
        if (!x->placed) continue;
        x->first = 0;
        if (x->last < 0) x->last = 0;
        if (x->mval >= 0 && g->ops[g->values[mid->vals[x->mval].value].op].kind == LM__GOP_PARAM)
            x->last = (int32_t)end;
    }
    /* repeat bodies: a buffer crossing a body boundary lives through the whole body */
    for (int64_t s = 0; s < low->nsteps; s++) {
        const lm__plan_step *st = &low->steps[s];
        if (st->kind != LM__PLAN_S_REPEAT) continue;
        int32_t r = (int32_t)s, e = st->match;
        for (int64_t b = 0; b < low->nbufs; b++) {
            lm__plan_buf *x = &low->bufs[b];
            if (x->first < 0) continue;
            int in_first = x->first > r && x->first<e, in_last = x->last> r && x->last < e;
            if (in_first != in_last || (x->first < r && x->last > e)) {
                x->first = LM_MIN(x->first, r);
                x->last = LM_MAX(x->last, e);
            }
        }
    }
}

static int32_t group_root(const lm__plan_low *low, int32_t b) {
    while (low->bufs[b].alias >= 0) b = low->bufs[b].alias;
    return b;
}

lm_status lm__plan_sram_allocate(const lm_plan_machine *m, const lm__plan_mid *mid, const lm_graph *g,
                                 lm__plan_low *low) {
    liveness(low, mid, g);
    int64_t T = low->tiles, nb = low->nbufs;
    /* merge alias groups into their roots */
    for (int64_t b = 0; b < nb; b++) {
        lm__plan_buf *x = &low->bufs[b];
        if (x->alias < 0 || x->first < 0) continue;
        lm__plan_buf *r = &low->bufs[group_root(low, (int32_t)b)];
        if (r->first < 0) r->first = x->first, r->last = x->last;
        r->first = LM_MIN(r->first, x->first);
        r->last = LM_MAX(r->last, x->last);
        r->bytes = LM_MAX(r->bytes, x->bytes);
    }
    lm__free(low->peak);
    lm__free(low->live_bound);
    low->peak = lm__calloc((size_t)T, sizeof(int64_t));
    low->live_bound = lm__calloc((size_t)T, sizeof(int64_t));
    int64_t *count = lm__calloc((size_t)T + 1, sizeof(int64_t));
    lm__interval *gs = lm__alloc(sizeof *gs * (size_t)(nb ? nb : 1), 16);
    lm_status st = (!low->peak || !low->live_bound || !count || !gs) ? LM_OUT_OF_MEMORY : LM_OK;
    /* bucket group roots by tile */
    if (st == LM_OK) {
        for (int64_t b = 0; b < nb; b++)
            if (low->bufs[b].alias < 0 && low->bufs[b].first >= 0) count[low->bufs[b].tile + 1]++;
        for (int64_t t = 0; t < T; t++) count[t + 1] += count[t];
        for (int64_t b = 0; b < nb; b++) {
            const lm__plan_buf *x = &low->bufs[b];
            if (x->alias >= 0 || x->first < 0) continue;
            lm__interval gr = {x->first, x->last, x->bytes * x->copies, 0, b};
            gs[count[x->tile]++] = gr;
        }
    }
    int64_t start = 0;
    for (int64_t t = 0; t < T && st == LM_OK; t++) {
        int64_t end = count[t], n = end - start;
        lm__interval *tg = gs + start;
        st = lm__pack_intervals(tg, n, m->align, low->nsteps, &low->peak[t], &low->live_bound[t]);
        for (int64_t i = 0; st == LM_OK && i < n; i++) low->bufs[tg[i].id].offset = tg[i].offset;
        if (st == LM_OK && low->peak[t] > m->sram_bytes)
            st = lm__error(
                LM_UNSUPPORTED,
                "plan needs %lld bytes of SRAM on tile %lld (live lower bound %lld) but the machine has %lld",
                (long long)low->peak[t], (long long)t, (long long)low->live_bound[t], (long long)m->sram_bytes);
        start = end;
    }
    for (int64_t b = 0; b < nb && st == LM_OK; b++)
        if (low->bufs[b].alias >= 0) low->bufs[b].offset = low->bufs[group_root(low, (int32_t)b)].offset;
    lm__free(count);
    lm__free(gs);
    return st;
}
