/* The plan checker (lm_plan_check) against corrupted programs: a small real plan is
 * compiled (an MLP and a GEMM on small16, a GEMM on small4, flash attention on small16), shown to
 * pass the checker, then its low program is corrupted in one specific way and the
 * checker must refuse it with LM_INTERNAL and a message naming the hazard class:
 * (a) write while read in one exchange phase, (b) a misrouted destination (wrong tile,
 * or wrong offset so the consumer reads stale data), (c) SRAM overflow (a buffer, an
 * access, a peak), (d) too many streams per slot (send and receive), (e) a missing
 * transfer, (f) a transfer placed after its consumer (misordered), and overlapping
 * live buffers. Every corruption is undone where it can be and the plan must pass
 * again, so each refusal is caused by the corruption alone. A sweep of random field
 * corruptions shows the checker never reads out of bounds and answers OK or a
 * "check:" message (run it under the sanitizer preset); failing allocations leak nothing.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "plan/low.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct plan_case {
    const char *name, *machine;
    lm_plan_workload_kind kind;
    int64_t a, b, c, heads;
    lm_dtype dt;
    int64_t grid[3];
    lm_plan_attention att;
} plan_case;

/* Small plans with the patterns the corruptions need: multicasts, reduce-scatters
 * (several slots per phase, every tile sending and receiving), several exchange
 * phases, streamed K/V blocks. */
static const plan_case k_cases[] = {
    {"mlp small16", "small16", LM_PLAN_WL_MLP, 32, 64, 96, 1, LM_F16, {0, 0, 0}, LM_PLAN_ATTN_AUTO},
    {"gemm small16 1x4x4", "small16", LM_PLAN_WL_GEMM, 64, 64, 256, 1, LM_F16, {1, 4, 4}, LM_PLAN_ATTN_AUTO},
    {"gemm small4 f32 2x1x2", "small4", LM_PLAN_WL_GEMM, 48, 40, 64, 1, LM_F32, {2, 1, 2}, LM_PLAN_ATTN_AUTO},
    {"attention small16 flash", "small16", LM_PLAN_WL_ATTENTION, 48, 64, 64, 4, LM_F16, {0, 0, 0}, LM_PLAN_ATTN_FLASH},
};
enum { NCASES = sizeof k_cases / sizeof k_cases[0] };

static lm_plan *compile_case(const plan_case *pc) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset(pc->machine, &m));
    lm_plan_workload w;
    lm_plan_workload_default(pc->kind, &w);
    w.m = w.tokens = pc->a;
    w.n = w.width = pc->b;
    w.k = w.hidden = pc->c;
    w.heads = pc->heads;
    w.dtype = pc->dt;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan_options o;
    lm_plan_options_default(&o);
    for (int i = 0; i < 3; i++) o.gemm_grid[i] = pc->grid[i];
    o.attention = pc->att;
    lm_plan *p = NULL;
    lm_status st = m && g ? lm_plan_compile(g, m, &o, &p) : LM_INTERNAL;
    LT_CHECK_MSG(st == LM_OK, "%s: %s", pc->name, lm_last_error());
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    /* the uncorrupted plan passes, so no refusal below can be vacuous */
    if (p && lm_plan_check(p) != LM_OK) {
        LT_CHECK_MSG(0, "%s: the uncorrupted plan fails the checker: %s", pc->name, lm_last_error());
        lm_plan_destroy(p);
        p = NULL;
    }
    return p;
}

/* The checker must refuse p with a message containing needle. */
static int refused(const lm_plan *p, const char *cls, const char *site, const char *needle) {
    lm_status st = lm_plan_check(p);
    int ok = st == LM_INTERNAL && strstr(lm_last_error(), needle) != NULL;
    LT_CHECK_MSG(ok, "%s (%s): lm_plan_check returned %s, want LM_INTERNAL naming '%s': %s", cls, site,
                 lm_status_name(st), needle, st == LM_OK ? "(no error)" : lm_last_error());
    return ok;
}

static void show(const char *cls, const char *site) { printf("  %-18s %-24s %s\n", cls, site, lm_last_error()); }

static int is_exchange(const lm__plan_step *s) { return s->kind == LM__PLAN_S_EXCHANGE && s->x1 > s->x0; }

static lm__plan_opnd *dst_of(lm_plan *p, int64_t x, int32_t d) { return &p->low.xdst[p->low.xfers[x].dst0 + d].dst; }

/* (a) A transfer delivers into the very bytes another transfer of the phase sends
 * from (same size and dtype, so the slot check still passes). */
static void test_write_while_read(void) {
    int hits = 0;
    for (int c = 0; c < NCASES; c++) {
        lm_plan *p = compile_case(&k_cases[c]);
        if (!p) continue;
        lm__plan_low *low = &p->low;
        int done = 0;
        for (int64_t s = 0; s < low->nsteps && !done; s++) {
            const lm__plan_step *st = &low->steps[s];
            if (!is_exchange(st)) continue;
            for (int64_t x = st->x0; x < st->x1 && !done; x++)
                for (int64_t y = st->x0; y < st->x1 && !done; y++) {
                    const lm__plan_xfer *rd = &low->xfers[x];
                    for (int32_t d = 0; d < low->xfers[y].ndst && !done && y != x; d++) {
                        lm__plan_xdst *xd = &low->xdst[low->xfers[y].dst0 + d];
                        if (xd->tile != rd->src_tile || xd->dst.dtype != rd->src.dtype ||
                            lm__plan_opnd_elems(&xd->dst) != lm__plan_opnd_elems(&rd->src))
                            continue;
                        lm__plan_opnd saved = xd->dst;
                        xd->dst = rd->src;
                        if (refused(p, "write while read", k_cases[c].name, "written while read"))
                            show("write while read", k_cases[c].name);
                        xd->dst = saved;
                        LT_CHECK_OK(lm_plan_check(p));
                        done = 1;
                    }
                }
        }
        hits += done;
        lm_plan_destroy(p);
    }
    LT_CHECK_MSG(hits >= 2, "write while read applied to %d plans", hits);
}

/* (b) A destination moved to another tile; a destination moved to other bytes of its
 * buffer (so its consumer finds bytes nobody delivered, or two pieces collide). */
static void test_misrouted_destination(void) {
    int tiles_hit = 0, offsets_hit = 0;
    for (int c = 0; c < NCASES; c++) {
        lm_plan *p = compile_case(&k_cases[c]);
        if (!p) continue;
        lm__plan_low *low = &p->low;
        int64_t x = -1, xs = -1;
        for (int64_t s = 0; s < low->nsteps && x < 0; s++)
            if (is_exchange(&low->steps[s])) x = low->steps[s].x0, xs = s;
        if (x >= 0) { /* wrong tile */
            lm__plan_xdst *xd = &low->xdst[low->xfers[x].dst0];
            int32_t saved = xd->tile;
            xd->tile = (int32_t)((saved + 1) % low->tiles);
            if (refused(p, "misrouted tile", k_cases[c].name, "misrouted")) show("misrouted tile", k_cases[c].name);
            /* consistently misrouted: to a tile free to receive in that slot, into one of its buffers
             * big enough for the box, so only the consumer left waiting on the right tile can tell */
            int32_t saved_buf = xd->dst.buf;
            xd->tile = -1;
            for (int32_t u = 0; u < low->tiles && xd->tile < 0; u++) {
                int busy = u == saved || u == low->xfers[x].src_tile;
                for (int64_t y = low->steps[xs].x0; y < low->steps[xs].x1; y++)
                    for (int32_t d = 0; d < low->xfers[y].ndst; d++)
                        busy |= low->xfers[y].slot == low->xfers[x].slot && low->xdst[low->xfers[y].dst0 + d].tile == u;
                if (!busy) xd->tile = u;
            }
            for (int64_t b = 0; b < low->nbufs && xd->tile >= 0; b++) {
                int used = 0; /* a buffer this phase does not touch */
                for (int64_t y = low->steps[xs].x0; y < low->steps[xs].x1; y++) {
                    used |= low->xfers[y].src.buf == b;
                    for (int32_t d = 0; d < low->xfers[y].ndst; d++) used |= dst_of(p, y, d)->buf == b;
                }
                if (!used && low->bufs[b].tile == xd->tile && low->bufs[b].alias < 0 && low->bufs[b].first >= 0 &&
                    low->bufs[b].bytes >= low->bufs[saved_buf].bytes) {
                    xd->dst.buf = (int32_t)b;
                    if (refused(p, "misrouted tile+buffer", k_cases[c].name, "misrouted"))
                        show("misrouted tile+buf", k_cases[c].name);
                    break;
                }
            }
            xd->tile = saved, xd->dst.buf = saved_buf;
            LT_CHECK_OK(lm_plan_check(p));
            tiles_hit++;
        }
        /* wrong offset: every destination that leaves room in its buffer, shifted past itself */
        int64_t tried = 0;
        for (int64_t s = 0; s < low->nsteps; s++) {
            const lm__plan_step *st = &low->steps[s];
            if (!is_exchange(st)) continue;
            for (int64_t y = st->x0; y < st->x1; y++)
                for (int32_t d = 0; d < low->xfers[y].ndst; d++) {
                    lm__plan_opnd *o = dst_of(p, y, d);
                    int64_t es = (int64_t)lm_dtype_size(o->dtype), span = 1;
                    for (int k = 0; k < o->ndim; k++) span += (int64_t)(o->dims[k] - 1) * o->strides[k];
                    int64_t saved = o->off, room = low->bufs[o->buf].bytes / es;
                    if (saved + 2 * span <= room)
                        o->off = saved + span;
                    else if (saved - span >= 0)
                        o->off = saved - span;
                    else
                        continue;
                    char site[96];
                    snprintf(site, sizeof site, "%s xfer %lld", k_cases[c].name, (long long)y);
                    if (refused(p, "misrouted offset", site, "misrouted") && tried == 0)
                        show("misrouted offset", k_cases[c].name);
                    o->off = saved;
                    tried++;
                }
        }
        LT_CHECK_OK(lm_plan_check(p));
        offsets_hit += tried > 0;
        lm_plan_destroy(p);
    }
    LT_CHECK_MSG(tiles_hit == NCASES && offsets_hit >= 2, "misrouting applied to %d / %d plans", tiles_hit,
                 offsets_hit);
}

/* A buffer of tile t with no alias pointing at it, written by a compute call (op k). */
static int find_output(const lm_plan *p, int64_t *call, int *op) {
    const lm__plan_low *low = &p->low;
    for (int64_t c = 0; c < low->ncalls; c++)
        for (int k = 0; k < 4; k++) {
            const lm__plan_opnd *o = &low->calls[c].op[k];
            if (o->buf < 0 || low->calls[c].kernel != LM__PLAN_K_MATMUL || k != 2) continue;
            const lm__plan_buf *b = &low->bufs[o->buf];
            int aliased = b->alias >= 0 || b->copies != 1;
            for (int64_t j = 0; j < low->nbufs && !aliased; j++) aliased = low->bufs[j].alias == o->buf;
            if (aliased || low->peak[b->tile] + b->bytes > p->m.sram_bytes) continue;
            *call = c, *op = k;
            return 1;
        }
    return 0;
}

/* (c) A buffer placed past the SRAM; an access running off the SRAM's end; an access
 * leaving its buffer inside the SRAM; a tile whose allocated peak exceeds the SRAM. */
static void test_sram_overflow(void) {
    int hits = 0;
    for (int c = 0; c < NCASES; c++) {
        lm_plan *p = compile_case(&k_cases[c]);
        if (!p) continue;
        lm__plan_low *low = &p->low;
        int64_t S = p->m.sram_bytes, call;
        int op;
        if (!find_output(p, &call, &op)) {
            lm_plan_destroy(p);
            continue;
        }
        lm__plan_opnd *o = &low->calls[call].op[op];
        lm__plan_buf *b = &low->bufs[o->buf];
        int64_t t = b->tile, off = b->offset, peak = low->peak[t];
        /* the buffer straddles the SRAM's end */
        b->offset = S - b->bytes / 2 / p->m.align * p->m.align;
        if (refused(p, "SRAM overflow", k_cases[c].name, "SRAM overflow")) show("SRAM buffer", k_cases[c].name);
        /* the buffer moved to the SRAM's free top (peak raised to match), then its access
         * shifted one buffer length up: off the SRAM's end */
        b->offset = S - b->bytes;
        low->peak[t] = S;
        LT_CHECK_OK(lm_plan_check(p));
        int64_t es = (int64_t)lm_dtype_size(o->dtype), saved = o->off;
        o->off += b->bytes / es;
        if (refused(p, "SRAM overflow", k_cases[c].name, "SRAM overflow")) show("SRAM access", k_cases[c].name);
        /* back in place: the same access leaves only its buffer */
        b->offset = off, low->peak[t] = peak;
        if (refused(p, "out of bounds", k_cases[c].name, "out of bounds")) show("buffer access", k_cases[c].name);
        o->off = saved;
        LT_CHECK_OK(lm_plan_check(p));
        low->peak[t] = S + p->m.align;
        if (refused(p, "SRAM overflow", k_cases[c].name, "SRAM overflow")) show("SRAM peak", k_cases[c].name);
        low->peak[t] = peak;
        LT_CHECK_OK(lm_plan_check(p));
        hits++;
        lm_plan_destroy(p);
    }
    LT_CHECK_MSG(hits >= 3, "SRAM overflow applied to %d plans", hits);
}

/* (d) A transfer moved into a slot where its source tile already sends, and one moved
 * into a slot where one of its destinations already receives (its source free there). */
static void test_too_many_streams_per_slot(void) {
    int sends = 0, recvs = 0;
    for (int c = 0; c < NCASES; c++) {
        lm_plan *p = compile_case(&k_cases[c]);
        if (!p) continue;
        lm__plan_low *low = &p->low;
        int send_done = 0, recv_done = 0;
        for (int64_t s = 0; s < low->nsteps; s++) {
            const lm__plan_step *st = &low->steps[s];
            if (!is_exchange(st) || st->nslots < 2) continue;
            for (int64_t x = st->x0; x < st->x1; x++)
                for (int64_t y = st->x0; y < st->x1; y++) {
                    lm__plan_xfer *X = &low->xfers[x], *Y = &low->xfers[y];
                    if (x == y || X->slot == Y->slot) continue;
                    int32_t saved = X->slot;
                    if (!send_done && X->src_tile == Y->src_tile) {
                        X->slot = Y->slot;
                        if (refused(p, "two sends", k_cases[c].name, "sends two streams"))
                            show("slot: two sends", k_cases[c].name);
                        LT_CHECK(strstr(lm_last_error(), "too many streams per slot") != NULL);
                        X->slot = saved;
                        send_done = 1;
                        continue;
                    }
                    int shared = 0, busy = 0;
                    for (int32_t d = 0; d < X->ndst; d++)
                        for (int32_t e = 0; e < Y->ndst; e++)
                            shared |= low->xdst[X->dst0 + d].tile == low->xdst[Y->dst0 + e].tile;
                    for (int64_t z = st->x0; z < st->x1; z++)
                        busy |= z != x && low->xfers[z].slot == Y->slot && low->xfers[z].src_tile == X->src_tile;
                    if (recv_done || !shared || busy) continue;
                    X->slot = Y->slot;
                    if (refused(p, "two receives", k_cases[c].name, "receives two streams"))
                        show("slot: two receives", k_cases[c].name);
                    X->slot = saved;
                    recv_done = 1;
                }
        }
        LT_CHECK_OK(lm_plan_check(p));
        sends += send_done, recvs += recv_done;
        lm_plan_destroy(p);
    }
    LT_CHECK_MSG(sends >= 1 && recvs >= 1, "slot corruptions applied: %d send, %d receive", sends, recvs);
}

/* (e) Each transfer of each plan removed in turn (swapped to the end of its phase,
 * which then ends before it): its consumer must find bytes nobody delivered. */
static void test_missing_transfer(void) {
    int64_t removed = 0, caught = 0;
    for (int c = 0; c < NCASES; c++) {
        lm_plan *p = compile_case(&k_cases[c]);
        if (!p) continue;
        lm__plan_low *low = &p->low;
        int shown = 0;
        for (int64_t s = 0; s < low->nsteps; s++) {
            lm__plan_step *st = &low->steps[s];
            if (!is_exchange(st)) continue;
            for (int64_t x = st->x0; x < st->x1; x++) {
                int64_t last = st->x1 - 1;
                lm__plan_xfer tmp = low->xfers[x];
                low->xfers[x] = low->xfers[last], low->xfers[last] = tmp;
                st->x1--;
                char site[96];
                snprintf(site, sizeof site, "%s step %lld xfer %lld", k_cases[c].name, (long long)s, (long long)x);
                if (refused(p, "missing transfer", site, "missing")) {
                    caught++;
                    if (!shown++) show("missing transfer", k_cases[c].name);
                }
                st->x1++;
                low->xfers[last] = low->xfers[x], low->xfers[x] = tmp;
                removed++;
            }
        }
        LT_CHECK_OK(lm_plan_check(p));
        lm_plan_destroy(p);
    }
    printf("  missing transfer: %lld of %lld removals caught\n", (long long)caught, (long long)removed);
    LT_CHECK(removed >= 10);
}

/* Moves transfer x of exchange step a to the end of the later exchange step b, in a
 * slot of its own. */
static void move_xfer(lm__plan_low *low, int64_t a, int64_t x, int64_t b) {
    int64_t to = low->steps[b].x0 - 1;
    lm__plan_xfer tmp = low->xfers[x];
    memmove(low->xfers + x, low->xfers + x + 1, sizeof tmp * (size_t)(to - x));
    tmp.slot = low->steps[b].nslots++;
    low->xfers[to] = tmp;
    low->steps[a].x1--;
    for (int64_t s = a + 1; s < b; s++)
        if (low->steps[s].kind == LM__PLAN_S_EXCHANGE) low->steps[s].x0--, low->steps[s].x1--;
    low->steps[b].x0--;
}

/* 1 when kernel call c reads operand k (the kernels' contracts in plan/low.h). */
static int reads(const lm__plan_call *c, int k) {
    if (c->op[k].buf < 0) return 0;
    switch ((lm__plan_kk)c->kernel) {
    case LM__PLAN_K_MATMUL: return k != 2 || c->i[0];
    case LM__PLAN_K_BIAS:
    case LM__PLAN_K_BINARY: return k != 2;
    case LM__PLAN_K_REDUCE:
    case LM__PLAN_K_FLASH_INIT: return k != 0;
    case LM__PLAN_K_FLASH_COMBINE: return 1;
    default: return k != 1; /* unary, softmax, norms, copy, flash update (op2 read and written), final, rope */
    }
}

/* 1 when a call of compute step c reads a buffer that exchange step x delivers into. */
static int reads_delivery(const lm__plan_low *low, int64_t x, int64_t c) {
    for (int64_t i = low->steps[x].x0; i < low->steps[x].x1; i++)
        for (int32_t d = 0; d < low->xfers[i].ndst; d++)
            for (int64_t k = low->steps[c].c0; k < low->steps[c].c1; k++)
                for (int j = 0; j < 4; j++)
                    if (reads(&low->calls[k], j) &&
                        low->calls[k].op[j].buf == low->xdst[low->xfers[i].dst0 + d].dst.buf)
                        return 1;
    return 0;
}

/* (f) A transfer moved to a later exchange phase, after the kernel that reads it; and a
 * whole exchange phase swapped with the compute step after it. */
static void test_transfer_after_its_consumer(void) {
    int moved = 0, swapped = 0;
    for (int c = 0; c < NCASES; c++) {
        lm_plan *p = compile_case(&k_cases[c]);
        if (!p) continue;
        lm__plan_low *low = &p->low;
        int64_t a = -1, b = -1;
        for (int64_t s = 0; s < low->nsteps; s++) {
            if (low->steps[s].kind == LM__PLAN_S_REPEAT) break; /* keep the move outside repeat bodies */
            if (!is_exchange(&low->steps[s])) continue;
            if (a < 0)
                a = s;
            else if (b < 0 && s > a + 1)
                b = s;
        }
        if (a >= 0 && b >= 0) {
            move_xfer(low, a, low->steps[a].x0, b);
            if (refused(p, "misordered", k_cases[c].name, "misordered")) show("moved transfer", k_cases[c].name);
            moved++;
        }
        lm_plan_destroy(p);
        p = compile_case(&k_cases[c]);
        if (!p) continue;
        low = &p->low;
        for (int64_t s = 0; s + 1 < low->nsteps; s++) {
            lm__plan_step *st = low->steps;
            if (!is_exchange(&st[s]) || st[s + 1].kind != LM__PLAN_S_COMPUTE || !reads_delivery(low, s, s + 1))
                continue;
            lm__plan_step tmp = st[s];
            st[s] = st[s + 1], st[s + 1] = tmp;
            if (refused(p, "misordered", k_cases[c].name, "misordered")) show("swapped phase", k_cases[c].name);
            st[s + 1] = st[s], st[s] = tmp;
            LT_CHECK_OK(lm_plan_check(p));
            swapped++;
            break;
        }
        lm_plan_destroy(p);
    }
    LT_CHECK_MSG(moved >= 1 && swapped >= 2, "misordering applied: %d moved, %d swapped", moved, swapped);
}

/* A buffer moved onto another one of its tile whose allocator lifetime overlaps: the
 * checker refuses the moves whose accesses really collide (naming the overlap) and
 * accepts the others, which the simulator then confirms harmless (its numerical
 * checks pass), so an acceptance is never a miss. */
static void test_overlapping_live_buffers(void) {
    lm_plan *p = compile_case(&k_cases[0]);
    if (!p) return;
    lm__plan_low *low = &p->low;
    int refusals = 0, accepted = 0;
    for (int64_t a = 0; a < low->nbufs && refusals + accepted < 40; a++)
        for (int64_t b = 0; b < low->nbufs && refusals + accepted < 40; b++) {
            lm__plan_buf *x = &low->bufs[a], *y = &low->bufs[b];
            if (a == b || x->tile != y->tile || x->first < 0 || y->first < 0 || x->alias >= 0 || y->alias >= 0 ||
                x->placed || y->placed || x->offset == y->offset || x->first > y->last || y->first > x->last ||
                y->offset + x->bytes * x->copies > low->peak[x->tile])
                continue;
            int aliased = 0;
            for (int64_t j = 0; j < low->nbufs; j++) aliased |= low->bufs[j].alias == a;
            if (aliased) continue;
            int64_t saved = x->offset;
            x->offset = y->offset;
            if (lm_plan_check(p) != LM_OK) {
                if (refused(p, "overlap", k_cases[0].name, "live values overlap") && !refusals)
                    show("live overlap", k_cases[0].name);
                refusals++;
            } else if (accepted < 8) {
                lm_plan_sim *sim = NULL;
                lm_plan_sim_options so;
                lm_plan_sim_options_default(&so);
                so.threads = 2;
                LT_CHECK_OK(lm_plan_simulate(p, &so, &sim));
                lm_plan_sim_summary ss = {0};
                if (sim) LT_CHECK_OK(lm_plan_sim_get_summary(sim, &ss));
                LT_CHECK_MSG(sim && ss.checks > 0 && ss.checks_failed == 0,
                             "buffer %lld moved onto %lld passes the checker but fails %d of %d numerical checks",
                             (long long)a, (long long)b, ss.checks_failed, ss.checks);
                lm_plan_sim_destroy(sim);
                accepted++;
            }
            x->offset = saved;
        }
    printf("  live overlap: %d moves refused, %d accepted and simulated correctly\n", refusals, accepted);
    LT_CHECK(refusals >= 1);
    LT_CHECK_OK(lm_plan_check(p));
    lm_plan_destroy(p);
}

/* Random single-field corruptions of indices, tiles, slots, offsets, extents and kernel
 * arguments in every plan: the checker answers LM_OK or LM_INTERNAL with a "check:"
 * message, and never reads out of bounds (the sanitizer build proves the latter). */
static void test_random_corruptions_never_derail_the_checker(void) {
    lt_rng r = lt_rng_seed(16);
    int refusals = 0, total = 0;
    for (int c = 0; c < NCASES; c++) {
        lm_plan *p = compile_case(&k_cases[c]);
        if (!p) continue;
        lm__plan_low *low = &p->low;
        for (int i = 0; i < 300; i++, total++) {
            int big = lt_rng_int(&r, 0, 3) == 0;
            int32_t v = (int32_t)lt_rng_int(&r, -2, big ? INT32_MAX : 64);
            lm__plan_xfer *xf = &low->xfers[lt_rng_int(&r, 0, low->nxfers - 1)];
            lm__plan_call *call = &low->calls[lt_rng_int(&r, 0, low->ncalls - 1)];
            lm__plan_buf *bf = &low->bufs[lt_rng_int(&r, 0, low->nbufs - 1)];
            lm__plan_opnd *o = lt_rng_int(&r, 0, 1) ? &xf->src : &call->op[lt_rng_int(&r, 0, 3)];
            int d = (int)lt_rng_int(&r, 0, LM__PLAN_MAX_DIMS - 1);
            int32_t *f32 = NULL;
            int64_t *f64 = NULL;
            int16_t *f16 = NULL;
            switch (lt_rng_int(&r, 0, 13)) {
            case 0: f32 = &xf->src_tile; break;
            case 1: f32 = &xf->slot; break;
            case 2: f32 = &xf->ndst; break;
            case 3: f32 = &low->xdst[xf->dst0].tile; break;
            case 4: f32 = &o->buf; break;
            case 5: f32 = &o->dims[d]; break;
            case 6: f32 = &o->strides[d]; break;
            case 7: f64 = &o->off; break;
            case 8: f64 = &bf->offset; break;
            case 9: f32 = &bf->alias; break;
            case 10: f64 = &call->i[lt_rng_int(&r, 0, 1)]; break;
            case 11: f16 = &call->kernel; break;
            case 12: f32 = &low->xdst[xf->dst0].dst.dims[d]; break;
            default: f32 = &call->tile; break;
            }
            int64_t saved = f32 ? *f32 : f64 ? *f64 : *f16;
            if (f32) *f32 = v;
            if (f64) *f64 = lt_rng_int(&r, 0, 1) ? v : -(int64_t)v;
            if (f16) *f16 = (int16_t)(v % 40 - 2);
            lm_status st = lm_plan_check(p);
            LT_CHECK_MSG(st == LM_OK || (st == LM_INTERNAL && !strncmp(lm_last_error(), "check:", 6)),
                         "%s corruption %d: %s: %s", k_cases[c].name, i, lm_status_name(st), lm_last_error());
            refusals += st != LM_OK;
            if (f32) *f32 = (int32_t)saved;
            if (f64) *f64 = saved;
            if (f16) *f16 = (int16_t)saved;
        }
        LT_CHECK_OK(lm_plan_check(p));
        lm_plan_destroy(p);
    }
    printf("  random corruptions: %d of %d refused\n", refusals, total);
    LT_CHECK(total == 300 * NCASES && refusals >= total / 2);
}

/* Every allocation of the checker failing in turn (on the flash attention plan, whose
 * program has every kind of step): LM_OK or LM_OUT_OF_MEMORY, nothing leaked. */
static void test_checker_survives_allocation_failures(void) {
    lm_plan *p = compile_case(&k_cases[NCASES - 1]);
    if (!p) return;
    lt_alloc_track(0);
    LT_CHECK_OK(lm_plan_check(p));
    int64_t total = lt_alloc_count();
    lt_alloc_untrack();
    LT_CHECK(total >= 5);
    for (int64_t f = 1; f <= total; f++) {
        lt_alloc_track(f);
        lm_status st = lm_plan_check(p);
        LT_CHECK_MSG(st == LM_OK || st == LM_OUT_OF_MEMORY, "failing allocation %lld gave %s: %s", (long long)f,
                     lm_status_name(st), lm_last_error());
        LT_CHECK_MSG(lt_alloc_live() == 0, "failing allocation %lld leaked %lld", (long long)f,
                     (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_plan_destroy(p);
}

int main(void) {
    LT_RUN(test_write_while_read);
    LT_RUN(test_misrouted_destination);
    LT_RUN(test_sram_overflow);
    LT_RUN(test_too_many_streams_per_slot);
    LT_RUN(test_missing_transfer);
    LT_RUN(test_transfer_after_its_consumer);
    LT_RUN(test_overlapping_live_buffers);
    LT_RUN(test_random_corruptions_never_derail_the_checker);
    LT_RUN(test_checker_survives_allocation_failures);
    return lt_finish();
}
