/* The planner: beam search finds the same best plan as exhaustive search on small
 * shapes; forced strategies and forced matmul grids are honored; plans that cannot
 * fit are rejected with a reason; invalid graphs and options fail with the exact
 * status; compiling survives allocation failures without leaks.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "plan/low.h"

#include <math.h>
#include <string.h>

static lm_plan_machine *machine(const char *name) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset(name, &m));
    return m;
}

static lm_graph *workload(lm_plan_workload_kind k, int64_t a, int64_t b, int64_t c, int64_t heads) {
    lm_plan_workload w;
    lm_plan_workload_default(k, &w);
    w.m = w.tokens = a;
    w.n = w.width = b;
    w.k = w.hidden = c;
    w.heads = heads;
    w.repeat = 2;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    return g;
}

static int has_mid(const lm_plan *p, lm__plan_mk kind) {
    for (int64_t i = 0; i < p->mid.nops; i++)
        if (p->mid.ops[i].kind == kind) return 1;
    return 0;
}

static void test_beam_matches_exhaustive_on_small_shapes(void) {
    static const struct {
        lm_plan_workload_kind k;
        int64_t a, b, c, h;
        const char *m;
    } cases[] = {
        {LM_PLAN_WL_GEMM, 32, 48, 64, 1, "small4"},        {LM_PLAN_WL_GEMM, 64, 64, 64, 1, "small16"},
        {LM_PLAN_WL_GEMM, 40, 24, 96, 1, "small16"},       {LM_PLAN_WL_MLP, 32, 48, 64, 1, "small4"},
        {LM_PLAN_WL_MLP, 48, 64, 96, 1, "small16"},        {LM_PLAN_WL_MLP_REPEAT, 16, 32, 48, 1, "small4"},
        {LM_PLAN_WL_MLP_REPEAT, 32, 32, 64, 1, "small16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lm_plan_machine *m = machine(cases[i].m);
        lm_graph *g = workload(cases[i].k, cases[i].a, cases[i].b, cases[i].c, cases[i].h);
        lm_plan_options o;
        lm_plan_options_default(&o);
        o.gemm_candidates = 12;
        lm_plan *beam = NULL, *ex = NULL;
        LT_CHECK_OK(lm_plan_compile(g, m, &o, &beam));
        o.exhaustive = 1;
        LT_CHECK_OK(lm_plan_compile(g, m, &o, &ex));
        if (beam && ex) {
            LT_CHECK_MSG(fabs(beam->search_cost - ex->search_cost) <= 1e-6 * ex->search_cost,
                         "case %zu: beam %.1f vs exhaustive %.1f cycles", i, beam->search_cost, ex->search_cost);
            LT_CHECK(fabs(beam->summary.predicted_cycles - ex->summary.predicted_cycles) <=
                     1e-6 * ex->summary.predicted_cycles);
        }
        lm_plan_destroy(beam);
        lm_plan_destroy(ex);
        lm_graph_destroy(g);
        lm_plan_machine_destroy(m);
    }
}

static void test_forced_strategies_are_honored(void) {
    lm_plan_machine *m = machine("small16");
    lm_graph *g = workload(LM_PLAN_WL_ATTENTION, 32, 64, 64, 4);
    lm_plan_options o;
    lm_plan_options_default(&o);
    lm_plan *p = NULL;
    o.attention = LM_PLAN_ATTN_FLASH;
    LT_CHECK_OK(lm_plan_compile(g, m, &o, &p));
    LT_CHECK(p && has_mid(p, LM__PLAN_M_FLASH));
    lm_plan_destroy(p);
    o.attention = LM_PLAN_ATTN_MATERIALIZED;
    LT_CHECK_OK(lm_plan_compile(g, m, &o, &p));
    LT_CHECK(p && !has_mid(p, LM__PLAN_M_FLASH));
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    /* a forced matmul grid appears on every matmul */
    g = workload(LM_PLAN_WL_MLP, 32, 48, 64, 1);
    lm_plan_options_default(&o);
    o.gemm_grid[0] = 2, o.gemm_grid[1] = 4, o.gemm_grid[2] = 2;
    LT_CHECK_OK(lm_plan_compile(g, m, &o, &p));
    int matmuls = 0;
    for (int64_t i = 0; p && i < p->mid.nops; i++) {
        const lm__plan_mop *op = &p->mid.ops[i];
        if (op->kind != LM__PLAN_M_COMPUTE || p->g->ops[op->gop].kind != LM__GOP_MATMUL) continue;
        matmuls++;
        LT_CHECK(op->grid[1] == 2 && op->grid[2] == 4 && op->grid[3] == 2);
    }
    LT_CHECK(matmuls == 2);
    lm_plan_destroy(p);
    /* a grid that cannot exist is rejected with the reason */
    o.gemm_grid[0] = 64, o.gemm_grid[1] = 1, o.gemm_grid[2] = 1;
    LT_CHECK_STATUS(lm_plan_compile(g, m, &o, &p), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "forced grid 64x1x1") != NULL);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

static void test_too_large_plans_are_rejected_with_a_reason(void) {
    lm_plan_machine *m = machine("small4");
    lm_graph *g = workload(LM_PLAN_WL_GEMM, 1024, 1024, 1024, 1);
    lm_plan *p = (lm_plan *)1;
    LT_CHECK_STATUS(lm_plan_compile(g, m, NULL, &p), LM_UNSUPPORTED);
    LT_CHECK(p == NULL);
    LT_CHECK_MSG(strstr(lm_last_error(), "SRAM") && strstr(lm_last_error(), "gemm"), "reason: %s", lm_last_error());
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

/* The IR holds any dtype (the engine's graphs carry i32 ids and bf16 weights); the
 * tile compiler refuses what it cannot run, naming the op. */
static void test_plan_refuses_dtypes_it_cannot_run(void) {
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t s23[2] = {2, 3};
    lm_graph_value i, y;
    LT_CHECK_OK(lm_graph_input(g, "ids", LM_I32, 2, s23, 1, &i));
    LT_CHECK_OK(lm_graph_unary(g, "act", LM_GRAPH_SILU, i, &y));
    LT_CHECK_OK(lm_graph_output(g, y));
    lm_plan_machine *m = machine("small4");
    lm_plan *p = NULL;
    LT_CHECK_STATUS(lm_plan_compile(g, m, NULL, &p), LM_UNSUPPORTED);
    LT_CHECK_MSG(strstr(lm_last_error(), "'ids'") && strstr(lm_last_error(), "i32"), "reason: %s", lm_last_error());
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

static void test_graph_builder_errors(void) {
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t s23[2] = {2, 3}, s45[2] = {4, 5}, s3[1] = {3}, bad[2] = {2, 0};
    lm_graph_value a, b, w, c, v;
    LT_CHECK_OK(lm_graph_input(g, "a", LM_F16, 2, s23, 1, &a));
    LT_CHECK_STATUS(lm_graph_input(g, "z", LM_F16, 2, bad, 1, &v), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_graph_param(g, "w", LM_F16, 2, s45, 0, 1, &w));
    LT_CHECK_STATUS(lm_graph_matmul(g, "mm", a, w, LM_F16, &c), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "mm") != NULL);
    LT_CHECK_OK(lm_graph_param(g, "b", LM_F32, 1, s3, 0, 1, &b));
    LT_CHECK_STATUS(lm_graph_bias_add(g, "ba", a, b, &v), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_graph_matmul(g, "mm2", a, 99, LM_F16, &c), LM_INVALID_ARGUMENT);
    int64_t r5[1] = {5};
    LT_CHECK_STATUS(lm_graph_reshape(g, "r", a, 1, r5, &v), LM_SHAPE_MISMATCH);
    const int perm[2] = {0, 0};
    LT_CHECK_STATUS(lm_graph_permute(g, "p", a, perm, &v), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_graph_split_heads(g, "h", a, 2, &v), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_graph_repeat_end(g, 1, &a, &v), LM_INVALID_ARGUMENT);
    lm_graph_value in;
    LT_CHECK_OK(lm_graph_repeat_begin(g, 2, 1, &a, &in));
    LT_CHECK_STATUS(lm_graph_repeat_begin(g, 2, 1, &a, &in), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_graph_input(g, "late", LM_F16, 2, s23, 1, &v), LM_INVALID_ARGUMENT);
    lm_graph_value y;
    LT_CHECK_OK(lm_graph_unary(g, "act", LM_GRAPH_GELU, in, &y));
    /* a compile with the repeat still open is refused */
    lm_plan_machine *m = machine("small4");
    lm_plan *p = NULL;
    LT_CHECK_STATUS(lm_plan_compile(g, m, NULL, &p), LM_INVALID_ARGUMENT);
    lm_graph_value out;
    LT_CHECK_OK(lm_graph_repeat_end(g, 1, &y, &out));
    LT_CHECK_STATUS(lm_graph_unary(g, "after", LM_GRAPH_GELU, y, &v), LM_INVALID_ARGUMENT);
    /* no outputs yet */
    LT_CHECK_STATUS(lm_plan_compile(g, m, NULL, &p), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_graph_output(g, out));
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.partials = LM_BF16;
    LT_CHECK_STATUS(lm_plan_compile(g, m, &o, &p), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
    lm_plan_destroy(p);
    lm_plan_machine_destroy(m);
    lm_graph_destroy(g);
    lm_graph_destroy(NULL);
}

/* Every k-th allocation failing (strided over the whole run) gives LM_OK or
 * LM_OUT_OF_MEMORY and leaks nothing, for compile and simulate. */
static void survive(lm_plan_workload_kind k, int64_t a, int64_t b, int64_t c, int64_t heads) {
    lm_plan_machine *m = machine("small16");
    lm_graph *g = workload(k, a, b, c, heads);
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 1;
    lt_alloc_track(0);
    lm_plan *p = NULL;
    lm_plan_sim *s = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
    LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    int64_t total = lt_alloc_count();
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
    lt_alloc_untrack();
    int64_t stride = total / 120 + 1;
    for (int64_t f = 1; f <= total; f += stride) {
        lt_alloc_track(f);
        p = NULL;
        s = NULL;
        lm_status st = lm_plan_compile(g, m, NULL, &p);
        if (st == LM_OK) st = lm_plan_simulate(p, &so, &s);
        LT_CHECK_MSG(st == LM_OK || st == LM_OUT_OF_MEMORY, "%s: failing allocation %lld gave %s: %s",
                     lm_plan_workload_name(k), (long long)f, lm_status_name(st), lm_last_error());
        lm_plan_sim_destroy(s);
        lm_plan_destroy(p);
        LT_CHECK_MSG(lt_alloc_live() == 0, "%s: failing allocation %lld leaked %lld", lm_plan_workload_name(k),
                     (long long)f, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

static void test_compile_and_simulate_survive_allocation_failures(void) {
    survive(LM_PLAN_WL_MLP, 16, 32, 48, 1);
    survive(LM_PLAN_WL_MLP_REPEAT, 16, 32, 48, 1);
    survive(LM_PLAN_WL_ATTENTION, 24, 32, 32, 2);
    survive(LM_PLAN_WL_GEMM, 128, 96, 320, 1);
}

int main(void) {
    LT_RUN(test_beam_matches_exhaustive_on_small_shapes);
    LT_RUN(test_forced_strategies_are_honored);
    LT_RUN(test_too_large_plans_are_rejected_with_a_reason);
    LT_RUN(test_graph_builder_errors);
    LT_RUN(test_plan_refuses_dtypes_it_cannot_run);
    LT_RUN(test_compile_and_simulate_survive_allocation_failures);
    return lt_finish();
}
