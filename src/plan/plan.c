/* plan/plan.c — lm_plan_compile: search, mid program, low program and SRAM
 * allocation, trying the search's other final states in cost order (the beam's
 * light ones, kept for their low resident memory, come last) when the best one
 * overflows a tile; plus the plan summary and the public checker entry.
 *
 * The plan owns a copy of the graph and the machine, so callers may free theirs.
 */
#include "plan/low.h"

#include <stdio.h>

void lm_plan_options_default(lm_plan_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->beam_width = 8;
    o->attention = LM_PLAN_ATTN_AUTO;
    o->partials = LM_F32;
    o->gemm_candidates = 48;
}

/* The op kinds the tile machine has kernels and cost models for. */
static int has_kernel(lm__gopk k) {
    return k <= LM__GOP_REPEAT_OUT || k == LM__GOP_SWIGLU || k == LM__GOP_ROPE || k == LM__GOP_ATTENTION;
}

/* i32 values exist only as RoPE positions (possibly through views). */
static lm_status check_i32(const lm_graph *g, int v) {
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        for (int k = 0; k < op->nin; k++) {
            if (op->in[k] != v || lm__gop_is_view(op->kind) || (op->kind == LM__GOP_ROPE && k == 1)) continue;
            return lm__error(LM_UNSUPPORTED,
                             "plan: op '%s' (%s) reads the i32 value '%s': the tile compiler takes i32 values only as "
                             "RoPE positions",
                             op->name, lm__gop_name(op->kind), g->values[v].name);
        }
    }
    return LM_OK;
}

/* What the tile machine can run: f32/f16 values (i32 RoPE positions), the ops it
 * has kernels and cost models for, matmuls of at most 3 dims with equal batch dims,
 * attention over one batch row, biases, norm scales and RoPE frequency tables held
 * as parameters. Errors name the op. */
static lm_status supported(const lm_graph *g) {
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (!has_kernel(op->kind))
            return lm__error(LM_UNSUPPORTED, "plan: op '%s' (%s) has no tile-machine kernel", op->name,
                             lm__gop_name(op->kind));
        const lm__gvalue *v = &g->values[op->out];
        if (v->dtype == LM_I32 && (op->kind == LM__GOP_INPUT || lm__gop_is_view(op->kind))) {
            LM_TRY(check_i32(g, op->out));
        } else if (v->dtype != LM_F32 && v->dtype != LM_F16) {
            return lm__error(LM_UNSUPPORTED,
                             "plan: op '%s' (%s): dtype %s (the tile compiler supports f32 and f16, and i32 inputs as "
                             "RoPE positions)",
                             op->name, lm__gop_name(op->kind), lm_dtype_name(v->dtype));
        }
        if (op->kind == LM__GOP_MATMUL) {
            const lm__gvalue *a = &g->values[op->in[0]], *b = &g->values[op->in[1]];
            if (a->ndim > 3 || a->dtype != b->dtype)
                return lm__error(LM_UNSUPPORTED, "plan: matmul '%s': needs [B?,M,K] x [B?,K,N] operands of one dtype",
                                 op->name);
        }
        if (op->kind == LM__GOP_ATTENTION && g->values[op->in[0]].dims[0] != 1)
            return lm__error(LM_UNSUPPORTED, "plan: attention '%s': batch %lld (the tile compiler runs one batch row)",
                             op->name, (long long)g->values[op->in[0]].dims[0]);
        int first = op->kind == LM__GOP_ROPE ? 2 : 1; /* RoPE: positions are an activation, inv_freq a parameter */
        if (op->kind == LM__GOP_BIAS_ADD || op->kind == LM__GOP_LAYERNORM || op->kind == LM__GOP_RMSNORM ||
            op->kind == LM__GOP_ROPE)
            for (int k = first; k < op->nin; k++)
                if (op->in[k] >= 0 && g->ops[g->values[op->in[k]].op].kind != LM__GOP_PARAM)
                    return lm__error(LM_UNSUPPORTED, "plan: op '%s' (%s): its %s must be a parameter", op->name,
                                     lm__gop_name(op->kind), op->kind == LM__GOP_ROPE ? "inv_freq" : "bias/scale");
    }
    return LM_OK;
}

static lm_status validate(const lm_graph *g, const lm_plan_options *o) {
    LM_TRY(supported(g));
    for (int64_t i = 0; i < g->nops && o->attention == LM_PLAN_ATTN_MATERIALIZED; i++)
        if (g->ops[i].kind == LM__GOP_ATTENTION)
            return lm__error(LM_UNSUPPORTED,
                             "plan: attention '%s': the attention op has only the flash lowering (the materialized "
                             "strategy applies to matmul-softmax-matmul graphs)",
                             g->ops[i].name);
    if (g->open_region >= 0) return lm__error(LM_INVALID_ARGUMENT, "plan: a repeat is still open (repeat_end missing)");
    int outputs = 0;
    for (int64_t v = 0; v < g->nvalues; v++) outputs += g->values[v].output;
    if (!outputs) return lm__error(LM_INVALID_ARGUMENT, "plan: the graph has no outputs");
    if (o->beam_width < 0 || o->gemm_candidates < 0)
        return lm__error(LM_INVALID_ARGUMENT, "plan: negative beam width or candidate count");
    if (o->partials != LM_F32 && o->partials != LM_F16)
        return lm__error(LM_INVALID_ARGUMENT, "plan: partials must be f32 or f16");
    if ((unsigned)o->attention > LM_PLAN_ATTN_MATERIALIZED)
        return lm__error(LM_INVALID_ARGUMENT, "plan: unknown attention strategy %d", (int)o->attention);
    for (int i = 0; i < 3; i++)
        if (o->gemm_grid[i] < 0) return lm__error(LM_INVALID_ARGUMENT, "plan: negative forced gemm grid");
    int set = 0, negative = 0;
    for (int i = 0; i < 4; i++) set += o->flash_grid[i] != 0, negative |= o->flash_grid[i] < 0;
    if (negative || (set && set != 4))
        return lm__error(LM_INVALID_ARGUMENT, "plan: a forced flash grid needs all four splits >= 1 (or all 0)");
    return LM_OK;
}

static void summarize(lm_plan *p, const lm__plan_planner *P, double seconds) {
    lm_plan_summary *s = &p->summary;
    const lm__plan_low *low = &p->low;
    memset(s, 0, sizeof *s);
    s->predicted_cycles = p->mid.cost;
    s->matmul_flops = lm__graph_matmul_flops(p->g);
    lm_dtype dt = LM_F16;
    for (int64_t i = 0; i < p->g->nops; i++)
        if (p->g->ops[i].kind == LM__GOP_MATMUL) {
            dt = p->g->values[p->g->ops[i].in[0]].dtype;
            break;
        }
    s->lower_bound_cycles = s->matmul_flops / ((double)p->m.tiles * lm_plan_machine_matmul_flops(&p->m, dt));
    for (int64_t t = 0; t < low->tiles; t++) {
        s->sram_peak_bytes = LM_MAX(s->sram_peak_bytes, low->peak[t]);
        s->sram_live_bound = LM_MAX(s->sram_live_bound, low->live_bound[t]);
        if (low->live_bound[t] > 0) {
            double r = (double)low->peak[t] / (double)low->live_bound[t];
            if (r > s->sram_alloc_ratio) s->sram_alloc_ratio = r;
        }
    }
    for (int64_t i = 0; i < low->nsteps; i++) {
        const lm__plan_step *st = &low->steps[i];
        if (st->kind == LM__PLAN_S_COMPUTE) s->compute_steps++;
        if (st->kind == LM__PLAN_S_EXCHANGE) {
            s->exchange_steps++;
            for (int64_t x = st->x0; x < st->x1; x++) s->exchange_bytes += low->xfers[x].bytes * low->xfers[x].ndst;
        }
    }
    s->kernel_calls = low->ncalls;
    s->transfers = low->nxfers;
    s->plan_seconds = seconds;
    s->candidates_costed = P->costed;
    s->planner_peak_bytes = lm__plan_planner_bytes(P);
}

lm_status lm_plan_compile(const lm_graph *g, const lm_plan_machine *m, const lm_plan_options *o, lm_plan **out) {
    if (!g || !m || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_compile: NULL argument");
    *out = NULL;
    lm_plan_options opt;
    if (o)
        opt = *o;
    else
        lm_plan_options_default(&opt);
    LM_TRY(validate(g, &opt));
    double t0 = lm__now_seconds();
    lm_plan *p = lm__calloc(1, sizeof *p);
    if (!p) return LM_OUT_OF_MEMORY;
    p->m = *m;
    p->opt = opt;
    lm_status st = lm__graph_clone(g, &p->g);
    /* The search sees resident parameters and each op's working set, not activations
     * live across ops (residual streams, a Repeat's carried values), so its best plans
     * can overflow a tile at allocation. Then it searches again within a smaller budget:
     * the budget less the smallest overflow seen (plus 1/32 of the SRAM), or halfway
     * back to the last budget that overflowed when a smaller one left the search no
     * plan; five searches at most. The allocator keeps the machine's real SRAM. */
    lm__plan_planner P;
    memset(&P, 0, sizeof P);
    lm_plan_machine budget = p->m;
    int finals[16], nfinals = 0, best = -1;
    lm_status first_fail = LM_OK;
    char why[512] = "";
    int built = 0;
    int64_t lo = 0, hi = p->m.sram_bytes; /* budgets known to leave no plan / to overflow */
    for (int attempt = 0; st == LM_OK && !built && attempt < 5; attempt++) {
        if (attempt) {
            lm__plan_planner_free(&P);
            memset(&P, 0, sizeof P);
        }
        p->search_attempts = attempt + 1;
        p->search_sram = budget.sram_bytes;
        st = lm__plan_planner_init(&P, p->g, &budget, &opt);
        if (st == LM_OK) st = lm__plan_search(&P, &best, &p->search_cost, finals, &nfinals, 16);
        if (st == LM_UNSUPPORTED && attempt) { /* no plan within this budget: halfway back up */
            st = LM_OK;
            lo = budget.sram_bytes;
            budget.sram_bytes = lo + (hi - lo) / 2;
            if (hi - lo < p->m.sram_bytes / 32) break;
            continue;
        }
        int64_t over = INT64_MAX;
        for (int k = 0; st == LM_OK && k < nfinals && !built; k++) {
            st = lm__plan_mid_build(&P, finals[k], &p->mid);
            if (st == LM_OK) st = lm__plan_low_build(&P, &p->mid, &p->low);
            if (st == LM_OK) st = lm__plan_sram_allocate(&p->m, &p->mid, p->g, &p->low);
            if (st == LM_UNSUPPORTED) { /* this plan overflows a tile: try the next one */
                if (first_fail == LM_OK) {
                    first_fail = st;
                    snprintf(why, sizeof why, "%s", lm_last_error());
                }
                int64_t need = 0;
                for (int64_t t = 0; p->low.peak && t < p->low.tiles; t++) need = LM_MAX(need, p->low.peak[t]);
                if (need > p->m.sram_bytes) over = LM_MIN(over, need - p->m.sram_bytes);
                lm__plan_low_free(&p->low);
                lm__plan_mid_free(&p->mid);
                st = LM_OK;
                continue;
            }
            if (st == LM_OK) built = 1;
        }
        if (st != LM_OK || built || over == INT64_MAX) break;
        hi = budget.sram_bytes;
        budget.sram_bytes -= over + p->m.sram_bytes / 32;
        if (budget.sram_bytes <= lo) budget.sram_bytes = lo + (hi - lo) / 2;
        if (budget.sram_bytes < p->m.sram_bytes / 8 || hi - budget.sram_bytes < p->m.sram_bytes / 64) break;
    }
    if (st == LM_OK && !built) st = lm__error(LM_UNSUPPORTED, "no feasible plan: %s", why);
    if (st == LM_OK) summarize(p, &P, lm__now_seconds() - t0);
    lm__plan_planner_free(&P);
    if (st != LM_OK) {
        lm_plan_destroy(p);
        return st;
    }
    *out = p;
    return LM_OK;
}

void lm_plan_destroy(lm_plan *p) {
    if (!p) return;
    lm__plan_low_free(&p->low);
    lm__plan_mid_free(&p->mid);
    lm_graph_destroy(p->g);
    lm__free(p);
}

lm_status lm_plan_get_summary(const lm_plan *p, lm_plan_summary *out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_get_summary: NULL argument");
    *out = p->summary;
    return LM_OK;
}

lm_status lm_plan_check(const lm_plan *p) {
    if (!p) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_check: NULL plan");
    return lm__plan_check_low(&p->m, &p->mid, &p->low);
}
