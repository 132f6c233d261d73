/* plan/sim.c — the simulator: executes a low program on real data in per-tile SRAM
 * images and accounts cycles from the machine model.
 *
 * Time is bulk-synchronous: consecutive compute steps form one superstep costing the
 * busiest tile's summed call cycles; each exchange phase costs sync + sum over its
 * slots of the slot's longest transfer (bytes / rate + message overhead). Compute
 * steps run tiles in parallel on the thread pool (a tile's calls in order); exchange
 * transfers run in parallel (hazard-freedom makes that order-independent). Every
 * checkpoint gathers the value from its shards and compares it with the reference;
 * program outputs stay gathered in the result for lm_plan_sim_output. Inputs and
 * parameters come from the caller's data source or are generated (data.c).
 */
#include "plan/low.h"

#include <math.h>
#include <stdio.h>

typedef struct phase {
    int kind;     /* 0 compute, 1 exchange */
    int32_t step; /* first step of the phase */
    int64_t iter;
    double start, cycles, sync;
    int64_t bytes;
} phase;

typedef struct sim_output {
    char name[LM__G_NAME];
    int64_t n;   /* elements */
    float *data; /* [n] dense row-major, as simulated */
} sim_output;

struct lm_plan_sim {
    lm_plan_sim_summary sum;
    sim_output *outputs; /* [noutputs] program outputs in check order */
    int64_t noutputs, cap_outputs;
    lm_plan_check_result *checks; /* [nchecks] */
    int64_t nchecks, cap_checks;
    phase *phases; /* [nphases] timeline */
    int64_t nphases, cap_phases;
};

typedef struct simctx {
    const lm_plan *p;        /* borrowed */
    const lm__plan_low *low; /* &p->low */
    lm_plan_sim *s;          /* receives results */
    uint8_t **mem;           /* [tiles] SRAM images of each tile's peak size */
    int64_t *tstart;         /* [tiles + 1] call range per tile within the current step */
    int64_t iter;
    int64_t xfer0;  /* first transfer of the exchange step being run */
    float *scratch; /* [workers][scratch] */
    int64_t scratch_n;
    double *tile_cycles; /* [tiles] current superstep */
    double clock;
    int open_compute;
    int32_t open_step;
    lm_plan_sim_options opt;
    lm__plan_data data;
    lm__plan_ref ref;
} simctx;

void lm_plan_sim_options_default(lm_plan_sim_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->nmse_tol = 1e-5;
    o->abs_tol = 2e-2;
}

static lm_status add_phase(simctx *c, int kind, int32_t step, double cycles, double sync, int64_t bytes) {
    phase ph = {kind, step, c->iter, c->clock, cycles, sync, bytes};
    c->clock += cycles;
    return LM__PUSH(c->s->phases, c->s->nphases, c->s->cap_phases, ph);
}

static lm_status close_compute(simctx *c) {
    if (!c->open_compute) return LM_OK;
    double mx = 0;
    for (int64_t t = 0; t < c->low->tiles; t++) {
        mx = fmax(mx, c->tile_cycles[t]);
        c->tile_cycles[t] = 0;
    }
    c->open_compute = 0;
    c->s->sum.compute_cycles += mx;
    return add_phase(c, 0, c->open_step, mx, 0, 0);
}

/* ---- placement of inputs and parameters ---------------------------------------------------------- */
static lm_status place_value(simctx *c, int mv) {
    const lm__plan_mid *mid = &c->p->mid;
    const lm__plan_mval *v = &mid->vals[mv];
    const lm__plan_low *low = c->low;
    const lm__gvalue *val = &c->p->g->values[v->value];
    int64_t n = lm__gvalue_numel(val);
    float *data = lm__alloc(sizeof(float) * (size_t)n, 64);
    if (!data) return LM_OUT_OF_MEMORY;
    int64_t vstr[LM__PLAN_MAX_DIMS], s = 1, strides[LM__PLAN_MAX_DIMS];
    for (int d = val->ndim - 1; d >= 0; d--) vstr[d] = s, s *= val->dims[d];
    lm__plan_layout_strides(&v->l, strides);
    int64_t es = (int64_t)lm_dtype_size(v->l.dtype);
    int64_t S = lm__plan_layout_shards(&v->l), R = lm__plan_layout_reps(&v->l);
    for (int64_t it = 0; it < v->stacked; it++) {
        lm__plan_data_get(&c->data, v->value, it, data);
        for (int64_t sh = 0; sh < S; sh++) {
            int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS];
            if (!lm__plan_layout_box(&v->l, sh, lo, hi)) continue;
            int64_t cnt = 1;
            for (int d = 0; d < val->ndim; d++) cnt *= hi[d] - lo[d];
            for (int64_t r = 0; r < R; r++) {
                int64_t t = lm__plan_layout_tile(&v->l, sh, r);
                const lm__plan_buf *b = &low->bufs[low->buf_of[(size_t)mv * (size_t)low->tiles + (size_t)t]];
                uint8_t *base = c->mem[t] + b->offset + it * b->bytes;
                for (int64_t i = 0; i < cnt; i++) {
                    int64_t rem = i, src = 0, dst = 0;
                    for (int d = val->ndim - 1; d >= 0; d--) {
                        int64_t ext = hi[d] - lo[d], x = rem % ext;
                        rem /= ext;
                        src += (lo[d] + x) * vstr[d];
                        dst += x * strides[d];
                    }
                    lm__plan_store(base + dst * es, v->l.dtype, data[src]);
                }
            }
        }
    }
    lm__free(data);
    return LM_OK;
}

/* ---- steps ---------------------------------------------------------------------------------------- */
typedef struct ctask {
    simctx *c;
    const lm__plan_step *st; /* the compute step */
    int64_t *tiles;          /* [ntiles] tiles with calls in the step */
} ctask;

static void run_tile(void *arg, int64_t task, int worker) {
    ctask *k = arg;
    simctx *c = k->c;
    int64_t t = k->tiles[task];
    float *scratch = c->scratch + (int64_t)worker * c->scratch_n;
    for (int64_t i = c->tstart[t]; i < c->tstart[t + 1]; i++) {
        const lm__plan_call *call = &c->low->calls[i];
        lm__plan_kernel_run(call, c->mem[t], c->low, c->iter, scratch);
        c->tile_cycles[t] += call->cycles;
    }
}

static lm_status compute_step(simctx *c, int64_t si, lm_threadpool *pool) {
    const lm__plan_step *st = &c->low->steps[si];
    if (st->c1 == st->c0) return LM_OK;
    if (!c->open_compute) c->open_compute = 1, c->open_step = (int32_t)si;
    int64_t T = c->low->tiles;
    int64_t *tiles = lm__alloc(sizeof(int64_t) * (size_t)T, 16);
    if (!tiles) return LM_OUT_OF_MEMORY;
    for (int64_t t = 0; t <= T; t++) c->tstart[t] = 0;
    int64_t nt = 0;
    for (int64_t i = st->c0; i < st->c1; i++) c->tstart[c->low->calls[i].tile + 1]++;
    for (int64_t t = 0; t < T; t++) {
        if (c->tstart[t + 1]) tiles[nt++] = t;
        c->tstart[t + 1] += c->tstart[t];
    }
    for (int64_t t = 0; t <= T; t++) c->tstart[t] += st->c0;
    ctask k = {c, st, tiles};
    lm_threadpool_run(pool, nt, run_tile, &k);
    lm__free(tiles);
    return LM_OK;
}

static void copy_box(const lm__plan_low *low, const lm__plan_opnd *src, uint8_t *smem, const lm__plan_opnd *dst,
                     uint8_t *dmem, int64_t iter) {
    const uint8_t *ps = lm__plan_opnd_base(low, src, smem, iter);
    uint8_t *pd = lm__plan_opnd_base(low, dst, dmem, iter);
    int64_t n = lm__plan_opnd_elems(src), es = (int64_t)lm_dtype_size(src->dtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, so = 0, doff = 0;
        for (int d = src->ndim - 1; d >= 0; d--) {
            int64_t x = rem % src->dims[d];
            rem /= src->dims[d];
            so += x * src->strides[d];
            doff += x * dst->strides[d];
        }
        memcpy(pd + doff * es, ps + so * es, (size_t)es);
    }
}

static void run_xfer(void *arg, int64_t task, int worker) {
    (void)worker;
    simctx *c = arg;
    const lm__plan_xfer *x = &c->low->xfers[c->xfer0 + task];
    for (int32_t d = 0; d < x->ndst; d++) {
        const lm__plan_xdst *xd = &c->low->xdst[x->dst0 + d];
        copy_box(c->low, &x->src, c->mem[x->src_tile], &xd->dst, c->mem[xd->tile], c->iter);
    }
}

static lm_status exchange_step(simctx *c, int64_t si, lm_threadpool *pool) {
    const lm__plan_step *st = &c->low->steps[si];
    const lm_plan_machine *m = &c->p->m;
    LM_TRY(close_compute(c));
    double *slot = lm__calloc((size_t)(st->nslots ? st->nslots : 1), sizeof(double));
    if (!slot) return LM_OUT_OF_MEMORY;
    int64_t bytes = 0;
    for (int64_t i = st->x0; i < st->x1; i++) {
        const lm__plan_xfer *x = &c->low->xfers[i];
        double t = (double)x->bytes / m->exch_bytes_per_cycle + (double)m->msg_cycles;
        slot[x->slot] = fmax(slot[x->slot], t);
        bytes += x->bytes * x->ndst;
    }
    double total = 0;
    for (int32_t s = 0; s < st->nslots; s++) total += slot[s];
    lm__free(slot);
    /* transfers run on the pool: each writes its own destinations */
    c->xfer0 = st->x0;
    lm_threadpool_run(pool, st->x1 - st->x0, run_xfer, c);
    double sync = st->x1 > st->x0 ? (double)m->sync_cycles : 0;
    c->s->sum.exchange_cycles += total;
    c->s->sum.sync_cycles += sync;
    c->s->sum.exchange_bytes += bytes;
    return add_phase(c, 1, (int32_t)si, total + sync, sync, bytes);
}

static lm_status check_step(simctx *c, const lm__plan_step *st) {
    const lm__plan_mid *mid = &c->p->mid;
    const lm_graph *g = c->p->g;
    const lm__plan_low *low = c->low;
    const lm__plan_mval *mv = &mid->vals[st->mval];
    int value = mv->value;
    int target = -1;
    if (st->check >= 0)
        target = st->check;
    else
        for (int k = (int)g->nchecks; k < c->ref.ntargets; k++)
            if (c->ref.value[k] == -1 - st->check) target = k;
    if (target < 0) return lm__error(LM_INTERNAL, "sim: checkpoint without a reference");
    const lm__gvalue *val = &g->values[value];
    int64_t n = lm__gvalue_numel(val);
    const float *want = c->ref.data[target] + (c->ref.count[target] > 1 ? c->iter : 0) * n;
    float *got = lm__alloc(sizeof(float) * (size_t)n, 64);
    if (!got) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) got[i] = NAN;
    int64_t vstr[LM__PLAN_MAX_DIMS], s = 1;
    for (int d = val->ndim - 1; d >= 0; d--) vstr[d] = s, s *= val->dims[d];
    int64_t S = lm__plan_layout_shards(&mv->l);
    for (int64_t sh = 0; sh < S; sh++) {
        int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS];
        if (!lm__plan_layout_box(&mv->l, sh, lo, hi)) continue;
        int64_t t = lm__plan_layout_tile(&mv->l, sh, 0);
        lm__plan_opnd o;
        lm_status e = lm__plan_low_operand(low, mid, st->mval, t, lo, hi, &o);
        if (e != LM_OK) {
            lm__free(got);
            return e;
        }
        const uint8_t *base = lm__plan_opnd_base(low, &o, c->mem[t], c->iter);
        int64_t cnt = lm__plan_opnd_elems(&o), es = (int64_t)lm_dtype_size(o.dtype);
        for (int64_t i = 0; i < cnt; i++) {
            int64_t rem = i, src = 0, dst = 0;
            for (int d = o.ndim - 1; d >= 0; d--) {
                int64_t x = rem % o.dims[d];
                rem /= o.dims[d];
                src += x * o.strides[d];
                dst += (lo[d] + x) * vstr[d];
            }
            got[dst] = lm__plan_load(base + src * es, o.dtype);
        }
    }
    lm_status kept = LM_OK;
    if (st->check < 0) { /* a program output: the simulation result keeps it */
        sim_output so;
        memset(&so, 0, sizeof so);
        snprintf(so.name, sizeof so.name, "%s", val->name);
        so.n = n;
        so.data = got;
        kept = LM__PUSH(c->s->outputs, c->s->noutputs, c->s->cap_outputs, so);
    }
    double num = 0, den = 0, maxd = 0, maxw = 0;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        if (!isfinite(got[i])) finite = 0;
        num += d * d;
        den += (double)want[i] * want[i];
        maxd = fmax(maxd, fabs(d));
        maxw = fmax(maxw, fabs((double)want[i]));
    }
    if (st->check >= 0 || kept != LM_OK) lm__free(got);
    LM_TRY(kept);
    lm_plan_check_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", st->check >= 0 ? g->checks[st->check].name : val->name);
    r.iteration = c->iter;
    r.nmse = den > 0 ? num / den : num;
    r.rel_abs = maxw > 0 ? maxd / maxw : maxd;
    if (!finite) r.nmse = r.rel_abs = INFINITY;
    r.pass = finite && r.nmse <= c->opt.nmse_tol && r.rel_abs <= c->opt.abs_tol;
    c->s->sum.checks++;
    c->s->sum.checks_failed += !r.pass;
    c->s->sum.worst_nmse = fmax(c->s->sum.worst_nmse, r.nmse);
    c->s->sum.worst_rel_abs = fmax(c->s->sum.worst_rel_abs, r.rel_abs);
    return LM__PUSH(c->s->checks, c->s->nchecks, c->s->cap_checks, r);
}

static lm_status execute(simctx *c, lm_threadpool *pool) {
    const lm__plan_low *low = c->low;
    for (int64_t si = 0; si < low->nsteps; si++) {
        const lm__plan_step *st = &low->steps[si];
        switch (st->kind) {
        case LM__PLAN_S_COMPUTE: LM_TRY(compute_step(c, si, pool)); break;
        case LM__PLAN_S_EXCHANGE: LM_TRY(exchange_step(c, si, pool)); break;
        case LM__PLAN_S_CHECK: LM_TRY(check_step(c, st)); break;
        case LM__PLAN_S_REPEAT: c->iter = 0; break;
        case LM__PLAN_S_END:
            if (++c->iter < low->steps[st->match].count)
                si = st->match;
            else
                c->iter = 0;
            break;
        }
    }
    return close_compute(c);
}

lm_status lm_plan_simulate(const lm_plan *p, const lm_plan_sim_options *o, lm_plan_sim **out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_simulate: NULL argument");
    *out = NULL;
    simctx c;
    memset(&c, 0, sizeof c);
    if (o)
        c.opt = *o;
    else
        lm_plan_sim_options_default(&c.opt);
    if (c.opt.nmse_tol <= 0) c.opt.nmse_tol = 1e-5;
    if (c.opt.abs_tol <= 0) c.opt.abs_tol = 2e-2;
    c.p = p;
    c.low = &p->low;
    int64_t T = p->low.tiles;
    lm_plan_sim *s = lm__calloc(1, sizeof *s);
    if (!s) return LM_OUT_OF_MEMORY;
    c.s = s;
    lm_threadpool *pool = NULL;
    lm_status st = lm_threadpool_create(c.opt.threads, &pool);
    double t0 = lm__now_seconds();
    if (st == LM_OK) st = lm__plan_data_init(&c.data, p->g, &c.opt);
    if (st == LM_OK) st = lm__plan_ref_run(p->g, &c.data, pool, &c.ref);
    double t1 = lm__now_seconds();
    c.mem = lm__calloc((size_t)T, sizeof *c.mem);
    c.tstart = lm__alloc(sizeof(int64_t) * (size_t)(T + 1), 16);
    c.tile_cycles = lm__calloc((size_t)T, sizeof(double));
    c.scratch_n = lm__plan_kernel_scratch(&p->low);
    c.scratch = lm__alloc(sizeof(float) * (size_t)(c.scratch_n * lm_threadpool_size(pool)), 64);
    if (st == LM_OK && (!c.mem || !c.tstart || !c.tile_cycles || !c.scratch)) st = LM_OUT_OF_MEMORY;
    for (int64_t t = 0; t < T && st == LM_OK; t++) {
        c.mem[t] = lm__calloc((size_t)(p->low.peak[t] ? p->low.peak[t] : 8), 1);
        if (!c.mem[t]) st = LM_OUT_OF_MEMORY;
    }
    for (int64_t v = 0; v < p->mid.nvals && st == LM_OK; v++)
        if (p->mid.vals[v].placed && p->mid.vals[v].view_of < 0) st = place_value(&c, (int)v);
    if (st == LM_OK) st = execute(&c, pool);
    double t2 = lm__now_seconds();
    s->sum.cycles = c.clock;
    s->sum.ref_seconds = t1 - t0;
    s->sum.sim_seconds = t2 - t1;
    for (int64_t t = 0; t < T; t++) s->sum.sram_peak_bytes = LM_MAX(s->sum.sram_peak_bytes, p->low.peak[t]);
    if (c.mem)
        for (int64_t t = 0; t < T; t++) lm__free(c.mem[t]);
    lm__free(c.mem);
    lm__free(c.tstart);
    lm__free(c.tile_cycles);
    lm__free(c.scratch);
    lm__plan_ref_free(&c.ref);
    lm__plan_data_free(&c.data);
    lm_threadpool_destroy(pool);
    if (st != LM_OK) {
        lm_plan_sim_destroy(s);
        return st;
    }
    *out = s;
    return LM_OK;
}

void lm_plan_sim_destroy(lm_plan_sim *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->noutputs; i++) lm__free(s->outputs[i].data);
    lm__free(s->outputs);
    lm__free(s->checks);
    lm__free(s->phases);
    lm__free(s);
}

lm_status lm_plan_sim_get_summary(const lm_plan_sim *s, lm_plan_sim_summary *out) {
    if (!s || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_sim_get_summary: NULL argument");
    *out = s->sum;
    return LM_OK;
}

int lm_plan_sim_check_count(const lm_plan_sim *s) { return s ? (int)s->nchecks : 0; }

lm_status lm_plan_sim_check_get(const lm_plan_sim *s, int i, lm_plan_check_result *out) {
    if (!s || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_sim_check_get: NULL argument");
    if (i < 0 || i >= s->nchecks) return lm__error(LM_OUT_OF_RANGE, "check %d of %lld", i, (long long)s->nchecks);
    *out = s->checks[i];
    return LM_OK;
}

lm_status lm_plan_sim_output(const lm_plan_sim *s, const char *name, float *dst, int64_t n) {
    if (!s || !name || (!dst && n > 0)) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_sim_output: NULL argument");
    const sim_output *found = NULL;
    for (int64_t i = 0; i < s->noutputs; i++) {
        if (strcmp(s->outputs[i].name, name)) continue;
        if (found) return lm__error(LM_INVALID_ARGUMENT, "sim output '%s': two outputs share the name", name);
        found = &s->outputs[i];
    }
    if (!found) {
        char known[256] = "";
        for (int64_t i = 0, k = 0; i < s->noutputs && k < (int64_t)sizeof known - 1; i++)
            k += snprintf(known + k, sizeof known - (size_t)k, "%s'%s'", i ? ", " : "", s->outputs[i].name);
        return lm__error(LM_NOT_FOUND, "sim output '%s': no program output has that name (outputs: %s)", name,
                         s->noutputs ? known : "none");
    }
    if (n != found->n)
        return lm__error(LM_SHAPE_MISMATCH, "sim output '%s': %lld elements, the destination holds %lld", name,
                         (long long)found->n, (long long)n);
    memcpy(dst, found->data, sizeof(float) * (size_t)n);
    return LM_OK;
}

/* Timeline access for the report. */
int64_t lm__plan_sim_phases(const lm_plan_sim *s) { return s ? s->nphases : 0; }

void lm__plan_sim_phase(const lm_plan_sim *s, int64_t i, int *kind, int32_t *step, int64_t *iter, double *start,
                        double *cycles, double *sync, int64_t *bytes) {
    const phase *p = &s->phases[i];
    *kind = p->kind, *step = p->step, *iter = p->iter, *start = p->start, *cycles = p->cycles, *sync = p->sync,
    *bytes = p->bytes;
}
